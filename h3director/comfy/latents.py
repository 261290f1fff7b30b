"""ComfyUI LATENT dicts for H3: split and check them before any decoding.

An H3 AV latent is ``{"samples": NestedTensor((video [B, 24, T, H/16, W/16], audio [B, 32, 2, Ta]))}``
(`comfy/nested_tensor.py`, built by `comfy_extras/nodes_minimax_h3.py`); a plain video latent is
``{"samples": video}``. `split_av_latent` recognises both by duck typing (`is_nested`, `tensors`),
so ComfyUI itself is not imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from h3director.errors import InvalidInputError
from h3director.geometry import AUDIO_LATENT_CHANNELS, VIDEO_LATENT_CHANNELS

VIDEO_SHAPE = "[B, 24, T, H/16, W/16]"
AUDIO_SHAPE = "[B, 32, 2, T_audio]"


@dataclass(frozen=True)
class AVLatent:
    """The video latent and, for an AV latent, the audio latent (None for a plain video latent)."""

    video: torch.Tensor
    audio: torch.Tensor | None


def _shape(t: Any) -> str:
    return str(list(t.shape)) if hasattr(t, "shape") else type(t).__name__


def _check_finite(name: str, tensor: torch.Tensor) -> None:
    if not bool(torch.isfinite(tensor).all()):
        raise InvalidInputError(f"{name} latent contains NaN or infinite values; the sampler diverged upstream")


def split_av_latent(latent: Any) -> AVLatent:
    """Return the video (and audio) tensors of an H3 LATENT, or raise `InvalidInputError` saying what came."""
    if not isinstance(latent, dict) or "samples" not in latent:
        raise InvalidInputError(f"expected a ComfyUI LATENT (a dict with 'samples'), got {type(latent).__name__}")
    samples = latent["samples"]
    audio = None
    if getattr(samples, "is_nested", False):
        tensors = list(getattr(samples, "tensors", []))
        if len(tensors) != 2:
            raise InvalidInputError(
                f"expected an H3 AV latent NestedTensor of (video {VIDEO_SHAPE}, audio {AUDIO_SHAPE}), "
                f"got {len(tensors)} tensors with shapes {[_shape(t) for t in tensors]}")
        video, audio = tensors
    else:
        video = samples
    if not isinstance(video, torch.Tensor):
        raise InvalidInputError(f"expected a tensor video latent, got {type(video).__name__}")
    if video.ndim != 5 or video.shape[1] != VIDEO_LATENT_CHANNELS:
        hint = " (this looks like an image latent; H3 decodes video latents)" if video.ndim == 4 else ""
        raise InvalidInputError(f"expected an H3 video latent {VIDEO_SHAPE}, got shape {_shape(video)}{hint}")
    if audio is not None:
        if (not isinstance(audio, torch.Tensor) or audio.ndim != 4 or audio.shape[1] != AUDIO_LATENT_CHANNELS
                or audio.shape[2] != 2):
            raise InvalidInputError(f"expected an H3 audio latent {AUDIO_SHAPE}, got shape {_shape(audio)}")
        if audio.shape[0] != video.shape[0]:
            raise InvalidInputError(
                f"video and audio latents disagree on batch size: {video.shape[0]} vs {audio.shape[0]}")
        _check_finite("audio", audio)
    _check_finite("video", video)
    return AVLatent(video=video, audio=audio)


def save_latent_before_decode(filename_prefix: str, av_latent: AVLatent) -> str:
    """Write `av_latent` (video and audio) to ``<output>/latents/<prefix's last part>_NNNNN_.safetensors``
    (`video.latent_file.write_latent_file`, atomic) and return the report line naming the file and the
    command that decodes it again (`h3director decode` reads this layout)."""
    import os

    from h3director.comfy import runtime
    from h3director.video.latent_file import write_latent_file

    name = os.path.basename(os.path.normpath(str(filename_prefix).strip() or "H3Director")) or "H3Director"
    video = av_latent.video
    target = runtime.save_target(f"latents/{name}", video.shape[-1] * 16, video.shape[-2] * 16, "safetensors")
    write_latent_file(target.path, video, av_latent.audio)
    return f"latent saved: {target.path} (decode it again: h3director decode {target.path} --vae VAE --out FILE)"


__all__ = ["AVLatent", "save_latent_before_decode", "split_av_latent"]
