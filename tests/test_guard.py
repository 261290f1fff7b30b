"""MemoryGuard: preflight, the watch, each action, OOM handling, the three forms, config.

No GPU here: `SimulatedDevice` stands in for the device. Its `used_bytes(device) -> int` has the
signature of `h3director.core.devices.device_used_bytes`; steps "allocate" by raising its counter,
and faults are injected by raising a real `torch.OutOfMemoryError`.
"""

from __future__ import annotations

import contextlib
import threading

import pytest
import torch

from h3director.core.guard import MemoryGuard, MemoryLimitExceeded

MiB = 1 << 20


class SimulatedDevice:
    """A device whose used bytes the test sets; mirrors ``device_used_bytes(device) -> int``."""

    def __init__(self, used: int = 0) -> None:
        self.used = used
        self.reads: list[str] = []
        self.cleared: list[str] = []
        self.cache = 0          # bytes that free_caches gives back

    @contextlib.contextmanager
    def hold(self, nbytes: int):
        """Bytes a step holds while it runs (freed when it returns or raises)."""
        self.used += nbytes
        try:
            yield
        finally:
            self.used -= nbytes

    def used_bytes(self, device) -> int:
        self.reads.append(str(device))
        return self.used

    def clear(self, device) -> None:
        self.cleared.append(str(device))
        self.used -= self.cache
        self.cache = 0


def _guard(sim: SimulatedDevice, action: str = "stop_and_clear", budget: int = 100 * MiB, **kw) -> MemoryGuard:
    kw.setdefault("poll_interval_ms", 0)
    return MemoryGuard(budget, action=action, device="cuda:0", device_reader=sim.used_bytes,
                       cache_clearer=sim.clear, **kw)


def test_preflight_fits_frees_caches_then_refuses():
    sim = SimulatedDevice(used=60 * MiB)
    guard = _guard(sim)
    assert guard.preflight(30 * MiB, "decode clip 0") == 10 * MiB
    sim.cache = 20 * MiB
    assert guard.preflight(50 * MiB, "decode clip 1") == 10 * MiB     # fits once the cache is emptied
    assert sim.cleared == ["cuda:0"]
    with pytest.raises(MemoryLimitExceeded) as info:
        guard.preflight(80 * MiB, "decode clip 2")
    message = str(info.value)
    assert message.startswith("[Director Safety] GPU memory limit exceeded")
    assert "'decode clip 2'" in message and "budget 100.00 MiB" in message and "measured use 40.00 MiB" in message
    assert info.value.requested_bytes == 80 * MiB


def test_stop_and_clear_on_a_crossing_during_the_step():
    sim = SimulatedDevice(used=10 * MiB)
    guard = _guard(sim)

    def step():
        sim.used = 130 * MiB       # the work allocates past the budget
        return "done"

    with pytest.raises(MemoryLimitExceeded, match=r"^\[Director Safety\] GPU memory limit exceeded in phase 'upscale'") as info:
        guard.run(step, what="upscale")
    assert info.value.measured_bytes == 130 * MiB and info.value.budget_bytes == 100 * MiB
    assert sim.cleared == ["cuda:0"]
    assert [(e.cause, e.action) for e in guard.events] == [("watch", "stop_and_clear")]


def test_check_inside_the_step_stops_it_early():
    sim = SimulatedDevice()
    guard = _guard(sim)
    reached = []

    def step():
        for tile in range(10):
            sim.used = (tile + 1) * 30 * MiB
            guard.check()
            reached.append(tile)

    with pytest.raises(MemoryLimitExceeded):
        guard.run(step, what="tiles")
    assert reached == [0, 1, 2], "the step stopped at the first tile past the budget"


def test_reduce_batch_retries_smaller_until_it_fits_and_stops_at_the_floor():
    sim = SimulatedDevice()
    guard = _guard(sim, action="reduce_batch", min_batch=2)
    calls = []

    def step(frames, batch_size):
        calls.append(batch_size)
        with sim.hold(batch_size * 30 * MiB):
            guard.check()
            return [frames] * batch_size

    assert guard.run(step, "f", batch_size=8, what="upscale") == ["f"] * 2
    assert calls == [8, 4, 2]
    assert [e.batch_size for e in guard.events] == [8, 4]
    calls.clear()

    def hungry(batch_size):
        calls.append(batch_size)
        with sim.hold(500 * MiB):
            guard.check()

    with pytest.raises(MemoryLimitExceeded, match="cannot be reduced below the floor 2"):
        guard.run(hungry, batch_size=8, what="upscale")
    assert calls == [8, 4, 2]

    with pytest.raises(Exception, match="batch_size"):
        guard.run(step, "f", what="no batch")


