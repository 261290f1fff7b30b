"""The caching-allocator reader on snapshot-shaped data.

No GPU here, so the snapshots are built by hand. They mirror the real format exactly: every key
that PyTorch's ``torch/csrc/cuda/memory_snapshot.cpp`` (``segmentInfoToDict``) writes for a
segment and a block, with the state strings it uses ("active_allocated", "active_pending_free",
"inactive"), block addresses that advance by block size from the segment address, and the list
(``memory_snapshot()``) and dict (``memory._snapshot()``) containers.
"""

from __future__ import annotations

import pytest
import torch

from h3director.core.allocator_snapshot import cuda_allocator_fragmentation, read_snapshot_fragmentation
from h3director.errors import InvalidInputError

MiB = 1 << 20


def _segment(address: int, blocks: list[tuple[str, int]], *, device: int = 0, pool_id=(0, 0)) -> dict:
    """A segment dict with the keys of ``segmentInfoToDict``; ``blocks`` are (state, size) in address order."""
    block_dicts, cursor = [], address
    for state, size in blocks:
        block_dicts.append(
            {"address": cursor, "size": size, "requested_size": size if state != "inactive" else 0,
             "state": state, "frames": []}
        )
        cursor += size
    total = cursor - address
    allocated = sum(size for state, size in blocks if state == "active_allocated")
    active = sum(size for state, size in blocks if state != "inactive")
    return {
        "device": device, "address": address, "total_size": total, "allocated_size": allocated,
        "active_size": active, "requested_size": allocated, "stream": 0,
        "segment_type": "large" if total > MiB else "small", "segment_pool_id": pool_id,
        "is_expandable": False, "frames": [], "blocks": block_dicts,
    }


def _snapshot() -> list[dict]:
    return [
        # 20 MiB segment: inactive 2 + 3 MiB adjacent (one run of 5), allocated, inactive 4, pending 1.
        _segment(0x7F0000000000, [("inactive", 2 * MiB), ("inactive", 3 * MiB), ("active_allocated", 10 * MiB),
                                  ("inactive", 4 * MiB), ("active_pending_free", 1 * MiB)]),
        # 2 MiB segment, entirely cached: one run of 2 (never merged with the other segment's runs).
        _segment(0x7F0010000000, [("inactive", 2 * MiB)]),
        # A small-pool segment: 512 KiB allocated then 1.5 MiB inactive.
        _segment(0x7F0020000000, [("active_allocated", MiB // 2), ("inactive", 3 * MiB // 2)]),
        # A different device and a private MemPool segment.
        _segment(0x7E0000000000, [("inactive", 64 * MiB)], device=1),
        _segment(0x7F0030000000, [("active_allocated", 8 * MiB), ("inactive", 8 * MiB)], pool_id=(1, 7)),
    ]


def test_inactive_runs_per_segment_give_the_one_fragmentation():
    result = read_snapshot_fragmentation(_snapshot(), device=0)
    runs = [5 * MiB, 4 * MiB, 2 * MiB, 3 * MiB // 2, 8 * MiB]
    assert sorted(result.free_runs) == sorted(runs)
    assert result.inactive_bytes == sum(runs)
    assert result.largest_inactive_run_bytes == 8 * MiB
    assert result.fragmentation == pytest.approx(1 - 8 * MiB / sum(runs))
    assert result.allocated_bytes == 10 * MiB + MiB // 2 + 8 * MiB
    assert result.pending_free_bytes == MiB
    assert result.reserved_bytes == 20 * MiB + 2 * MiB + 2 * MiB + 16 * MiB
    assert result.segments == 4


def test_excluding_a_private_pool_and_reading_the_dict_form():
    snapshot = {"segments": _snapshot(), "device_traces": [[]], "allocator_settings": {}}
    result = read_snapshot_fragmentation(snapshot, device=0, exclude_pool_ids=[(1, 7)])
    runs = [5 * MiB, 4 * MiB, 2 * MiB, 3 * MiB // 2]
    assert result.fragmentation == pytest.approx(1 - 5 * MiB / sum(runs))
    assert result.segments == 3


def test_all_devices_and_documented_state_spelling():
    segments = _snapshot()
    segments[0]["blocks"][4]["state"] = "active_awaiting_free"   # the spelling in torch's docstring
    result = read_snapshot_fragmentation(segments)
    assert result.inactive_bytes == (5 + 4 + 2 + 1.5 + 64 + 8) * MiB
    assert result.largest_inactive_run_bytes == 64 * MiB
    assert result.pending_free_bytes == MiB


def test_empty_and_fully_allocated_snapshots_have_no_fragmentation():
    assert read_snapshot_fragmentation([]).fragmentation == 0.0
    full = read_snapshot_fragmentation([_segment(0x1000, [("active_allocated", MiB)])])
    assert full.fragmentation == 0.0 and full.inactive_bytes == 0


def test_malformed_snapshots_are_refused():
    with pytest.raises(InvalidInputError, match="malformed"):
        read_snapshot_fragmentation([{"device": 0, "blocks": []}])
    bad = _snapshot()
    bad[0]["blocks"][0]["state"] = "mystery"
    with pytest.raises(InvalidInputError, match="unknown block state"):
        read_snapshot_fragmentation(bad)
    with pytest.raises(InvalidInputError, match="segments"):
        read_snapshot_fragmentation({"device_traces": []})


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_live_reader_refuses_without_cuda():
    with pytest.raises(InvalidInputError, match="CUDA"):
        cuda_allocator_fragmentation()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_live_reader_on_cuda():
    keep = [torch.empty(MiB * (i + 1), dtype=torch.uint8, device="cuda") for i in range(6)]
    del keep[1::2]
    result = cuda_allocator_fragmentation()
    assert result.reserved_bytes >= result.allocated_bytes + result.inactive_bytes
    assert 0.0 <= result.fragmentation < 1.0
