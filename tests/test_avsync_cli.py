"""`h3director avsync measure|fix` on real MP4 files written with PyAV: round trips and bad input."""

from __future__ import annotations

import json

import av
import numpy as np
import pytest
from synthetic_av import synthetic_tracks, write_clip, write_synthetic_clip

from h3director.cli import main

FPS, RATE, SIZE = 24.0, 32000, (64, 48)


@pytest.fixture(scope="module")
def late_clip(tmp_path_factory):
    """A flash clip whose audio is 125 ms (3 frames) late."""
    return write_synthetic_clip(tmp_path_factory.mktemp("avsync") / "late.mp4", "flash", 125.0, seconds=6.0,
                                fps=FPS, sample_rate=RATE, size=SIZE, seed=5)


def _measure(capsys, path) -> dict:
    assert main(["avsync", "measure", str(path), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _packets(path, kind: str) -> list[tuple[bytes, int, int]]:
    with av.open(str(path)) as container:
        stream = container.streams.video[0] if kind == "video" else container.streams.audio[0]
        return [(bytes(p), p.pts, p.dts) for p in container.demux(stream) if p.size]


def _decoded(path, kind: str) -> int:
    with av.open(str(path)) as container:
        if kind == "video":
            return sum(1 for _ in container.decode(video=0))
        return sum(frame.samples for frame in container.decode(audio=0))


def _first_samples(path, count: int) -> np.ndarray:
    blocks = []
    with av.open(str(path)) as container:
        for frame in container.decode(audio=0):
            blocks.append(frame.to_ndarray()[0])
            if sum(map(len, blocks)) >= count:
                break
    return np.concatenate(blocks)[:count]


def test_measure_prints_the_offset_and_windows(capsys, late_clip):
    report = _measure(capsys, late_clip)
    assert report["usable"] and abs(report["offset_ms"] - 125.0) <= 10.0
    assert report["confidence"] >= 0.25 and report["windows"] == []
    assert main(["avsync", "measure", str(late_clip), "--window-s", "3"]) == 0
    text = capsys.readouterr().out
    assert "audio late" in text and text.count("confidence") == 1 + 3


def test_fix_moves_the_audio_by_samples_and_copies_the_video(capsys, late_clip, tmp_path):
    out = tmp_path / "fixed.mp4"
    assert main(["avsync", "fix", str(late_clip), "--out", str(out), "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["mode"] == "audio" and done["samples"] == -int(round(done["offset_ms"] * RATE / 1000))
    assert abs(_measure(capsys, out)["offset_ms"]) <= 10.0
    assert _packets(out, "video") == _packets(late_clip, "video")  # byte-identical, same timestamps
    assert _decoded(out, "audio") == _decoded(late_clip, "audio")
    assert [p.name for p in tmp_path.iterdir()] == ["fixed.mp4"]


def test_fix_copies_matroska_b_frame_video_into_mp4_and_keeps_stereo(capsys, tmp_path):
    """Matroska stores no decoding timestamps for the first B-frame packets: they are filled in, and the
    payloads still arrive byte-identical; 25 fps, 48 kHz stereo."""
    frames, mono = synthetic_tracks("flash", 60.0, seconds=5.0, fps=25.0, sample_rate=48000, size=SIZE, seed=3)
    source = write_clip(tmp_path / "stereo.mkv", frames, np.stack([mono, 0.5 * mono]), 25.0, 48000, crf=23,
                        container_format="matroska")
    with av.open(str(source)) as container:
        assert any(p.dts is None and p.size for p in container.demux(container.streams.video[0]))
    out = tmp_path / "fixed.mp4"
    assert main(["avsync", "fix", str(source), "--out", str(out)]) == 0
    capsys.readouterr()
    assert [p[0] for p in _packets(out, "video")] == [p[0] for p in _packets(source, "video")]
    with av.open(str(out)) as container:
        assert container.streams.audio[0].codec_context.channels == 2
    assert abs(_measure(capsys, out)["offset_ms"]) <= 10.0


def test_fix_by_frames_moves_the_picture_and_copies_the_audio(capsys, late_clip, tmp_path):
    out = tmp_path / "fixed.mp4"
    assert main(["avsync", "fix", str(late_clip), "--offset", "125", "--by-frames", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["frames"] == 3
    assert abs(_measure(capsys, out)["offset_ms"]) <= 10.0
    assert _packets(out, "audio") == _packets(late_clip, "audio")
    assert _decoded(out, "video") == _decoded(late_clip, "video")


def test_fix_by_frames_repeats_the_first_frame(tmp_path):
    """Picture later by 2 frames: output frames 0..2 all show input frame 0, output 3 shows input 1."""
    frames = np.zeros((8, 48, 64, 3), np.uint8)
    for k in range(8):
        frames[k] = 20 + 25 * k
    silence = np.zeros(int(RATE * 8 / FPS), np.float32)
    source = write_clip(tmp_path / "steps.mp4", frames, silence, FPS, RATE, crf=0)
    out = tmp_path / "moved.mp4"
    assert main(["avsync", "fix", str(source), "--offset", f"{2000 / FPS}", "--by-frames", "--crf", "0",
                 "--out", str(out)]) == 0
    with av.open(str(out)) as container:
        levels = [int(round(f.to_ndarray(format="gray").mean())) for f in container.decode(video=0)]
    with av.open(str(source)) as container:
        original = [int(round(f.to_ndarray(format="gray").mean())) for f in container.decode(video=0)]
    assert levels == [original[0]] * 3 + original[1:6]


def test_fix_then_early_audio_pads_silence_in_front(capsys, tmp_path):
    source = write_synthetic_clip(tmp_path / "early.mp4", "mouth", -90.0, seconds=6.0, fps=FPS, sample_rate=RATE,
                                  size=SIZE, seed=8)
    out = tmp_path / "fixed.mkv"
    assert main(["avsync", "fix", str(source), "--offset", "-90", "--out", str(out)]) == 0
    capsys.readouterr()
    head = int(0.085 * RATE)  # the sound moves 2880 samples (90 ms) later: silence in front
    assert np.abs(_first_samples(source, head)).max() > 0.02
    assert np.abs(_first_samples(out, head)).max() < 2e-3
    assert abs(_measure(capsys, out)["offset_ms"]) <= 10.0


def test_fix_states_the_exact_sound_length(capsys, tmp_path):
    """A source with exactly 192,000 samples (16-bit PCM): the fix's re-encoded sound pads its last AAC frame (187.5
    frames of 1,024); Matroska signals the padding and FFmpeg's decoder drops it; MP4 states the exact length and
    FFmpeg returns the padding besides, which the report names."""
    frames, samples = synthetic_tracks("flash", 125.0, 6.0, FPS, RATE, SIZE, 5)
    source = write_clip(tmp_path / "late.mkv", frames, samples, FPS, RATE, container_format="matroska",
                        audio_codec="pcm_s16le")
    assert _decoded(source, "audio") == 192_000
    reports, decoded, stated = {}, {}, {}
    for suffix in (".mkv", ".mp4"):
        out = tmp_path / f"fixed{suffix}"
        assert main(["avsync", "fix", str(source), "--offset", "125", "--out", str(out), "--json"]) == 0
        reports[suffix] = json.loads(capsys.readouterr().out)
        decoded[suffix] = _decoded(out, "audio")
        with av.open(str(out)) as container:
            stream = container.streams.audio[0]
            stated[suffix] = stream.duration * stream.time_base * RATE if stream.duration else None
    padding = reports[".mp4"]["audio_end_padding"]
    assert padding == 512 and reports[".mkv"]["audio_end_padding"] == padding
    assert decoded[".mkv"] == stated[".mp4"] == decoded[".mp4"] - padding == 192_000


def test_no_events_measure_says_so_and_auto_fix_refuses(capsys, tmp_path):
    source = write_synthetic_clip(tmp_path / "still.mp4", "none", 0.0, seconds=3.0, fps=FPS, sample_rate=RATE,
                                  size=SIZE)
    assert main(["avsync", "measure", str(source)]) == 1
    assert "no usable events" in capsys.readouterr().out
    out = tmp_path / "out.mp4"
    assert main(["avsync", "fix", str(source), "--out", str(out)]) == 2
    assert "no usable events" in capsys.readouterr().err
    assert not out.exists()


def _refused(capsys, args, out, message):
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()
    assert not list(out.parent.glob(f".{out.name}*"))


def test_bad_inputs_are_refused_before_any_output(capsys, late_clip, tmp_path):
    out = tmp_path / "out.mp4"
    frames, _ = synthetic_tracks("flash", 0.0, seconds=2.0, fps=FPS, sample_rate=RATE, size=SIZE)
    silent_film = write_clip(tmp_path / "silent.mp4", frames, None, FPS, RATE)
    for action in (["measure"], ["fix", "--out", str(out)], ["fix", "--offset", "20", "--out", str(out)]):
        _refused(capsys, ["avsync", action[0], str(silent_film), *action[1:]], out, "no audio stream")
    truncated = tmp_path / "truncated.mp4"
    truncated.write_bytes(late_clip.read_bytes()[: late_clip.stat().st_size // 2])
    not_media = tmp_path / "notes.mp4"
    not_media.write_text("not a video")
    for broken in (truncated, not_media, tmp_path / "missing.mp4"):
        for action in (["measure"], ["fix", "--offset", "20", "--out", str(out)]):
            assert main(["avsync", action[0], str(broken), *action[1:]]) == 2, broken
            assert capsys.readouterr().err.startswith("h3director avsync: error:")
            assert not out.exists()
    _refused(capsys, ["avsync", "fix", str(late_clip), "--offset", "7000", "--out", str(out)], out, "beyond the clip")
    _refused(capsys, ["avsync", "fix", str(late_clip), "--offset", "-7000", "--by-frames", "--out", str(out)], out,
             "beyond the clip")
    _refused(capsys, ["avsync", "fix", str(late_clip), "--offset", "soon", "--out", str(out)], out, "--offset")
    _refused(capsys, ["avsync", "fix", str(late_clip), "--offset", "10", "--out", str(tmp_path / "o.avi")],
             tmp_path / "o.avi", "must end in")


def test_a_truncated_file_with_its_index_in_front_is_refused(capsys, late_clip, tmp_path):
    """moov before mdat (faststart): the file opens, but the index declares frames that are not there."""
    whole = tmp_path / "faststart.mp4"
    with av.open(str(late_clip)) as source, av.open(str(whole), "w", format="mp4",
                                                   options={"movflags": "faststart"}) as copy:
        streams = {s.index: copy.add_stream_from_template(s) for s in source.streams}
        for packet in source.demux():
            if packet.dts is not None:
                packet.stream = streams[packet.stream.index]
                copy.mux(packet)
    data = whole.read_bytes()
    assert data.find(b"moov") < data.find(b"mdat")
    cut = tmp_path / "cut.mp4"
    cut.write_bytes(data[: len(data) * 2 // 3])
    out = tmp_path / "out.mp4"
    assert main(["avsync", "measure", str(whole)]) == 0
    capsys.readouterr()
    _refused(capsys, ["avsync", "measure", str(cut)], out, "truncated")
    _refused(capsys, ["avsync", "fix", str(cut), "--offset", "20", "--out", str(out)], out, "truncated")


def test_a_failed_fix_leaves_an_existing_output_untouched(capsys, late_clip, tmp_path):
    out = tmp_path / "out.mp4"
    out.write_bytes(b"previous result")
    assert main(["avsync", "fix", str(late_clip), "--offset", "9000", "--out", str(out)]) == 2
    assert out.read_bytes() == b"previous result"
