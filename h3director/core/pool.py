"""SlotPool: one pre-allocated block per device, leased out as tensor views over runs of slots.

Layout and conventions
----------------------
The pool owns one ``uint8`` block of ``slot_count * slot_bytes`` bytes on its device (CPU, CUDA or
MPS; on CUDA it is allocated inside its own ``torch.cuda.MemPool`` when PyTorch has one, so the
caching allocator's snapshot shows it as a separate pool). A lease of ``nbytes`` takes a run of
``ceil(nbytes / slot_bytes)`` contiguous slots (at least one) and hands out a tensor view of any
dtype and shape over the first ``nbytes`` of it. Sizes are in bytes; slot indices count slots.

Placement follows the lease's generation, a lifetime class the caller states: 0 (default) dies
within the step that made it (activations, tile scratch), 1 lives across steps within one unit of
work such as a clip (tile outputs, the stitched clip), 2 outlives it (a cross-fade tail carried to
the next clip, buffers kept for the whole job).

- generation 0: best fit, the smallest free run that holds it, carved from its low end, so scratch
  fills holes instead of cutting into the large free run;
- generation 1: the lowest-addressed run that holds it, low end, so these stack compactly at the
  bottom and their space rejoins the free middle when the unit of work ends;
- generation 2: the highest-addressed run that holds it, high end, so long-lived memory gathers at
  the top and does not pin holes between shorter-lived leases.

`bench/fragmentation.py` measures what this buys on an H3 decode + upscale trace.

Invariants (checked by the property tests in ``tests/test_pool.py``):

1. No two live leases overlap, and every lease lies inside the block.
2. Free runs are maximal: no two free runs touch (freed runs coalesce with both neighbours).
3. Live lease slots + free run slots == slot_count; ``used_bytes == leased slots * slot_bytes``.
4. ``stats().fragmentation`` is `h3director.fragmentation.fragmentation` of the free runs.

Release
-------
A lease is released explicitly (``lease.release()``), by leaving its ``with`` block, or when the
last tensor that views its memory is garbage collected: the tensor's storage owns a small region
object and ``weakref.finalize`` on that object queues the release (views derived from the lease
tensor keep the region alive, so memory is never reused while any view exists). Queued releases
are applied at the next pool call, never inside a garbage-collector callback. Using a lease tensor
after an explicit release is a caller bug, like using memory after ``free``.

Generations
-----------
Leases carry a generation: 0 young, 1, 2 old. A collection of generation ``g`` applies queued
releases, runs Python's cyclic collector on generations <= g (this frees unreachable reference
cycles, such as a stored exception's traceback, that still hold lease tensors), then promotes
the surviving leases of generation <= g by one. A young collection runs at most every
``generation_gc_interval_ms`` when the pool is used and every tenth one also collects generation
1; when a request does not fit, collections of 0, 1 and 2 run in turn before giving up ("pressure";
a full collection of generation 2 at most once per ten intervals, as it walks every Python object).
Each collection's cost is measured (`CollectionReport.seconds`). What it reclaimed
(`CollectionReport.reclaimed_leases` / ``reclaimed_bytes``, summed in ``stats().reclaimed_by_collection``)
is every lease, of any generation, whose slots it returned: those whose tensors died since the last pool
call and those Python's collector freed.

Fallback
--------
A request the pool cannot serve (too large, or no run fits after collecting) is served by the
framework allocator (``torch.empty``) and counted in ``fallback_count``; its bytes count as
``fallback_live_bytes`` until its tensor is collected.
"""

from __future__ import annotations

import collections
import gc
import itertools
import math
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from h3director.errors import InvalidInputError
from h3director.fragmentation import fragmentation
from h3director.units import MiB

