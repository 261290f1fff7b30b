"""Stitching chained segments (h3director.av.stitch): exact counts, blends, exactness outside overlaps, refusals."""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np
import pytest

pytest.importorskip("av")

from chain_clips import write_segment  # noqa: E402

from h3director.av.segment_audio import SampleReader  # noqa: E402
from h3director.av.stitch import inspect_segment, stitch_files  # noqa: E402
from h3director.av.stitch_check import compare_stitch  # noqa: E402
from h3director.av.timeline import Timeline, sample_at  # noqa: E402
from h3director.cli import main  # noqa: E402
from h3director.errors import InvalidInputError  # noqa: E402

W, H, OV = 64, 48, 22


def _chain(folder, lengths, **kw):
    paths = []
    for s, frames in enumerate(lengths):
        path = folder / f"seg{s}{kw.get('ext', '.mkv')}"
        opts = {k: v for k, v in kw.items() if k != "ext"}
        write_segment(path, segment=s, frames=frames, overlap=OV, width=W, height=H, **opts)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    return _chain(tmp_path_factory.mktemp("chain"), (56, 73, 50))


def _visible(folder):
    return sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("blend", ["cut", "crossfade"])
def test_lossless_stitch_is_exact_outside_the_overlaps(chain, tmp_path, blend):
    out = tmp_path / "out.mkv"
    report = stitch_files(chain, out, OV, blend=blend, video_codec="ffv1")
    assert report.frames == 56 + 73 + 50 - 2 * OV
    assert report.samples == sample_at(report.frames, Fraction(24), 32_000)
    check = compare_stitch(chain, out, OV, blend)
    assert check.output_frames == report.frames and check.output_samples == report.samples
    assert check.exact and check.samples_checked > 0
    # cut keeps the earlier segment through the overlap: every frame has one source; crossfade blends 2 x 22
    assert check.frames_checked == (report.frames if blend == "cut" else report.frames - 2 * OV)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]     # no temporary left
    if blend == "crossfade":   # the checker can fail: by the cut rule the blended overlap frames do not match
        other = compare_stitch(chain, out, OV, "cut")
        assert other.frames_checked - other.frames_equal == 2 * OV


def test_crossfade_frames_lie_between_the_two_segments(chain, tmp_path):
    import av

    out = tmp_path / "x.mkv"
    stitch_files(chain, out, OV, blend="crossfade", video_codec="ffv1")
    def frame(path, index):
        with av.open(str(path)) as c:
            for i, f in enumerate(c.decode(video=0)):
                if i == index:
                    return f.to_ndarray().astype(int)
    j = 10                                             # overlap frame 10 of the first join: output frame 34 + 10
    a, b, mixed = frame(chain[0], 56 - OV + j), frame(chain[1], j), frame(out, 56 - OV + j)
    w = (j + 1) / (OV + 1)
    assert np.abs(mixed - (a * (1 - w) + b * w)).max() <= 1
    assert not np.array_equal(mixed, a) and not np.array_equal(mixed, b)


def test_audio_is_crossfaded_with_equal_power_at_the_join_instant(chain, tmp_path):
    out = tmp_path / "a.mkv"
    stitch_files(chain, out, OV, blend="cut", video_codec="ffv1")
    timeline = Timeline((56, 73, 50), OV, Fraction(24), 32_000)
    join, end = sample_at(56 - OV, Fraction(24), 32_000), sample_at(56, Fraction(24), 32_000)
    assert (join, end) == (45333, 74667)               # 34 x 4000/3 = 45333.3, 56 x 4000/3 = 74666.7
    assert timeline.audio_regions()[1].start == join and timeline.audio_regions()[1].stop == end
    readers = [SampleReader(p) for p in (out, chain[0], chain[1])]
    got, first, second = readers[0].read(end), readers[1].read(end), readers[2].read(end - join)
    for r in readers:
        r.close()
    t = (np.arange(end - join) + 0.5) / (end - join)
    want = np.rint(first[:, join:].astype(float) * np.cos(np.pi * t / 2) + second * np.sin(np.pi * t / 2))
    assert np.array_equal(got[:, join:], want.astype(np.int16))
    assert np.array_equal(got[:, :join], first[:, :join])


