"""ComfyUI's VAE objects as the streaming scheduler's decoder adapter.

`ComfyH3VideoAdapter(vae)` wraps a ComfyUI `comfy.sd.VAE` whose `first_stage_model` is ComfyUI's
`MiniMaxH3VideoVAE` (`comfy/ldm/minimax/vae.py`). It decodes clip by clip through ComfyUI's own
modules, doing per clip what ComfyUI's `MiniMaxH3VideoVAE.decode` / `decode_temporal` do for the
whole video, in the same dtype on the same device:

- latents go to `vae.device` / `vae.vae_dtype` (as `comfy.sd.VAE.decode` moves them) and are
  denormalized as ``z * latents_std + latents_mean`` with the buffers cast to `z`;
- the padding copies of the last latent frame are appended as `decode_temporal` does;
- each clip is decoded by `first_stage_model._adaptive_decode` (ComfyUI's 256 px spatial tiling);
- cross-fade, trim and the final ``clamp(x * pixel_std + pixel_mean, 0, 1)`` in float32 are the
  scheduler's and sinks' (`h3director.video.crossfade`, `h3director.video.sinks.pixels`), which perform
  the same float operations as ComfyUI's `blend` and `_finalize_pixels`.

So the frames equal ComfyUI's `VAEDecode` output bit for bit (checked against a real ComfyUI in
`tests/test_comfy_real.py`), while only one clip's pixels exist at a time.

`decode_audio(audio_vae, latent)` is ComfyUI's audio decode (`comfy.sd.VAE.decode` plus the loudness
normalisation of `comfy_extras/nodes_audio.py` `vae_decode_audio`); H3 audio is small (32 kHz
stereo float32 is 256 kB per second), so it is decoded whole.

Nothing here imports ComfyUI: the objects come in from the node that received them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from h3director.errors import InvalidInputError
from h3director.geometry import (
    AUDIO_LATENT_CHANNELS,
    AUDIO_SAMPLE_RATE,
    VIDEO_LATENT_CHANNELS,
    ClipStep,
    DecodeSchedule,
    TemporalGeometry,
)
from h3director.video.decoder import ClipExecution, DecodeSession, VideoDecoderAdapter
from h3director.video.faults import STAGE_MID, FaultInjector

# Attributes of ComfyUI's MiniMaxH3VideoVAE this adapter relies on.
_REQUIRED_MODEL_ATTRS = ("clip_length", "token_drop", "vae_ratio", "vae_ratio_t", "latents_mean", "latents_std",
                         "pixel_mean", "pixel_std", "_adaptive_decode")
_REQUIRED_VAE_ATTRS = ("first_stage_model", "device", "vae_dtype", "latent_channels")


def describe_vae(vae: Any) -> str:
    """Short text naming a VAE object for error messages."""
    model = getattr(vae, "first_stage_model", None)
    return f"{type(vae).__name__} wrapping {type(model).__name__}" if model is not None else type(vae).__name__


def is_comfy_h3_video_vae(vae: Any) -> bool:
    """True when `vae` looks like ComfyUI's VAE around a MiniMax H3 video VAE."""
    if any(not hasattr(vae, name) for name in _REQUIRED_VAE_ATTRS):
        return False
    model = vae.first_stage_model
    return (getattr(vae, "latent_channels", None) == VIDEO_LATENT_CHANNELS
            and all(hasattr(model, name) for name in _REQUIRED_MODEL_ATTRS))


def is_comfy_h3_audio_vae(vae: Any) -> bool:
    """True when `vae` looks like ComfyUI's VAE around a MiniMax H3 audio VAE (32 latent channels, 32 kHz)."""
    return (hasattr(vae, "decode") and getattr(vae, "latent_channels", None) == AUDIO_LATENT_CHANNELS
            and getattr(vae, "audio_sample_rate", None) == AUDIO_SAMPLE_RATE)


