"""The stock diffusers H3 decode path, step for step: the baseline `h3director demo` (and the decode bench) compares
the director with.

diffusers' modular H3 pipeline (`modular_pipelines/minimax_h3/decoders.py`) decodes video as

    latents = latents * latents_std + latents_mean                      (float32 statistics)
    video = vae.decode(latents).sample                                  (the whole video at once)
    video = (video.float() * pixel_std + pixel_mean).clamp(0, 1)        (the pipeline's ImageNet stats)
    frames = VideoProcessor(vae_scale_factor=16, do_normalize=False).postprocess_video(video, "np")

and uint8 frames are ``(frames * 255).round().astype("uint8")`` (what `numpy_to_pil` and
`export_to_video` do with them). Audio: ``audio_vae.decode(z * std + mean).sample.float().permute(1, 0, 2)``.
Nothing here is changed or optimised: it is the reference, memory peaks included.
"""

from __future__ import annotations

import numpy as np
import torch


def stock_pixel_convention() -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The H3 pipeline's own pixel mean and std (read from diffusers)."""
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    return (tuple(MiniMaxH3ModularPipeline.pixel_mean.fget(None)),
            tuple(MiniMaxH3ModularPipeline.pixel_std.fget(None)))


def stock_video_decode(vae, latents: torch.Tensor) -> torch.Tensor:
    """`vae.decode` of the denormalized latents: the decoder output `[B, 3, F, H, W]`."""
    mean = torch.tensor(vae.config.latents_mean, device=latents.device).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std, device=latents.device).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        return vae.decode(latents * std + mean, return_dict=False)[0]


def stock_uint8_frames(video: torch.Tensor) -> np.ndarray:
    """The pipeline's post-processing of a decoded video to uint8 frames `[B, F, H, W, 3]`."""
    from diffusers.video_processor import VideoProcessor

    mean, std = stock_pixel_convention()
    pixel_mean = torch.tensor(mean, device=video.device).view(1, -1, 1, 1, 1)
    pixel_std = torch.tensor(std, device=video.device).view(1, -1, 1, 1, 1)
    pixels = (video.float() * pixel_std + pixel_mean).clamp(0, 1)
    frames = VideoProcessor(vae_scale_factor=16, do_normalize=False).postprocess_video(pixels, output_type="np")
    del pixels
    return (frames * 255).round().astype("uint8")


def stock_audio_decode(audio_vae, audio_latents: torch.Tensor) -> torch.Tensor:
    """The pipeline's audio decode: `[2, 32, Ta]` latents -> waveform `[1, 2, samples]` float32."""
    mean = torch.tensor(audio_vae.config.latents_mean, device=audio_latents.device).view(1, -1, 1)
    std = torch.tensor(audio_vae.config.latents_std, device=audio_latents.device).view(1, -1, 1)
    with torch.no_grad():
        audio = audio_vae.decode(audio_latents * std + mean, return_dict=False)[0]
    return audio.float().permute(1, 0, 2)


__all__ = ["stock_audio_decode", "stock_pixel_convention", "stock_uint8_frames", "stock_video_decode"]