def test_cli_writes_and_reports(chain, tmp_path, capsys):
    out = tmp_path / "cli.mp4"
    assert main(["stitch", *map(str, chain), "--overlap", "22", "--blend", "cut", "--out", str(out)]) == 0
    assert "135 frames from 3 segments" in capsys.readouterr().out
    assert inspect_segment(out).frames == 135
    lossy = compare_stitch(chain, out, OV, "cut")          # the default H.264 CRF 18 + AAC is not exact
    assert lossy.frames_equal < lossy.frames_checked and lossy.samples_equal < lossy.samples_checked
    import av
    with av.open(str(out)) as c:
        assert sum(1 for p in c.demux(video=0) if p.size) == 135


def test_the_lossless_h264_path_is_byte_equal_too(chain, tmp_path):
    out = tmp_path / "l.mp4"
    stitch_files(chain, out, OV, blend="crossfade", video_codec="h264-lossless", preset="ultrafast")
    assert compare_stitch(chain, out, OV, "crossfade").exact


def _refused(paths, out, match, **kw):
    with pytest.raises(InvalidInputError, match=match):
        stitch_files(paths, out, kw.pop("overlap", OV), video_codec="ffv1", **kw)
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]


def test_bad_inputs_are_refused_before_any_output(chain, tmp_path):
    out = tmp_path / "bad.mkv"
    odd = tmp_path / "odd"
    odd.mkdir()
    big = odd / "big.mkv"
    write_segment(big, segment=1, frames=60, overlap=OV, width=96, height=48)
    _refused([chain[0], big], out, "size 96x48 differs")
    fast = odd / "fast.mkv"
    write_segment(fast, segment=1, frames=60, overlap=OV, width=W, height=H, fps=30)
    _refused([chain[0], fast], out, "frame rate 30 differs")
    rate = odd / "rate.mkv"
    write_segment(rate, segment=1, frames=60, overlap=OV, width=W, height=H, rate=48_000)
    _refused([chain[0], rate], out, "sample rate 48000 differs")
    mono = odd / "mono.mkv"
    write_segment(mono, segment=1, frames=60, overlap=OV, width=W, height=H, channels=1)
    _refused([chain[0], mono], out, "audio channels 1 differs")
    silent = odd / "silent.mkv"
    write_segment(silent, segment=1, frames=60, overlap=OV, width=W, height=H, audio=False)
    _refused([chain[0], silent], out, "no audio stream")
    short = odd / "short.mkv"
    write_segment(short, segment=1, frames=60, overlap=OV, width=W, height=H, audio_samples=60_000)
    _refused([chain[0], short], out, "more than one frame of sound is missing")
    _refused(chain, out, "needs more frames than the overlap", overlap=60)
    _refused(chain, out, r"at least 2 x overlap = 80", overlap=40)
    junk = odd / "junk.mkv"
    junk.write_bytes(b"not a video" * 100)
    _refused([chain[0], junk], out, "not a readable media file|unreadable")
    _refused([chain[0], odd / "missing.mkv"], out, "no such file")
    cut = odd / "cut.mp4"
    write_segment(cut, segment=1, frames=60, overlap=OV, width=W, height=H, video_codec="libx264",
                  audio_codec="aac")
    cut.write_bytes(cut.read_bytes()[: os.path.getsize(cut) // 2])
    _refused([chain[0], cut], out, "truncated|unreadable|not a readable")
    _refused(chain, tmp_path / "bad.mp4", "ffv1 video needs a .mkv")


def test_a_failure_midway_keeps_an_existing_output_and_leaves_no_temporary(chain, tmp_path, monkeypatch):
    from h3director.av import stitch as stitch_module

    out = tmp_path / "keep.mkv"
    out.write_bytes(b"previous result")
    calls = {"n": 0}
    real = stitch_module._blend

    def failing(*args):
        calls["n"] += 1
        if calls["n"] == 5:
            raise RuntimeError("disk full")
        return real(*args)

    monkeypatch.setattr(stitch_module, "_blend", failing)
    with pytest.raises(RuntimeError, match="disk full"):
        stitch_files(chain, out, OV, blend="crossfade", video_codec="ffv1")
    assert out.read_bytes() == b"previous result"
    assert _visible(tmp_path) == ["keep.mkv"] and len(list(tmp_path.iterdir())) == 1


def _segment_with_sound(path, frames, sound):
    from synthetic_av import write_clip

    pictures = np.full((frames, H, W, 3), 90, np.uint8)
    write_clip(path, pictures, sound, 24.0, 32_000, container_format="matroska", audio_codec="pcm_s16le")
    return path


@pytest.mark.parametrize("related", [True, False])
def test_the_join_keeps_the_level_of_matching_and_of_unrelated_sound(tmp_path, related):
    """A later segment conditioned on the earlier one's last frames often repeats its sound: equal power would
    make that 3 dB louder mid-join, so correlated overlaps fade linearly; unrelated sound keeps equal power."""
    from h3director.av.segment_audio import SampleReader

    rate, frames = 32_000, 48
    length = sample_at(frames, Fraction(24), rate)
    noise = np.random.default_rng(1).standard_normal(3 * length) * 0.2
    join = sample_at(frames - OV, Fraction(24), rate)
    first = noise[:length]
    second = noise[join:join + length] if related else noise[length:2 * length]
    paths = [_segment_with_sound(tmp_path / "s0.mkv", frames, first),
             _segment_with_sound(tmp_path / "s1.mkv", frames, second)]
    report = stitch_files(paths, tmp_path / "joined.mkv", OV, blend="cut", video_codec="ffv1")
    assert report.audio_fades == (["linear"] if related else ["equal power"])
    reader = SampleReader(tmp_path / "joined.mkv")
    out = reader.read(report.samples)[0].astype(np.float64) / 32768
    reader.close()
    end = sample_at(frames, Fraction(24), rate)
    middle = out[(join + end) // 2 - 2000:(join + end) // 2 + 2000]
    reference = first[:join]
    gain_db = 10 * np.log10(np.mean(middle ** 2) / np.mean(reference ** 2))
    assert abs(gain_db) < 0.5, gain_db          # equal power on matching sound would read about +3 dB


def _decoded_samples(path):
    """Samples per channel FFmpeg's decoder (PyAV, no trimming of ours) returns from the file's first audio stream."""
    import av

    with av.open(str(path)) as c:
        return sum(f.samples for f in c.decode(c.streams.audio[0]))


@pytest.fixture(scope="module")
def chain48(tmp_path_factory):
    """A 48 kHz chain: 136 output frames = 272,000 samples = 5.6667 s, not a whole number of milliseconds."""
    return _chain(tmp_path_factory.mktemp("chain48"), (56, 73, 51), rate=48_000)


def test_aac_in_matroska_decodes_to_exactly_the_stated_samples(chain48, tmp_path):
    """The encoder pads the last AAC frame to 1024 samples; the padding is signalled (DiscardPadding) and FFmpeg's
    own decoder drops it, so a plain PyAV decode returns exactly the report's samples."""
    report = stitch_files(chain48, tmp_path / "aac.mkv", OV, blend="cut", video_codec="h264", audio_codec="aac",
                          preset="ultrafast")
    assert report.samples == sample_at(136, Fraction(24), 48_000) == 272_000
    assert 0 < report.audio_end_padding < 1024                  # 272,000 is not a multiple of 1024
    assert _decoded_samples(report.path) == report.samples == report.decoded_samples


@pytest.mark.parametrize("ext", [".mp4", ".mov"])
def test_aac_in_mp4_states_its_exact_length_and_the_report_says_what_ffmpeg_decodes(chain48, tmp_path, ext):
    """MP4 carries the exact length in the edit list (movie timescale in whole samples; at the default 1 ms it
    would round 5.6667 s down by 32 samples); h3director's reader honours it, FFmpeg's decoder returns the last
    frame whole, which the report states."""
    import av

    report = stitch_files(chain48, tmp_path / f"aac{ext}", OV, blend="cut", video_codec="h264", audio_codec="aac",
                          preset="ultrafast")
    with av.open(str(report.path)) as c:
        stream = c.streams.audio[0]
        assert stream.duration * stream.time_base * 48_000 == report.samples == 272_000
        assert sum(1 for p in c.demux(c.streams.video[0]) if p.size) == report.frames == 136
    reader = SampleReader(report.path)
    reader.read(report.samples)
    assert reader.padded == 0 and reader.read(1).shape[1] == 1 and reader.padded == 1    # nothing beyond
    reader.close()
    assert 0 < report.audio_end_padding < 1024
    assert _decoded_samples(report.path) == report.decoded_samples == report.samples + report.audio_end_padding


def test_lossless_audio_has_no_end_padding(chain, tmp_path):
    report = stitch_files(chain, tmp_path / "pcm.mkv", OV, blend="cut", video_codec="ffv1")
    assert report.audio_end_padding == 0
    assert _decoded_samples(report.path) == report.decoded_samples == report.samples
