"""ComfyUI-shaped VAE objects around the REAL diffusers H3 VAEs (test stand-ins; no ComfyUI needed).

`FakeComfyVAE` mirrors the attributes and methods of ComfyUI's `comfy.sd.VAE` (`comfy/sd.py`,
class `VAE`: `first_stage_model`, `device`, `vae_dtype`, `output_device`, `latent_channels`,
`latent_dim`, `patcher`, `disable_offload`, `audio_sample_rate`, `memory_used_decode(shape, dtype)`,
`model_size()`, `decode(samples)` returning channels-last pixels) that the pack reads.

`FakeMiniMaxH3VideoVAE` mirrors ComfyUI's `MiniMaxH3VideoVAE` (`comfy/ldm/minimax/vae.py`):
the geometry attributes (`clip_length`, `token_drop`, `vae_ratio`, `vae_ratio_t`,
`frame_pre_padding`, `tokens_chunk_size`, `token_overlap`, `frame_overlap`), the buffers
`latents_mean`/`latents_std` (1-D) and `pixel_mean`/`pixel_std` (`[1, 3, 1, 1, 1]`),
`_adaptive_decode(z)` (one clip, spatially tiled) and `decode(z)` (normalized latents -> float32
pixels in [0, 1], `[B, 3, F, H, W]`). The computation is diffusers' `AutoencoderKLMiniMaxH3`
(`_decode_clip`, `_decode`) followed by ComfyUI's `_finalize_pixels` arithmetic, so `decode` is
the reference the streaming node must equal bit for bit.

`FakeMiniMaxH3AudioVAE` mirrors `MiniMaxH3AudioVAE.decode` (normalized `[B, 32, 2, T]` ->
`[B, 2, L]`, stereo channels decoded as a batch of 2) on diffusers' `AutoencoderKLMiniMaxH3Audio`.

The memory estimate is a stand-in (10 x one clip's float32 pixels), not ComfyUI's numbers.
"""

from __future__ import annotations

import torch

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class FakeMiniMaxH3VideoVAE(torch.nn.Module):
    comfy_has_chunked_io = True

    def __init__(self, diffusers_vae) -> None:
        super().__init__()
        self.inner = diffusers_vae
        cfg = diffusers_vae.config
        self.clip_length, self.token_drop = cfg.clip_length, cfg.token_drop
        self.vae_ratio = diffusers_vae.spatial_compression_ratio
        self.vae_ratio_t = diffusers_vae.temporal_compression_ratio
        self.frame_pre_padding = diffusers_vae.frame_pre_padding
        self.tokens_chunk_size = diffusers_vae.tokens_chunk_size
        self.token_overlap = diffusers_vae.token_overlap
        self.frame_overlap = diffusers_vae.frame_overlap
        self.register_buffer("latents_mean", torch.tensor(cfg.latents_mean))
        self.register_buffer("latents_std", torch.tensor(cfg.latents_std))
        self.register_buffer("pixel_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1, 1), persistent=False)

    def _adaptive_decode(self, z: torch.Tensor) -> torch.Tensor:
        return self.inner._decode_clip(z)

    def _finalize_pixels(self, part: torch.Tensor) -> torch.Tensor:
        part = part * self.pixel_std.to(device=part.device, dtype=torch.float32)
        return part.add_(self.pixel_mean.to(device=part.device, dtype=torch.float32)).clamp_(0.0, 1.0)

    @torch.no_grad()
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        z = z * self.latents_std.view(1, -1, 1, 1, 1).to(z) + self.latents_mean.view(1, -1, 1, 1, 1).to(z)
        if z.shape[2] == 1:
            return self._finalize_pixels(self._adaptive_decode(z)[:, :, -1:])
        return self._finalize_pixels(self.inner._decode(z))


class FakeMiniMaxH3AudioVAE(torch.nn.Module):
    def __init__(self, diffusers_audio_vae) -> None:
        super().__init__()
        self.inner = diffusers_audio_vae
        cfg = diffusers_audio_vae.config
        self.register_buffer("latents_mean", torch.tensor(cfg.latents_mean))
        self.register_buffer("latents_std", torch.tensor(cfg.latents_std))

    @torch.no_grad()
    def decode(self, z: torch.Tensor) -> torch.Tensor:
        b, c, s, t = z.shape
        z = z.permute(0, 2, 1, 3).reshape(b * s, c, t)
        z = z * self.latents_std.view(1, -1, 1).to(z) + self.latents_mean.view(1, -1, 1).to(z)
        return self.inner.decode(z, return_dict=False)[0].reshape(b, s, -1)


class FakeComfyVAE:
    """The `comfy.sd.VAE` surface around a first-stage model (see the module docstring)."""

    def __init__(self, first_stage_model, *, latent_channels: int, audio_sample_rate: int = 44100) -> None:
        self.first_stage_model = first_stage_model.eval()
        self.device = torch.device("cpu")
        self.vae_dtype = torch.float32
        self.output_device = torch.device("cpu")
        self.latent_channels = latent_channels
        self.latent_dim = 3 if latent_channels == 24 else 2
        self.patcher = object()
        self.disable_offload = False
        self.audio_sample_rate = audio_sample_rate
        self.decode_calls = 0

    def memory_used_decode(self, shape, dtype) -> int:
        ratio = getattr(self.first_stage_model, "vae_ratio", 1)
        frames = shape[2] * getattr(self.first_stage_model, "vae_ratio_t", 1)
        return 10 * shape[0] * 3 * frames * shape[-2] * ratio * shape[-1] * ratio * 4

    def model_size(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.first_stage_model.parameters())

    def decode(self, samples_in: torch.Tensor) -> torch.Tensor:
        """Mirrors `VAE.decode`: model decode on `device`/`vae_dtype`, then channels last (`movedim(1, -1)`)."""
        self.decode_calls += 1
        out = self.first_stage_model.decode(samples_in.to(device=self.device, dtype=self.vae_dtype))
        return out.to(self.output_device).movedim(1, -1)


def comfy_video_vae(seed: int = 0) -> FakeComfyVAE:
    from h3director.commands.demo_vaes import tiny_h3_vae

    return FakeComfyVAE(FakeMiniMaxH3VideoVAE(tiny_h3_vae(seed)), latent_channels=24)


def comfy_audio_vae(seed: int = 0) -> FakeComfyVAE:
    from h3director.commands.demo_vaes import tiny_h3_audio_vae

    return FakeComfyVAE(FakeMiniMaxH3AudioVAE(tiny_h3_audio_vae(seed)), latent_channels=32, audio_sample_rate=32_000)


def vae_decode_node(vae: FakeComfyVAE, latent: dict) -> torch.Tensor:
    """Core `VAEDecode.decode`'s steps (nodes.py) on a stand-in VAE: IMAGE `[B * F, H, W, C]`."""
    samples = latent["samples"]
    if getattr(samples, "is_nested", False):
        samples = samples.tensors[0]
    images = vae.decode(samples)
    return images.reshape(-1, images.shape[-3], images.shape[-2], images.shape[-1]) if images.ndim == 5 else images
