"""The C backend: thin ctypes wrappers over h3_core.c (bound by _loader.c_backend()).

Arguments arrive validated by h3director.native (see _common); this module passes pointers and
the byte size of every buffer, and turns a negative status from the library into an exception.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from h3director.errors import InvalidInputError
from h3director.native import _common

NAME = "c"
LIBRARY_PATH = ""
_lib: Any = None


class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "capacity", "used", "free", "high_water", "largest_free", "free_blocks", "live",
        "total_allocs", "failed_allocs")]


def bind(lib: Any, path: str) -> None:
    """Attach the loaded library; refuses one whose stats struct differs from this module's."""
    global _lib, LIBRARY_PATH
    if lib.h3_arena_stats_size() != ctypes.sizeof(_Stats):
        raise OSError(f"{path}: arena stats struct has {lib.h3_arena_stats_size()} bytes, expected {ctypes.sizeof(_Stats)}")
    _lib, LIBRARY_PATH = lib, path


def _check(status: int, what: str) -> None:
    if status != 0:
        message = _lib.h3_strerror(status).decode()
        raise InvalidInputError(f"{what}: h3_core refused the call ({message})")


def _readable_range(x: Any) -> tuple[int, int, int]:
    """(address of element 0, lowest, one past the highest element offset the caller may read)."""
    if isinstance(x, np.ndarray):
        lo = sum((n - 1) * s for n, s in zip(x.shape, x.strides, strict=True) if s < 0) // x.itemsize
        hi = sum((n - 1) * s for n, s in zip(x.shape, x.strides, strict=True) if s > 0) // x.itemsize + 1
        return x.ctypes.data, lo, hi
    itemsize = x.element_size()
    storage_items = x.untyped_storage().nbytes() // itemsize
    return x.data_ptr(), -x.storage_offset(), storage_items - x.storage_offset()


def pack_frames(inp: _common.FrameInput, mean: np.ndarray, std: np.ndarray, out: np.ndarray, threads: int) -> None:
    address, lo, hi = _readable_range(inp.array)
    status = _lib.h3_pack_frames(
        address, _common.DTYPE_CODES[inp.dtype], lo, hi,
        inp.channels, inp.frames, inp.height, inp.width,
        inp.stride_c, inp.stride_f, inp.stride_h, inp.stride_w,
        mean.ctypes.data, std.ctypes.data, mean.size, out.ctypes.data, out.nbytes, threads)
    _check(status, "pack_frames")


def dequantize(blocks: np.ndarray, qt: _common.QuantType, out_flat: np.ndarray, dtype: str, threads: int) -> None:
    status = _lib.h3_dequantize(qt.value, blocks.ctypes.data, blocks.nbytes, out_flat.ctypes.data,
                                _common.DTYPE_CODES[dtype], out_flat.nbytes, threads)
    _check(status, f"dequantize {qt.name}")


class ArenaEngine:
    """Owns one h3_arena; destroyed when the last lease block referring to it is gone."""

    def __init__(self, capacity_bytes: int, alignment: int, release_threshold: int) -> None:
        self._lib = _lib  # keep the library alive as long as any arena
        self._arena = _lib.h3_arena_create(capacity_bytes, alignment, release_threshold)
        if not self._arena:
            raise MemoryError(f"could not map an arena of {capacity_bytes} bytes (alignment {alignment})")
        self.base_address = _lib.h3_arena_base(self._arena)

    def alloc(self, nbytes: int) -> tuple[int, int] | None:
        handle, offset = ctypes.c_uint64(), ctypes.c_uint64()
        status = self._lib.h3_arena_alloc(self._arena, nbytes, ctypes.byref(handle), ctypes.byref(offset))
        if status == -3:  # H3_ENOMEM: no fitting free run
            return None
        _check(status, "arena alloc")
        return handle.value, offset.value

    def free(self, handle: int) -> None:
        _check(self._lib.h3_arena_free(self._arena, handle), "arena free")

    def stats(self) -> dict[str, int]:
        s = _Stats()
        _check(self._lib.h3_arena_stats(self._arena, ctypes.byref(s), ctypes.sizeof(s)), "arena stats")
        return {
            "capacity_bytes": s.capacity,
            "used_bytes": s.used,
            "free_bytes": s.free,
            "high_water_bytes": s.high_water,
            "largest_free_bytes": s.largest_free,
            "free_blocks": s.free_blocks,
            "live_allocations": s.live,
            "total_allocations": s.total_allocs,
            "failed_allocations": s.failed_allocs,
        }

    def __del__(self) -> None:
        arena, self._arena = getattr(self, "_arena", None), None
        if arena:
            self._lib.h3_arena_destroy(arena)