YOUNG, MIDDLE, OLD = 0, 1, 2
_GENERATIONS = (YOUNG, MIDDLE, OLD)
_SLOT_ALIGNMENT = 64        # bytes; any dtype's view of a slot start is aligned
_OLD_COLLECTION_EVERY = 10  # every tenth periodic collection is of generation 1; full ones at most every tenth interval
_MONITOR_UNITS = {"pool_used_bytes": "bytes", "pool_fragmentation": "ratio", "pool_fallback_bytes": "bytes"}


@dataclass(frozen=True)
class PoolStats:
    """A consistent picture of the pool (bytes unless the name says otherwise)."""

    capacity_bytes: int
    slot_bytes: int
    slot_count: int
    used_bytes: int            # slots held by live leases, in bytes
    requested_bytes: int       # bytes the live leases asked for (<= used_bytes; the rest is slot rounding)
    free_bytes: int
    largest_free_bytes: int
    fragmentation: float       # 1 - largest_free / free, see h3director.fragmentation
    live_leases: int
    leases_by_generation: tuple[int, int, int]
    fallback_count: int        # requests served by the framework allocator since creation
    fallback_live_count: int
    fallback_live_bytes: int
    collections: int
    collection_seconds_total: float
    reclaimed_by_collection: int

    @property
    def used_fraction(self) -> float:
        return self.used_bytes / self.capacity_bytes if self.capacity_bytes else 0.0


@dataclass(frozen=True)
class CollectionReport:
    """What one generation collection did and what it cost (wall seconds)."""

    generation: int
    reclaimed_leases: int
    reclaimed_bytes: int
    promoted: int
    seconds: float


@dataclass
class _LeaseRecord:
    lease_id: int
    start: int                 # first slot; -1 for a fallback allocation
    slots: int
    nbytes: int
    generation: int
    released: bool = False
    finalizer: weakref.finalize | None = field(default=None, repr=False)

    @property
    def from_pool(self) -> bool:
        return self.start >= 0


class _Region:
    """Owns a lease's bytes as seen by PyTorch: the lease tensor's storage holds this object.

    It exposes the bytes through ``__array_interface__`` (CPU, via numpy) or
    ``__cuda_array_interface__`` (CUDA); PyTorch keeps the exporting object alive for as long as the
    storage lives, so a ``weakref.finalize`` on it fires exactly when the last view is gone. It also
    holds the backing tensor, so the pool block outlives every lease tensor.
    """

    __slots__ = ("_backing", "_offset", "_nbytes", "__weakref__")

    def __init__(self, backing: torch.Tensor, offset: int, nbytes: int) -> None:
        self._backing = backing
        self._offset = offset
        self._nbytes = nbytes

    def _interface(self) -> dict:
        return {
            "shape": (self._nbytes,),
            "typestr": "|u1",
            "data": (self._backing.data_ptr() + self._offset, False),
            "version": 2,
            "strides": None,
        }

    @property
    def __array_interface__(self) -> dict:
        return self._interface()

    @property
    def __cuda_array_interface__(self) -> dict:
        return self._interface()


def _region_tensor(backing: torch.Tensor, offset: int, nbytes: int) -> tuple[torch.Tensor, object]:
    """A uint8 tensor over ``backing[offset:offset+nbytes]`` and the object whose death means "no view left".

    On MPS (no array interface) the tensor is a plain slice and the owner is that tensor itself:
    there, a view derived from a lease tensor does not keep the lease alive.
    """
    kind = backing.device.type
    if kind == "cpu":
        import numpy as np

        region = _Region(backing, offset, nbytes)
        return torch.from_numpy(np.asarray(region)), region
    if kind == "cuda":
        region = _Region(backing, offset, nbytes)
        return torch.as_tensor(region, device=backing.device), region
    view = backing[offset:offset + nbytes]
    return view, view


def _nbytes_of(shape: Sequence[int], dtype: torch.dtype) -> int:
    dims = tuple(int(d) for d in shape)
    if any(d < 0 for d in dims):
        raise InvalidInputError(f"lease shape must have non-negative sizes, got {tuple(shape)}")
    return math.prod(dims) * dtype.itemsize


