"""What a `h3director.core.monitor.Monitor` recorded: `MonitorReport` (plain data) and its exports: JSON (re-loadable),
CSV, a summary table and a PNG timeline (matplotlib is imported only when one is drawn).

The timeline's layout: one axis of memory (MiB) over time (seconds since the monitor started) with every
``bytes`` series, shaded bands for phases (labelled at the top), a marker at each phase's peak of
each series and a labelled marker at the run's overall peak, and a dashed line at the budget.
Series with another unit (e.g. fragmentation, a ratio) go on a second axis on the right.
Drawn with the Agg canvas directly: no pyplot, no global backend change, safe in threads.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from h3director.core.atomic_file import atomic_path
from h3director.errors import InvalidInputError
from h3director.units import MiB, format_size


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


FIGSIZE_IN = (10.0, 5.0)
DPI = 100


def _require_matplotlib():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        from h3director.errors import H3DirectorError, missing_package

        raise H3DirectorError(missing_package("plotting", "matplotlib", "plot")) from None
    return Figure, FigureCanvasAgg


def plot_timeline(report: MonitorReport, path: str | os.PathLike, *, title: str | None = None) -> Path:
    """Draw ``report`` to a PNG at ``path`` (written to a temporary name, then renamed). Returns the path."""
    Figure, FigureCanvasAgg = _require_matplotlib()
    figure = Figure(figsize=FIGSIZE_IN, dpi=DPI)
    FigureCanvasAgg(figure)
    axis = figure.add_subplot(1, 1, 1)
    times = report.times()
    byte_series = [name for name in report.series if report.units.get(name) == "bytes"]
    other_series = [name for name in report.series if name not in byte_series]
    colors = {name: f"C{i % 10}" for i, name in enumerate(report.series)}

    for number, span in enumerate(report.phases):
        end = span.end if span.end is not None else (times[-1] if times else span.start)
        axis.axvspan(span.start, end, color=("0.80", "0.90")[number % 2], alpha=0.6, linewidth=0)
        axis.axvline(span.start, color="0.55", linewidth=0.6)
        axis.annotate(span.name, xy=((span.start + end) / 2, 1.0), xycoords=("data", "axes fraction"),
                      ha="center", va="bottom", fontsize=8, clip_on=False)

    phase_peaks, peaks = report.phase_peaks, report.peaks  # each property scans every sample: read once
    for name in byte_series:
        values = report.values(name)
        points = [(t, v / MiB) for t, v in zip(times, values, strict=True) if v is not None]
        if not points:
            continue
        axis.plot([p[0] for p in points], [p[1] for p in points], color=colors[name], linewidth=1.4, label=name)
        for phase_name, in_phase in phase_peaks.items():
            if name in in_phase:
                t_peak = _time_of_peak(report, name, in_phase[name], phase_name)
                axis.plot([t_peak], [in_phase[name] / MiB], marker="v", color=colors[name], markersize=5)
        peak = peaks.get(name)
        if peak is not None:
            t_peak = _time_of_peak(report, name, peak, None)
            axis.plot([t_peak], [peak / MiB], marker="o", color=colors[name], markersize=7)
            axis.annotate(f"peak {peak / MiB:,.0f} MiB", xy=(t_peak, peak / MiB), xytext=(4, 4),
                          textcoords="offset points", fontsize=8, color=colors[name])

    if report.budget_bytes is not None:
        axis.axhline(report.budget_bytes / MiB, color="red", linestyle="--", linewidth=1.2,
                     label=f"budget {report.budget_bytes / MiB:,.0f} MiB")

    axis.set_xlabel("time since start (s)")
    axis.set_ylabel("memory (MiB)")
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    if other_series:
        right = axis.twinx()
        for name in other_series:
            values = report.values(name)
            points = [(t, v) for t, v in zip(times, values, strict=True) if v is not None]
            if points:
                right.plot([p[0] for p in points], [p[1] for p in points], color=colors[name], linestyle=":",
                           linewidth=1.2, label=f"{name} ({report.units.get(name, '')})")
        right.set_ylabel(", ".join(sorted({report.units.get(n, "") for n in other_series})))
        handles, labels = axis.get_legend_handles_labels()
        more_handles, more_labels = right.get_legend_handles_labels()
        axis.legend(handles + more_handles, labels + more_labels, loc="upper left", fontsize=8)
    elif axis.get_legend_handles_labels()[0]:
        axis.legend(loc="upper left", fontsize=8)
    if title:
        figure.suptitle(title, fontsize=10)
    figure.tight_layout()

    with atomic_path(path) as temporary:
        figure.savefig(temporary, format="png")
    return Path(path)


def _time_of_peak(report: MonitorReport, series: str, value: float, phase: str | None) -> float:
    for sample in report.samples:
        if sample.values.get(series) == value and (phase is None or phase in sample.phases):
            return sample.t
    return report.samples[0].t if report.samples else 0.0


__all__ = ["DPI", "FIGSIZE_IN", "MonitorReport", "PhaseSpan", "Sample", "plot_timeline"]
