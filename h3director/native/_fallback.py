"""The numpy backend: the same results as h3_core.c, byte for byte, without a C compiler.

Used when the shared library is missing, was built for another ABI version, or when the
environment sets ``H3_NATIVE=numpy``. Every function works chunk by chunk (one frame plane, or a
few thousand quantised blocks at a time) so its temporaries stay small.
"""

from __future__ import annotations

import bisect
import mmap
import threading

import numpy as np

from h3director.errors import InvalidInputError
from h3director.native import _common

NAME = "numpy"
BF16_NAN_BITS = 0xFFFF  # see float32_to_bfloat16_bits
_DEQUANT_CHUNK_BLOCKS = 4096


# ---------------------------------------------------------------------------------------------
# pack_frames


def _plane_float32(inp: _common.FrameInput, c: int, f: int) -> np.ndarray:
    """One [H, W] plane as a fresh float32 array (conversion from float16/bfloat16 is exact)."""
    plane = inp.array[(c, f) if inp.layout == "CFHW" else (f, c)]
    if isinstance(plane, np.ndarray):
        return plane.astype(np.float32)
    import torch

    return plane.to(torch.float32, copy=True).numpy()


def pack_frames(inp: _common.FrameInput, mean: np.ndarray, std: np.ndarray, out: np.ndarray, threads: int) -> None:
    """Fill `out` ([F, H, W, C] uint8) from a validated input; see h3director.native.pack_frames."""
    del threads  # numpy already uses what it uses; the fallback stays single-threaded and simple
    scale = np.float32(255.0)
    with np.errstate(all="ignore"):  # NaN / inf / overflow in the input are data, not errors
        for f in range(inp.frames):
            for c in range(inp.channels):
                v = _plane_float32(inp, c, f)
                np.multiply(v, std[c], out=v)
                np.add(v, mean[c], out=v)
                # clamp(0, 1) with NaN mapped to 0 (what torch's float -> uint8 cast gives for NaN here).
                np.copyto(v, np.float32(0.0), where=~(v >= 0))
                np.minimum(v, np.float32(1.0), out=v)
                np.multiply(v, scale, out=v)
                np.rint(v, out=v)  # round half to even, like torch.round
                out[f, :, :, c] = v.astype(np.uint8)


# ---------------------------------------------------------------------------------------------
# GGUF dequantisation (float32 first, in the same operation order as gguf.quants)


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block, as a float32 column."""
    return blocks[:, start:start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """Bytes (n, k) -> 4-bit values (n, 2k): low nibbles of all bytes first, then high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8 six-bit (scale, min) pairs packed into the 12 scale bytes of Q4_K / Q5_K."""
    a, b, c = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = np.concatenate([a & 0x3F, (c & 0x0F) | ((a >> 2) & 0x30)], axis=1)
    mn = np.concatenate([b & 0x3F, (c >> 4) | ((b >> 2) & 0x30)], axis=1)
    return sc.astype(np.float32), mn.astype(np.float32)


def _qh_bits(qh: np.ndarray, count: int) -> np.ndarray:
    """Bit i of a little-endian bit field, for i < count, as uint8 values 0/1."""
    return np.unpackbits(qh, axis=1, bitorder="little")[:, :count]


def _dequant_q8_0(b: np.ndarray) -> np.ndarray:
    return b[:, 2:].view(np.int8).astype(np.float32) * _f16(b, 0)


def _dequant_q4_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 2:]).astype(np.float32) - np.float32(8)
    return _f16(b, 0) * q


def _dequant_q4_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 4:]).astype(np.float32)
    return _f16(b, 0) * q + _f16(b, 2)


def _q5_values(b: np.ndarray, qh_at: int) -> np.ndarray:
    high = _qh_bits(b[:, qh_at:qh_at + 4], 32)
    return (_nibbles(b[:, qh_at + 4:]) | (high << 4)).astype(np.float32)


def _dequant_q5_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * (_q5_values(b, 2) - np.float32(16))


def _dequant_q5_1(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * _q5_values(b, 4) + _f16(b, 2)


def _k_affine(b: np.ndarray, q: np.ndarray) -> np.ndarray:
    """(d * scale) * q - (dmin * min) per 32-value sub-block, as ggml's K formats define it."""
    sc, mn = _k_scales(b[:, 4:16])
    n = b.shape[0]
    d = (_f16(b, 0) * sc)[:, :, None]
    dm = (_f16(b, 2) * mn)[:, :, None]
    return (d * q.reshape(n, 8, 32) - dm).reshape(n, 256)


def _dequant_q4_k(b: np.ndarray) -> np.ndarray:
    qs = b[:, 16:144].reshape(-1, 4, 32)
    q = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 256)  # sub-block 2i: low, 2i+1: high nibbles
    return _k_affine(b, q.astype(np.float32))


