"""Argument checking and constants shared by the C binding and the numpy fallback.

Both backends validate through these functions, so a bad argument fails the same way (and before
any work starts) whichever backend is active.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from h3director.errors import InvalidInputError

# GGML quantisation types this module implements: name -> (enum value, values per block, bytes per block).
# Enum values and block layouts are those of ggml / the `gguf` package (`gguf.GGMLQuantizationType`).
QUANT_TYPES: dict[str, tuple[int, int, int]] = {
    "Q4_0": (2, 32, 18),
    "Q4_1": (3, 32, 20),
    "Q5_0": (6, 32, 22),
    "Q5_1": (7, 32, 24),
    "Q8_0": (8, 32, 34),
    "Q4_K": (12, 256, 144),
    "Q5_K": (13, 256, 176),
    "Q6_K": (14, 256, 210),
}
_QUANT_BY_VALUE = {value: name for name, (value, _, _) in QUANT_TYPES.items()}

# Output dtype codes understood by the C library (h3_core.c `H3_F32`, ...).
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
LAYOUTS = ("CFHW", "FCHW")
DEFAULT_ALIGNMENT = 64
MAX_ALIGNMENT = 1 << 21  # 2 MiB: a huge page; larger alignments waste the arena
MAX_CAPACITY = 1 << 46  # 64 TiB: the arena's address-space limit (h3_core.c checks the same)


@dataclass(frozen=True)
class QuantType:
    """One GGML block format: `block_values` values stored in `block_bytes` bytes."""

    name: str
    value: int
    block_values: int
    block_bytes: int


def quant_type(qtype: Any) -> QuantType:
    """Resolve a `gguf.GGMLQuantizationType`, its name ("Q4_K") or its integer value."""
    if isinstance(qtype, str):
        name = qtype.upper()
    elif hasattr(qtype, "name") and isinstance(qtype.name, str):
        name = qtype.name
    elif isinstance(qtype, (int, np.integer)) and int(qtype) in _QUANT_BY_VALUE:
        name = _QUANT_BY_VALUE[int(qtype)]
    else:
        name = repr(qtype)
    if name not in QUANT_TYPES:
        raise InvalidInputError(f"unsupported quantisation type {qtype!r}; expected one of {', '.join(QUANT_TYPES)}")
    value, block_values, block_bytes = QUANT_TYPES[name]
    return QuantType(name, value, block_values, block_bytes)


def dtype_name(dtype: Any) -> str:
    """Normalise np.float32 / torch.float16 / "bfloat16" ... to "float32" | "float16" | "bfloat16"."""
    text = str(dtype)
    if text.startswith("torch."):
        text = text[len("torch."):]
    else:
        try:
            text = np.dtype(dtype).name
        except TypeError:
            pass
    if text not in DTYPE_CODES:
        raise InvalidInputError(f"unsupported dtype {dtype!r}; expected float32, float16 or bfloat16")
    return text


def check_quantized(data: np.ndarray, qt: QuantType) -> tuple[np.ndarray, tuple[int, ...]]:
    """Validate quantised bytes; return them C-contiguous as uint8 and the dequantised shape."""
    if not isinstance(data, np.ndarray):
        raise TypeError(f"data must be a numpy uint8 array, got {type(data).__name__}")
    if data.ndim == 0:
        raise InvalidInputError("data must have at least one axis (the last holds whole blocks)")
    if data.dtype != np.uint8:
        data = data.view(np.uint8) if data.flags.c_contiguous else np.ascontiguousarray(data).view(np.uint8)
    row_bytes = data.shape[-1]
    if row_bytes % qt.block_bytes:
        raise InvalidInputError(
            f"{qt.name}: last axis holds {row_bytes} bytes, not a whole number of {qt.block_bytes}-byte blocks"
        )
    shape = (*data.shape[:-1], row_bytes // qt.block_bytes * qt.block_values)
    return np.ascontiguousarray(data), shape


def check_out(out: Any, shape: tuple[int, ...], dtype: str, what: str) -> None:
    """Check a caller buffer (numpy array or CPU torch tensor): shape, dtype, C-contiguous, writable."""
    if isinstance(out, np.ndarray):
        if dtype == "bfloat16":
            ok_dtype = out.dtype in (np.uint16, np.int16)
        else:
            ok_dtype = out.dtype == np.dtype(dtype)
        if not ok_dtype:
            raise InvalidInputError(f"{what}: out has dtype {out.dtype}, expected {dtype}")
        if tuple(out.shape) != tuple(shape):
            raise InvalidInputError(f"{what}: out has shape {tuple(out.shape)}, expected {tuple(shape)}")
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise InvalidInputError(f"{what}: out must be a C-contiguous, writable array")
        return
    import torch

    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{what}: out must be a numpy array or a torch tensor, got {type(out).__name__}")
    if out.device.type != "cpu":
        raise InvalidInputError(f"{what}: out must be on the CPU, got {out.device}")
    if str(out.dtype) != f"torch.{dtype}":
        raise InvalidInputError(f"{what}: out has dtype {out.dtype}, expected torch.{dtype}")
    if tuple(out.shape) != tuple(shape):
        raise InvalidInputError(f"{what}: out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if not out.is_contiguous():
        raise InvalidInputError(f"{what}: out must be contiguous")


def is_integer(value: Any) -> bool:
    """True for a Python or numpy integer (bool excluded): what size and count arguments must be."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_threads(threads: int) -> int:
    if not is_integer(threads) or not 1 <= threads <= 256:
        raise InvalidInputError(f"threads must be an integer in [1, 256], got {threads!r}")
    return int(threads)