def _shaped(raw: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """``raw`` (uint8, 1-D) reinterpreted as ``dtype`` and ``shape`` without copying."""
    typed = raw if dtype == torch.uint8 else raw.view(dtype)
    return typed if typed.shape == shape else typed.view(shape)


class Lease:
    """A tensor view handed out by `SlotPool.lease`; release it with `release()` or a ``with`` block.

    `tensor` has the requested shape and dtype. `from_pool` is False when the framework allocator
    served the request (the pool was full or the request larger than the pool).
    """

    __slots__ = ("_pool", "_record", "tensor")

    def __init__(self, pool: SlotPool, record: _LeaseRecord, tensor: torch.Tensor) -> None:
        self._pool = pool
        self._record = record
        self.tensor = tensor

    @property
    def lease_id(self) -> int:
        return self._record.lease_id

    @property
    def nbytes(self) -> int:
        return self._record.nbytes

    @property
    def from_pool(self) -> bool:
        return self._record.from_pool

    @property
    def slot_start(self) -> int:
        """First slot of the lease (-1 for a fallback allocation)."""
        return self._record.start

    @property
    def slot_count(self) -> int:
        return self._record.slots

    @property
    def generation(self) -> int:
        return self._record.generation

    @property
    def released(self) -> bool:
        return self._record.released

    def release(self) -> None:
        """Give the slots back now (idempotent). The tensor must not be used afterwards."""
        self._pool._release(self._record)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    def __repr__(self) -> str:
        where = f"slots {self.slot_start}..{self.slot_start + self.slot_count - 1}" if self.from_pool else "fallback"
        return f"Lease(id={self.lease_id}, {self.nbytes} B, {where}, gen {self.generation}, released={self.released})"


class SlotPool:
    """A pre-allocated block of ``capacity_bytes`` on ``device``, leased out in runs of ``slot_bytes`` slots.

    ``capacity_bytes`` is rounded down to whole slots and must hold at least one; ``slot_bytes`` must be
    a positive multiple of 64. ``generation_gc_interval_ms`` spaces the periodic young collections
    (0 disables them; collections on pressure still run unless ``generation_gc=False``).
    ``use_cuda_mem_pool`` puts the CUDA block in its own ``torch.cuda.MemPool`` when available.
    See the module docstring for the layout, invariants, release rules and generations.
    """

    def __init__(
        self,
        capacity_bytes: int,
        slot_bytes: int = 64 * MiB,
        device: str | torch.device = "cpu",
        *,
        generation_gc: bool = True,
        generation_gc_interval_ms: int = 120,
        use_cuda_mem_pool: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if slot_bytes <= 0 or slot_bytes % _SLOT_ALIGNMENT:
            raise InvalidInputError(f"slot_bytes must be a positive multiple of {_SLOT_ALIGNMENT}, got {slot_bytes}")
        if capacity_bytes < slot_bytes:
            raise InvalidInputError(
                f"pool capacity {capacity_bytes} B is smaller than one slot ({slot_bytes} B)"
            )
        if generation_gc_interval_ms < 0:
            raise InvalidInputError(f"generation_gc_interval_ms must be >= 0, got {generation_gc_interval_ms}")
        self.device = torch.device(device)
        self.slot_bytes = int(slot_bytes)
        self.slot_count = int(capacity_bytes) // self.slot_bytes
        self.capacity_bytes = self.slot_count * self.slot_bytes
        self.generation_gc = generation_gc
        self.generation_gc_interval_s = generation_gc_interval_ms / 1000.0
        self._clock = clock
        self._mem_pool = None
        self._block = self._allocate_block(use_cuda_mem_pool)
        self._lock = threading.RLock()
        self._ids = itertools.count(1)
        self._free: dict[int, int] = {0: self.slot_count}        # start -> length
        self._free_by_end: dict[int, int] = {self.slot_count: 0}  # end (exclusive) -> start
        self._live: dict[int, _LeaseRecord] = {}
        self._fallback_live: dict[int, _LeaseRecord] = {}
        self._pending: collections.deque[int] = collections.deque()
        self._fallback_count = 0
        self._collections = 0
        self._periodic_collections = 0
        self._collection_seconds = 0.0
        self._reclaimed_by_collection = 0
        self._last_collection = self._clock()
        self._last_full_collection = -math.inf
        self.collection_log: list[CollectionReport] = []

    @classmethod
    def from_config(cls, config, device: str | torch.device = "cpu") -> SlotPool | None:
        """Build the pool an `H3Config` asks for, or None when it asks for none.

        Uses ``pre_allocated_pool_mb``, ``pool_slot_mb`` and ``generation_gc_interval_ms``;
        ``features().pool`` / ``features().generation_gc`` switch the pool and its collections.
        """
        features = config.features()
        if not features.pool:  # off below level 1 and when pre_allocated_pool_mb is 0
            return None
        return cls(
            config.pool_bytes,
            config.pool_slot_bytes,
            device,
            generation_gc=features.generation_gc,
            generation_gc_interval_ms=config.generation_gc_interval_ms,
        )

    def _allocate_block(self, use_cuda_mem_pool: bool) -> torch.Tensor:
        if self.device.type == "cuda" and use_cuda_mem_pool and hasattr(torch.cuda, "MemPool"):
            self._mem_pool = torch.cuda.MemPool()
            with torch.cuda.use_mem_pool(self._mem_pool, device=self.device):
                return torch.empty(self.capacity_bytes, dtype=torch.uint8, device=self.device)
        return torch.empty(self.capacity_bytes, dtype=torch.uint8, device=self.device)

    @property
    def base_pointer(self) -> int:
        """Address of slot 0 (for checks that lease tensors really live where their slots say)."""
        return self._block.data_ptr()

    # ------------------------------------------------------------------ leasing

    def lease(self, shape: Sequence[int] | int, dtype: torch.dtype = torch.float32, *, generation: int = YOUNG) -> Lease:
        """A tensor of ``shape`` and ``dtype`` over pool slots, or from the framework allocator if none fit.

        ``generation`` is the lifetime class that decides placement: 0 (default) dies within the current
        step, 1 lives across steps of one unit of work (a clip), 2 outlives it (see the module docstring).
        """
        if generation not in _GENERATIONS:
            raise InvalidInputError(f"generation must be one of {_GENERATIONS}, got {generation!r}")
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = _nbytes_of(shape, dtype)
        slots = max(1, math.ceil(nbytes / self.slot_bytes))
        with self._lock:
            self._drain_pending()
            self._maybe_collect_periodically()
            start = self._take(slots, generation) if slots <= self.slot_count else None
            if start is None and slots <= self.slot_count and self.generation_gc:
                start = self._collect_under_pressure(slots, generation)
            if start is None:
                return self._fallback(shape, dtype, nbytes, generation)
            record = _LeaseRecord(next(self._ids), start, slots, nbytes, generation)
            raw, owner = _region_tensor(self._block, start * self.slot_bytes, nbytes)
            self._live[record.lease_id] = record
        record.finalizer = weakref.finalize(owner, self._pending.append, record.lease_id)
        return Lease(self, record, _shaped(raw, dtype, shape))

    def _fallback(self, shape: tuple[int, ...], dtype: torch.dtype, nbytes: int, generation: int) -> Lease:
        record = _LeaseRecord(next(self._ids), -1, 0, nbytes, generation)
        backing = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        raw, owner = _region_tensor(backing, 0, nbytes)
        self._fallback_count += 1
        self._fallback_live[record.lease_id] = record
        record.finalizer = weakref.finalize(owner, self._pending.append, record.lease_id)
        return Lease(self, record, _shaped(raw, dtype, shape))

    def _take(self, slots: int, generation: int) -> int | None:
        """Place ``slots`` by lifetime class (see "Placement" in the module docstring); None if nothing fits."""
        fitting = [(start, length) for start, length in self._free.items() if length >= slots]
        if not fitting:
            return None
        if generation == YOUNG:
            start, length = min(fitting, key=lambda run: (run[1], run[0]))    # best fit, lowest on ties
        elif generation == MIDDLE:
            start, length = min(fitting)                                     # lowest-addressed fit
        else:
            start, length = max(fitting)                                     # highest-addressed fit
        self._remove_free(start)
        if generation == OLD:
            taken = start + length - slots
            if taken > start:
                self._add_free(start, taken - start)
        else:
            taken = start
            if length > slots:
                self._add_free(start + slots, length - slots)
        return taken

    def _add_free(self, start: int, length: int) -> None:
        self._free[start] = length
        self._free_by_end[start + length] = start

    def _remove_free(self, start: int) -> int:
        length = self._free.pop(start)
        del self._free_by_end[start + length]
        return length

    def _give_back(self, start: int, length: int) -> None:
        """Return slots to the free map, merging with the free runs on either side."""
        end = start + length
        left = self._free_by_end.get(start)
        if left is not None:
            length += self._remove_free(left)
            start = left
        if end in self._free:
            length += self._remove_free(end)
        self._add_free(start, length)

    # ------------------------------------------------------------------ release

    def _release(self, record: _LeaseRecord) -> None:
        with self._lock:
            self._release_locked(record)

    def _release_locked(self, record: _LeaseRecord) -> bool:
        if record.released:
            return False
        record.released = True
        if record.finalizer is not None:
            record.finalizer.detach()
        if record.from_pool:
            del self._live[record.lease_id]
            self._give_back(record.start, record.slots)
        else:
            del self._fallback_live[record.lease_id]
        return True

    def _drain_pending(self) -> list[_LeaseRecord]:
        """Apply releases queued by finalizers (tensors that were garbage collected)."""
        released = []
        while self._pending:
            lease_id = self._pending.popleft()
            record = self._live.get(lease_id) or self._fallback_live.get(lease_id)
            if record is not None and self._release_locked(record):
                released.append(record)
        return released

    # ------------------------------------------------------------------ generations

    def collect(self, generation: int = YOUNG) -> CollectionReport:
        """Collect generations <= ``generation`` now (see the module docstring); returns what it did."""
        if generation not in _GENERATIONS:
            raise InvalidInputError(f"generation must be one of {_GENERATIONS}, got {generation!r}")
        with self._lock:
            return self._collect_locked(generation)

    def _collect_locked(self, generation: int) -> CollectionReport:
        started = time.perf_counter()
        # Every lease whose slots this collection returns counts, whatever its lifetime class: those whose
        # tensors died since the last pool call and those the cyclic collector frees. (The pool's generations
        # are lifetime classes, not Python's collector generations: `gc.collect(0)` frees a clip's buffers,
        # class 1, when a young reference cycle held them.)
        reclaimed = self._drain_pending()
        gc.collect(generation)
        reclaimed += self._drain_pending()
        promoted = 0
        for record in itertools.chain(self._live.values(), self._fallback_live.values()):
            if record.generation <= generation and record.generation < OLD:
                record.generation += 1
                promoted += 1
        seconds = time.perf_counter() - started
        report = CollectionReport(
            generation, len(reclaimed), sum(r.nbytes for r in reclaimed), promoted, seconds
        )
        self._collections += 1
        self._collection_seconds += seconds
        self._reclaimed_by_collection += len(reclaimed)
        self._last_collection = self._clock()
        self.collection_log.append(report)
        del self.collection_log[:-256]
        return report

    def _collect_under_pressure(self, slots: int, generation: int) -> int | None:
        """Collect generations 0, 1, then 2 until ``slots`` fit; returns the placement or None.

        A full (generation 2) collection walks every Python object, so under sustained pressure it runs
        at most once per ``_OLD_COLLECTION_EVERY`` collection intervals; the cheaper ones run every time.
        """
        for gen in _GENERATIONS:
            now = self._clock()
            if gen == OLD and now - self._last_full_collection < _OLD_COLLECTION_EVERY * self.generation_gc_interval_s:
                break
            if gen == OLD:
                self._last_full_collection = now
            self._collect_locked(gen)
            start = self._take(slots, generation)
            if start is not None:
                return start
        return None

    def _maybe_collect_periodically(self) -> None:
        if not self.generation_gc or self.generation_gc_interval_s <= 0:
            return
        if self._clock() - self._last_collection < self.generation_gc_interval_s:
            return
        self._periodic_collections += 1
        self._collect_locked(MIDDLE if self._periodic_collections % _OLD_COLLECTION_EVERY == 0 else YOUNG)

    # ------------------------------------------------------------------ views of the state

    def free_runs(self) -> list[tuple[int, int]]:
        """Free runs as ``(first_slot, slot_count)``, sorted by first slot."""
        with self._lock:
            self._drain_pending()
            return sorted(self._free.items())

    def live_leases(self) -> list[tuple[int, int, int]]:
        """Live pool leases as ``(first_slot, slot_count, generation)``, sorted by first slot."""
        with self._lock:
            self._drain_pending()
            return sorted((r.start, r.slots, r.generation) for r in self._live.values())

    def stats(self) -> PoolStats:
        with self._lock:
            self._drain_pending()
            runs = [length * self.slot_bytes for length in self._free.values()]
            used_slots = sum(r.slots for r in self._live.values())
            by_gen = [0, 0, 0]
            for record in self._live.values():
                by_gen[record.generation] += 1
            return PoolStats(
                capacity_bytes=self.capacity_bytes,
                slot_bytes=self.slot_bytes,
                slot_count=self.slot_count,
                used_bytes=used_slots * self.slot_bytes,
                requested_bytes=sum(r.nbytes for r in self._live.values()),
                free_bytes=sum(runs),
                largest_free_bytes=max(runs, default=0),
                fragmentation=fragmentation(runs),
                live_leases=len(self._live),
                leases_by_generation=(by_gen[0], by_gen[1], by_gen[2]),
                fallback_count=self._fallback_count,
                fallback_live_count=len(self._fallback_live),
                fallback_live_bytes=sum(r.nbytes for r in self._fallback_live.values()),
                collections=self._collections,
                collection_seconds_total=self._collection_seconds,
                reclaimed_by_collection=self._reclaimed_by_collection,
            )

    def _monitor_values(self) -> dict[str, float]:
        """The pool's monitor series from one `stats()`: bytes in use, fragmentation, live fallback bytes."""
        stats = self.stats()
        return {
            "pool_used_bytes": float(stats.used_bytes),
            "pool_fragmentation": stats.fragmentation,
            "pool_fallback_bytes": float(stats.fallback_live_bytes),
        }

    def monitor_series(self) -> dict[str, Callable[[], float]]:
        """Series for `Monitor.add_series`: pool bytes in use, fragmentation, live fallback bytes."""
        return {name: (lambda name=name: self._monitor_values()[name]) for name in _MONITOR_UNITS}

    def attach_to_monitor(self, monitor) -> None:
        """Add the pool's series to an `h3director.core.monitor.Monitor` (fragmentation as a "ratio"); one
        reader serves all of them, so each sample takes one `stats()`."""
        reader = self._monitor_values  # one bound method: the monitor calls a shared reader once per sample
        for name, unit in _MONITOR_UNITS.items():
            monitor.add_series(name, reader, unit=unit)


__all__ = ["MIDDLE", "OLD", "YOUNG", "CollectionReport", "Lease", "PoolStats", "SlotPool"]
