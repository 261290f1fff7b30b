"""The ComfyUI process's memory monitors: the ones the Monitor nodes started, and the last report.

One registry per process (module state), read by the Monitor Stop node and the `/h3director/*`
routes. Thread-safe: nodes run in ComfyUI's prompt worker thread, routes in its aiohttp loop.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_lock = threading.Lock()
_ids = itertools.count(1)
_active: dict[int, Any] = {}
_last_report: Any = None


@dataclass(frozen=True)
class MonitorHandle:
    """What the Monitor Start node outputs (ComfyUI type `H3_MONITOR`): the id of a running monitor."""

    monitor_id: int
    label: str


def default_devices() -> list[str]:
    """The host plus ComfyUI's torch device when it is an accelerator."""
    devices = ["cpu"]
    from h3director.comfy import runtime

    try:
        device = runtime.torch_device()
    except ImportError:  # outside ComfyUI
        return devices
    if getattr(device, "type", "cpu") in ("cuda", "mps"):
        devices.append(str(device))
    return devices


def start_monitor(interval_ms: float, label: str, budget_bytes: int | None = None) -> MonitorHandle:
    """Start a `Monitor` sampling every `interval_ms` (ms) on `default_devices()`, with `budget_bytes`
    (bytes, or None) drawn on its plot, and register it under `label`; returns its `MonitorHandle` for
    `stop_monitor`."""
    from h3director.core.monitor import Monitor

    monitor = Monitor(interval_ms=interval_ms, devices=default_devices(), budget_bytes=budget_bytes)
    monitor.start()
    with _lock:
        handle = MonitorHandle(next(_ids), label)
        _active[handle.monitor_id] = monitor
    return handle


def stop_monitor(handle: MonitorHandle):
    """Stop the monitor behind `handle` and return its `MonitorReport` (also kept as the last report).
    `InvalidInputError` when it is not running (stopped already, or ComfyUI restarted since)."""
    global _last_report
    from h3director.errors import InvalidInputError

    with _lock:
        monitor = _active.pop(handle.monitor_id, None)
    if monitor is None:
        raise InvalidInputError(f"monitor {handle.monitor_id} ({handle.label!r}) is not running: it was stopped "
                                "already, or ComfyUI restarted since it started")
    monitor.stop()
    report = monitor.report(metadata={"label": handle.label})
    with _lock:
        _last_report = report
    return report


def running_report():
    """A snapshot of the most recently started running monitor, else the last stopped report, else None."""
    with _lock:
        monitor = _active[max(_active)] if _active else None
        last = _last_report
    return monitor.report() if monitor is not None else last


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Mark `name` as a phase on every running monitor (so their plots and peaks show it)."""
    with _lock:
        monitors = list(_active.values())
    with contextlib.ExitStack() as stack:
        for monitor in monitors:
            stack.enter_context(monitor.phase(name))
        yield


def report_rgb(report, title: str, folder: Path | None = None):
    """The report's timeline plot as an RGB `PIL.Image`, drawn in a temporary folder (inside
    `folder` when given, else the system's) that is deleted before this returns."""
    import tempfile

    from PIL import Image

    with tempfile.TemporaryDirectory(prefix=".h3director-plot-", dir=folder, ignore_cleanup_errors=True) as tmp:
        path = report.plot(Path(tmp) / "timeline.png", title=title)
        with Image.open(path) as image:
            return image.convert("RGB")


__all__ = ["MonitorHandle", "default_devices", "phase", "report_rgb", "running_report", "start_monitor", "stop_monitor"]
