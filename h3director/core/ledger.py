"""A per-job memory ledger: what each job of a loop (a ComfyUI prompt, a render) leaves behind, and leaks.

    ledger = MemoryLedger(devices=("cpu", "cuda:0"),
                          kept=lambda: KeptMemory({"pipeline": [pipe], "cache": [my_cache]}))
    for job in jobs:
        with ledger.job(key="t2v-720p", label=job.name):
            run(job)
    ledger.leaks          # [Leak]: series, growth per job, the largest new tensors and who holds them
    ledger.to_dict()      # plain data: every job's readings at start and end, the leaks, the rule

Readings. At the start and the end of each job: the process's resident set (``host``), and per accelerator
the allocated and reserved bytes (CUDA: ``memory_allocated`` / ``memory_reserved``, the latter estimated
device-wide under cudaMallocAsync; MPS: ``current_allocated_memory`` / ``driver_allocated_memory``; see
`h3director.core.devices`). And what is kept on purpose: the ``kept`` callable returns the objects the
caller holds between jobs by design (models, caches), grouped by name; their tensor storages are counted
per device (`held_tensor_bytes`, each storage once across all groups).

Leak rule. Per series (``host``; each accelerator), the unexplained bytes of a reading are what is not kept
on purpose: ``host`` = RSS - kept CPU tensor bytes; an accelerator = allocated - kept tensor bytes on it. A
job's ``steps`` are its net growth: unexplained bytes at its end minus at its start. A series leaks for a
``key`` (the same workflow) when, over the last ``rule.jobs`` jobs of that key (jobs of other keys may run in
between),

- every job but the first grew by at least ``rule.min_growth_bytes`` (the first job of a window may carry
  one-time costs: loading, lazy initialisation), and
- the growth persisted: the key's last job ended at least ``(rule.jobs - 1) * rule.min_growth_bytes`` above
  where the window's first job ended (memory another job gave back in between is no leak).

Growth of one job is charged to that job's key, so another workflow run in between neither hides a leak nor
is blamed for it. The leak's ``growth_per_job_bytes`` is the mean growth of its jobs; it stays active while
the key's jobs keep growing, and is logged once (a WARNING on ``logger``), when first found, with its numbers.

Cost. A job's readings are two RSS reads, two device samples and two walks of the kept objects. When a job
that is not its key's first grew by the floor or more (a leak is suspected), the end does more:
``gc.collect()`` and a new reading (so garbage waiting for the collector is not taken for a leak), then a
census of every live tensor (`TensorCensus`, one pass over the heap). The censuses of two suspected jobs of
one key give the storages that are new since the earlier; the largest become the leak's ``suspects``, each
with its holder as far as Python can see (`h3director.core.tensor_owners`), a few more passes over the
heap. Suspects need the census of the job before: with ``rule.jobs >= 3`` the leak has them when it is
first reported. Once every leaking series of a key has suspects, later suspected jobs skip the census (the
collection stays, so a leak's numbers stay honest).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from h3director.core.devices import parse_device, process_rss_bytes, sample_device
from h3director.core.held_tensors import HeldBytes, StorageSet, TensorCensus, held_tensor_bytes
from h3director.core.tensor_owners import Owner, find_owners
from h3director.errors import InvalidInputError
from h3director.units import MiB, format_size

LOGGER = logging.getLogger("h3director.ledger")
MAX_KEYS = 256  # job keys whose last readings are kept
MAX_CENSUSES = 4  # keys whose last tensor census is kept (weak references to every live tensor each)
HOST = "host"


@dataclass(frozen=True)
class LeakRule:
    """``jobs``: job ends of one run the growth must span (2 or more: ``jobs - 1`` steps).
    ``min_growth_bytes``: the least growth per step that counts (bytes; RSS moves by a few MiB on its own)."""

    jobs: int = 3
    min_growth_bytes: int = 16 * MiB

    def __post_init__(self):
        if not isinstance(self.jobs, int) or self.jobs < 2:
            raise InvalidInputError(f"LeakRule.jobs must be an integer >= 2, got {self.jobs!r}")
        if not isinstance(self.min_growth_bytes, int) or self.min_growth_bytes < 1:
            raise InvalidInputError(f"LeakRule.min_growth_bytes must be a positive integer, got {self.min_growth_bytes!r}")


@dataclass
class KeptMemory:
    """What a caller keeps on purpose between jobs: ``groups`` of objects whose tensors count as kept
    (name -> objects), and ``details`` shown as they are (e.g. each loaded model's name and size)."""

    groups: dict[str, Iterable[Any]]
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class LedgerReading:
    """Memory at one moment. Bytes. ``devices[name]``: ``allocated_bytes``, ``reserved_bytes`` (None where the
    backend cannot tell), ``reserved_is_estimate``. ``kept_bytes[device]``: tensor bytes kept on purpose
    (``"cpu"`` for host memory); ``kept_groups[group][device]`` the same per group."""

    wall: float
    host_rss_bytes: int
    devices: dict[str, dict[str, Any]]
    kept_bytes: dict[str, int]
    kept_groups: dict[str, dict[str, int]]
    kept_details: dict[str, Any]
    kept_truncated: bool = False

    def unexplained(self) -> dict[str, int]:
        """Series -> bytes not kept on purpose: ``host`` = RSS - kept CPU bytes; each accelerator =
        allocated - kept bytes on it."""
        values = {HOST: self.host_rss_bytes - self.kept_bytes.get("cpu", 0)}
        for name, sample in self.devices.items():
            if sample.get("allocated_bytes") is not None:
                values[name] = int(sample["allocated_bytes"]) - self.kept_bytes.get(name, 0)
        return values


@dataclass
class JobRecord:
    """One job: ``index`` (0, 1, ... in this ledger), ``key`` (jobs with one key in a row form a run),
    ``label``, readings at ``start`` and ``end``, ``status``, ``steps`` (series -> net unexplained growth of
    the job, end minus start, bytes), ``collected`` (True when a
    suspected leak made the end run ``gc.collect()`` before its reading), ``overhead_s`` (wall seconds the
    ledger itself spent on this job: both readings, and at a suspected leak the collection, census and
    owners; waits for the GIL included) and ``overhead_cpu_s`` (the CPU seconds of the same, in the job's
    thread)."""

    index: int
    key: str
    label: str | None
    start: LedgerReading
    end: LedgerReading | None = None
    status: str | None = None
    steps: dict[str, int] = field(default_factory=dict)
    collected: bool = False
    overhead_s: float = 0.0
    overhead_cpu_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["start"]["unexplained"] = self.start.unexplained()
        if self.end is not None:
            data["end"]["unexplained"] = self.end.unexplained()
        return data


@dataclass
class Leak:
    """Growth of ``series`` that persists across the jobs of ``key`` from ``first_job`` to ``last_job`` (indices): ``steps`` (bytes per job), ``growth_per_job_bytes`` (their mean), ``total_bytes`` (their sum).
    ``suspects``: the largest new storages of a leaking job on that series' device, each a dict with
    ``bytes``, ``device``, ``shape``, ``dtype``, ``owner`` (who holds it, in words), ``owner_kind``,
    ``module`` and ``node`` (what the ledger's ``name_node`` says about the owner, or None).
    ``active``: still growing at the last job of ``key``."""

    key: str
    label: str | None
    series: str
    first_job: int
    last_job: int
    steps: list[int]
    suspects: list[dict[str, Any]] = field(default_factory=list)
    active: bool = True

    @property
    def growth_per_job_bytes(self) -> int:
        return sum(self.steps) // len(self.steps)

    @property
    def total_bytes(self) -> int:
        return sum(self.steps)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["growth_per_job_bytes"] = self.growth_per_job_bytes
        data["total_bytes"] = self.total_bytes
        data["jobs"] = len(self.steps) + 1
        return data

    def describe(self, unit: str = "job") -> str:
        what = "host memory (RSS)" if self.series == HOST else f"{self.series} allocated memory"
        text = (f"{what} not kept on purpose grew {format_size(self.growth_per_job_bytes)} per {unit} over "
                f"{len(self.steps) + 1} {unit}s of {self.key!r}"
                f"{f' ({self.label})' if self.label else ''}, {format_size(self.total_bytes)} in all")
        if self.suspects:
            parts = []
            for s in self.suspects[:3]:
                node = f" (node {s['node']})" if s.get("node") else ""
                parts.append(f"{format_size(s['bytes'])} {s['dtype']}{list(s['shape'])} on {s['device']} held by "
                             f"{s['owner']}{node}")
            text += "; largest new tensors: " + "; ".join(parts)
        return text


class MemoryLedger:
    """The per-job ledger (see the module docstring). Thread-safe: jobs run in one thread, `to_dict` may be
    called from another.

    ``devices``: ``"cpu"`` (the host, always read) and any of ``"cuda:N"``, ``"mps"``. ``rule``: the
    `LeakRule`. ``kept``: returns the `KeptMemory` (None: nothing is kept on purpose). ``name_node``: maps a
    suspect's `Owner` to the name of the node or component it belongs to (None when unknown).
    ``history``: job records kept. ``suspects``: largest new storages named per leak. ``unit``: the word
    for a job in log lines ("prompt" in ComfyUI).
    """

    def __init__(self, devices: Sequence[str] = ("cpu",), rule: LeakRule | None = None, *,
                 kept: Callable[[], KeptMemory] | None = None, name_node: Callable[[Owner], str | None] | None = None,
                 history: int = 100, suspects: int = 5, unit: str = "job", logger: logging.Logger = LOGGER):
        self.rule = rule or LeakRule()
        if history < self.rule.jobs:
            raise InvalidInputError(f"history ({history}) must hold at least rule.jobs ({self.rule.jobs}) jobs")
        self.devices = []
        for device in devices:
            kind, index = parse_device(device)
            if kind == "cuda":
                self.devices.append(f"cuda:{index or 0}")
            elif kind == "mps":
                self.devices.append("mps")
        self._kept = kept
        self._name_node = name_node
        self._suspect_count = suspects
        self.unit = unit
        self._logger = logger
        self._lock = threading.Lock()
        self._records: deque[JobRecord] = deque(maxlen=history)
        self._runs: dict[str, list[JobRecord]] = {}  # key -> its last rule.jobs records, least recent key first
        self._current: JobRecord | None = None
        self._censuses: dict[str, TensorCensus] = {}  # key -> census at the end of its last suspected job
        self._leaks: list[Leak] = []
        self._active: dict[tuple[str, str], Leak] = {}
        self._logged: set[tuple[str, str]] = set()
        self._count = 0

    # --- readings ---------------------------------------------------------------------------------

    def read(self) -> LedgerReading:
        """Memory now: RSS, each device, and what is kept on purpose."""
        devices = {}
        for name in self.devices:
            sample = sample_device(name)
            devices[name] = {"allocated_bytes": sample.allocated_bytes, "reserved_bytes": sample.reserved_bytes,
                             "reserved_is_estimate": sample.reserved_is_estimate}
        kept_bytes: dict[str, int] = {}
        groups: dict[str, dict[str, int]] = {}
        details: dict[str, Any] = {}
        truncated = False
        if self._kept is not None:
            kept = self._kept()
            storages = StorageSet()
            for group, objects in kept.groups.items():
                held: HeldBytes = held_tensor_bytes(objects, storages=storages)
                groups[group] = held.by_device
                truncated |= held.truncated
                for device, nbytes in held.by_device.items():
                    kept_bytes[device] = kept_bytes.get(device, 0) + nbytes
            details = kept.details
        return LedgerReading(time.time(), process_rss_bytes(), devices, kept_bytes, groups, details, truncated)

    # --- jobs -------------------------------------------------------------------------------------

    def begin(self, key: str, label: str | None = None) -> JobRecord:
        """Start a job of ``key`` (reads memory). A job begun and never ended is replaced by this one."""
        if not key or not isinstance(key, str):
            raise InvalidInputError(f"a job key must be a non-empty string, got {key!r}")
        began, began_cpu = time.perf_counter(), time.thread_time()
        reading = self.read()
        with self._lock:
            record = JobRecord(self._count, key, label, reading, overhead_s=time.perf_counter() - began,
                               overhead_cpu_s=time.thread_time() - began_cpu)
            self._count += 1
            self._current = record
        return record

    def end(self, status: str = "success") -> JobRecord:
        """End the current job (reads memory, applies the leak rule, logs a new leak). Returns its record."""
        with self._lock:
            record = self._current
        if record is None:
            raise InvalidInputError("MemoryLedger.end() without a job begun: call begin(key) first")
        began, began_cpu = time.perf_counter(), time.thread_time()
        with self._lock:
            run = list(self._runs.get(record.key, []))
        start = record.start.unexplained()
        reading = self.read()
        steps = _steps(start, reading.unexplained())
        baseline_only = not run  # a key's first job is only the baseline of its window: never suspected
        if not baseline_only and any(step >= self.rule.min_growth_bytes for step in steps.values()):
            gc.collect()  # garbage that waits for the collector is not a leak
            reading = self.read()
            steps = _steps(start, reading.unexplained())
            record.collected = True
        record.end, record.status, record.steps = reading, status, steps
        run = [*run, record][-self.rule.jobs:]
        suspected = [series for series, step in steps.items()
                     if not baseline_only and step >= self.rule.min_growth_bytes]
        census = self._take_census(record, suspected)
        leaking = [series for series in suspected if self._leaks_now(run, series)]
        new_leaks: list[Leak] = []
        with self._lock:
            for (key, series), leak in list(self._active.items()):
                if key == record.key and series not in leaking:
                    leak.active = False
                    del self._active[key, series]
            for series in leaking:
                leak = self._active.get((record.key, series))
                if leak is None:
                    leak = Leak(record.key, record.label, series, run[0].index, record.index,
                                [r.steps[series] for r in run[1:]])
                    self._active[record.key, series] = leak
                    self._leaks.append(leak)
                    new_leaks.append(leak)
                else:
                    leak.last_job, leak.label = record.index, record.label
                    leak.steps.append(steps[series])
            self._records.append(record)
            self._runs.pop(record.key, None)
            self._runs[record.key] = run
            while len(self._runs) > MAX_KEYS:  # the least recently run key goes
                del self._runs[next(iter(self._runs))]
            self._current = None
            leaking_now = [self._active[record.key, series] for series in leaking]
        if census is not None:  # the census of a suspected job: the baseline of the key's next one
            self._name_suspects(census, self._censuses.pop(record.key, None), leaking_now)
            self._censuses[record.key] = census
            while len(self._censuses) > MAX_CENSUSES:
                del self._censuses[next(iter(self._censuses))]
        record.overhead_s += time.perf_counter() - began
        record.overhead_cpu_s += time.thread_time() - began_cpu
        for leak in new_leaks:
            if (leak.key, leak.series) not in self._logged:
                self._logged.add((leak.key, leak.series))
                self._logger.warning("H3 Director memory ledger: leak: %s", leak.describe(self.unit))
        return record

    @contextlib.contextmanager
    def job(self, key: str, label: str | None = None) -> Iterator[JobRecord]:
        """`begin` on entry, `end` on exit (status "error" when the body raised)."""
        record = self.begin(key, label)
        status = "error"
        try:
            yield record
            status = "success"
        finally:
            self.end(status)

    # --- leak rule --------------------------------------------------------------------------------

    def _leaks_now(self, run: list[JobRecord], series: str) -> bool:
        """The leak rule (module docstring) on the last ``rule.jobs`` jobs of one key."""
        last = run[-self.rule.jobs:]
        if len(last) < self.rule.jobs:
            return False
        floor = self.rule.min_growth_bytes
        if not all(r.steps.get(series, 0) >= floor for r in last[1:]):
            return False
        first, final = last[0].end.unexplained().get(series), last[-1].end.unexplained().get(series)
        return first is not None and final is not None and final - first >= (self.rule.jobs - 1) * floor

    def _take_census(self, record: JobRecord, suspected: list[str]) -> TensorCensus | None:
        """A census while a leak is suspected and a leak of this run still lacks suspects (None otherwise)."""
        with self._lock:
            named = {series for (key, series), leak in self._active.items() if key == record.key and leak.suspects}
        if not suspected or set(suspected) <= named:
            return None
        return TensorCensus.take()

    def _name_suspects(self, census: TensorCensus | None, older: TensorCensus | None, leaks: list[Leak]) -> None:
        """Fill the suspects of ``leaks`` that have none from the storages of ``census`` new since ``older``."""
        leaks = [leak for leak in leaks if not leak.suspects]
        if census is None or older is None or not leaks:
            return
        new = census.new_since(older, limit=4 * self._suspect_count)
        for leak in leaks:
            device = "cpu" if leak.series == HOST else leak.series
            chosen = [item for item in new if item.device == device][: self._suspect_count]
            tensors = [item.tensor() for item in chosen]
            alive = [(item, tensor) for item, tensor in zip(chosen, tensors, strict=True) if tensor is not None]
            owners = find_owners([tensor for _, tensor in alive]) if alive else []
            suspects = []
            for (item, _tensor), owner in zip(alive, owners, strict=True):
                suspects.append({"bytes": item.nbytes, "device": item.device, "shape": list(item.shape),
                                 "dtype": item.dtype, "owner": owner.describe(), "owner_kind": owner.kind,
                                 "module": owner.module,
                                 "node": self._name_node(owner) if self._name_node is not None else None})
            del tensors, alive
            with self._lock:
                leak.suspects = suspects

    # --- results ----------------------------------------------------------------------------------

    @property
    def records(self) -> list[JobRecord]:
        with self._lock:
            return list(self._records)

    @property
    def leaks(self) -> list[Leak]:
        """Every leak found, oldest first (``active`` ones still growing)."""
        with self._lock:
            return list(self._leaks)

    def to_dict(self, jobs: int | None = None) -> dict[str, Any]:
        """Plain data: ``rule``, ``devices``, ``jobs`` (the last ``jobs`` records, all when None), ``current``
        (the job begun and not ended, or None), ``leaks``."""
        with self._lock:
            records = list(self._records)
            current = self._current
            leaks = [leak.to_dict() for leak in self._leaks]
        if jobs is not None:
            records = records[-jobs:] if jobs > 0 else []
        return {"rule": asdict(self.rule), "devices": [HOST, *self.devices], "unit": self.unit,
                "jobs": [r.to_dict() for r in records], "current": None if current is None else current.to_dict(),
                "leaks": leaks}


def _steps(start: dict[str, int], end: dict[str, int]) -> dict[str, int]:
    return {series: value - start[series] for series, value in end.items() if series in start}


__all__ = ["HOST", "JobRecord", "KeptMemory", "Leak", "LeakRule", "LedgerReading", "MemoryLedger"]
