"""The monitor: phases and per-phase peaks of known buffers, extra series, exports (JSON, CSV, PNG)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
import time

import numpy as np
import pytest

from h3director.core.monitor import Monitor, MonitorReport, ProcessTree
from h3director.errors import InvalidInputError
from h3director.units import MiB

BUFFER = 400 * MiB
#: A touched buffer must appear in the sampled RSS within this fraction of its size.
TOLERANCE = 0.15


def _wait_for_samples(mon: Monitor, count: int, timeout_s: float = 60.0) -> None:
    """Block until the sampler thread has taken `count` more samples: unlike a sleep, this does not
    depend on how busy the machine is."""
    target = mon.report().overhead["sampler_samples"] + count
    deadline = time.monotonic() + timeout_s
    while mon.report().overhead["sampler_samples"] < target:
        assert time.monotonic() < deadline, f"the sampler took fewer than {count} samples in {timeout_s} s"
        time.sleep(0.005)


@pytest.fixture(scope="module")
def recorded() -> tuple[MonitorReport, float]:
    """One monitored run: idle, a 400 MiB buffer held in phase "hold" (inside "outer"), then freed."""
    ticks = iter(range(10**9))
    with Monitor(interval_ms=20, devices=("cpu",), budget_bytes=1024 * MiB) as mon:
        mon.add_series("counter", lambda: float(next(ticks)), unit="count")
        _wait_for_samples(mon, 5)
        baseline = mon.report().samples[0].values["host.rss_bytes"]
        with mon.phase("outer"):
            with mon.phase("hold"):
                buffer = np.ones(BUFFER, dtype=np.uint8)
                _wait_for_samples(mon, 5)
            del buffer
            with mon.phase("after"):
                _wait_for_samples(mon, 5)
    return mon.report({"purpose": "test"}), baseline


def test_phase_peaks_find_the_known_buffer(recorded):
    report, baseline = recorded
    peaks = report.phase_peaks
    assert list(peaks) == ["outer", "hold", "after"]
    held = peaks["hold"]["host.rss_bytes"] - baseline
    assert abs(held - BUFFER) <= TOLERANCE * BUFFER, held / MiB
    assert peaks["after"]["host.rss_bytes"] - baseline < TOLERANCE * BUFFER  # freed before "after" began
    assert peaks["outer"]["host.rss_bytes"] == peaks["hold"]["host.rss_bytes"]  # nested phases count for both
    assert report.peaks["host.rss_bytes"] == peaks["hold"]["host.rss_bytes"]


def test_every_phase_has_entry_and_exit_samples_and_spans(recorded):
    report, _ = recorded
    for span in report.phases:
        inside = [s for s in report.samples if span.name in s.phases]
        assert len(inside) >= 2, span.name
        assert span.start <= inside[0].t and inside[-1].t <= span.end
    hold = next(s for s in report.phases if s.name == "hold")
    outer = next(s for s in report.phases if s.name == "outer")
    assert outer.start <= hold.start and hold.end <= outer.end
    assert [s.t for s in report.samples] == sorted(s.t for s in report.samples)


def test_extra_series_and_overhead_are_recorded(recorded):
    report, _ = recorded
    assert report.series == ["host.rss_bytes", "counter"]
    assert report.units["counter"] == "count"
    counters = [v for v in report.values("counter") if v is not None]
    assert counters == sorted(counters) and len(counters) >= 10
    overhead = report.overhead
    assert overhead["requested_hz"] == 50.0
    assert overhead["sampler_samples"] > 0 and overhead["sampler_cpu_s"] >= 0
    assert report.metadata["purpose"] == "test"


def test_json_round_trip_lists_series_and_peaks(recorded, tmp_path):
    report, _ = recorded
    path = report.to_json(tmp_path / "r.json")
    data = json.loads(path.read_text())
    assert data["series"] == ["host.rss_bytes", "counter"]
    assert data["budget_bytes"] == 1024 * MiB
    assert len(data["samples"]) == len(report.samples)
    assert data["phase_peaks"]["hold"]["host.rss_bytes"] == report.phase_peaks["hold"]["host.rss_bytes"]
    again = MonitorReport.from_json(path)
    assert again.phase_peaks == report.phase_peaks
    assert again.series == report.series
    assert not list(tmp_path.glob(".*tmp"))  # the temporary file was renamed away


def test_csv_has_one_row_per_sample_with_the_same_values(recorded, tmp_path):
    report, _ = recorded
    with open(report.to_csv(tmp_path / "r.csv"), newline="") as handle:
        rows = list(csv.reader(handle))
    assert rows[0] == ["t_s", "wall", "phase", "host.rss_bytes", "counter"]
    assert len(rows) - 1 == len(report.samples)
    rss = [int(row[3]) for row in rows[1:]]
    assert rss == [int(v) for v in report.values("host.rss_bytes")]
    assert any(row[2] == "outer/hold" for row in rows[1:])


def _pixels_near(image: np.ndarray, rgb: tuple[int, int, int], distance: float = 40.0) -> int:
    colors = (image[..., :3] * 255.0).astype(float)
    return int((np.linalg.norm(colors - np.array(rgb, dtype=float), axis=-1) < distance).sum())


def test_png_timeline_has_size_content_series_and_budget(recorded, tmp_path):
    from matplotlib import image as mpimg

    from h3director.core import monitor_report

    report, _ = recorded
    path = report.plot(tmp_path / "t.png", title="test run")
    image = mpimg.imread(path)
    width, height = (int(v * monitor_report.DPI) for v in monitor_report.FIGSIZE_IN)
    assert image.shape[:2] == (height, width)
    assert image[..., :3].std() > 0.05  # not blank
    assert _pixels_near(image, (31, 119, 180)) > 200  # the first series' line (matplotlib C0 blue)
    assert _pixels_near(image, (255, 0, 0), distance=60) > 200  # the dashed budget line


def test_a_failing_series_records_none_and_the_error():
    def broken() -> float:
        raise RuntimeError("sensor unplugged")

    with Monitor(interval_ms=10, devices=()) as mon:
        mon.add_series("broken", broken)
        time.sleep(0.05)
    report = mon.report()
    assert all(v is None for v in report.values("broken"))
    assert "sensor unplugged" in report.metadata["series_errors"]["broken"]
    assert "broken" not in report.peaks


def test_long_runs_are_compacted_without_losing_peaks_or_phases():
    values = iter([1.0] * 40 + [99.0] + [1.0] * 10**6)  # one spike among many samples
    with Monitor(interval_ms=1, devices=(), max_samples=16) as mon:
        mon.add_series("spiky", lambda: next(values), unit="count")
        with mon.phase("first"):
            _wait_for_samples(mon, 60)   # past the spike at the 41st reading
        with mon.phase("second"):
            _wait_for_samples(mon, 20)
    report = mon.report()
    assert report.overhead["compactions"] >= 1
    assert len(report.samples) <= 16
    assert report.peaks["spiky"] == 99.0
    assert set(report.phase_peaks) == {"first", "second"}
    assert all(len([s for s in report.samples if name in s.phases]) >= 1 for name in ("first", "second"))


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidInputError, match="interval_ms"):
        Monitor(interval_ms=0)
    with pytest.raises(InvalidInputError, match="budget_bytes"):
        Monitor(budget_bytes=-1)
    with pytest.raises(InvalidInputError, match="unknown device"):
        Monitor(devices=("gpu",))
    mon = Monitor(interval_ms=50, devices=())
    mon.add_series("x", lambda: 1.0)
    with pytest.raises(InvalidInputError, match="already exists"):
        mon.add_series("x", lambda: 2.0)
    with pytest.raises(InvalidInputError, match="phase name"):
        with mon.phase("a/b"):
            pass
    with mon:
        pass
    with pytest.raises(InvalidInputError, match="already started"):
        mon.start()
    with pytest.raises(InvalidInputError, match="no series"):
        mon.report().values("missing")


def test_process_tree_sums_children_and_keeps_their_peak():
    # A parent that starts a child holding 200 MiB; the tree's RSS and the child's peak must show it.
    child_code = "import numpy as np, time; a = np.ones(200 * 1024**2, dtype=np.uint8); time.sleep(30)"
    parent_code = (
        "import subprocess, sys, time\n"
        f"p = subprocess.Popen([sys.executable, '-c', {child_code!r}])\n"
        "time.sleep(30)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        tree = ProcessTree(parent.pid)
        deadline = time.monotonic() + 20
        rss = 0.0
        while time.monotonic() < deadline:
            rss = tree.rss_bytes() or 0.0
            if tree.process_count() >= 2 and rss >= 200 * MiB:
                break
            time.sleep(0.05)
        assert tree.process_count() == 2
        assert 200 * MiB <= rss <= 200 * MiB + 120 * MiB, rss / MiB  # two interpreters' own memory on top
        if sys.platform.startswith("linux"):
            assert abs(tree.largest_peak_rss_bytes() - 200 * MiB) <= 60 * MiB
    finally:
        for process in ProcessTree(parent.pid).processes()[::-1]:
            process.kill()
        parent.wait()
    with pytest.raises(InvalidInputError, match="no process"):
        ProcessTree(parent.pid)
