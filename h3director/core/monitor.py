"""A background memory sampler with named phases, per-phase peaks and exports.

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
import csv
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from h3director.core.atomic_file import atomic_path
from h3director.core.devices import (
    linux_rss_and_peak,
    nvml_process_gpu_bytes,
    parse_device,
    process_rss_bytes,
    sample_device,
)
from h3director.errors import InvalidInputError
from h3director.units import format_size

MIN_INTERVAL_MS = 1
MAX_INTERVAL_MS = 60_000


@dataclass
class Sample:
    """One sample: ``t`` seconds since the monitor started, the innermost active phases, series values."""

    t: float
    wall: float
    phases: tuple[str, ...]
    values: dict[str, float | None]


@dataclass
class PhaseSpan:
    """A phase as it ran: seconds since the monitor started."""

    name: str
    start: float
    end: float | None


@dataclass
class MonitorReport:
    """Everything a monitor recorded; plain data, exportable and re-loadable (`from_json`).

    ``phase_peaks[phase][series]`` is the largest sampled value of that series while the phase
    was active (nested phases count for every enclosing phase); ``peaks[series]`` is over the
    whole run. Values of series whose unit is ``"bytes"`` are bytes.
    """

    interval_ms: float
    series: list[str]
    units: dict[str, str]
    samples: list[Sample]
    phases: list[PhaseSpan]
    budget_bytes: int | None = None
    overhead: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def peaks(self) -> dict[str, float]:
        return _peaks(self.samples, self.series)

    @property
    def phase_peaks(self) -> dict[str, dict[str, float]]:
        names = list(dict.fromkeys(span.name for span in self.phases))
        return {name: _peaks([s for s in self.samples if name in s.phases], self.series) for name in names}

    def values(self, series: str) -> list[float | None]:
        """The sampled values of one series, in time order."""
        if series not in self.series:
            raise InvalidInputError(f"no series {series!r} in this report; it has {', '.join(self.series)}")
        return [sample.values.get(series) for sample in self.samples]

    def times(self) -> list[float]:
        return [sample.t for sample in self.samples]

    # --- exports ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "interval_ms": self.interval_ms,
            "series": self.series,
            "units": self.units,
            "budget_bytes": self.budget_bytes,
            "phases": [asdict(span) for span in self.phases],
            "peaks": self.peaks,
            "phase_peaks": self.phase_peaks,
            "overhead": self.overhead,
            "metadata": self.metadata,
            "samples": [
                {"t": s.t, "wall": s.wall, "phases": list(s.phases), "values": s.values} for s in self.samples
            ],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> MonitorReport:
        return cls(
            interval_ms=data["interval_ms"],
            series=list(data["series"]),
            units=dict(data["units"]),
            samples=[Sample(s["t"], s["wall"], tuple(s["phases"]), dict(s["values"])) for s in data["samples"]],
            phases=[PhaseSpan(**span) for span in data["phases"]],
            budget_bytes=data.get("budget_bytes"),
            overhead=dict(data.get("overhead", {})),
            metadata=dict(data.get("metadata", {})),
        )

    def to_json(self, path: str | os.PathLike) -> Path:
        """Write the report as JSON (atomically: temporary name, then rename). Returns the path."""
        return _atomic_write(path, lambda handle: json.dump(self.to_dict(), handle, indent=1), newline=None)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> MonitorReport:
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))

    def to_csv(self, path: str | os.PathLike) -> Path:
        """One row per sample: ``t_s, wall, phase`` (innermost, ``/``-joined when nested), then each series."""

        def write(handle):
            writer = csv.writer(handle)
            writer.writerow(["t_s", "wall", "phase", *self.series])
            for s in self.samples:
                row = [f"{s.t:.6f}", f"{s.wall:.6f}", "/".join(s.phases)]
                row += ["" if s.values.get(name) is None else _number(s.values[name]) for name in self.series]
                writer.writerow(row)

        return _atomic_write(path, write, newline="")

    def plot(self, path: str | os.PathLike, *, title: str | None = None) -> Path:
        """PNG timeline: each series over time, phase bands, peak marks, the budget line (matplotlib)."""
        from h3director.core.timeline_plot import plot_timeline

        return plot_timeline(self, path, title=title)

    def summary_table(self) -> str:
        """Plain-text table: rows = the whole run and each phase, columns = peak of each series."""
        rows = [("(whole run)", self.peaks)] + list(self.phase_peaks.items())
        header = ["phase", *self.series]
        body = [[name] + [self._format(series, peaks.get(series)) for series in self.series] for name, peaks in rows]
        widths = [max(len(str(row[i])) for row in [header, *body]) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *body]]
        lines.insert(1, "  ".join("-" * width for width in widths))
        if self.budget_bytes is not None:
            lines.append(f"budget: {format_size(self.budget_bytes)}")
        if self.overhead:
            o = self.overhead
            lines.append(
                f"samples: {int(o.get('samples', 0))} at {o.get('achieved_hz', 0):.1f}/s "
                f"(requested {o.get('requested_hz', 0):.1f}/s), sampler CPU {o.get('cpu_per_sample_us', 0):.0f} us/sample"
            )
        return "\n".join(lines)

    def _format(self, series: str, value: float | None) -> str:
        if value is None:
            return "-"
        return format_size(value) if self.units.get(series) == "bytes" else f"{value:.4g}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _peaks(samples: Sequence[Sample], series: Sequence[str]) -> dict[str, float]:
    peaks: dict[str, float] = {}
    for name in series:
        values = [s.values.get(name) for s in samples]
        finite = [v for v in values if v is not None and not math.isnan(v)]
        if finite:
            peaks[name] = max(finite)
    return peaks


def _atomic_write(path: str | os.PathLike, write: Callable[[Any], None], *, newline: str | None) -> Path:
    with atomic_path(path) as temporary, open(temporary, "w", encoding="utf-8", newline=newline) as handle:
        write(handle)
    return Path(path)


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


__all__ = ["Monitor", "MonitorReport", "PhaseSpan", "ProcessTree", "Sample"]
