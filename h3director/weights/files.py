"""One view of a weight file, safetensors or GGUF: its tensor table, raw bytes and values, one tensor at a time.

`open_weights(path)` validates the file first (safetensors: `core.safetensors_header.read_header` with
weight-file limits; GGUF: `gguf_file.open_gguf`) and then exposes

- `entries`: name -> `Entry(name, shape (torch order), type (safetensors dtype code such as "BF16", or the
  GGML type name such as "Q4_K"), nbytes)`, in file order;
- `raw_chunks(name)`: the tensor's stored bytes in chunks of at most `CHUNK_BYTES` (for hashing; nothing
  larger is held);
- `load(name, dtype=None)`: the tensor as a CPU torch tensor (GGUF: dequantised/cast by `dequant`;
  safetensors: as stored, or cast to `dtype`).

Nothing is read until asked for; both formats are memory-mapped.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from h3director.core.safetensors_header import WEIGHT_LIMITS, read_header
from h3director.errors import InvalidInputError

CHUNK_BYTES = 16 << 20
SAFETENSORS_TORCH = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32", "U32": "uint32",
    "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
}


@dataclass(frozen=True)
class Entry:
    """One tensor as stored: torch-order `shape`, storage `type` name, `nbytes` in the file."""

    name: str
    shape: tuple[int, ...]
    type: str
    nbytes: int


class WeightFile:
    """Base of the two readers; see the module docstring."""

    kind = ""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, Entry] = {}
        self.metadata: dict[str, Any] = {}
        self.architecture = ""

    def raw_chunks(self, name: str) -> Iterator[bytes]:
        raise NotImplementedError

    def load(self, name: str, dtype: Any = None) -> Any:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self) -> WeightFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SafetensorsWeights(WeightFile):
    """A `.safetensors` file with a checked header (`read_header` with `WEIGHT_LIMITS`): `entries` in file
    order with dtype codes and bytes; `load` reads one tensor; `raw_chunks` yields its stored bytes."""

    kind = "safetensors"

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        header = read_header(path, WEIGHT_LIMITS)
        self.metadata = dict(header.metadata)
        self.header_bytes = header.header_bytes
        # read_header validated every entry; read the offsets it does not return (the same bounded header).
        with open(path, "rb") as handle:
            handle.seek(8)
            table = json.loads(handle.read(header.header_bytes))
        table.pop("__metadata__", None)
        self.offsets = {name: tuple(entry["data_offsets"]) for name, entry in table.items()}
        ordered = sorted(header.tensors.values(), key=lambda e: self.offsets[e.name][0])
        self.entries = {e.name: Entry(e.name, e.shape, e.dtype, e.nbytes) for e in ordered}
        self._handle = None

    def raw_chunks(self, name: str) -> Iterator[bytes]:
        begin, end = self.offsets[name]
        with open(self.path, "rb") as handle:
            handle.seek(8 + self.header_bytes + begin)
            left = end - begin
            while left:
                chunk = handle.read(min(left, CHUNK_BYTES))
                if not chunk:
                    raise InvalidInputError(f"{str(self.path)!r}: file shrank while reading {name!r}")
                left -= len(chunk)
                yield chunk

    def load(self, name: str, dtype: Any = None) -> Any:
        from safetensors import safe_open

        if self._handle is None:
            self._handle = safe_open(str(self.path), framework="pt", device="cpu")
        tensor = self._handle.get_tensor(name)
        return tensor if dtype is None or tensor.dtype == dtype else tensor.to(dtype)

    def close(self) -> None:
        self._handle = None


class GGUFWeights(WeightFile):
    """A validated `.gguf` file (`gguf_file.open_gguf`): `entries` with GGML type names and bytes; `load`
    dequantises one tensor (to `dtype`; by default float tensors as stored, quantised ones to float32);
    `raw_chunks` yields its stored bytes."""

    kind = "gguf"

    def __init__(self, path: Path) -> None:
        from h3director.weights.gguf_file import open_gguf

        super().__init__(path)
        self.file = open_gguf(path)
        self.metadata = self.file.metadata
        self.architecture = self.file.architecture
        self.entries = {t.name: Entry(t.name, t.shape, t.qtype.name, t.nbytes) for t in self.file.tensors.values()}

    def raw_chunks(self, name: str) -> Iterator[bytes]:
        raw = self.file.tensors[name].raw
        for start in range(0, raw.size, CHUNK_BYTES):
            yield raw[start:start + CHUNK_BYTES].tobytes()

    def load(self, name: str, dtype: Any = None) -> Any:
        import torch

        from h3director.weights.dequant import FLOATS, dequantize_tensor

        info = self.file.tensors[name]
        if dtype is None:
            dtype = FLOATS[info.qtype.name][1] if info.qtype.name in FLOATS else torch.float32
        if info.qtype.name in FLOATS or info.qtype.name in _quantised():
            return dequantize_tensor(info, dtype=dtype)
        return _reference_dequant(info).to(dtype)

    def close(self) -> None:
        self.file.close()


def _quantised() -> tuple[str, ...]:
    from h3director.weights.dequant import QUANTISED

    return QUANTISED


def _reference_dequant(info: Any) -> Any:
    """Types this package has no kernel for (TQ1_0, MXFP4, I32 ...): gguf's reference decoder, float32."""
    import numpy as np
    import torch
    from gguf import GGML_QUANT_SIZES, quants

    name = info.qtype.name
    if name in ("I8", "I16", "I32", "I64", "F64"):
        values = np.array(info.raw).view({"I8": np.int8, "I16": np.int16, "I32": np.int32, "I64": np.int64,
                                          "F64": np.float64}[name])
        return torch.from_numpy(values.astype(np.float64 if name == "F64" else values.dtype)).reshape(info.shape)
    block_values, block_bytes = GGML_QUANT_SIZES[info.qtype]
    rows = np.array(info.raw).reshape(-1, block_bytes)
    try:
        values = quants.dequantize(rows, info.qtype)
    except NotImplementedError as exc:
        raise InvalidInputError(f"tensor {info.name!r}: no decoder for {name} ({exc})") from None
    return torch.from_numpy(values.reshape(-1)).reshape(info.shape)


def open_weights(path: str | os.PathLike) -> WeightFile:
    """The validated `WeightFile` for `path`: `GGUFWeights` or `SafetensorsWeights`, chosen by its first
    bytes, then its suffix. `InvalidInputError` for a missing file, a bad magic, or neither format."""
    path = Path(path)
    if not path.is_file():
        raise InvalidInputError(f"{str(path)!r} is not a file")
    with open(path, "rb") as handle:
        head = handle.read(8)
    if head[:4] == b"GGUF":
        return GGUFWeights(path)
    if path.suffix.lower() == ".gguf":
        raise InvalidInputError(f"{str(path)!r}: not a GGUF file: magic {head[:4]!r}, expected b'GGUF'")
    if len(head) == 8 and struct.unpack("<Q", head)[0] > 0 or path.suffix.lower() == ".safetensors":
        return SafetensorsWeights(path)
    raise InvalidInputError(f"{str(path)!r}: neither a GGUF nor a safetensors file")


__all__ = ["SAFETENSORS_TORCH", "Entry", "GGUFWeights", "SafetensorsWeights", "WeightFile", "open_weights"]
