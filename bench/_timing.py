"""Timing for the benchmarks: a warm-up call, then the median (or the fastest) of `repeats` timed calls.

Seconds of wall time (`time.perf_counter`) on the CPU; `median_cuda_seconds` times with CUDA events on the
current stream, synchronising after each call. Ratios measured side by side in one run are the result;
absolute times are the machine's.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def _times(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up (first-touch page faults, lazy initialisation)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls of `fn`, after one untimed call."""
    return statistics.median(_times(fn, repeats))


def best_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Fastest of `repeats` runs: for millisecond kernels on a shared machine, the least disturbed one."""
    return min(_times(fn, repeats))


def median_cuda_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median of `repeats` calls of `fn` timed with CUDA events (seconds), after one untimed call."""
    import torch

    fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)
