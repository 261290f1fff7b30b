"""Host arena: random alloc/free traces keep every invariant; leases never dangle."""

from __future__ import annotations

import gc
import itertools
import os
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from native_helpers import backend_params

from h3director import native
from h3director.errors import InvalidInputError
from h3director.fragmentation import fragmentation


@pytest.fixture(params=backend_params())
def backend(request):
    return request.param


def _address(lease) -> int:
    return lease.numpy().ctypes.data


def _check_invariants(arena: native.Arena, live: dict[int, tuple[native.Lease, int]], high_water: int) -> None:
    stats = arena.stats()
    rounded = {k: -(-lease.nbytes // arena.alignment) * arena.alignment for k, (lease, _) in live.items()}
    assert stats.used_bytes == sum(rounded.values())
    assert stats.used_bytes + stats.free_bytes == stats.capacity_bytes == arena.capacity_bytes
    assert stats.live_allocations == len(live)
    assert stats.high_water_bytes == high_water
    assert 0 <= stats.largest_free_bytes <= stats.free_bytes
    assert (stats.free_blocks == 0) == (stats.free_bytes == 0)
    spans = sorted((lease.offset, lease.offset + rounded[k]) for k, (lease, _) in live.items())
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start, "two live leases overlap"
    assert all(0 <= s and e <= arena.capacity_bytes for s, e in spans)
    # free runs are the gaps between live leases (freeing coalesces with both neighbours)
    edges = [0, *itertools.chain.from_iterable(spans), arena.capacity_bytes]
    gaps = [end - start for start, end in zip(edges[::2], edges[1::2], strict=True) if end > start]
    assert stats.largest_free_bytes == max(gaps, default=0)
    assert stats.fragmentation == pytest.approx(fragmentation(gaps))
    for lease, fill in live.values():  # nobody wrote over anybody else's bytes
        assert (lease.numpy() == fill).all()


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    alignment=st.sampled_from([16, 64, 4096]),
    ops=st.lists(st.tuples(st.booleans(), st.integers(1, 9000), st.integers(0, 1000)), min_size=1, max_size=60),
)
def test_random_traces_keep_invariants(backend, alignment, ops):
    arena = native.Arena(64 * 1024, alignment=alignment, backend=backend)
    live: dict[int, tuple[native.Lease, int]] = {}
    high_water = 0
    next_key = 0
    for is_alloc, nbytes, pick in ops:
        if is_alloc or not live:
            try:
                lease = arena.lease(nbytes)
            except native.ArenaFullError:
                assert arena.stats().largest_free_bytes < nbytes
                continue
            assert lease.offset % alignment == 0 and _address(lease) % alignment == 0
            fill = next_key % 251
            lease.numpy()[:] = fill
            live[next_key] = (lease, fill)
            next_key += 1
            high_water = max(high_water, arena.stats().used_bytes)
        else:
            key = sorted(live)[pick % len(live)]
            live.pop(key)[0].release()  # CPython frees the block at once (reference counting)
        _check_invariants(arena, live, high_water)
    for lease, _ in live.values():
        lease.release()
    live.clear()
    gc.collect()
    stats = arena.stats()
    assert stats.used_bytes == 0 and stats.free_blocks == 1 and stats.fragmentation == 0.0


def test_fragmentation_of_scattered_free_runs(backend):
    arena = native.Arena(6 * 64, alignment=64, backend=backend)
    leases = [arena.lease(64) for _ in range(6)]
    for lease in leases[::2]:  # three separate free runs of 64 bytes
        lease.release()
    del lease
    gc.collect()
    stats = arena.stats()
    assert (stats.free_blocks, stats.free_bytes, stats.largest_free_bytes) == (3, 192, 64)
    assert stats.fragmentation == pytest.approx(fragmentation([64, 64, 64]))


def test_tensor_outliving_its_lease_keeps_its_memory(backend):
    arena = native.Arena(1 << 16, backend=backend)
    lease = arena.lease(4096)
    tensor = lease.torch(torch.float32, (32, 32))
    tensor.fill_(3.5)
    view = lease.numpy(np.float32)[::2]
    lease.release()
    del lease
    gc.collect()
    assert arena.stats().used_bytes == 4096  # still referenced by the tensor and the view
    others = [arena.lease(4096) for _ in range(15)]  # fill every other free byte with garbage
    for other in others:
        other.numpy()[:] = 0xAB
    with pytest.raises(native.ArenaFullError):
        arena.lease(64)
    assert (tensor == 3.5).all() and (view == 3.5).all()
    del tensor
    gc.collect()
    assert arena.stats().used_bytes == 16 * 4096  # the numpy view still holds the block
    del view
    gc.collect()
    assert arena.stats().used_bytes == 15 * 4096
    assert arena.lease(4096).nbytes == 4096  # the block is reusable now


def test_views_outlive_the_arena_object(backend):
    arena = native.Arena(8192, backend=backend)
    with arena.lease(100) as lease:
        data = lease.numpy(np.uint8, (10, 10))
    del arena, lease
    gc.collect()
    data[:] = 9  # the mapping is still alive: writing must not crash
    assert int(data.sum()) == 900


def test_views_share_memory_without_copies(backend):
    arena = native.Arena(1 << 16, alignment=4096, backend=backend)
    with arena.lease(3 * 4096) as lease:
        a = lease.numpy(np.float32, (3, 1024))
        t = lease.torch(torch.bfloat16)
        assert a.ctypes.data == t.data_ptr() and a.ctypes.data % 4096 == 0
        a[:] = 1.0
        assert t.numel() == 3 * 2048 and t.view(torch.int16).view(-1)[1].item() == 0x3F80


def test_released_lease_refuses_new_views_and_sizes_are_checked(backend):
    arena = native.Arena(4096, backend=backend)
    lease = arena.lease(100)
    with pytest.raises(InvalidInputError, match="needs 404 bytes"):
        lease.numpy(np.float32, (101,))
    with pytest.raises(InvalidInputError, match="needs"):
        lease.torch(torch.float64, (13,))
    lease.release()
    lease.release()  # idempotent
    with pytest.raises(InvalidInputError, match="released"):
        lease.numpy()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"capacity_bytes": 0}, "capacity_bytes"),
        ({"capacity_bytes": 1 << 50}, "capacity_bytes"),
        ({"capacity_bytes": 4096, "alignment": 48}, "power of two"),
        ({"capacity_bytes": 4096, "alignment": 8}, "power of two"),
        ({"capacity_bytes": 4096, "alignment": 1 << 22}, "power of two"),
        ({"capacity_bytes": 4096, "release_threshold": 0}, "release_threshold"),
    ],
)
def test_bad_arena_arguments(backend, kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        native.Arena(backend=backend, **kwargs)


def test_bad_lease_sizes_and_exhaustion(backend):
    arena = native.Arena(8192, backend=backend)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InvalidInputError, match="positive integer"):
            arena.lease(bad)
    with pytest.raises(native.ArenaFullError, match="exceeds the arena capacity"):
        arena.lease(8193)
    held = arena.lease(8000)
    with pytest.raises(native.ArenaFullError, match="largest run"):
        arena.lease(1024)
    assert arena.stats().failed_allocations >= 1
    held.release()


