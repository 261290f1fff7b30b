"""Element sizes of compute dtypes, accepted as `torch.dtype` or as text ("bf16", "float32")."""

from __future__ import annotations

from h3director.errors import InvalidInputError

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4,
    "bfloat16": 2, "bf16": 2,
    "float16": 2, "fp16": 2, "half": 2,
    "float64": 8, "fp64": 8,
    "float8_e4m3fn": 1, "fp8": 1,
}


def dtype_bytes(dtype: object) -> int:
    """Bytes per element of a floating compute dtype: `torch.float32` or "fp32" -> 4, "bf16" -> 2.
    `InvalidInputError` for any other dtype."""
    itemsize = getattr(dtype, "itemsize", None)
    if isinstance(itemsize, int) and not isinstance(dtype, str):
        return itemsize
    name = str(dtype).removeprefix("torch.").lower()
    if name not in _DTYPE_BYTES:
        raise InvalidInputError(f"unknown compute dtype {dtype!r}: expected one of {sorted(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


__all__ = ["dtype_bytes"]
