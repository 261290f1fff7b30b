"""The decode node honours the memory level (ComfyUI stand-ins from `tests/comfy_harness`): level 0
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