class _ComfySession(DecodeSession):
    """One latent video prepared for clip-by-clip decoding (denormalized, padded, on the VAE device)."""

    def __init__(self, adapter: ComfyH3VideoAdapter, padded: torch.Tensor) -> None:
        self._adapter = adapter
        self._z = padded

    def decode_clip(self, clip: ClipStep, execution: ClipExecution,
                    checkpoint: FaultInjector | None = None) -> torch.Tensor:
        z = self._z[:, :, clip.latent_start:clip.latent_stop]
        if execution.device is not None and torch.device(execution.device) != self._z.device:
            raise InvalidInputError(f"{self._adapter.name} decodes on {self._z.device} only, "
                                    f"not {execution.device}")
        with torch.no_grad():  # ComfyUI's executor runs nodes under inference_mode; callers outside it may not
            out = self._adapter.model._adaptive_decode(z)
        if checkpoint is not None:
            checkpoint(STAGE_MID)
        return out

    def close(self) -> None:
        self._z = None


class ComfyH3VideoAdapter(VideoDecoderAdapter):
    """ComfyUI's `VAE` (around `MiniMaxH3VideoVAE`) as a `VideoDecoderAdapter`.

    Pixel space: ImageNet-normalized RGB (`pixel_mean`/`pixel_std` read from the model's buffers).
    Latents: NORMALIZED `[B, 24, T, H/16, W/16]` as ComfyUI's samplers produce them.
    Geometry: `clip_length`, `token_drop`, `vae_ratio_t` read from the model (17, 3, 4 for H3).
    Memory: the per-clip estimate is ComfyUI's own `vae.memory_used_decode` for one clip's latents.
    """

    name = "comfyui-minimax-h3"
    out_channels = 3
    fps = 24.0

    def __init__(self, vae: Any, *, on_out_of_memory: Callable[[], None] | None = None) -> None:
        if not is_comfy_h3_video_vae(vae):
            raise InvalidInputError(
                f"unsupported VAE for H3 streaming decode: expected ComfyUI's VAE around MiniMaxH3VideoVAE "
                f"(24 latent channels), got {describe_vae(vae)} with latent_channels="
                f"{getattr(vae, 'latent_channels', None)}")
        self.vae = vae
        self.model = vae.first_stage_model
        self.on_out_of_memory = on_out_of_memory
        self.geometry = TemporalGeometry(clip_length=int(self.model.clip_length),
                                         temporal_ratio=int(self.model.vae_ratio_t),
                                         token_drop=int(self.model.token_drop))
        self.spatial_ratio = int(self.model.vae_ratio)
        self.pixel_mean = tuple(float(v) for v in self.model.pixel_mean.flatten().tolist())
        self.pixel_std = tuple(float(v) for v in self.model.pixel_std.flatten().tolist())

    @property
    def device(self) -> torch.device:
        return torch.device(self.vae.device)

    @property
    def dtype(self) -> torch.dtype:
        return self.vae.vae_dtype

    def validate(self, latents: torch.Tensor, *, denormalize: bool = True) -> None:
        if not isinstance(latents, torch.Tensor):
            raise InvalidInputError(f"H3 video latents must be a tensor, got {type(latents).__name__}")
        if latents.ndim != 5 or latents.shape[1] != VIDEO_LATENT_CHANNELS:
            raise InvalidInputError(
                f"H3 video latents must be [B, 24, T, H/16, W/16], got shape {list(latents.shape)}")
        if min(latents.shape) < 1:
            raise InvalidInputError(f"H3 video latents are empty: shape {list(latents.shape)}")
        if not latents.is_floating_point():
            raise InvalidInputError(f"H3 video latents must be floating point, got {latents.dtype}")

    def schedule(self, latent_frames: int) -> DecodeSchedule:
        return self.geometry.decode_schedule(latent_frames)

    def output_size(self, latent_height: int, latent_width: int) -> tuple[int, int]:
        return latent_height * self.spatial_ratio, latent_width * self.spatial_ratio

    def open(self, latents: torch.Tensor, *, denormalize: bool = True) -> DecodeSession:
        self.validate(latents, denormalize=denormalize)
        z = latents.to(device=self.device, dtype=self.dtype)
        if denormalize:
            std = self.model.latents_std.view(1, -1, 1, 1, 1).to(z)
            mean = self.model.latents_mean.view(1, -1, 1, 1, 1).to(z)
            z = z * std + mean
        pad = self.schedule(z.shape[2]).pad_tokens
        if pad > 0:
            z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad, 1, 1)], dim=2)
        return _ComfySession(self, z)

    def clip_working_set_bytes(self, batch: int, latent_height: int, latent_width: int,
                               execution: ClipExecution) -> int:
        shape = (batch, VIDEO_LATENT_CHANNELS, self.geometry.clip_latent_frames, latent_height, latent_width)
        return int(self.vae.memory_used_decode(shape, self.dtype))

    def cheaper(self, execution: ClipExecution) -> ClipExecution | None:
        """After an out-of-memory error: free other models (`on_out_of_memory`) and retry the clip once.

        ComfyUI's H3 decoder already runs one 256 px tile per decoder call, so the retry is the same
        computation (bit-identical) with the memory of the models `on_out_of_memory` unloaded; a
        second failure of the same clip is final.
        """
        if execution.tiles_per_call is not None:
            return None
        if self.on_out_of_memory is not None:
            self.on_out_of_memory()
        return ClipExecution(tiles_per_call=1, device=execution.device)


