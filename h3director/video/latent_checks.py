"""Checks every latent input passes before any decoding: rank, channels, sizes, dtype, device, values.

Each failure is an `InvalidInputError` that says what was expected and what came.
"""

from __future__ import annotations

import torch

from h3director.errors import InvalidInputError

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_latents(latents: object, *, name: str, layout: str, channels: int, channel_dim: int = 1,
                  model_device: torch.device | None = None) -> torch.Tensor:
    """Return `latents` unchanged once it is a floating torch tensor with the axes of `layout` (e.g. ``"[B,
    C, T, h, w]"``; its number of axes is the required rank), `channels` on `channel_dim`, no empty axis,
    on the CPU or `model_device`, and finite. Anything else raises `InvalidInputError` starting with
    `name`.
    """
    if not isinstance(latents, torch.Tensor):
        raise InvalidInputError(f"{name} must be a torch.Tensor {layout}, got {type(latents).__name__}")
    rank = layout.count(",") + 1
    shape = tuple(latents.shape)
    if latents.ndim != rank:
        raise InvalidInputError(f"{name} must have rank {rank} {layout}, got rank {latents.ndim} with shape {shape}")
    if latents.numel() == 0:
        raise InvalidInputError(f"{name} is empty: shape {shape} {layout} has a zero-length axis")
    if shape[channel_dim] != channels:
        raise InvalidInputError(
            f"{name} must have {channels} channels on axis {channel_dim} of {layout}, got {shape[channel_dim]} "
            f"(shape {shape}); are these latents for a different model?"
        )
    if latents.dtype not in FLOAT_DTYPES:
        allowed = ", ".join(str(d).removeprefix("torch.") for d in FLOAT_DTYPES)
        raise InvalidInputError(f"{name} must be a floating tensor ({allowed}), got {latents.dtype}")
    device = latents.device
    if device.type == "meta":
        raise InvalidInputError(f"{name} is on the meta device and holds no values")
    if model_device is not None and device.type != "cpu" and device != model_device:
        raise InvalidInputError(
            f"{name} are on {device} but the decoder is on {model_device}: move them to {model_device} or to the cpu"
        )
    finite = torch.isfinite(latents)
    if not bool(finite.all()):
        bad = int((~finite).sum())
        first = tuple(int(i) for i in (~finite).nonzero()[0])
        raise InvalidInputError(f"{name} contain {bad} NaN/inf value(s), the first at index {first}")
    return latents


__all__ = ["check_latents"]
