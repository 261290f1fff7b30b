"""The decode node honours the memory level (ComfyUI stand-ins from `fixtures/comfy_harness`): level 0
runs ComfyUI's own `vae.decode`, level 2 streams with pooled buffers; the IMAGE frames are equal."""

from __future__ import annotations

import torch
from comfy_harness.loader import install_stubs

from h3director.core.config import validate_config

install_stubs()

from comfy_harness.fake_vae import comfy_video_vae, vae_decode_node  # noqa: E402


def _use_level(monkeypatch, level: int) -> None:
    from h3director.comfy import settings

    config = validate_config({"memory_optimization_level": level, "pre_allocated_pool_mb": 1024,
                              "pool_slot_mb": 1}, env={})
    monkeypatch.setattr(settings, "pack_config", lambda: config)


def test_decode_node_takes_the_reference_path_at_level_0(output_dir, monkeypatch):
    from h3director.comfy.nodes_decode import DecodeAVStreaming

    vae = comfy_video_vae(seed=1)
    latent = {"samples": torch.randn(1, 24, 12, 8, 8, generator=torch.Generator().manual_seed(3))}
    reference = vae_decode_node(vae, latent)
    _use_level(monkeypatch, 0)
    images0, _, report0 = DecodeAVStreaming.execute(latent, vae, "images", "video/x", 24.0, 18).args
    _use_level(monkeypatch, 2)
    images2, _, report2 = DecodeAVStreaming.execute(latent, vae, "images", "video/x", 24.0, 18).args
    assert torch.equal(images0, reference) and torch.equal(images2, reference)
    assert "reference path" in report0 and "pool lease" not in report0
    assert "streaming decode:" in report2 and "collection(s) between clips" in report2
    _use_level(monkeypatch, 0)
    DecodeAVStreaming.execute(latent, vae, "video_file", "video/x", 24.0, 18)
    assert [p.name for p in (output_dir / "video").iterdir()] == ["x_00001_.mp4"]


def test_reference_path_decodes_an_av_latent_without_audio_vae_as_video_only(output_dir, monkeypatch):
    import av

    from h3director.comfy.nodes_decode import AUDIO_SKIPPED_NOTE, DecodeAVStreaming

    class Nested:   # mirrors comfy.nested_tensor.NestedTensor (`tensors`, `is_nested`)
        is_nested = True

        def __init__(self, tensors):
            self.tensors = list(tensors)

    vae = comfy_video_vae(seed=1)
    video = torch.randn(1, 24, 7, 8, 8, generator=torch.Generator().manual_seed(3))
    audio = torch.randn(1, 32, 2, 12, generator=torch.Generator().manual_seed(5))
    _use_level(monkeypatch, 0)
    last, audio_out, report = DecodeAVStreaming.execute({"samples": Nested((video, audio))}, vae, "video_file",
                                                        "videoonly/x", 24.0, 18).args
    reference = vae_decode_node(vae, {"samples": video})
    assert audio_out is None and torch.equal(last, reference[-1:])
    assert "reference path" in report and AUDIO_SKIPPED_NOTE in report.splitlines()
    [path] = (output_dir / "videoonly").iterdir()
    with av.open(str(path)) as container:
        assert container.streams.video[0].frames == reference.shape[0] and len(container.streams.audio) == 0
