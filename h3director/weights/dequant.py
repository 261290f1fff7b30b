"""Dequantiser dispatch: GGUF tensor bytes -> a torch tensor of the requested dtype, on the requested device.

- F32, F16, BF16: the stored values, cast with torch's ``.to(dtype)`` (one copy, never a view of the map);
- Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K on the CPU: the native core
  (`h3director.native.dequantize`, C or its numpy twin), writing straight into `out` when given so a
  caller can reuse one buffer per layer shape;
- the same types on any other device: the raw bytes cross to the device and are decoded there by
  `dequant_torch` (the values are made on the device, only quantised bytes travel).

Every path gives the bits of ``gguf.quants.dequantize`` (float32), then torch's rounding to float16 or
bfloat16 when asked for (the native core's float16/bfloat16 outputs round the same way).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

from h3director.errors import InvalidInputError
from h3director.weights import dequant_torch

QUANTISED = tuple(dequant_torch.BLOCKS)
FLOATS = {"F32": (np.float32, torch.float32), "F16": (np.float16, torch.float16), "BF16": (np.uint16, torch.bfloat16)}
_NATIVE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _supported() -> frozenset:
    from gguf import GGMLQuantizationType

    return frozenset(GGMLQuantizationType[name] for name in (*FLOATS, *QUANTISED))


try:
    SUPPORTED_QTYPES = _supported()
except ImportError:  # pragma: no cover - gguf is a declared extra
    SUPPORTED_QTYPES = frozenset()


def _qtype_name(qtype: Any) -> str:
    name = getattr(qtype, "name", None)
    if name is None and isinstance(qtype, str):
        name = qtype.upper()
    if name is None and isinstance(qtype, (int, np.integer)) and not isinstance(qtype, bool):
        try:
            from gguf import GGMLQuantizationType

            name = GGMLQuantizationType(int(qtype)).name
        except (ImportError, ValueError):
            name = None
    if name in (*FLOATS, *QUANTISED):
        return name
    raise InvalidInputError(f"unsupported tensor type {name or qtype!r}; "
                            f"supported: {', '.join((*FLOATS, *QUANTISED))}")


def tensor_nbytes(qtype: Any, shape: tuple[int, ...], *, rows_checked: bool = False) -> int:
    """Bytes a tensor of `qtype` and torch `shape` occupies. Its last dim must hold whole blocks, unless
    `rows_checked` (the GGUF reader checked the stored rows; ``orig_shape`` may differ from them)."""
    name = _qtype_name(qtype)
    count = math.prod(shape)
    if name in FLOATS:
        return count * (4 if name == "F32" else 2)
    values, nbytes = dequant_torch.BLOCKS[name]
    if count % values or not rows_checked and (not shape or shape[-1] % values):
        raise InvalidInputError(f"{name} tensor of shape {list(shape)}: its rows must hold whole {values}-value blocks")
    return count // values * nbytes


def dequantize_tensor(info_or_raw: Any, qtype: Any = None, shape: tuple[int, ...] | None = None,
                      dtype: torch.dtype = torch.float32, device: Any = "cpu", out: torch.Tensor | None = None,
                      *, backend: str | None = None) -> torch.Tensor:
    """Decode one GGUF tensor into a new torch tensor of `shape` (torch order), `dtype`, on `device`.

    `info_or_raw`: a `GGUFTensorInfo` (its raw bytes, qtype and shape are used) or a uint8 numpy
    array / CPU torch tensor of the tensor's bytes, with `qtype` and `shape` given. `out`: a contiguous
    tensor of `shape` and `dtype` on `device` to fill instead (returned). `backend`: None chooses (native on
    the CPU, torch elsewhere); "torch" forces the torch kernels, "c"/"numpy" force a native backend on the CPU.
    Raises `InvalidInputError` for an unsupported type or a byte count that does not match type x shape.
    """
    rows_checked = hasattr(info_or_raw, "raw") and hasattr(info_or_raw, "qtype")
    if rows_checked:
        raw, qtype = info_or_raw.raw, info_or_raw.qtype if qtype is None else qtype
        shape = tuple(info_or_raw.shape) if shape is None else tuple(shape)
    else:
        raw = info_or_raw
        if qtype is None or shape is None:
            raise InvalidInputError("dequantize_tensor: give qtype and shape with raw bytes")
        shape = tuple(int(d) for d in shape)
    name = _qtype_name(qtype)
    raw_np = raw.numpy() if isinstance(raw, torch.Tensor) else np.asarray(raw)
    if raw_np.dtype != np.uint8:
        raise InvalidInputError(f"dequantize_tensor: raw bytes must be uint8, got {raw_np.dtype}")
    raw_np = raw_np.reshape(-1)
    expected = tensor_nbytes(name, shape, rows_checked=rows_checked)
    if raw_np.size != expected:
        raise InvalidInputError(f"{name} tensor of shape {list(shape)} needs {expected} bytes, got {raw_np.size}")
    device = torch.device(device)
    if out is not None:
        if tuple(out.shape) != shape or out.dtype != dtype or out.device != device or not out.is_contiguous():
            raise InvalidInputError(f"dequantize_tensor: out must be a contiguous {dtype} tensor of shape "
                                    f"{list(shape)} on {device}, got {out.dtype} {list(out.shape)} on {out.device}")

    if name in FLOATS:
        np_type, torch_type = FLOATS[name]
        stored = _as_torch(raw_np.view(np_type))
        if name == "BF16":
            stored = stored.view(torch.bfloat16)
        stored = stored.reshape(shape)
        if out is not None:
            return out.copy_(stored)
        return stored.to(device=device, dtype=dtype, copy=True)

    if device.type == "cpu" and backend != "torch" and dtype in _NATIVE_DTYPES:
        from h3director import native

        if out is None:
            out = torch.empty(shape, dtype=dtype)
        native.dequantize(raw_np, name, dtype, out=out.view(-1), backend=backend)
        return out

    blocks = _as_torch(raw_np).to(device)
    if dtype in _NATIVE_DTYPES or out is not None and out.dtype in _NATIVE_DTYPES:
        flat = dequant_torch.dequantize_blocks(blocks, name, dtype, out=None if out is None else out.view(-1))
    else:  # e.g. float64: float32 values, then one cast
        flat = dequant_torch.dequantize_blocks(blocks, name, torch.float32).to(dtype)
        if out is not None:
            return out.copy_(flat.view(shape))
    return flat.view(shape) if out is None else out


def _as_torch(array: np.ndarray) -> torch.Tensor:
    """A torch view of a (possibly read-only, memory-mapped) numpy array; callers copy before writing."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "The given NumPy array is not writable"
        return torch.from_numpy(array)


__all__ = ["FLOATS", "QUANTISED", "SUPPORTED_QTYPES", "dequantize_tensor"]
