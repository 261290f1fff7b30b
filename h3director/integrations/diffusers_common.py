"""What the diffusers adapters share: latent denormalization, the model's device and compute dtype,
pixel size, hooks."""

from __future__ import annotations

import torch

from h3director.video.decoder import VideoDecoderAdapter


def denormalize_latents(latents: torch.Tensor, mean, std, device: torch.device | None = None) -> torch.Tensor:
    """``latents * std + mean`` per channel (axis 1, any rank) with float32 statistics on `device`
    (default: the latents'), as diffusers' H3 pipelines compute it for the video and the audio VAE."""
    device = latents.device if device is None else device
    shape = (1, -1) + (1,) * (latents.ndim - 2)
    latents_mean = torch.tensor(mean, device=device).view(shape)
    latents_std = torch.tensor(std, device=device).view(shape)
    return latents * latents_std + latents_mean


def parameter_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype diffusers casts inputs to for `module` (its `get_parameter_dtype`)."""
    from diffusers.models.modeling_utils import get_parameter_dtype

    return get_parameter_dtype(module)


def run_forward_hook(vae: torch.nn.Module) -> None:
    """What diffusers' `apply_forward_hook` does around `decode`: let an offload hook onload the model."""
    hook = getattr(vae, "_hf_hook", None)
    if hook is not None and hasattr(hook, "pre_forward"):
        hook.pre_forward(vae)


class DiffusersVideoAdapter(VideoDecoderAdapter):
    """Base of the adapters over a diffusers video VAE `self.vae` with a `post_quant_conv` and a
    `spatial_compression_ratio`."""

    vae: torch.nn.Module
    spatial_ratio: int

    @property
    def device(self) -> torch.device:
        return self.vae.post_quant_conv.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return parameter_dtype(self.vae.post_quant_conv)

    def output_size(self, latent_height: int, latent_width: int) -> tuple[int, int]:
        return latent_height * self.spatial_ratio, latent_width * self.spatial_ratio


__all__ = ["DiffusersVideoAdapter", "denormalize_latents", "run_forward_hook"]
