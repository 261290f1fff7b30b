"""Latent-level stitching: segments' latents joined on the grid and decoded once (real tiny diffusers H3 VAEs)."""

from __future__ import annotations

import pytest
import torch
from decode_helpers import CollectingSink, single_thread  # noqa: F401 - fixture

from h3director import geometry
from h3director.errors import InvalidInputError
from h3director.integrations.diffusers_h3 import H3VideoAdapter
from h3director.integrations.diffusers_h3_audio import H3AudioAdapter
from h3director.video.scheduler import stream_decode
from h3director.video.stitch_latents import decode_stitched, join_latents

pytestmark = pytest.mark.usefixtures("single_thread")


def _segments(latent_frames, seed=0):
    g = torch.Generator().manual_seed(seed)
    videos = [torch.randn(1, 24, t, 4, 4, generator=g) for t in latent_frames]
    audios = [torch.randn(2, 32, geometry.audio_latent_frames_for(geometry.frames_for_latents(t)), generator=g)
              for t in latent_frames]
    return videos, audios


def test_joined_latents_stay_on_the_grid_and_cover_the_chain():
    videos, audios = _segments((12, 17, 12))                   # 39, 56, 39 frames
    video, audio = join_latents(videos, audios, overlap=22)
    assert video.shape[2] == 12 + 17 + 12 - 2 * 7
    assert geometry.frames_for_latents(video.shape[2]) == 39 + 56 + 39 - 2 * 22
    assert torch.equal(video[:, :, :12], videos[0]) and torch.equal(video[:, :, 12:22], videos[1][:, :, 7:])
    assert audio.shape[-1] == geometry.audio_latent_frames_for(90) == 150
    # the first segment's audio up to the end of the first overlap (frame 39 -> latent 65), then the second's
    assert torch.equal(audio[..., :65], audios[0][..., :65])
    assert torch.equal(audio[..., 65:70], audios[1][..., 65 - 28:70 - 28])   # segment 2 starts at frame 17 -> 28


def test_one_decode_gives_the_exact_frame_count_and_the_first_clip_unchanged(tiny_h3, tiny_h3_audio):
    videos, audios = _segments((12, 17, 12), seed=1)
    adapter, audio_adapter = H3VideoAdapter(tiny_h3), H3AudioAdapter(tiny_h3_audio, chunk_seconds=0.5)
    sink = CollectingSink()
    with torch.no_grad():
        report = decode_stitched(adapter, videos, sink, audios=audios, audio_adapter=audio_adapter, overlap=22)
        alone = stream_decode(adapter, videos[0], CollectingSink()).result
    frames = report.result
    assert report.frames == frames.shape[2] == 90
    assert report.audio_samples == sink.audio.shape[-1] == 150 * 800
    assert torch.equal(frames[:, :, :17], alone[:, :, :17])          # decoder clip 0 lies inside segment 1    # decoder clip 0 lies inside segment 1


@pytest.mark.parametrize("latent_frames, overlap, match", [
    ((12, 13), 22, "off the 5n\\+2 grid"),
    ((12, 12), 21, "overlap on the 17n\\+5 grid"),
    ((7, 12), 22, "more frames than the overlap"),
    ((12,), 22, "at least two segments"),
])
def test_bad_latent_chains_are_refused(latent_frames, overlap, match):
    videos = [torch.zeros(1, 24, t, 4, 4) for t in latent_frames]
    with pytest.raises(InvalidInputError, match=match):
        join_latents(videos, overlap=overlap)


def test_short_audio_latents_are_refused():
    videos, audios = _segments((12, 12))
    with pytest.raises(InvalidInputError, match="audio latent frames, the join needs"):
        join_latents(videos, [audios[0][..., :40], audios[1]])


def test_the_cli_latent_mode_decodes_the_joined_chain_once(tmp_path, capsys):
    import av
    from safetensors.torch import save_file

    from h3director.cli import main
    from h3director.commands.demo_vaes import tiny_h3_audio_vae, tiny_h3_vae

    tiny_h3_vae(seed=1).save_pretrained(tmp_path / "vae")
    tiny_h3_audio_vae(seed=1).save_pretrained(tmp_path / "audio_vae")
    videos, audios = _segments((12, 12), seed=2)
    paths = []
    for i, (v, a) in enumerate(zip(videos, audios, strict=True)):
        paths.append(tmp_path / f"seg{i}.safetensors")
        save_file({"latents": v, "audio_latents": a}, paths[-1])
    out = tmp_path / "chain.mp4"
    code = main(["stitch", *map(str, paths), "--overlap", "22", "--vae", str(tmp_path / "vae"),
                 "--audio-vae", str(tmp_path / "audio_vae"), "--out", str(out)])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    assert "56 frames from 2 latent segments" in printed.out          # 39 + 39 - 22
    with av.open(str(out)) as container:
        assert sum(1 for p in container.demux(video=0) if p.size) == 56
    assert main(["stitch", *map(str, paths), "--vae", str(tmp_path / "vae"), "--blend", "crossfade",
                 "--out", str(tmp_path / "x.mp4")]) == 2
    assert not (tmp_path / "x.mp4").exists()