class ComfyH3AudioAdapter:
    """ComfyUI's audio `VAE` (around `MiniMaxH3AudioVAE`) as the scheduler's `AudioJob.adapter`."""

    def __init__(self, audio_vae: Any) -> None:
        if not is_comfy_h3_audio_vae(audio_vae):
            raise InvalidInputError(
                f"unsupported audio VAE: expected ComfyUI's VAE around MiniMaxH3AudioVAE (32 latent channels, "
                f"32 kHz), got {describe_vae(audio_vae)} with latent_channels="
                f"{getattr(audio_vae, 'latent_channels', None)}")
        self.vae = audio_vae
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None  # (latents, waveform) of the last decode
        self.sample_rate = int(getattr(audio_vae, "audio_sample_rate_output",
                                       getattr(audio_vae, "audio_sample_rate", AUDIO_SAMPLE_RATE)))

    def validate(self, latents: torch.Tensor, *, denormalize: bool = True) -> None:
        if not denormalize:
            raise InvalidInputError("ComfyUI's audio VAE always denormalizes; denormalize=False is not supported")
        if not isinstance(latents, torch.Tensor) or latents.ndim != 4 or latents.shape[1] != AUDIO_LATENT_CHANNELS \
                or latents.shape[2] != 2:
            raise InvalidInputError(f"H3 audio latents must be [B, 32, 2, T], got shape {list(getattr(latents, 'shape', []))}")

    def decode(self, latents: torch.Tensor, *, denormalize: bool = True,
               chunk_seconds: float | None = None) -> torch.Tensor:
        """Waveform `[B, 2, samples]` as ComfyUI's `VAEDecodeAudio` returns it (`chunk_seconds` unused:
        ComfyUI decodes H3 audio whole, and so does this adapter to stay identical).

        Decoding the same latents tensor again returns the first result: a node decodes the audio
        before it loads the video VAE (ComfyUI may swap one VAE out to load the other), and the
        scheduler's later call for the sink then costs nothing.
        """
        self.validate(latents, denormalize=denormalize)
        if self._last is not None and self._last[0] is latents:
            return self._last[1]
        waveform = decode_audio(self.vae, latents)
        self._last = (latents, waveform)
        return waveform


def decode_audio(audio_vae: Any, latent: torch.Tensor) -> torch.Tensor:
    """Decode an H3 audio latent `[B, 32, 2, T]` with ComfyUI's audio VAE (checked by `ComfyH3AudioAdapter`).

    Returns the waveform `[B, 2, samples]` (float), normalised exactly as ComfyUI's
    `VAEDecodeAudio` (`comfy_extras/nodes_audio.py` `vae_decode_audio`): divided by
    ``max(1, 5 * std)`` per batch item.
    """
    audio = audio_vae.decode(latent).movedim(-1, 1)
    std = torch.std(audio, dim=[1, 2], keepdim=True) * 5.0
    std[std < 1.0] = 1.0
    audio /= std
    return audio


__all__ = ["ComfyH3AudioAdapter", "ComfyH3VideoAdapter"]
