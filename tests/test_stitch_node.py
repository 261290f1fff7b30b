"""H3Director Stitch (ComfyUI node) and the in-memory joins it runs (h3director.av.stitch_arrays)."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch
from comfy_harness.loader import install_stubs

from h3director.errors import InvalidInputError

install_stubs()

from h3director.av.stitch_arrays import join_audio, join_frames  # noqa: E402
from h3director.av.timeline import sample_at  # noqa: E402
from h3director.comfy.nodes_stitch import Stitch  # noqa: E402

RATE, FPS, OV = 32_000, 24.0, 22


def _segment(frames, seed, height=8, width=12):
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(frames, height, width, 3, generator=g)
    wave = torch.rand(1, 2, sample_at(frames, Fraction(24), RATE), generator=g) * 2 - 1
    return images, {"waveform": wave, "sample_rate": RATE}


@pytest.mark.parametrize("blend", ["cut", "crossfade"])
def test_three_segments_chain_to_the_exact_counts(blend):
    segs = [_segment(n, s) for s, n in enumerate((56, 73, 50))]
    images, audio = segs[0]
    for nxt_images, nxt_audio in segs[1:]:
        images, audio = Stitch.execute(images, audio, nxt_images, nxt_audio, OV, blend, FPS).args
    assert images.shape[0] == 56 + 73 + 50 - 2 * OV
    assert audio["waveform"].shape[-1] == sample_at(images.shape[0], Fraction(24), RATE)
    # frames outside the overlaps are the segments' own
    assert torch.equal(images[:56 - OV], segs[0][0][:56 - OV])
    assert torch.equal(images[56:56 + 73 - 2 * OV], segs[1][0][OV:73 - OV])
    assert torch.equal(images[-(50 - OV):], segs[2][0][OV:])
    # audio outside the cross-fades is the segments' own, placed at the absolute join instants
    join, end = sample_at(56 - OV, Fraction(24), RATE), sample_at(56, Fraction(24), RATE)
    wave = audio["waveform"]
    assert torch.equal(wave[..., :join], segs[0][1]["waveform"][..., :join])
    join2 = sample_at(56 + 73 - 2 * OV, Fraction(24), RATE)
    assert torch.equal(wave[..., end:join2], segs[1][1]["waveform"][..., end - join:join2 - join])


def test_the_crossfades_follow_the_stated_weights():
    (a, wa), (b, wb) = _segment(40, 1), _segment(40, 2)
    images = join_frames(a, b, OV, "crossfade")
    j = 5
    w = (j + 1) / (OV + 1)
    assert torch.allclose(images[40 - OV + j], a[40 - OV + j] * (1 - w) + b[j] * w)
    out = join_audio(wa["waveform"], wb["waveform"], RATE, FPS, 40, 40, OV)
    join, end = sample_at(40 - OV, Fraction(24), RATE), sample_at(40, Fraction(24), RATE)
    i = 1000
    t = (i + 0.5) / (end - join)
    want = wa["waveform"][0, 0, join + i] * torch.cos(torch.tensor(torch.pi * t / 2, dtype=torch.float64)) + \
        wb["waveform"][0, 0, i] * torch.sin(torch.tensor(torch.pi * t / 2, dtype=torch.float64))
    assert abs(float(out[0, 0, join + i]) - float(want)) < 1e-6


def test_bad_segments_are_refused():
    a, wa = _segment(40, 1)
    b, wb = _segment(40, 2, width=16)
    with pytest.raises(InvalidInputError, match="differ in size"):
        Stitch.execute(a, wa, b, wb, OV, "cut", FPS)
    b, wb = _segment(20, 2)
    with pytest.raises(InvalidInputError, match="more frames than the overlap"):
        Stitch.execute(a, wa, b, wb, OV, "cut", FPS)
    b, wb = _segment(40, 2)
    with pytest.raises(InvalidInputError, match="sample rates differ"):
        Stitch.execute(a, wa, b, {**wb, "sample_rate": 48_000}, OV, "cut", FPS)
    with pytest.raises(InvalidInputError, match="audio channels differ"):
        Stitch.execute(a, wa, b, {**wb, "waveform": wb["waveform"][:, :1]}, OV, "cut", FPS)
    with pytest.raises(InvalidInputError, match="more than one frame is missing"):
        Stitch.execute(a, {**wa, "waveform": wa["waveform"][..., :10_000]}, b, wb, OV, "cut", FPS)
    with pytest.raises(InvalidInputError, match="AUDIO dict"):
        Stitch.execute(a, None, b, wb, OV, "cut", FPS)