def test_reduce_batch_with_a_custom_reducer_and_an_injected_oom():
    sim = SimulatedDevice()
    guard = _guard(sim, action="reduce_batch", reducer=lambda b: b - 1)
    calls = []

    def step(batch_size):
        calls.append(batch_size)
        if batch_size > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
        return batch_size

    assert guard.run(step, batch_size=4) == 2
    assert calls == [4, 3, 2]
    assert [e.cause for e in guard.events] == ["oom", "oom"]


def test_fallback_to_cpu_reruns_the_step_on_cpu():
    sim = SimulatedDevice()
    guard = _guard(sim, action="fallback_to_cpu")
    devices = []

    def step(x, device):
        devices.append(device)
        if device != "cpu":
            raise torch.OutOfMemoryError("injected")
        return x.to(device) * 2

    out = guard.run(step, torch.ones(3), what="vae decode")
    assert devices == ["cuda:0", "cpu"] and torch.equal(out, torch.full((3,), 2.0))
    assert [(e.cause, e.action, e.device) for e in guard.events] == [("oom", "fallback_to_cpu", "cuda:0")]


def test_fallback_to_cpu_after_a_failed_preflight_never_starts_the_gpu_try():
    sim = SimulatedDevice(used=90 * MiB)
    guard = _guard(sim, action="fallback_to_cpu")
    devices = []
    guard.run(lambda device: devices.append(device), nbytes=20 * MiB, what="decode")
    assert devices == ["cpu"] and guard.events[0].cause == "preflight"


def test_host_budget_is_watched_too():
    sim = SimulatedDevice()
    host = {"rss": 1 * MiB}
    guard = _guard(sim, host_budget_bytes=50 * MiB, host_reader=lambda: host["rss"])

    def step():
        host["rss"] = 80 * MiB

    with pytest.raises(MemoryLimitExceeded, match=r"^\[Director Safety\] host memory limit exceeded"):
        guard.run(step)


def test_decorator_and_context_manager_forms():
    sim = SimulatedDevice()
    guard = _guard(sim, action="reduce_batch")

    @guard
    def upscale(batch_size):
        with sim.hold(batch_size * 40 * MiB):
            guard.check()
            return batch_size

    assert upscale(batch_size=4) == 2 and upscale.__name__ == "upscale"
    assert guard.events[0].phase.endswith("upscale")

    @guard.protect(what="decode", nbytes=lambda batch: batch * 40 * MiB)
    def decode(batch_size):
        return batch_size

    assert decode(batch_size=8) == 2      # preflight refused 8 and 4 before running anything

    with pytest.raises(MemoryLimitExceeded, match="phase 'stitch'"):
        with guard.watch("stitch"):
            sim.used = 300 * MiB
    sim.used = 0
    with pytest.raises(MemoryLimitExceeded, match="out of memory"), guard:
        raise torch.OutOfMemoryError("injected")
    with guard.watch("fine"):
        sim.used = 10 * MiB


def test_oom_without_a_budget_still_clears_and_reports():
    sim = SimulatedDevice(used=7 * MiB)
    guard = MemoryGuard(None, device="cuda:0", device_reader=sim.used_bytes, cache_clearer=sim.clear,
                        poll_interval_ms=0)

    def step():
        raise torch.OutOfMemoryError("injected")

    with pytest.raises(MemoryLimitExceeded, match="no budget set") as info:
        guard.run(step, what="dit block 12")
    assert info.value.measured_bytes == 7 * MiB and sim.cleared == ["cuda:0"]


def test_sampler_thread_catches_a_transient_peak():
    sim = SimulatedDevice()
    guard = _guard(sim, poll_interval_ms=1)

    seen = threading.Event()
    original = sim.used_bytes

    def reader(device):
        value = original(device)
        if value > 100 * MiB:
            seen.set()
        return value

    guard.device_reader = reader

    def step():
        sim.used = 150 * MiB       # a peak that is gone before the step returns
        assert seen.wait(10), "the sampler thread never ran"
        sim.used = 0

    with pytest.raises(MemoryLimitExceeded, match="150.00 MiB"):
        guard.run(step)


