"""H3Director Memory Monitor: Start / Stop around part of a graph (or a whole prompt)."""

from __future__ import annotations

import time

from comfy_api.latest import io

MONITOR_TYPE = io.Custom("H3_MONITOR")
_ops_logs: dict[int, object] = {}   # monitor id -> the TransferLog its Start node entered (worker thread)
_node_names: dict[tuple[str, str], str] = {}


def executing_node_name() -> str | None:
    """``"#<id> <class_type>"`` of the node ComfyUI executes on this thread, or None (names cached)."""
    try:
        from comfy_execution.utils import get_executing_context
    except ImportError:
        return None
    context = get_executing_context()
    if context is None:
        return None
    key = (str(context.prompt_id), str(context.node_id))
    if key not in _node_names:
        from h3director.comfy.runtime import prompt_node

        node = prompt_node(*key) or {}
        _node_names[key] = f"#{key[1]} {node.get('class_type') or '?'}"
    return _node_names[key]


def start_ops_log(monitor_id: int) -> None:
    """Enter a `TransferLog` on this (ComfyUI's worker) thread for the monitor; one at a time."""
    from h3director.comfy import runtime
    from h3director.core.transfers import TransferLog

    for stale in list(_ops_logs):   # a Stop that never ran (the prompt failed): end its log first
        stop_ops_log(stale)
    log = TransferLog(runtime.torch_device(), phase_of=executing_node_name)
    log.__enter__()
    _ops_logs[monitor_id] = log


def stop_ops_log(monitor_id: int) -> str | None:
    """Exit the monitor's log and return its table, or None when it had none."""
    log = _ops_logs.pop(monitor_id, None)
    if log is None:
        return None
    log.__exit__(None, None, None)
    return log.table()


def report_image(report, title: str):
    """The report's timeline plot as a ComfyUI IMAGE `[1, H, W, 3]` float32 in [0, 1]."""
    import numpy as np
    import torch

    from h3director.comfy.live import report_rgb

    pixels = np.asarray(report_rgb(report, title), dtype=np.float32) / 255.0
    return torch.from_numpy(pixels).unsqueeze(0)


class MonitorStart(io.ComfyNode):
    """Node `H3DirectorMonitorStart`: optional `trigger` (anything) + `interval_ms` (ms between samples),
    `label` and `ops_log` -> `monitor` (H3_MONITOR, the handle for Monitor Stop) and `passthrough` (the
    trigger, unchanged). Starts sampling host RSS and GPU memory; wire `passthrough` on to order it before
    the watched nodes."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorMonitorStart",
            display_name="H3Director Memory Monitor (Start)",
            category="H3 Director/monitor",
            description="Starts sampling host RSS and GPU memory. Connect the monitor output to a Monitor (Stop).",
            inputs=[
                io.AnyType.Input("trigger", optional=True, tooltip="Anything; passed through unchanged."),
                io.Int.Input("interval_ms", default=500, min=10, max=60000, step=10),
                io.String.Input("label", default="prompt"),
                io.Boolean.Input("ops_log", default=False, optional=True,
                                 tooltip="Also log host<->device copies, synchronising calls and CPU ops per node "
                                         "until the Stop node (slows every op a little)."),
            ],
            outputs=[MONITOR_TYPE.Output(display_name="monitor"), io.AnyType.Output(display_name="passthrough")],
            not_idempotent=True,
        )

    @classmethod
    def fingerprint_inputs(cls, **kwargs) -> float:
        return time.time()  # a monitor must start afresh on every run

    @classmethod
    def execute(cls, interval_ms, label, trigger=None, ops_log=False) -> io.NodeOutput:
        from h3director.comfy.live import start_monitor

        handle = start_monitor(interval_ms, label)
        if ops_log:
            start_ops_log(handle.monitor_id)
        return io.NodeOutput(handle, trigger)


class MonitorStop(io.ComfyNode):
    """Node `H3DirectorMonitorStop`: `monitor` (Monitor Start's H3_MONITOR) + optional `trigger` (the last
    watched node's output, for ordering) -> `timeline` (IMAGE of the memory plot) and `summary` (STRING:
    the summary table, with the ops log when it was on). Stops that monitor."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorMonitorStop",
            display_name="H3Director Memory Monitor (Stop)",
            category="H3 Director/monitor",
            description="Stops the monitor once `trigger` (the last watched node's output) is ready.",
            inputs=[
                MONITOR_TYPE.Input("monitor"),
                io.AnyType.Input("trigger", optional=True, tooltip="Connect the last watched node's output."),
            ],
            outputs=[io.Image.Output(display_name="timeline"), io.String.Output(display_name="summary")],
            is_output_node=True,
            not_idempotent=True,
        )

    @classmethod
    def fingerprint_inputs(cls, **kwargs) -> float:
        return time.time()

    @classmethod
    def execute(cls, monitor, trigger=None) -> io.NodeOutput:
        from h3director.comfy.live import stop_monitor

        ops = stop_ops_log(monitor.monitor_id)
        report = stop_monitor(monitor)
        summary = report.summary_table() + (f"\n\n{ops}" if ops else "")
        return io.NodeOutput(report_image(report, f"H3 Director: {monitor.label}"), summary,
                             ui={"text": (summary,)})


__all__ = ["MonitorStart", "MonitorStop", "report_image"]
