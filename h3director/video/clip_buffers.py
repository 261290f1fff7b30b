"""Where a streaming decode's per-clip buffers come from, and the collections between clips.

`ClipBuffers` is handed to the scheduler (and through `FrameSink.use_buffers` to the sink). It
serves three buffers per clip:

- the clip output: the final frames of one clip, assembled (cross-faded body + tail) into one
  buffer, lifetime class 1 (one clip);
- the cross-fade tail carried to the next clip, lifetime class 2 (outlives the clip);
- the uint8 staging of a sink that converts frames to bytes before handing them on (the video-file
  sink's per-clip frame array), lifetime class 1.

With a `SlotPool` (memory level >= 1 and ``pre_allocated_pool_mb`` > 0) each buffer on the pool's
device is leased from it; a request the pool cannot serve is served by ``torch.empty`` inside the
pool and counted as a fallback; a buffer on another device (a clip retried on the CPU, staging on
the host while the pool is on a GPU) is a plain allocation and counted in `unpooled`. Without a
pool every buffer is a plain allocation. Leases go back to the pool when their tensors are
garbage collected (see `h3director.core.pool`), so a sink that keeps a view keeps the slots.

``collect_between_clips`` (memory level >= 2): after each clip a young-generation collection runs
(the pool's `collect`, else Python's ``gc.collect(0)``), so buffers held by reference cycles of the
finished clip are freed before the next clip allocates. Exact by construction: only where bytes
live and when they are freed changes, never a value (the buffers are filled by copies).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from h3director.core.pool import MIDDLE, OLD, YOUNG, SlotPool

CLIP = MIDDLE
"""Lifetime class of a clip's output and staging buffers."""
CARRIED = OLD
"""Lifetime class of the cross-fade tail carried to the next clip."""


@dataclass(frozen=True)
class BufferCounts:
    """What a decode's buffers did: pool leases served, fallbacks (pool full or too small), plain
    allocations outside the pool, collections run between clips, and the pool leases / bytes those
    collections returned to the pool (counts and bytes, this decode only)."""

    pool_leases: int = 0
    pool_fallbacks: int = 0
    unpooled: int = 0
    collections: int = 0
    reclaimed_leases: int = 0
    reclaimed_bytes: int = 0


class ClipBuffers:
    """Per-clip buffers of one decode, from `pool` when given (see the module docstring)."""

    def __init__(self, pool: SlotPool | None = None, *, collect_between_clips: bool = False) -> None:
        self.pool = pool
        self.collect_between_clips = collect_between_clips
        self._leases = self._fallbacks = self._unpooled = self._collections = 0
        self._reclaimed_leases = self._reclaimed_bytes = 0

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str,
              generation: int = CLIP) -> torch.Tensor:
        """An uninitialised tensor of `shape`/`dtype` on `device` (leased when the pool lives there)."""
        device = torch.device(device)
        pool = self.pool
        if pool is None or not _same_device(pool.device, device):
            self._unpooled += 1
            return torch.empty(shape, dtype=dtype, device=device)
        lease = pool.lease(tuple(shape), dtype, generation=generation)
        if lease.from_pool:
            self._leases += 1
        else:
            self._fallbacks += 1
        return lease.tensor

    def copy(self, source: torch.Tensor, generation: int = CARRIED) -> torch.Tensor:
        """A copy of `source` in a buffer of its own (the carried tail)."""
        out = self.empty(tuple(source.shape), source.dtype, source.device, generation)
        out.copy_(source)
        return out

    def cat(self, parts: list[torch.Tensor], dim: int, generation: int = CLIP) -> torch.Tensor:
        """``torch.cat(parts, dim)`` written into one buffer (a single part is returned as it is)."""
        if len(parts) == 1:
            return parts[0]
        shape = list(parts[0].shape)
        shape[dim] = sum(part.shape[dim] for part in parts)
        out = self.empty(tuple(shape), parts[0].dtype, parts[0].device, generation)
        return torch.cat(parts, dim=dim, out=out)

    def staging_uint8(self, shape: tuple[int, ...]) -> torch.Tensor | None:
        """A host uint8 staging buffer from the pool when the pool is on the CPU, else None (the sink
        allocates its own)."""
        if self.pool is None or self.pool.device.type != "cpu":
            return None
        return self.empty(shape, torch.uint8, "cpu", CLIP)

    def after_clip(self) -> None:
        """Between clips: a young collection when `collect_between_clips` is on."""
        if not self.collect_between_clips:
            return
        if self.pool is not None:
            report = self.pool.collect(YOUNG)
            self._reclaimed_leases += report.reclaimed_leases
            self._reclaimed_bytes += report.reclaimed_bytes
        else:
            gc.collect(0)
        self._collections += 1

    def counts(self) -> BufferCounts:
        return BufferCounts(self._leases, self._fallbacks, self._unpooled, self._collections,
                            self._reclaimed_leases, self._reclaimed_bytes)


def _same_device(a: torch.device, b: torch.device) -> bool:
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device() if torch.cuda.is_available() else 0
    return (a.index if a.index is not None else current) == (b.index if b.index is not None else current)


__all__ = ["CARRIED", "CLIP", "BufferCounts", "ClipBuffers"]