def test_guard_from_config_and_disabled_guard():
    from h3director.core.config import load_config

    config = load_config(env={"H3_MEMORY_SAFETY__MAX_GPU_MEMORY_MB": "8000",
                              "H3_MEMORY_SAFETY__MAX_HOST_MEMORY_MB": "16000",
                              "H3_MEMORY_SAFETY__ACTION_ON_EXCEED": "reduce_batch"})
    guard = MemoryGuard.from_config(config, device="cuda:0")
    assert (guard.budget_bytes, guard.host_budget_bytes, guard.action) == (8000 * MiB, 16000 * MiB, "reduce_batch")
    same = MemoryGuard(config, device="cuda:0")
    assert (same.budget_bytes, same.host_budget_bytes, same.action) == (8000 * MiB, 16000 * MiB, "reduce_batch")
    sim = SimulatedDevice(used=10**12)
    off = MemoryGuard(MiB, device="cuda:0", device_reader=sim.used_bytes, enabled=False)
    assert off.run(lambda: 5) == 5 and sim.reads == []
    with pytest.raises(Exception, match="action must be one of"):
        MemoryGuard(MiB, action="panic")


def test_explicit_arguments_override_the_config_in_both_constructors():
    from h3director.core.config import validate_config
    from h3director.core.guard import MemoryGuard

    config = validate_config({"memory_safety": {"enabled": True, "max_gpu_memory_mb": 1024,
                                                "action_on_exceed": "reduce_batch"}}, env={})
    plain = MemoryGuard(config, device="cpu")
    assert (plain.action, plain.enabled, plain.budget_bytes) == ("reduce_batch", True, 1024 * 2**20)
    for guard in (MemoryGuard(config, device="cpu", action="fallback_to_cpu", enabled=False),
                  MemoryGuard.from_config(config, device="cpu", action="fallback_to_cpu", enabled=False)):
        assert (guard.action, guard.enabled, guard.budget_bytes) == ("fallback_to_cpu", False, 1024 * 2**20)


def test_the_message_names_the_guarded_device():
    sim = SimulatedDevice(used=90 * MiB)
    gpu = _guard(sim)
    with pytest.raises(MemoryLimitExceeded) as info:
        gpu.preflight(20 * MiB, "decode")
    assert str(info.value).startswith("[Director Safety] GPU memory limit exceeded in phase 'decode' on cuda:0: budget")
    assert info.value.memory == "GPU" and info.value.device == "cuda:0"

    cpu = MemoryGuard(100 * MiB, device="cpu", device_reader=sim.used_bytes, cache_clearer=sim.clear,
                      poll_interval_ms=0)
    with pytest.raises(MemoryLimitExceeded) as info:
        cpu.preflight(20 * MiB, "decode")
    assert str(info.value).startswith("[Director Safety] CPU memory limit exceeded in phase 'decode' on cpu: budget")
    assert info.value.memory == "CPU"

    def grow():
        sim.used = 150 * MiB

    with pytest.raises(MemoryLimitExceeded, match=r"^\[Director Safety\] CPU memory limit exceeded in phase 'grow'"):
        cpu.run(grow, what="grow")

    def fail():
        raise torch.OutOfMemoryError("injected")

    with pytest.raises(MemoryLimitExceeded, match=r"^\[Director Safety\] CPU memory limit exceeded .*out of memory on cpu"):
        cpu.run(fail, what="fail")


def test_a_real_cpu_allocation_failure_counts_as_out_of_memory():
    """The CPU allocator's own failure (not an injected exception type) takes the guard's action, in the
    `run` form and in the `with` form; an unrelated RuntimeError passes through untouched."""
    sim = SimulatedDevice()
    guard = _guard(sim, action="reduce_batch", reducer=lambda b: b // 2)
    calls = []

    def step(batch_size):
        calls.append(batch_size)
        if batch_size > 2:
            torch.empty(2**50 * batch_size, dtype=torch.uint8)   # a real "DefaultCPUAllocator" failure
        return batch_size

    assert guard.run(step, batch_size=8, what="upscale") == 2
    assert calls == [8, 4, 2] and [e.cause for e in guard.events] == ["oom", "oom"]

    with pytest.raises(MemoryLimitExceeded, match="out of memory"), guard.watch("decode"):
        torch.empty(2**50, dtype=torch.uint8)

    def broken(batch_size):
        raise RuntimeError("shape mismatch")

    with pytest.raises(RuntimeError, match="shape mismatch"):
        guard.run(broken, batch_size=4)
