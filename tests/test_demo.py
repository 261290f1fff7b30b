"""`h3director demo` end to end: stock vs director on the real (tiny) H3 VAEs, files it writes, its verdict."""

from __future__ import annotations

import json

import av

from h3director.cli import main
from h3director.commands import demo

SMALL = ["--frames", "39", "--size", "128x96"]  # 12 latent frames: 2 clips cross-faded, off the 5n+2 grid


def test_demo_writes_video_plot_and_reports_identical(tmp_path, capsys):
    code = main(["demo", "--out", str(tmp_path / "out"), *SMALL])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "identical decoded video (float32, every frame): yes" in out
    assert "identical uint8 frames (vs the pipeline's post-processing): yes" in out
    assert "identical audio (one decoder call for its 65 latent frames, not chunked): yes" in out
    assert "stock (vae.decode + post-processing)" in out and "director (stream_decode -> MP4)" in out

    folder = tmp_path / "out"
    with av.open(str(folder / "demo.mp4")) as container:
        video, audio = container.streams.video[0], container.streams.audio[0]
        assert (video.width, video.height) == (128, 96)
        assert audio.rate == 32_000 and audio.channels == 2
        assert sum(1 for _ in container.decode(video=0)) == 39
    assert (folder / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = json.loads((folder / "memory.json").read_text())
    assert {"stock decode", "director decode"} <= {phase["name"] for phase in report["phases"]}
    assert sorted(p.name for p in folder.iterdir()) == ["demo.mp4", "memory.json", "memory.png"]


def test_demo_reports_a_difference_when_the_stock_output_changes(tmp_path, capsys, monkeypatch):
    import h3director.commands.demo_stock as demo_stock

    original = demo_stock.stock_video_decode

    def nudged(vae, latents):
        video = original(vae, latents)
        video[0, 0, 5, 3, 3] += 0.25  # one value of one frame
        return video

    monkeypatch.setattr(demo_stock, "stock_video_decode", nudged)
    monkeypatch.setattr(demo, "START_METHOD", "fork")     # the phase processes inherit the patch
    code = main(["demo", "--out", str(tmp_path), *SMALL])
    out = capsys.readouterr().out
    assert code == 1
    assert "identical decoded video (float32, every frame): NO" in out
    assert "identical audio (one decoder call for its 65 latent frames, not chunked): yes" in out


def test_demo_checks_chunked_audio_against_a_tolerance_not_identity(tmp_path, capsys, monkeypatch):
    import h3director.integrations.load_vae as load_vae
    from h3director.integrations.diffusers_h3_audio import H3AudioAdapter

    monkeypatch.setattr(load_vae, "audio_adapter_for", lambda vae: H3AudioAdapter(vae, chunk_seconds=0.5))
    monkeypatch.setattr(demo, "START_METHOD", "fork")     # the phase processes inherit the patch
    code = main(["demo", "--out", str(tmp_path / "out"), *SMALL])
    out = capsys.readouterr().out
    assert code == 0, out
    line = next(line for line in out.splitlines() if line.startswith("audio within"))
    # 65 latent frames in chunks of 20 (0.5 s x 40/s): 4 decoder calls
    assert line.startswith("audio within 1.2e-07 of the stock decode (decoded in 4 chunks of up to 20 latent "
                           "frames, which changes float32 rounding): yes (max |difference| ")
    assert "identical audio" not in out


def test_demo_refuses_lengths_the_stock_decode_cannot_take(tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path), "--frames", "5"]) == 2
    assert "gives 2 latent frame(s); the stock decode needs at least 3" in capsys.readouterr().err
    assert main(["demo", "--out", str(tmp_path), "--size", "100x64"]) == 2
    assert "multiples of 16" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
