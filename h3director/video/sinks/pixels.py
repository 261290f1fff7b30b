"""Decoder output -> display pixels, the one conversion every sink uses.

A decoder returns frames in its own pixel space (`StreamSpec.pixel_mean` / `pixel_std`): H3 returns
ImageNet-normalized RGB, [-1, 1] decoders such as Wan return ``2 * pixel - 1``. Display pixels are

    float:  p = clamp(x * std + mean, 0, 1)          (or clamp((x + 1) / 2, 0, 1))
    uint8:  round(p * 255), round half to even

computed in float32, exactly as diffusers' H3 pipeline does it (`(video.float() * pixel_std +
pixel_mean).clamp(0, 1)` then `VideoProcessor.postprocess_video` and `(images * 255).round()`), so a
sink's uint8 frames equal the stock pipeline's value for value. The uint8 path runs through
`h3director.native.pack_frames` (C, with a numpy fallback computing the same bytes).
"""

from __future__ import annotations

import numpy as np
import torch

from h3director.video.sinks.contract import StreamSpec


def _channel_constants(spec: StreamSpec, device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    if spec.pixel_mean is None and spec.pixel_std is None:
        return None
    mean = torch.tensor(spec.pixel_mean, dtype=torch.float32, device=device).view(-1, 1, 1, 1)
    std = torch.tensor(spec.pixel_std, dtype=torch.float32, device=device).view(-1, 1, 1, 1)
    return mean, std


def float_pixels(frames: torch.Tensor, spec: StreamSpec) -> torch.Tensor:
    """Display pixels in [0, 1], float32 `[n, H, W, C]`, from one batch item's frames `[C, n, H, W]`.

    Element for element the value diffusers' H3 pipeline computes before post-processing.
    """
    x = frames.float()
    constants = _channel_constants(spec, x.device)
    if constants is None:
        x = (x + 1) / 2
    else:
        mean, std = constants
        x = x * std + mean
    return x.clamp_(0, 1).permute(1, 2, 3, 0)


def uint8_pixels(frames: torch.Tensor, spec: StreamSpec, *, out: np.ndarray | None = None,
                 threads: int = 1) -> np.ndarray:
    """uint8 display pixels `[n, H, W, C]` from one batch item's frames `[C, n, H, W]` (CPU or device).

    Each value is ``round(clamp(x * std + mean, 0, 1) * 255)`` in float32, computed on the CPU by
    `h3director.native.pack_frames`. With `out` (C-contiguous uint8 `[n, H, W, C]`, e.g. a slice of
    a result array or a memory map) the pixels are written there and `out` is returned.
    """
    from h3director.native import pack_frames

    return pack_frames(frames.detach(), layout="CFHW", mean=spec.pixel_mean, std=spec.pixel_std,
                       threads=threads, out=out)


__all__ = ["float_pixels", "uint8_pixels"]
