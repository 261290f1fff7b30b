"""A background memory sampler with named phases and per-phase peaks; its `MonitorReport` and the exports are in
`h3director.core.monitor_report`.

    with Monitor(interval_ms=100, devices=("cpu", "cuda:0"), budget_bytes=16 * GiB) as mon:
        with mon.phase("sample"):
            ...
        with mon.phase("decode"):
            ...
    report = mon.report()
    report.to_json("run.json"); report.to_csv("run.csv"); report.plot("run.png")
    print(report.summary_table())

Series and units. Each device contributes named series (bytes): ``host.rss_bytes`` for ``cpu``
(this process's resident set), ``cuda:N.allocated_bytes`` and ``cuda:N.reserved_bytes``,
``mps.allocated_bytes`` and ``mps.driver_bytes``. `Monitor.add_series` adds any other callable
(the slot pool's usage, its fragmentation, a process tree's RSS); its unit is declared
(``"bytes"`` or anything else, e.g. ``"ratio"``).

Sampling. A daemon thread samples every ``interval_ms`` on a fixed grid (start + k * interval, so
slow samples do not accumulate drift; missed ticks are skipped, not bunched). Entering and leaving
a phase also takes a sample in the calling thread, so every phase, however short, has a first and
a last sample. A peak between two samples can be missed: the report's peaks are lower bounds,
exact only for what a device tracks itself (``cuda:N`` ``peak_allocated_bytes``).

Overhead. The sampler thread measures its own CPU time (``time.thread_time``); the report's
``overhead`` says how many samples were taken per second against the requested rate and what each
cost (see ``bench/monitor_overhead.py``).
"""

from __future__ import annotations

import contextlib
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psutil

from h3director.core.devices import (
    linux_rss_and_peak,
    nvml_process_gpu_bytes,
    parse_device,
    process_rss_bytes,
    sample_device,
)
from h3director.core.monitor_report import MonitorReport, PhaseSpan, Sample
from h3director.errors import InvalidInputError

MIN_INTERVAL_MS = 1
MAX_INTERVAL_MS = 60_000


# ---------------------------------------------------------------------------------------------


def _device_series(device: str) -> list[tuple[str, Callable[[], Any]]]:
    """Series names and their readers; a reader returns a number, or a dict when it yields several series."""
    kind, index = parse_device(device)
    if kind == "cpu":
        return [("host.rss_bytes", process_rss_bytes)]
    name = "mps" if kind == "mps" else f"cuda:{index or 0}"
    allocated = f"{name}.allocated_bytes"
    reserved = f"{name}.driver_bytes" if kind == "mps" else f"{name}.reserved_bytes"

    def read() -> dict[str, float | None]:  # one device sample serves both series
        s = sample_device(name)
        return {allocated: s.allocated_bytes, reserved: s.reserved_bytes}

    return [(allocated, read), (reserved, read)]


