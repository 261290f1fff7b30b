"""SlotPool: invariants under random lease/release traces, release paths, generations, fallback, heatmap."""

from __future__ import annotations

import gc

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3director.core.pool import OLD, YOUNG, SlotPool
from h3director.core.pool_heatmap import FALLBACK, FREE, LEASED, pool_heatmap, save_pool_heatmap
from h3director.errors import InvalidInputError
from h3director.fragmentation import fragmentation

SLOT = 256
SLOTS = 32


def _free_runs_from_occupancy(slot_count: int, leases: list[tuple[int, int, int]]) -> list[tuple[int, int]]:
    """Maximal free runs recomputed from scratch from the live leases (independent of the pool's free map)."""
    used = [False] * slot_count
    for start, length, _ in leases:
        for i in range(start, start + length):
            assert not used[i], f"slot {i} is held by two live leases"
            used[i] = True
    runs, i = [], 0
    while i < slot_count:
        if used[i]:
            i += 1
            continue
        j = i
        while j < slot_count and not used[j]:
            j += 1
        runs.append((i, j - i))
        i = j
    return runs


def _check_pool(pool: SlotPool, tensors: dict[int, torch.Tensor], leases: dict) -> None:
    live = pool.live_leases()
    for start, length, _ in live:
        assert 0 <= start and start + length <= pool.slot_count
    expected_runs = _free_runs_from_occupancy(pool.slot_count, live)
    assert pool.free_runs() == expected_runs, "free runs are not the maximal (coalesced) gaps between leases"
    stats = pool.stats()
    assert stats.used_bytes == sum(length for _, length, _ in live) * pool.slot_bytes
    assert stats.used_bytes + stats.free_bytes == pool.capacity_bytes
    assert stats.requested_bytes == sum(lease.nbytes for lease in leases.values() if lease.from_pool)
    assert stats.fragmentation == fragmentation([n * pool.slot_bytes for _, n in expected_runs])
    assert stats.live_leases == len(live)
    # The memory behind each live lease still holds what its owner wrote: no two leases share bytes.
    for lease_id, tensor in tensors.items():
        assert torch.all(tensor == lease_id % 251), f"lease {lease_id}'s memory was overwritten"


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("lease"), st.integers(1, 3 * SLOT * 3), st.sampled_from([0, 1, 2])),
        st.tuples(st.just("release"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("drop"), st.integers(0, 50), st.just(0)),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops)
def test_random_traces_keep_invariants(ops):
    pool = SlotPool(SLOTS * SLOT, SLOT, generation_gc_interval_ms=0)
    leases: dict[int, object] = {}
    tensors: dict[int, torch.Tensor] = {}
    fallbacks = 0
    for kind, value, generation in ops:
        if kind == "lease":
            lease = pool.lease((value,), torch.uint8, generation=generation)
            if not lease.from_pool:
                fallbacks += 1
                continue
            assert lease.tensor.data_ptr() == pool.base_pointer + lease.slot_start * SLOT
            lease.tensor.fill_(lease.lease_id % 251)
            leases[lease.lease_id] = lease
            tensors[lease.lease_id] = lease.tensor
        elif leases:
            lease_id = sorted(leases)[value % len(leases)]
            lease = leases.pop(lease_id)
            tensors.pop(lease_id)
            if kind == "release":
                lease.release()
            else:
                del lease  # the last reference to the tensor goes: the finalizer releases the lease
        _check_pool(pool, tensors, leases)
    assert pool.stats().fallback_count == fallbacks


def test_best_fit_picks_smallest_run_and_runs_coalesce():
    pool = SlotPool(10 * SLOT, SLOT, generation_gc_interval_ms=0)
    a, b, c, d = (pool.lease(n * SLOT, torch.uint8) for n in (3, 1, 2, 4))
    assert [x.slot_start for x in (a, b, c, d)] == [0, 3, 4, 6]
    a.release()
    c.release()
    assert pool.free_runs() == [(0, 3), (4, 2)]
    e = pool.lease(2 * SLOT, torch.uint8)       # best fit: the 2-slot hole, not the first (3-slot) one
    assert e.slot_start == 4
    e.release()
    b.release()                                 # 0..2, 3 and 4..5 merge into one run
    assert pool.free_runs() == [(0, 6)]
    d.release()
    assert pool.free_runs() == [(0, 10)]
    assert pool.stats().fragmentation == 0.0