@dataclass(frozen=True)
class FrameInput:
    """A validated pack_frames input as a strided view: element strides for channel, frame, row, column."""

    array: Any  # numpy array or CPU torch tensor (kept alive while the call runs)
    layout: str
    dtype: str
    channels: int
    frames: int
    height: int
    width: int
    stride_c: int
    stride_f: int
    stride_h: int
    stride_w: int


def frame_input(x: Any, layout: str) -> FrameInput:
    """Validate a pack_frames input (numpy array or torch tensor, 4-D, float32/float16/bfloat16)."""
    if layout not in LAYOUTS:
        raise InvalidInputError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if isinstance(x, np.ndarray):
        if not x.dtype.isnative:
            x = x.astype(x.dtype.newbyteorder("="))
        dtype = x.dtype.name if x.dtype.name in ("float32", "float16") else None
        strides = tuple(s // x.itemsize if s % x.itemsize == 0 else None for s in x.strides)
    else:
        import torch

        if not isinstance(x, torch.Tensor):
            raise TypeError(f"pack_frames expects a numpy array or a torch tensor, got {type(x).__name__}")
        x = x.detach()
        if x.device.type != "cpu":
            x = x.to("cpu")
        dtype = str(x.dtype)[len("torch."):]
        dtype = dtype if dtype in DTYPE_CODES else None
        strides = tuple(x.stride())
    if dtype is None:
        raise InvalidInputError(f"pack_frames expects float32, float16 or bfloat16 input, got {x.dtype}")
    if x.ndim != 4:
        raise InvalidInputError(f"pack_frames expects a 4-D {layout} input, got shape {tuple(x.shape)}")
    if any(s is None for s in strides):
        raise InvalidInputError("pack_frames input strides must be whole multiples of the element size")
    if layout == "CFHW":
        c, f, h, w = x.shape
        sc, sf, sh, sw = strides
    else:
        f, c, h, w = x.shape
        sf, sc, sh, sw = strides
    return FrameInput(x, layout, dtype, int(c), int(f), int(h), int(w), int(sc), int(sf), int(sh), int(sw))


def affine(mean: Any, std: Any, channels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel float32 (mean, std); both None means the (x + 1) / 2 convention (mean = std = 0.5).

    x * 0.5 + 0.5 rounds to the same float32 as (x + 1) / 2 for every x (halving is exact), so the
    two conventions produce identical bytes.
    """
    if (mean is None) != (std is None):
        raise InvalidInputError("give both mean and std, or neither (for the (x + 1) / 2 convention)")
    if mean is None:
        mean, std = 0.5, 0.5
    vectors = []
    for name, value in (("mean", mean), ("std", std)):
        if hasattr(value, "detach"):
            value = value.detach().cpu().float().numpy()
        arr = np.asarray(value, dtype=np.float32).reshape(-1)
        if arr.size == 1:
            arr = np.repeat(arr, channels)
        if arr.size != channels:
            raise InvalidInputError(f"{name} has {arr.size} values, expected 1 or one per channel ({channels})")
        vectors.append(np.ascontiguousarray(arr))
    return vectors[0], vectors[1]
