"""The decode node writes its latent to disk before decoding, so a decode that dies is rerun from the file.

H3Director Decode AV (Streaming) on the ComfyUI stand-ins (`fixtures/comfy_harness`, the real diffusers H3 VAE
at a tiny size) with a decoder that dies in its second clip: the latent (video and audio) is already in
``output/latents/`` under its final name, `h3director decode FILE` decodes it to the frames the node gives
when it does not die (and, with the audio VAE, to an MP4 with its soundtrack), and ``save_latent=False``
writes nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from comfy_harness.loader import install_stubs

from h3director.cli import main

install_stubs()

from comfy_harness.fake_vae import comfy_audio_vae, comfy_video_vae  # noqa: E402


class Nested:
    """Mirrors `comfy.nested_tensor.NestedTensor` (`tensors`, `is_nested`)."""

    def __init__(self, tensors):
        self.tensors = list(tensors)
        self.is_nested = True


class DecoderDied(RuntimeError):
    pass


def _node():
    from h3director.comfy.nodes_decode import DecodeAVStreaming

    return DecodeAVStreaming


def _latent():
    video = torch.randn(1, 24, 12, 8, 8, generator=torch.Generator().manual_seed(3))   # 2 clips
    audio = torch.randn(1, 32, 2, 12, generator=torch.Generator().manual_seed(5))
    return video, audio


def test_a_decode_that_dies_leaves_the_latent_and_the_cli_decodes_it(output_dir, tmp_path, capsys):
    from h3director.commands.demo_vaes import tiny_h3_vae
    from h3director.video.latent_file import read_latent_file

    video, audio = _latent()
    vae, audio_vae = comfy_video_vae(seed=1), comfy_audio_vae(seed=2)
    calls = {"n": 0}
    clip_decode = vae.first_stage_model._adaptive_decode

    def dies_in_the_second_clip(z):
        calls["n"] += 1
        if calls["n"] == 2:
            raise DecoderDied("the decoder died")
        return clip_decode(z)

    vae.first_stage_model._adaptive_decode = dies_in_the_second_clip
    with pytest.raises(DecoderDied):
        _node().execute({"samples": Nested((video, audio))}, vae, "video_file", "clips/h3", 24.0, 18,
                        audio_vae=audio_vae)
    saved = sorted((output_dir / "latents").iterdir())
    assert [p.name for p in saved] == ["h3_00001_.safetensors"]
    found = read_latent_file(saved[0])
    assert torch.equal(found.video, video) and torch.equal(found.audio, audio)

    vae.first_stage_model._adaptive_decode = clip_decode
    out = _node().execute({"samples": video}, vae, "images", "clips/h3", 24.0, 18)
    images, _, report = out.args
    second = output_dir / "latents" / "h3_00002_.safetensors"
    assert f"latent saved: {second}" in report and f"h3director decode {second}" in report

    tiny_h3_vae(seed=1).save_pretrained(tmp_path / "weights" / "vae")
    code = main(["decode", str(saved[0]), "--vae", str(tmp_path / "weights"), "--out", str(tmp_path / "f.npy"),
                 "--sink", "memmap-float32", "--no-progress"])
    assert code == 0, capsys.readouterr().err
    frames = np.load(tmp_path / "f.npy", mmap_mode="r")
    assert frames.shape == tuple(images.shape) == (39, 128, 128, 3)
    np.testing.assert_array_equal(np.asarray(frames), images.numpy())

    # the same file with its soundtrack: ComfyUI's audio layout [B, 32, 2, Ta] through --audio-vae
    import av

    from h3director.commands.demo_vaes import tiny_h3_audio_vae

    tiny_h3_audio_vae(seed=2).save_pretrained(tmp_path / "audio" / "audio_vae")
    code = main(["decode", str(saved[0]), "--vae", str(tmp_path / "weights"), "--audio-vae", str(tmp_path / "audio"),
                 "--out", str(tmp_path / "av.mp4"), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    with av.open(str(tmp_path / "av.mp4")) as container:
        assert container.streams.audio[0].channels == 2
        samples = sum(frame.samples for frame in container.decode(audio=0))
    assert abs(samples - 12 * 800) <= 2048   # AAC pads to whole 1024-sample frames


def test_save_latent_off_writes_no_latent(output_dir):
    video, _ = _latent()
    out = _node().execute({"samples": video[:, :, :7]}, comfy_video_vae(seed=1), "images", "clips/h3", 24.0, 18,
                          save_latent=False)
    assert "latent saved" not in out.args[2]
    assert not (output_dir / "latents").exists()