def _dequant_q5_k(b: np.ndarray) -> np.ndarray:
    qh, qs = b[:, 16:48], b[:, 48:176].reshape(-1, 4, 32)
    low = np.stack([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, 32)
    high = (qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1  # sub-block s uses bit s
    return _k_affine(b, (low | (high << 4)).reshape(-1, 256).astype(np.float32))


def _dequant_q6_k(b: np.ndarray) -> np.ndarray:
    n = b.shape[0]
    ql, qh = b[:, 0:128].reshape(n, 2, 64), b[:, 128:192].reshape(n, 2, 32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # (n, 2, 128)
    high = (qh[:, :, None, :] >> np.array([0, 2, 4, 6], dtype=np.uint8)[None, None, :, None]) & 3
    q = (low | (high.reshape(n, 2, 128) << 4)).astype(np.float32) - np.float32(32)
    d = _f16(b, 208) * b[:, 192:208].view(np.int8).astype(np.float32)
    return (d[:, :, None] * q.reshape(n, 16, 16)).reshape(n, 256)


_KERNELS = {
    "Q8_0": _dequant_q8_0,
    "Q4_0": _dequant_q4_0,
    "Q4_1": _dequant_q4_1,
    "Q5_0": _dequant_q5_0,
    "Q5_1": _dequant_q5_1,
    "Q4_K": _dequant_q4_k,
    "Q5_K": _dequant_q5_k,
    "Q6_K": _dequant_q6_k,
}


def float32_to_bfloat16_bits(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 bits as torch's tensor cast does: nearest, ties to even; NaN -> 0xFFFF.

    0xFFFF (a quiet NaN) is what PyTorch's vectorised CPU cast writes for every NaN on x86-64; its
    scalar ``c10::BFloat16`` constructor writes 0x7FC0 instead. Both are NaN.
    """
    bits = values.view(np.uint32)
    rounded = ((bits + (np.uint32(0x7FFF) + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(BF16_NAN_BITS), rounded)


def dequantize(blocks: np.ndarray, qt: _common.QuantType, out_flat: np.ndarray, dtype: str, threads: int) -> None:
    """Dequantise (n_blocks * block_bytes) uint8 into `out_flat` (n_values of `dtype`; bf16 as uint16)."""
    del threads  # single-threaded
    kernel = _KERNELS[qt.name]
    blocks = blocks.reshape(-1, qt.block_bytes)
    with np.errstate(all="ignore"):  # NaN/inf scales are data, not errors
        for start in range(0, blocks.shape[0], _DEQUANT_CHUNK_BLOCKS):
            chunk = blocks[start:start + _DEQUANT_CHUNK_BLOCKS]
            values = kernel(chunk).astype(np.float32, copy=False).reshape(-1)
            dest = out_flat[start * qt.block_values:start * qt.block_values + values.size]
            if dtype == "float32":
                dest[:] = values
            elif dtype == "float16":
                dest[:] = values.astype(np.float16)
            else:
                dest[:] = float32_to_bfloat16_bits(values)


# ---------------------------------------------------------------------------------------------
# Arena engine: best fit over an address-ordered free list in an anonymous mmap (O(free runs) per
# allocation and free; the C engine is the fast one, this one keeps the API working without a compiler).


class ArenaEngine:
    """Python twin of the C arena: same alignment rules, same statistics, same errors."""

    def __init__(self, capacity_bytes: int, alignment: int, release_threshold: int) -> None:
        self.capacity = capacity_bytes
        self._release_threshold = release_threshold
        self.alignment = alignment
        self._map = mmap.mmap(-1, capacity_bytes, flags=mmap.MAP_PRIVATE)  # anonymous (fd -1), not shared
        self._view = np.frombuffer(self._map, dtype=np.uint8)
        self.base_address = self._view.ctypes.data
        self._lock = threading.Lock()
        self._free_starts: list[int] = [0]  # sorted offsets of free runs
        self._free_size: dict[int, int] = {0: capacity_bytes}
        self._used: dict[int, int] = {}  # handle (= offset) -> size
        self._used_bytes = 0
        self._high_water = 0
        self._alloc_count = 0
        self._failed = 0

    def alloc(self, nbytes: int) -> tuple[int, int] | None:
        size = -(-max(nbytes, 1) // self.alignment) * self.alignment
        with self._lock:
            best = None
            for start in self._free_starts:
                run = self._free_size[start]
                if run >= size and (best is None or run < self._free_size[best]):
                    best = start
            if best is None:
                self._failed += 1
                return None
            run = self._free_size.pop(best)
            self._free_starts.remove(best)
            if run > size:
                bisect.insort(self._free_starts, best + size)
                self._free_size[best + size] = run - size
            self._used[best] = size
            self._used_bytes += size
            self._high_water = max(self._high_water, self._used_bytes)
            self._alloc_count += 1
            return best, best

    def free(self, handle: int) -> None:
        with self._lock:
            size = self._used.pop(handle, None)
            if size is None:
                raise InvalidInputError(f"arena free: no live allocation with handle {handle}")
            self._used_bytes -= size
            start, end = handle, handle + size
            i = bisect.bisect_left(self._free_starts, start)
            if i < len(self._free_starts) and self._free_starts[i] == end:  # merge with the next run
                end += self._free_size.pop(end)
                self._free_starts.pop(i)
            if i > 0:
                prev = self._free_starts[i - 1]
                if prev + self._free_size[prev] == start:  # merge with the previous run
                    start = prev
            if start not in self._free_size:
                bisect.insort(self._free_starts, start)
            self._free_size[start] = end - start
            self._release_pages(start, end)

    def _release_pages(self, start: int, end: int) -> None:
        """madvise(MADV_DONTNEED) the whole pages of a free run of at least release_threshold bytes."""
        if not self._release_threshold or end - start < self._release_threshold:
            return
        page = mmap.PAGESIZE
        lo, hi = -(-start // page) * page, end // page * page
        if hi > lo and hasattr(self._map, "madvise"):
            self._map.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    def stats(self) -> dict[str, int]:
        with self._lock:
            runs = [self._free_size[s] for s in self._free_starts]
            return {
                "capacity_bytes": self.capacity,
                "used_bytes": self._used_bytes,
                "free_bytes": sum(runs),
                "high_water_bytes": self._high_water,
                "largest_free_bytes": max(runs, default=0),
                "free_blocks": len(runs),
                "live_allocations": len(self._used),
                "total_allocations": self._alloc_count,
                "failed_allocations": self._failed,
            }
