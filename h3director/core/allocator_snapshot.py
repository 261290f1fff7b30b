"""Fragmentation of PyTorch's CUDA caching allocator, read from ``torch.cuda.memory_snapshot()``.

The snapshot format (PyTorch's ``torch/csrc/cuda/memory_snapshot.cpp``, documented in
``torch.cuda.memory._snapshot``): a list of segments (one per ``cudaMalloc``), each a dict with
``device``, ``address``, ``total_size``, ``allocated_size``, ``active_size``, ``requested_size``,
``stream``, ``segment_type`` ("large"/"small"), ``segment_pool_id``, ``is_expandable``, ``frames``
and ``blocks``; each block has ``address``, ``size``, ``requested_size``, ``state`` and ``frames``,
where ``state`` is "active_allocated", "active_pending_free" (the documentation spells it
"active_awaiting_free") or "inactive". Blocks of a segment are listed in address order.

Free memory is the "inactive" blocks: cached by the allocator, reusable without a new ``cudaMalloc``.
A free run is a maximal sequence of address-adjacent inactive blocks inside one segment (segments
are separate ``cudaMalloc`` allocations, so runs never span two). The fragmentation reported is the
project's one definition, `h3director.fragmentation.fragmentation`, over those runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from h3director.errors import InvalidInputError
from h3director.fragmentation import fragmentation

_KNOWN_STATES = frozenset({"active_allocated", "active_pending_free", "active_awaiting_free", "inactive"})


@dataclass(frozen=True)
class AllocatorFragmentation:
    """The caching allocator's state on one device (bytes)."""

    device: int | None
    segments: int
    reserved_bytes: int         # sum of segment total_size
    allocated_bytes: int        # blocks in state active_allocated
    pending_free_bytes: int     # blocks freed but still in use by another stream
    inactive_bytes: int         # cached, reusable blocks
    largest_inactive_run_bytes: int
    free_runs: tuple[int, ...]  # sizes of the inactive runs
    fragmentation: float


def read_snapshot_fragmentation(
    snapshot: Iterable[Mapping] | Mapping,
    *,
    device: int | None = None,
    exclude_pool_ids: Iterable[tuple[int, int]] = (),
) -> AllocatorFragmentation:
    """Fragmentation of a memory snapshot's segments (optionally those of one ``device``).

    ``snapshot`` is the list ``torch.cuda.memory_snapshot()`` returns or the dict of
    ``torch.cuda.memory._snapshot()`` (its "segments" are read). ``exclude_pool_ids`` leaves out
    segments of the given ``segment_pool_id`` (e.g. a SlotPool's own ``MemPool``). Raises
    `InvalidInputError` on a structure that is not a snapshot.
    """
    segments = snapshot.get("segments") if isinstance(snapshot, Mapping) else snapshot
    if segments is None:
        raise InvalidInputError("memory snapshot dict has no 'segments' list")
    excluded = {tuple(p) for p in exclude_pool_ids}
    counted = reserved = allocated = pending = inactive = 0
    runs: list[int] = []
    for index, segment in enumerate(segments):
        try:
            if device is not None and segment["device"] != device:
                continue
            if excluded and tuple(segment.get("segment_pool_id", (0, 0))) in excluded:
                continue
            counted += 1
            reserved += int(segment["total_size"])
            run = 0
            run_end = None
            for block in segment["blocks"]:
                state, size, address = block["state"], int(block["size"]), int(block["address"])
                if state not in _KNOWN_STATES:
                    raise InvalidInputError(f"segment {index}: unknown block state {state!r}")
                if state == "inactive":
                    inactive += size
                    if run and address == run_end:
                        run += size
                    else:
                        if run:
                            runs.append(run)
                        run = size
                    run_end = address + size
                    continue
                if state == "active_allocated":
                    allocated += size
                else:
                    pending += size
                if run:
                    runs.append(run)
                run = 0
            if run:
                runs.append(run)
        except (KeyError, TypeError) as exc:
            raise InvalidInputError(f"segment {index} of the memory snapshot is malformed: {exc!r}") from exc
    return AllocatorFragmentation(
        device=device,
        segments=counted,
        reserved_bytes=reserved,
        allocated_bytes=allocated,
        pending_free_bytes=pending,
        inactive_bytes=inactive,
        largest_inactive_run_bytes=max(runs, default=0),
        free_runs=tuple(runs),
        fragmentation=fragmentation(runs),
    )


def cuda_allocator_fragmentation(device: int | None = None) -> AllocatorFragmentation:
    """`AllocatorFragmentation` (bytes) of the live CUDA caching allocator on `device` (an index; None: the
    current CUDA device), read from ``torch.cuda.memory_snapshot``. Raises `InvalidInputError` without a
    CUDA device, and under the ``cudaMallocAsync`` backend, which has no segment list.
    """
    import torch

    from h3director.core.devices import cuda_allocator_backend

    backend = cuda_allocator_backend()
    if backend is None:
        raise InvalidInputError("CUDA allocator fragmentation needs a CUDA device; none is available")
    if backend != "native":
        raise InvalidInputError(f"allocator backend is {backend!r}: only the native caching allocator has segments")
    index = torch.cuda.current_device() if device is None else int(device)
    return read_snapshot_fragmentation(torch.cuda.memory_snapshot(include_traces=False), device=index)


__all__ = ["AllocatorFragmentation", "cuda_allocator_fragmentation", "read_snapshot_fragmentation"]
