"""Extract components of a safetensors checkpoint into a new safetensors file, casting floats, streaming.

The output is written by hand in the safetensors layout (8-byte little-endian header length, JSON header
padded with spaces to a multiple of 8, tensors back to back in header order), so only one tensor is in
memory at a time; the file appears under its final name only when complete (`core.atomic_file`).
Every tensor is either kept or listed as dropped, with its bytes.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from h3director.core.atomic_file import atomic_path
from h3director.errors import InvalidInputError
from h3director.weights.files import SAFETENSORS_TORCH, SafetensorsWeights
from h3director.weights.h3_keys import COMPONENTS, split_components

CAST_DTYPES = {"bf16": "BF16", "fp16": "F16", "fp32": "F32"}
_SIZES = {"BF16": 2, "F16": 2, "F32": 4}
_FLOATS = ("F16", "BF16", "F32", "F64")  # float8 is left as stored: a cast up would grow the file


@dataclass
class SlimResult:
    """What `slim` kept and dropped: component -> [tensor count, bytes in the source, bytes written]."""

    kept: dict[str, list[int]] = field(default_factory=dict)
    dropped: dict[str, list[int]] = field(default_factory=dict)
    cast: int = 0


def slim(in_path: str | os.PathLike, out_path: str | os.PathLike, keep: list[str], dtype: str | None = None,
         strip_prefix: bool = False) -> SlimResult:
    """Write the tensors of the `keep` components of `in_path` to `out_path`, cast to `dtype` ("bf16",
    "fp16", "fp32" or None = as stored). `strip_prefix`: drop the all-in-one prefix
    (``model.diffusion_model.``, ``vae.`` ...) from the kept names, for loaders of single-component files.
    `InvalidInputError` for an unknown component or dtype, none of `keep` in the file, or names that would
    collide once stripped. Returns the `SlimResult`."""
    unknown = [k for k in keep if k not in COMPONENTS]
    if unknown or not keep:
        raise InvalidInputError(f"--keep takes {', '.join(COMPONENTS)}; got {', '.join(unknown) or 'nothing'}")
    if dtype is not None and dtype not in CAST_DTYPES:
        raise InvalidInputError(f"--dtype must be one of {', '.join(CAST_DTYPES)}, got {dtype!r}")
    target = CAST_DTYPES.get(dtype) if dtype else None
    result = SlimResult()
    with SafetensorsWeights(Path(in_path)) as source:
        groups = split_components(source.entries)
        chosen: list[tuple[str, str, str]] = []  # (source name, out name, out dtype)
        for component, names in groups.items():
            for name in names:
                entry = source.entries[name]
                if component not in keep:
                    row = result.dropped.setdefault(component, [0, 0, 0])
                    row[0] += 1
                    row[1] += entry.nbytes
                    continue
                out_type = target if target and entry.type in _FLOATS else entry.type
                out_name = _strip(name) if strip_prefix else name
                chosen.append((name, out_name, out_type))
                row = result.kept.setdefault(component, [0, 0, 0])
                row[0] += 1
                row[1] += entry.nbytes
                row[2] += _out_size(entry, out_type)
                result.cast += out_type != entry.type
        if not chosen:
            raise InvalidInputError(f"{str(in_path)!r}: none of {', '.join(keep)} found; the file holds "
                                    f"{', '.join(f'{k} ({len(v)} tensors)' for k, v in groups.items())}")
        names = [c[1] for c in chosen]
        if len(set(names)) != len(names):
            raise InvalidInputError("--strip-prefix would give two tensors the same name; keep one component "
                                    "at a time or leave the prefixes")
        header: dict[str, object] = {}
        offset = 0
        for name, out_name, out_type in chosen:
            entry = source.entries[name]
            size = _out_size(entry, out_type)
            header[out_name] = {"dtype": out_type, "shape": list(entry.shape), "data_offsets": [offset, offset + size]}
            offset += size
        metadata = {k: v for k, v in source.metadata.items() if isinstance(v, str)}
        metadata["h3director.slim"] = json.dumps({"keep": keep, "dtype": dtype, "source": Path(in_path).name})
        header["__metadata__"] = metadata
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        with atomic_path(out_path) as temporary, open(temporary, "wb") as out:
            out.write(struct.pack("<Q", len(blob)))
            out.write(blob)
            for name, _, out_type in chosen:
                _write_tensor(out, source, name, out_type)
    return result


def _out_size(entry, out_type: str) -> int:
    return entry.nbytes if out_type == entry.type else math.prod(entry.shape) * _SIZES[out_type]


def _strip(name: str) -> str:
    from h3director.weights.h3_keys import COMPONENT_PREFIXES

    for prefixes in COMPONENT_PREFIXES.values():
        for prefix in prefixes:
            if name.startswith(prefix):
                return name[len(prefix):]
    return name


def _write_tensor(out, source: SafetensorsWeights, name: str, out_type: str) -> None:
    entry = source.entries[name]
    if out_type == entry.type:  # bytes as stored, streamed
        for chunk in source.raw_chunks(name):
            out.write(chunk)
        return
    import torch

    tensor = source.load(name, getattr(torch, SAFETENSORS_TORCH[out_type])).contiguous()
    out.write(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())


__all__ = ["SlimResult", "slim"]