def test_old_leases_go_to_the_top_young_to_the_bottom():
    pool = SlotPool(10 * SLOT, SLOT, generation_gc_interval_ms=0)
    old = pool.lease(2 * SLOT, torch.uint8, generation=OLD)
    young = pool.lease(SLOT, torch.uint8, generation=YOUNG)
    assert (old.slot_start, young.slot_start) == (8, 0)


def test_views_have_requested_dtype_shape_and_alignment():
    pool = SlotPool(8 * 1024, 1024, generation_gc_interval_ms=0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64):
        lease = pool.lease((3, 5, 7), dtype)
        assert lease.tensor.shape == (3, 5, 7) and lease.tensor.dtype == dtype
        assert lease.tensor.is_contiguous()
        assert lease.tensor.data_ptr() % 64 == 0
        lease.release()


def test_context_manager_releases():
    pool = SlotPool(4 * SLOT, SLOT, generation_gc_interval_ms=0)
    with pool.lease(SLOT, torch.uint8) as lease:
        assert pool.stats().used_bytes == SLOT
    assert lease.released and pool.stats().used_bytes == 0
    lease.release()  # idempotent
    assert pool.stats().used_bytes == 0


def test_garbage_collected_tensor_releases_but_derived_views_keep_it():
    pool = SlotPool(4 * SLOT, SLOT, generation_gc_interval_ms=0)
    tensor = pool.lease((SLOT // 4,), torch.float32).tensor   # the Lease handle itself is dropped at once
    view = tensor[2:]
    del tensor
    assert pool.stats().live_leases == 1, "a derived view still uses the memory; the lease must stay"
    del view
    assert pool.stats().live_leases == 0 and pool.stats().used_bytes == 0


def test_fallback_is_counted_and_tracked_until_collected():
    pool = SlotPool(2 * SLOT, SLOT, generation_gc_interval_ms=0)
    held = pool.lease(2 * SLOT, torch.uint8)
    extra = pool.lease((SLOT // 4,), torch.float32)
    too_big = pool.lease(3 * SLOT, torch.uint8)
    assert held.from_pool and not extra.from_pool and not too_big.from_pool
    assert extra.tensor.shape == (SLOT // 4,) and too_big.tensor.numel() == 3 * SLOT
    stats = pool.stats()
    assert stats.fallback_count == 2 and stats.fallback_live_bytes == 4 * SLOT
    del extra
    assert pool.stats().fallback_live_bytes == 3 * SLOT
    too_big.release()
    stats = pool.stats()
    assert stats.fallback_live_count == 0 and stats.fallback_count == 2


def test_young_collection_reclaims_cyclic_garbage_and_promotes_survivors():
    pool = SlotPool(8 * SLOT, SLOT, generation_gc_interval_ms=0)
    gc.disable()
    try:
        survivor = pool.lease(SLOT, torch.uint8)
        cycle: list = [pool.lease(2 * SLOT, torch.uint8).tensor]
        cycle.append(cycle)                      # unreachable only once the cycle collector runs
        del cycle
        assert pool.stats().live_leases == 2
        report = pool.collect(0)
        assert report.reclaimed_leases == 1 and report.reclaimed_bytes == 2 * SLOT
        assert report.promoted == 1 and survivor.generation == 1
        assert report.seconds >= 0.0
        pool.collect(1)
        assert survivor.generation == 2
        pool.collect(2)
        assert survivor.generation == 2, "generation 2 is the oldest"
        stats = pool.stats()
        assert stats.collections == 3 and stats.reclaimed_by_collection == 1
        assert stats.leases_by_generation == (0, 0, 1)
    finally:
        gc.enable()


def test_pressure_collects_before_falling_back():
    pool = SlotPool(4 * SLOT, SLOT, generation_gc_interval_ms=0)
    gc.disable()
    try:
        cycle: list = [pool.lease(4 * SLOT, torch.uint8).tensor]
        cycle.append(cycle)
        del cycle
        lease = pool.lease(4 * SLOT, torch.uint8)   # only fits once the cycle is collected
        assert lease.from_pool and pool.stats().fallback_count == 0
        assert pool.stats().reclaimed_by_collection == 1
    finally:
        gc.enable()


def test_periodic_collection_follows_the_interval():
    now = [0.0]
    pool = SlotPool(4 * SLOT, SLOT, generation_gc_interval_ms=120, clock=lambda: now[0])
    pool.lease(SLOT, torch.uint8).release()
    assert pool.stats().collections == 0
    now[0] = 0.121
    pool.lease(SLOT, torch.uint8).release()
    assert pool.stats().collections == 1
    now[0] = 0.2
    pool.lease(SLOT, torch.uint8).release()
    assert pool.stats().collections == 1


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidInputError, match="multiple of 64"):
        SlotPool(1024, 100)
    with pytest.raises(InvalidInputError, match="smaller than one slot"):
        SlotPool(100, 256)
    pool = SlotPool(4 * SLOT, SLOT)
    with pytest.raises(InvalidInputError, match="generation"):
        pool.lease(4, torch.uint8, generation=3)
    with pytest.raises(InvalidInputError, match="non-negative"):
        pool.lease((-1, 2), torch.uint8)


def test_heatmap_cells_and_png(tmp_path):
    pool = SlotPool(6 * SLOT, SLOT, generation_gc_interval_ms=0)
    a = pool.lease(2 * SLOT, torch.uint8)
    b = pool.lease(SLOT, torch.uint8)
    a.release()
    overflow = pool.lease(5 * SLOT, torch.uint8)          # larger than the free space: fallback
    heatmap = pool_heatmap(pool, columns=4)
    cells = [c for row in heatmap.rows for c in row]
    assert cells[:6] == [FREE, FREE, LEASED, FREE, FREE, FREE]
    assert cells[6:11] == [FALLBACK] * 5
    assert (heatmap.leased_slots, heatmap.free_slots, heatmap.fallback_cells) == (1, 5, 5)
    assert heatmap.fragmentation == pytest.approx(1 - 3 / 5)
    out = tmp_path / "pool.png"
    numbers = save_pool_heatmap(pool, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert numbers.free_runs == ((0, 2), (3, 3))
    assert not list(tmp_path.glob(".*tmp*"))
    del b, overflow


def test_monitor_series_read_the_pool():
    pool = SlotPool(4 * SLOT, SLOT, generation_gc_interval_ms=0)
    series = pool.monitor_series()
    held = pool.lease(SLOT, torch.uint8)
    assert series["pool_used_bytes"]() == SLOT
    assert series["pool_fragmentation"]() == 0.0
    held.release()
    assert series["pool_used_bytes"]() == 0.0


def test_pool_from_config_follows_levels_and_sizes():
    from h3director.core.config import load_config

    config = load_config(env={"H3_MEMORY_OPTIMIZATION_LEVEL": "2", "H3_PRE_ALLOCATED_POOL_MB": "1024",
                              "H3_POOL_SLOT_MB": "256", "H3_GENERATION_GC_INTERVAL_MS": "50"})
    pool = SlotPool.from_config(config)
    assert (pool.capacity_bytes, pool.slot_bytes, pool.slot_count) == (1024 << 20, 256 << 20, 4)
    assert pool.generation_gc and pool.generation_gc_interval_s == 0.05
    level0 = load_config(env={"H3_MEMORY_OPTIMIZATION_LEVEL": "0"})
    assert SlotPool.from_config(level0) is None
    level1 = load_config(env={"H3_MEMORY_OPTIMIZATION_LEVEL": "1", "H3_PRE_ALLOCATED_POOL_MB": "1024"})
    assert SlotPool.from_config(level1).generation_gc is False


def test_monitor_samples_pool_usage_and_fragmentation():
    from h3director.core.monitor import Monitor

    pool = SlotPool(8 * SLOT, SLOT, generation_gc_interval_ms=0)
    leases = [pool.lease(SLOT, torch.uint8) for _ in range(4)]
    leases[1].release()
    with Monitor(interval_ms=10, devices=()) as monitor:
        pool.attach_to_monitor(monitor)
        import time

        time.sleep(0.1)
    report = monitor.report()
    used = [v for v in report.values("pool_used_bytes") if v is not None]
    frag = [v for v in report.values("pool_fragmentation") if v is not None]
    assert used and set(used) == {3 * SLOT}
    assert frag and set(frag) == {fragmentation([SLOT, 4 * SLOT])}
    assert report.units["pool_fragmentation"] == "ratio"


def test_monitor_reads_the_pool_stats_once_per_sample(monkeypatch):
    from h3director.core.monitor import Monitor

    pool = SlotPool(4 * SLOT, SLOT, generation_gc_interval_ms=0)
    held = pool.lease(SLOT, torch.uint8)
    calls = []
    real_stats = pool.stats
    monkeypatch.setattr(pool, "stats", lambda: calls.append(1) or real_stats())
    monitor = Monitor(interval_ms=60_000, devices=())
    pool.attach_to_monitor(monitor)
    with monitor:  # one sample on start, one on stop; the sampler thread's first tick is a minute away
        pass
    report = monitor.report()
    assert len(report.samples) == 2
    assert len(calls) == 2
    assert report.values("pool_used_bytes") == [SLOT, SLOT]
    held.release()


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 4000)), min_size=1, max_size=80))
def test_first_fit_baseline_keeps_its_invariants(ops):
    from h3director.core.first_fit import FirstFitHeap

    heap = FirstFitHeap(16 * 1024, alignment=256)
    live: dict[int, int] = {}
    for allocate, value in ops:
        if allocate:
            offset = heap.allocate(value)
            if offset is None:
                continue
            size = -(-value // 256) * 256
            # first fit: no lower free run could have held it
            assert all(length < size for start, length in heap.free_runs() if start < offset)
            live[offset] = size
        elif live:
            offset = sorted(live)[value % len(live)]
            heap.free(offset)
            del live[offset]
        spans = sorted(live.items())
        runs = heap.free_runs()
        pieces = sorted([(o, s, "used") for o, s in spans] + [(o, s, "free") for o, s in runs])
        cursor = 0
        for (offset, size, kind), nxt in zip(pieces, [*pieces[1:], None], strict=True):
            assert offset == cursor, "allocations and free runs must tile the heap exactly"
            cursor += size
            if nxt is not None:
                assert not (kind == "free" and nxt[2] == "free"), "adjacent free runs were not coalesced"
        assert cursor == heap.capacity_bytes
        assert heap.fragmentation() == fragmentation(size for _, size in runs)


def test_a_young_collection_counts_the_clip_buffers_it_frees():
    """Clip buffers are lifetime class 1 and the collection between clips is a young one: what it returns
    counts whatever the class, both buffers that died since the last pool call and ones a cycle held."""
    pool = SlotPool(8 * SLOT, SLOT, generation_gc_interval_ms=0)
    gc.disable()
    try:
        cycle: list = [pool.lease(2 * SLOT, torch.uint8, generation=1).tensor]
        cycle.append(cycle)                      # freed only by the cyclic collector
        del cycle
        dropped = pool.lease(SLOT, torch.uint8, generation=2).tensor
        del dropped                              # freed by its last reference: queued for the next pool call
        report = pool.collect(0)
        assert report.reclaimed_leases == 2 and report.reclaimed_bytes == 3 * SLOT
        assert pool.stats().reclaimed_by_collection == 2 and pool.stats().live_leases == 0
    finally:
        gc.enable()
