"""Validate an untrusted safetensors file's header before anything is loaded from it.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON, then the tensor
data. The JSON maps each tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
(offsets relative to the data section) plus an optional ``"__metadata__"`` map of strings.
`read_header` checks every number against the file and the caller's limits, so a truncated,
oversized or crafted file is refused with a specific message before a byte of tensor data is read.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path

from h3director.errors import InvalidInputError

# safetensors dtype code -> bytes per element
DTYPE_SIZES = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
    "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8,
}


@dataclass(frozen=True)
class SafetensorsLimits:
    """Bounds an untrusted file must respect (defaults suit latent files, not model weights)."""

    max_header_bytes: int = 1 << 20
    max_tensors: int = 64
    max_rank: int = 8
    max_dim: int = 1 << 24


WEIGHT_LIMITS = SafetensorsLimits(max_header_bytes=100 << 20, max_tensors=200_000)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor as the header declares it: safetensors dtype code, shape, bytes in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


@dataclass(frozen=True)
class SafetensorsHeader:
    """A checked safetensors header (`read_header`): `tensors` by name, the `metadata` strings,
    `header_bytes` (bytes of the JSON header, after the 8-byte length) and `file_bytes` (bytes of the whole
    file)."""

    tensors: dict[str, TensorEntry]
    metadata: dict[str, str]
    header_bytes: int
    file_bytes: int


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_header(path: str | os.PathLike, limits: SafetensorsLimits = SafetensorsLimits()) -> SafetensorsHeader:
    """Parse and check the header of the safetensors file at `path`; raise `InvalidInputError` on any problem."""
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise InvalidInputError(f"{where!r} is not a file")
    file_bytes = path.stat().st_size
    if file_bytes < 8:
        raise InvalidInputError(f"{where!r} is not a safetensors file: {file_bytes} bytes, the header length alone is 8")
    with open(path, "rb") as handle:
        (header_bytes,) = struct.unpack("<Q", handle.read(8))
        if header_bytes > limits.max_header_bytes:
            raise InvalidInputError(
                f"{where!r}: safetensors header of {header_bytes} bytes exceeds the limit of {limits.max_header_bytes}"
            )
        if 8 + header_bytes > file_bytes:
            raise InvalidInputError(
                f"{where!r}: header claims {header_bytes} bytes but the file has only {file_bytes - 8} after the length"
            )
        raw = handle.read(header_bytes)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise InvalidInputError(f"{where!r}: safetensors header is not valid UTF-8 JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise InvalidInputError(f"{where!r}: safetensors header must be a JSON object, got {type(header).__name__}")

    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise InvalidInputError(f"{where!r}: __metadata__ must map strings to strings")
    if len(header) > limits.max_tensors:
        raise InvalidInputError(f"{where!r}: {len(header)} tensors, more than the limit of {limits.max_tensors}")

    data_bytes = file_bytes - 8 - header_bytes
    tensors: dict[str, TensorEntry] = {}
    spans = []
    for name, entry in header.items():
        tensors[name] = _check_entry(where, name, entry, limits, data_bytes)
        begin, end = entry["data_offsets"]
        if end > begin:
            spans.append((begin, end, name))
    spans.sort()
    for (_, end_a, name_a), (begin_b, _, name_b) in zip(spans, spans[1:], strict=False):
        if begin_b < end_a:
            raise InvalidInputError(f"{where!r}: tensors {name_a!r} and {name_b!r} overlap in the data section")
    return SafetensorsHeader(tensors=tensors, metadata=dict(metadata), header_bytes=header_bytes,
                             file_bytes=file_bytes)


def _check_entry(where: str, name: str, entry: object, limits: SafetensorsLimits, data_bytes: int) -> TensorEntry:
    if not isinstance(entry, dict):
        raise InvalidInputError(f"{where!r}: entry {name!r} must be an object, got {type(entry).__name__}")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in DTYPE_SIZES:
        raise InvalidInputError(f"{where!r}: tensor {name!r} has unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise InvalidInputError(f"{where!r}: tensor {name!r} shape must be a list of ints >= 0, got {shape!r}")
    if len(shape) > limits.max_rank:
        raise InvalidInputError(f"{where!r}: tensor {name!r} has rank {len(shape)}, more than {limits.max_rank}")
    if any(d > limits.max_dim for d in shape):
        raise InvalidInputError(f"{where!r}: tensor {name!r} shape {shape} has a dimension above {limits.max_dim}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_int(o) for o in offsets)):
        raise InvalidInputError(f"{where!r}: tensor {name!r} data_offsets must be [begin, end], got {offsets!r}")
    begin, end = offsets
    nbytes = math.prod(shape) * DTYPE_SIZES[dtype]
    if not 0 <= begin <= end <= data_bytes:
        raise InvalidInputError(
            f"{where!r}: tensor {name!r} data_offsets {offsets} fall outside the {data_bytes}-byte data section"
        )
    if end - begin != nbytes:
        raise InvalidInputError(
            f"{where!r}: tensor {name!r} declares {dtype} {shape} ({nbytes} bytes) but its data spans {end - begin} bytes"
        )
    return TensorEntry(name=name, dtype=dtype, shape=tuple(shape), nbytes=nbytes)


__all__ = ["WEIGHT_LIMITS", "SafetensorsHeader", "SafetensorsLimits", "TensorEntry", "read_header"]