class Monitor:
    """Background memory sampler; a context manager (start on enter, stop on exit).

    ``interval_ms``: sampling period in milliseconds (1 .. 60000). ``devices``: any of ``"cpu"``,
    ``"cuda[:N]"``, ``"mps"``; may be empty when every series comes from `add_series`.
    ``budget_bytes``: drawn as a line on the plot and recorded in the report (bytes).
    ``max_samples``: memory bound for long runs; beyond it samples are merged pairwise, keeping
    each series' maximum (see `_compact`), so peaks and phase boundaries are never lost.
    """

    def __init__(self, interval_ms: float = 500, devices: Sequence[str] = ("cpu",), budget_bytes: int | None = None,
                 *, max_samples: int = 100_000):
        if not (MIN_INTERVAL_MS <= interval_ms <= MAX_INTERVAL_MS):
            raise InvalidInputError(
                f"interval_ms must be between {MIN_INTERVAL_MS} and {MAX_INTERVAL_MS}, got {interval_ms!r}"
            )
        if max_samples < 16:
            raise InvalidInputError(f"max_samples must be at least 16, got {max_samples!r}")
        if budget_bytes is not None and budget_bytes <= 0:
            raise InvalidInputError(f"budget_bytes must be positive or None, got {budget_bytes!r}")
        self.interval_ms = float(interval_ms)
        self.budget_bytes = budget_bytes
        self._readers: dict[str, Callable[[], Any]] = {}  # series -> reader (dict-returning or float)
        self._units: dict[str, str] = {}
        for device in devices:
            for series, reader in _device_series(str(device)):
                self._readers[series] = reader
                self._units[series] = "bytes"
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._phases: list[PhaseSpan] = []
        self._stack: list[str] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._t0 = 0.0
        self._started = self._stopped = False
        self._thread_cpu_s = 0.0
        self._thread_samples = 0
        self._missed_ticks = 0
        self._errors: dict[str, str] = {}
        self._duration = 0.0
        self.max_samples = max_samples
        self._compactions = 0

    def add_series(self, name: str, fn: Callable[[], float | None], unit: str = "bytes") -> None:
        """Sample ``fn()`` as series ``name`` from now on (``unit`` "bytes" or any label, e.g. "ratio").

        ``fn`` runs in the sampler thread: it must be thread-safe and fast. An exception from it
        records None for that sample and the first message in the report's metadata. One ``fn`` may
        serve several series: added under each name and returning ``{name: value}``, it is called once
        per sample.
        """
        if not name or not isinstance(name, str):
            raise InvalidInputError(f"series name must be a non-empty string, got {name!r}")
        with self._lock:
            if name in self._readers:
                raise InvalidInputError(f"series {name!r} already exists")
            self._readers[name] = fn
            self._units[name] = unit

    @property
    def series(self) -> list[str]:
        with self._lock:
            return list(self._readers)

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> Monitor:
        if self._started:
            raise InvalidInputError("this Monitor was already started; create a new one")
        self._started = True
        self._t0 = time.perf_counter()
        self._wall0 = time.time()
        self._take_sample()
        self._thread = threading.Thread(target=self._run, name="h3director-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if not self._started or self._stopped:
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._take_sample()
        self._duration = time.perf_counter() - self._t0
        self._stopped = True
        with self._lock:
            for span in self._phases:
                if span.end is None:
                    span.end = self._duration

    def __enter__(self) -> Monitor:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark a phase; phases nest. Takes a sample on entry and on exit."""
        if not name or "/" in name:
            raise InvalidInputError(f"phase name must be non-empty and contain no '/', got {name!r}")
        with self._lock:
            self._stack.append(name)
            span = PhaseSpan(name, time.perf_counter() - self._t0, None)
            self._phases.append(span)
        self._take_sample()
        try:
            yield
        finally:
            self._take_sample()
            with self._lock:
                span.end = time.perf_counter() - self._t0
                # remove this phase (the innermost with this name), even if inner phases leaked
                for i in range(len(self._stack) - 1, -1, -1):
                    if self._stack[i] == name:
                        del self._stack[i]
                        break

    # --- sampling -----------------------------------------------------------------------------

    def _read_all(self) -> dict[str, float | None]:
        with self._lock:
            readers = list(self._readers.items())
        values: dict[str, float | None] = {}
        called: dict[int, dict[str, float | None]] = {}
        for name, reader in readers:
            try:
                if id(reader) in called:  # one device reader yields several series
                    values[name] = called[id(reader)].get(name)
                    continue
                result = reader()
                if isinstance(result, dict):
                    called[id(reader)] = result
                    values[name] = result.get(name)
                else:
                    values[name] = None if result is None else float(result)
            except Exception as exc:  # a failing extra series must not stop the monitor
                values[name] = None
                self._errors.setdefault(name, f"{type(exc).__name__}: {exc}")
        return values

    def _take_sample(self) -> None:
        values = self._read_all()
        t = time.perf_counter() - self._t0
        with self._lock:
            self._samples.append(Sample(t, self._wall0 + t, tuple(self._stack), values))
            if len(self._samples) > self.max_samples:
                self._compact()

    def _compact(self) -> None:
        """Halve the stored samples, keeping peaks: neighbours in the same phases merge into one sample
        holding each series' maximum (at the later time). Phase boundaries and peaks survive; the
        time resolution of long runs halves. Called with the lock held."""
        merged: list[Sample] = []
        samples = self._samples
        i = 0
        while i < len(samples):
            first = samples[i]
            if i + 1 < len(samples) and samples[i + 1].phases == first.phases:
                second = samples[i + 1]
                values = {}
                for name in first.values.keys() | second.values.keys():
                    pair = [v for v in (first.values.get(name), second.values.get(name)) if v is not None]
                    values[name] = max(pair) if pair else None
                merged.append(Sample(second.t, second.wall, second.phases, values))
                i += 2
            else:
                merged.append(first)
                i += 1
        self._samples = merged
        self._compactions += 1
        if len(merged) > self.max_samples * 3 // 4:  # phases change about every sample: merging cannot keep up
            self.max_samples *= 2

    def _run(self) -> None:
        interval = self.interval_ms / 1000.0
        cpu0 = time.thread_time()
        tick = 1
        while True:
            deadline = self._t0 + tick * interval
            if self._stop.wait(max(0.0, deadline - time.perf_counter())):
                break
            self._take_sample()
            self._thread_samples += 1
            self._thread_cpu_s = time.thread_time() - cpu0  # kept current so a running report is right
            # next tick on the grid; skip ticks already in the past (a slow sample or a paused process)
            now_ticks = math.floor((time.perf_counter() - self._t0) / interval)
            self._missed_ticks += max(0, now_ticks - tick)
            tick = max(tick + 1, now_ticks + 1)
        self._thread_cpu_s = time.thread_time() - cpu0

    # --- results ------------------------------------------------------------------------------

    def report(self, metadata: dict[str, Any] | None = None) -> MonitorReport:
        """A snapshot of what was recorded (call after `stop` for final numbers)."""
        with self._lock:
            samples = list(self._samples)
            phases = [PhaseSpan(s.name, s.start, s.end) for s in self._phases]
            series = list(self._readers)
            units = dict(self._units)
        duration = self._duration or (time.perf_counter() - self._t0 if self._started else 0.0)
        sampler_samples = self._thread_samples
        overhead = {
            "samples": float(len(samples)),
            "sampler_samples": float(sampler_samples),
            "duration_s": duration,
            "requested_hz": 1000.0 / self.interval_ms,
            "achieved_hz": sampler_samples / duration if duration > 0 else 0.0,
            "missed_ticks": float(self._missed_ticks),
            "sampler_cpu_s": self._thread_cpu_s,
            "cpu_per_sample_us": 1e6 * self._thread_cpu_s / sampler_samples if sampler_samples else 0.0,
            "cpu_percent_of_core": 100.0 * self._thread_cpu_s / duration if duration > 0 else 0.0,
            "compactions": float(self._compactions),
        }
        meta = dict(metadata or {})
        if self._errors:
            meta["series_errors"] = dict(self._errors)
        return MonitorReport(self.interval_ms, series, units, samples, phases, self.budget_bytes, overhead, meta)


# ---------------------------------------------------------------------------------------------
# Another process and its children, seen from outside


class ProcessTree:
    """Memory of a process and all its descendants, read from outside (psutil, /proc; NVML for GPU).

    ``rss_bytes()`` sums the resident set of every live process in the tree (shared pages, such
    as common libraries, count once per process, so the sum can exceed the physical total).
    ``gpu_bytes()`` sums NVML's per-process GPU memory over the tree's PIDs (None without NVML).
    Children are re-listed at each call, so processes started later are included. On Linux each
    process's kernel-kept peak (VmHWM) is read too: `largest_peak_rss_bytes` is exact for any
    process seen at least once after its peak, whatever the sampling interval.
    """

    def __init__(self, pid: int):
        try:
            self.root = psutil.Process(pid)
        except psutil.NoSuchProcess:
            raise InvalidInputError(f"no process with PID {pid}") from None
        self._last_pids: list[int] = [pid]
        self.peak_by_pid: dict[int, int] = {}

    def processes(self) -> list[psutil.Process]:
        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def _rss_of(self, process: psutil.Process) -> int | None:
        if sys.platform.startswith("linux"):
            found = linux_rss_and_peak(process.pid)
            if found is None:
                return None
            rss, peak = found
            self.peak_by_pid[process.pid] = max(peak, self.peak_by_pid.get(process.pid, 0))
            return rss
        try:
            return int(process.memory_info().rss)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return None

    def rss_bytes(self) -> float | None:
        total = 0
        pids = []
        for process in self.processes():
            rss = self._rss_of(process)
            if rss is not None:
                total += rss
                pids.append(process.pid)
        self._last_pids = pids
        return float(total) if pids else None

    def process_count(self) -> float:
        return float(len(self._last_pids))

    def largest_peak_rss_bytes(self) -> int | None:
        """Largest per-process peak RSS seen (bytes; Linux VmHWM), or None where the OS does not keep it."""
        return max(self.peak_by_pid.values()) if self.peak_by_pid else None

    def gpu_bytes(self) -> float | None:
        usage = nvml_process_gpu_bytes()
        if usage is None:
            return None
        return float(sum(usage.get(pid, 0) for pid in self._last_pids))


__all__ = ["Monitor", "ProcessTree"]
