"""Read the latents to decode from an untrusted file, checking its header before loading a byte of data.

Two layouts are accepted, both normalized as the sampler produces them (the decoder applies the
VAE's `latents_std` / `latents_mean`):

- ``.safetensors`` (H3 Director / diffusers): ``latents`` video `[B, 24, T, h, w]` and, optionally,
  ``audio_latents`` `[2, 32, Ta]` (diffusers' H3 layout: the two stereo channels are two batch
  items of the mono audio VAE) or `[B, 32, 2, Ta]` (ComfyUI's layout).
- ``.latent`` (ComfyUI's SaveLatent): ``latent_tensor`` video `[B, 24, T, h, w]` and the
  ``latent_format_version_0`` marker. ComfyUI's H3 LATENT is a NestedTensor (video, audio) that stock
  SaveLatent cannot write (it calls ``.contiguous()``, which NestedTensor lacks), so a ``.latent``
  file carries video only. Files without the version marker are ComfyUI's pre-2023 layout, whose
  Stable Diffusion 1 scaling cannot apply to H3: they are refused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from h3director.core.safetensors_header import SafetensorsLimits, TensorEntry, read_header
from h3director.errors import InvalidInputError

FLOAT_CODES = ("F16", "BF16", "F32", "F64")
COMFY_VERSION_KEY = "latent_format_version_0"
LATENT_LIMITS = SafetensorsLimits(max_header_bytes=1 << 20, max_tensors=16, max_rank=6, max_dim=1 << 16)
# video: [B, C, T, h, w]; audio: [stereo, C, Ta] (diffusers) or [B, C, stereo, Ta] (ComfyUI)
_RANKS = {"video": (5,), "audio": (3, 4)}
_LAYOUTS = {"video": "[B, C, T, h, w]", "audio": "[2, C, Ta] or [B, C, 2, Ta]"}


@dataclass
class LatentFile:
    """Latents read from `path`: `video` `[B, C, T, h, w]`, `audio` (see the module docstring) or None."""

    path: Path
    video: torch.Tensor
    audio: torch.Tensor | None
    layout: str  # "safetensors" or "comfyui"


def _check_entry(where: str, entry: TensorEntry, role: str) -> None:
    if entry.dtype not in FLOAT_CODES:
        raise InvalidInputError(
            f"{where!r}: {entry.name!r} must be floating point ({', '.join(FLOAT_CODES)}), got {entry.dtype}"
        )
    if len(entry.shape) not in _RANKS[role]:
        ranks = " or ".join(map(str, _RANKS[role]))
        raise InvalidInputError(
            f"{where!r}: {entry.name!r} must have rank {ranks} {_LAYOUTS[role]}, got shape {list(entry.shape)}"
        )
    if 0 in entry.shape:
        raise InvalidInputError(f"{where!r}: {entry.name!r} is empty, shape {list(entry.shape)}")


def _keys_for(path: Path, names: set[str]) -> tuple[str, str | None, str]:
    """(video key, audio key or None, layout) for a file's suffix and tensor names."""
    where = str(path)
    suffix = path.suffix.lower()
    if suffix == ".latent":
        if "latent_tensor" not in names:
            raise InvalidInputError(f"{where!r}: a ComfyUI .latent file must hold 'latent_tensor', found {sorted(names)}")
        if COMFY_VERSION_KEY not in names:
            raise InvalidInputError(
                f"{where!r}: no {COMFY_VERSION_KEY!r} marker: this is ComfyUI's legacy latent layout "
                "(Stable Diffusion 1 scaling), which H3 latents never use"
            )
        return "latent_tensor", None, "comfyui"
    if suffix == ".safetensors":
        if "latents" not in names:
            hint = " (a ComfyUI file? rename it to .latent)" if "latent_tensor" in names else ""
            raise InvalidInputError(f"{where!r}: expected a 'latents' tensor, found {sorted(names)}{hint}")
        return "latents", ("audio_latents" if "audio_latents" in names else None), "safetensors"
    raise InvalidInputError(f"{where!r}: latents must be a .safetensors or a ComfyUI .latent file, got {suffix or 'no suffix'!r}")


def read_latent_file(path: str | os.PathLike, limits: SafetensorsLimits = LATENT_LIMITS) -> LatentFile:
    """The `LatentFile` at `path`: its header validated against `limits` (sizes, dtypes, ranks), then only the
    latent tensors loaded, as float32.

    Raises `InvalidInputError` naming the file and the problem. Values (NaN/inf, channel counts, sizes
    the VAE can decode) are checked afterwards by the decoder adapter, still before any decoding.
    """
    path = Path(path).expanduser()
    if path.suffix.lower() not in (".safetensors", ".latent"):
        raise InvalidInputError(
            f"{str(path)!r}: latents must be a .safetensors or a ComfyUI .latent file, got {path.suffix or 'no suffix'!r}"
        )
    header = read_header(path, limits)
    video_key, audio_key, layout = _keys_for(path, set(header.tensors))
    _check_entry(str(path), header.tensors[video_key], "video")
    if audio_key is not None:
        _check_entry(str(path), header.tensors[audio_key], "audio")

    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as handle:
        video = handle.get_tensor(video_key).float()
        audio = handle.get_tensor(audio_key).float() if audio_key is not None else None
    return LatentFile(path=path, video=video, audio=audio, layout=layout)


def write_latent_file(path: str | os.PathLike, video: torch.Tensor, audio: torch.Tensor | None = None) -> Path:
    """Write latents as an H3 Director ``.safetensors`` that `read_latent_file` (and `h3director decode`)
    reads. `InvalidInputError` for a `path` that does not end in ``.safetensors``.

    `video` `[B, C, T, h, w]` goes under ``latents``, `audio` (either layout of the module docstring) under
    ``audio_latents``, both as they are (dtype kept, moved to the host). Atomic: the file appears under
    its final name only when complete (`core.atomic_file.atomic_path`). Returns the path written.
    """
    from safetensors.torch import save_file

    from h3director.core.atomic_file import atomic_path

    path = Path(path)
    if path.suffix.lower() != ".safetensors":
        raise InvalidInputError(f"{str(path)!r}: latents are written as .safetensors, got {path.suffix or 'no suffix'!r}")
    tensors = {"latents": video.detach().contiguous().cpu()}
    if audio is not None:
        tensors["audio_latents"] = audio.detach().contiguous().cpu()
    with atomic_path(path) as temporary:
        save_file(tensors, str(temporary), metadata={"writer": "h3director"})
    return path


__all__ = ["LatentFile", "read_latent_file", "write_latent_file"]