def test_stale_or_forged_handles_are_rejected(backend):
    arena = native.Arena(8192, backend=backend)
    engine = arena._engine
    handle, _ = engine.alloc(64)
    engine.free(handle)
    with pytest.raises(ValueError):
        engine.free(handle)  # double free
    with pytest.raises(ValueError):
        engine.free(123456789)


def test_concurrent_leases_from_threads(backend):
    arena = native.Arena(1 << 20, backend=backend)
    errors = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        try:
            for _ in range(200):
                with arena.lease(int(rng.integers(1, 8192))) as lease:
                    a = lease.numpy()
                    a[:] = seed
                    assert (a == seed).all()
                    del a
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert not errors
    stats = arena.stats()
    assert stats.used_bytes == 0 and stats.total_allocations == 800 and stats.free_blocks == 1


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc to read RSS")
def test_release_threshold_returns_pages_to_the_os(backend):
    size = 32 << 20
    for threshold, returned in ((None, False), (1 << 20, True)):
        arena = native.Arena(size, alignment=4096, release_threshold=threshold, backend=backend)
        lease = arena.lease(size)
        a = lease.numpy()
        a[:] = 5  # fault every page in
        before = _rss_bytes()
        del a
        lease.release()
        gc.collect()
        dropped = before - _rss_bytes()
        assert (dropped > size // 2) == returned, f"threshold {threshold}: RSS dropped {dropped} bytes"
        with arena.lease(size) as again:  # still usable; returned pages read back as zeros
            b = again.numpy()
            assert (b[:: 1 << 16] == (0 if returned else 5)).all()
            del b
