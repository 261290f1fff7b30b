"""Memory levels act in a decode (real diffusers H3 VAE, tiny config): level 0 takes the model's own
path, level 1 leases the per-clip buffers from the slot pool, level 2 adds collections between clips;
the frames are the same bit for bit and the report counts what happened."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from decode_helpers import CollectingSink, h3_reference, single_thread  # noqa: F401 - fixture
from safetensors.torch import save_file

from h3director.cli import main
from h3director.core.config import validate_config
from h3director.core.pool import SlotPool
from h3director.integrations.diffusers_h3 import H3VideoAdapter
from h3director.units import MiB
from h3director.video.clip_buffers import ClipBuffers
from h3director.video.levels import decode_for_level
from h3director.video.scheduler import stream_decode
from h3director.video.sinks import VideoFileSink

pytestmark = pytest.mark.usefixtures("single_thread")

# 17 latent frames (5n + 2, n = 3): 3 clips on the tiny VAE, two cross-fades
LATENTS = torch.randn((1, 24, 17, 4, 6), generator=torch.Generator().manual_seed(5))


def _config(level: int, pool_mb: int = 1024, slot_mb: int = 1):
    return validate_config({"memory_optimization_level": level, "pre_allocated_pool_mb": pool_mb,
                            "pool_slot_mb": slot_mb, "memory_safety": {"enabled": False}}, env={})


@pytest.fixture(scope="module")
def adapter(tiny_h3):
    return H3VideoAdapter(tiny_h3)


def _decode(adapter, config):
    sink = CollectingSink()
    with torch.no_grad():
        report = decode_for_level(adapter, LATENTS, sink, config=config)
    return report, report.result


def test_levels_give_identical_frames_and_count_what_they_did(tiny_h3, adapter):
    expected = h3_reference(tiny_h3, LATENTS)
    level0, frames0 = _decode(adapter, _config(0))
    level1, frames1 = _decode(adapter, _config(1))
    level2, frames2 = _decode(adapter, _config(2))
    for frames in (frames0, frames1, frames2):
        assert torch.equal(frames, expected)
    assert level0.path == "reference" and level0.clips_decoded == 1
    assert (level0.buffers.pool_leases, level0.buffers.pool_fallbacks, level0.buffers.collections) == (0, 0, 0)
    assert "reference path" in level0.notes[0]
    assert level1.path == level2.path == "streaming" and level1.clips == 3
    # per clip: a carried tail (clips 0, 1) and an assembled output (clips 1, 2: cross-faded parts)
    assert level1.buffers.pool_leases >= 4 and level1.buffers.pool_fallbacks == 0
    assert level1.buffers.collections == 0           # level 1: no collections between clips
    assert level2.buffers.pool_leases >= 4
    assert level2.buffers.collections == level2.clips_decoded == 3
    # the collections between clips return the finished clip's buffers (lifetime class 1 and 2 leases; the
    # collections are young ones) and count them
    assert level2.buffers.reclaimed_leases > 0 and level2.buffers.reclaimed_bytes > 0
    assert level1.buffers.reclaimed_leases == 0
    assert "pool lease(s)" in level2.notes[-1]


def test_level_1_without_a_pool_allocates_plainly(adapter):
    report, _ = _decode(adapter, _config(1, pool_mb=0))
    assert report.path == "streaming"
    assert report.buffers.pool_leases == 0 and report.buffers.unpooled >= 4


def test_requests_the_pool_cannot_serve_are_fallbacks_with_the_same_frames(tiny_h3, adapter):
    pool = SlotPool(64 * 1024, 64 * 1024, "cpu", generation_gc=False)  # one 64 KiB slot: a clip is larger
    sink = CollectingSink()
    with torch.no_grad():
        report = stream_decode(adapter, LATENTS, sink, config=_config(1), buffers=ClipBuffers(pool))
    assert torch.equal(report.result, h3_reference(tiny_h3, LATENTS))
    assert report.buffers.pool_fallbacks > 0
    assert pool.stats().fallback_count == report.buffers.pool_fallbacks   # the pool counted the same ones


def test_video_sink_stages_its_uint8_frames_in_the_pool(adapter, tmp_path):
    pool = SlotPool(4 * MiB, MiB, "cpu", generation_gc=False)
    sink = VideoFileSink(tmp_path / "v.mp4", crf=18)
    with torch.no_grad():
        report = stream_decode(adapter, LATENTS, sink, config=_config(1), buffers=ClipBuffers(pool))
    # 3 staging leases (one per clip) on top of the tails and assembled outputs
    plain = CollectingSink()
    with torch.no_grad():
        without = stream_decode(adapter, LATENTS, plain, config=_config(1), buffers=ClipBuffers(pool))
    assert report.buffers.pool_leases == without.buffers.pool_leases + 3
    assert pool.stats().live_leases == 0   # every lease went back


def test_cli_level_0_says_it_takes_the_reference_path(tiny_h3, tmp_path, capsys, monkeypatch):
    tiny_h3.save_pretrained(tmp_path / "vae")
    save_file({"latents": LATENTS}, tmp_path / "z.safetensors")
    outputs = {}
    for level in (0, 2):
        monkeypatch.setenv("H3_MEMORY_OPTIMIZATION_LEVEL", str(level))
        out = tmp_path / f"f{level}.npy"
        code = main(["decode", str(tmp_path / "z.safetensors"), "--vae", str(tmp_path / "vae"), "--out", str(out),
                     "--no-progress"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
        outputs[level] = (np.load(out), captured.err)
    np.testing.assert_array_equal(outputs[0][0], outputs[2][0])
    assert "reference path" in outputs[0][1] and "pool lease" not in outputs[0][1]
    assert "streaming decode:" in outputs[2][1] and "collection(s) between clips" in outputs[2][1]
