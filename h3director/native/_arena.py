"""Host arena leases: numpy arrays and torch tensors that live in one pre-mapped region.

Lifetime rule: a block goes back to the arena only when nothing refers to it any more. Each block
has a Python owner object (`_Block`); every numpy array made from a lease has that owner as its
`.base`, and torch tensors made with `torch.from_numpy` keep that array alive. So
`Lease.release()` (or leaving the `with` block) only drops the lease's own reference: an array or
tensor that outlives its lease keeps its bytes valid, and they are freed when it dies.

Library-only: no pipeline of the director leases from an `Arena` (the native core's packing and dequantising
accept a lease view as ``out``; a caller that wants reused, pre-mapped host buffers uses it directly). The
host path it would fit, the per-clip uint8 staging of a decode to MP4, was measured (`bench/arena_staging.py`,
docs/NATIVE.md): reusing an arena's pages makes the packing faster only by keeping the staging resident between
clips, which a long-lived host such as ComfyUI would then hold for good, and at memory level >= 1 with the slot
pool on the CPU that staging already comes from the pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from h3director.errors import H3DirectorError, InvalidInputError
from h3director.fragmentation import fragmentation_of
from h3director.native import _common


class ArenaFullError(H3DirectorError, MemoryError):
    """The arena has no free run large enough for the requested lease."""


@dataclass(frozen=True)
class ArenaStats:
    """A snapshot of an arena, in bytes. `fragmentation` is h3director.fragmentation's number."""

    capacity_bytes: int
    used_bytes: int  # bytes in live blocks (each rounded up to the alignment)
    free_bytes: int
    high_water_bytes: int  # largest used_bytes seen since creation
    largest_free_bytes: int
    free_blocks: int
    live_allocations: int
    total_allocations: int
    failed_allocations: int
    fragmentation: float  # 1 - largest_free / free, 0.0 when nothing is free


class _Block:
    """Owner of one allocation; frees it when garbage-collected. Exposes `__array_interface__`."""

    def __init__(self, engine: Any, handle: int, offset: int, nbytes: int) -> None:
        self._engine = engine
        self._handle = handle
        self.offset = offset
        self.nbytes = nbytes
        self.__array_interface__ = {
            "version": 3,
            "shape": (nbytes,),
            "typestr": "|u1",
            "data": (engine.base_address + offset, False),
        }

    def __del__(self) -> None:
        engine, self._engine = getattr(self, "_engine", None), None
        if engine is not None:
            engine.free(self._handle)


class Lease:
    """`nbytes` bytes of an arena, aligned to the arena's alignment. Use `.numpy()` / `.torch()` views.

    The views share the arena's memory (no copy). `release()` / leaving the `with` block ends the
    lease; memory returns to the arena once every view made from it has been garbage-collected.
    """

    def __init__(self, block: _Block) -> None:
        self._block: _Block | None = block
        self.nbytes = block.nbytes
        self.offset = block.offset

    def _owner(self) -> _Block:
        if self._block is None:
            raise InvalidInputError("this lease was released; take a new lease for new views")
        return self._block

    def _view_shape(self, shape: tuple[int, ...] | None, itemsize: int, dtype: Any) -> tuple[tuple[int, ...], int]:
        """(`shape`, bytes it needs) for a view of `itemsize`-byte items; None: as many as fit, flat."""
        shape = (self.nbytes // itemsize,) if shape is None else tuple(int(s) for s in shape)
        need = int(np.prod(shape, dtype=np.int64)) * itemsize
        if any(s < 0 for s in shape) or need > self.nbytes:
            raise InvalidInputError(f"shape {shape} of {dtype} needs {need} bytes; the lease holds {self.nbytes}")
        return shape, need

    def numpy(self, dtype: Any = np.uint8, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A numpy view of the leased bytes as `dtype`, flat (as many items as fit) or in `shape`."""
        dtype = np.dtype(dtype)
        raw = np.asarray(self._owner())
        shape, need = self._view_shape(shape, dtype.itemsize, dtype)
        return raw[:need].view(dtype).reshape(shape)

    def torch(self, dtype: Any = None, shape: tuple[int, ...] | None = None) -> Any:
        """A CPU torch tensor viewing the leased bytes (any torch dtype, bfloat16 included)."""
        import torch

        dtype = torch.uint8 if dtype is None else dtype
        shape, need = self._view_shape(shape, torch.empty((), dtype=dtype).element_size(), dtype)
        return torch.from_numpy(np.asarray(self._owner())[:need]).view(dtype).reshape(shape)

    def release(self) -> None:
        """End the lease (idempotent). Views already made stay valid until they are garbage-collected."""
        self._block = None

    @property
    def released(self) -> bool:
        return self._block is None

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Arena:
    """One anonymous memory mapping of `capacity_bytes`, handed out as aligned leases.

    `alignment` (bytes, a power of two from 16 to 2 MiB; 64 by default, 4096 for page-aligned
    buffers) applies to every lease's start and size. Thread-safe. Freed runs of at least
    `release_threshold` bytes are returned to the OS with madvise(MADV_DONTNEED) by the C backend
    (None: never). `backend` picks "c" or "numpy" (default: the active backend, see `backend()`).
    """

    def __init__(
        self,
        capacity_bytes: int,
        alignment: int = _common.DEFAULT_ALIGNMENT,
        *,
        release_threshold: int | None = None,
        backend: str | None = None,
    ) -> None:
        if not _common.is_integer(capacity_bytes) or not 0 < capacity_bytes <= _common.MAX_CAPACITY:
            raise InvalidInputError(
                f"capacity_bytes must be an integer in [1, {_common.MAX_CAPACITY}], got {capacity_bytes!r}")
        if not _common.is_integer(alignment) or not 16 <= alignment <= _common.MAX_ALIGNMENT or alignment & (alignment - 1):
            raise InvalidInputError(f"alignment must be a power of two in [16, 2 MiB], got {alignment!r}")
        if release_threshold is not None and release_threshold <= 0:
            raise InvalidInputError(f"release_threshold must be positive or None, got {release_threshold!r}")
        capacity = -(-int(capacity_bytes) // int(alignment)) * int(alignment)
        from h3director.native._loader import implementation

        self._impl = implementation(backend)
        self._engine = self._impl.ArenaEngine(capacity, int(alignment), int(release_threshold or 0))
        self.capacity_bytes = capacity
        self.alignment = int(alignment)

    @property
    def backend(self) -> str:
        return self._impl.NAME

    def lease(self, nbytes: int) -> Lease:
        """Lease `nbytes` (> 0) bytes; raises ArenaFullError when no free run is large enough."""
        if not _common.is_integer(nbytes) or nbytes <= 0:
            raise InvalidInputError(f"nbytes must be a positive integer, got {nbytes!r}")
        if nbytes > self.capacity_bytes:
            raise ArenaFullError(f"lease of {nbytes} bytes exceeds the arena capacity of {self.capacity_bytes} bytes")
        got = self._engine.alloc(int(nbytes))
        if got is None:
            stats = self.stats()
            raise ArenaFullError(
                f"no free run of {nbytes} bytes in the arena (free {stats.free_bytes} bytes, "
                f"largest run {stats.largest_free_bytes} bytes)"
            )
        handle, offset = got
        return Lease(_Block(self._engine, handle, offset, int(nbytes)))

    def stats(self) -> ArenaStats:
        counts = self._engine.stats()  # every field but fragmentation, derived here for both backends
        free, largest = counts["free_bytes"], counts["largest_free_bytes"]
        return ArenaStats(**counts, fragmentation=fragmentation_of(largest, free))
