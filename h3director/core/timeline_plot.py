"""PNG timeline of a `MonitorReport` (matplotlib is imported only when one is drawn).

Layout: one axis of memory (MiB) over time (seconds since the monitor started) with every
``bytes`` series, shaded bands for phases (labelled at the top), a marker at each phase's peak of
each series and a labelled marker at the run's overall peak, and a dashed line at the budget.
Series with another unit (e.g. fragmentation, a ratio) go on a second axis on the right.
Drawn with the Agg canvas directly: no pyplot, no global backend change, safe in threads.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from h3director.units import MiB

if TYPE_CHECKING:
    from h3director.core.monitor import MonitorReport

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

    from h3director.core.atomic_file import atomic_path

    with atomic_path(path) as temporary:
        figure.savefig(temporary, format="png")
    return Path(path)


def _time_of_peak(report: MonitorReport, series: str, value: float, phase: str | None) -> float:
    for sample in report.samples:
        if sample.values.get(series) == value and (phase is None or phase in sample.phases):
            return sample.t
    return report.samples[0].t if report.samples else 0.0


__all__ = ["DPI", "FIGSIZE_IN", "plot_timeline"]
