"""Resize an H3 video latent to another latent size and length: stage two of staged generation.

A staged run samples a small, short draft first (fewer latent frames, smaller latent frames) and then refines it
at the final size; the refinement starts from the draft resized to the final latent grid. This is an
*approximate* operation (design guide, "Exactness classes"): interpolating latents is not decoding, resizing
and re-encoding pixels, and the sampler that follows re-noises and refines the result.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from h3director.errors import InvalidInputError
from h3director.geometry import VIDEO_LATENT_CHANNELS


def resize_video_latent(video: torch.Tensor, latent_frames: int, latent_height: int,
                        latent_width: int) -> torch.Tensor:
    """`video` [B, 24, T, H, W] resized to [B, 24, latent_frames, latent_height, latent_width], float32.

    Time: linear interpolation with the first and last latent frames kept in place (the draft and the final
    video span the same seconds at different frame rates). Space: bilinear over each latent frame (pixel
    centres aligned, ``align_corners=False``). Returns the input's values unchanged (as float32) when the
    shapes already match. Raises `InvalidInputError` for a tensor that is not an H3 video latent or a target
    size below 1.
    """
    if not isinstance(video, torch.Tensor) or video.ndim != 5 or video.shape[1] != VIDEO_LATENT_CHANNELS:
        shape = list(video.shape) if isinstance(video, torch.Tensor) else type(video).__name__
        raise InvalidInputError(f"expected an H3 video latent [B, {VIDEO_LATENT_CHANNELS}, T, H, W], got {shape}")
    if min(latent_frames, latent_height, latent_width) < 1:
        raise InvalidInputError(f"target latent size must be >= 1 in every axis, got "
                                f"{latent_frames} x {latent_height} x {latent_width}")
    out = video.to(torch.float32)
    batch, channels, frames, height, width = out.shape
    if frames != latent_frames:
        rows = out.permute(0, 3, 4, 1, 2).reshape(batch * height * width, channels, frames)
        if frames == 1:
            rows = rows.expand(-1, -1, latent_frames)
        else:
            rows = F.interpolate(rows, size=latent_frames, mode="linear", align_corners=True)
        out = rows.reshape(batch, height, width, channels, latent_frames).permute(0, 3, 4, 1, 2)
    if (height, width) != (latent_height, latent_width):
        planes = out.permute(0, 2, 1, 3, 4).reshape(batch * latent_frames, channels, height, width)
        planes = F.interpolate(planes, size=(latent_height, latent_width), mode="bilinear", align_corners=False)
        out = planes.reshape(batch, latent_frames, channels, latent_height, latent_width).permute(0, 2, 1, 3, 4)
    return out.contiguous()


__all__ = ["resize_video_latent"]
