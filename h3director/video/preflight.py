"""Preflight of a streaming decode: will one clip plus the sink's buffer fit the memory budget?

Budgets come from the caller (`budget_bytes`, meant for the decoder's device) or from
`h3_config.yaml` `memory_safety` (`max_gpu_memory_mb` for an accelerator, `max_host_memory_mb` for
host RAM). When the decoder runs on the CPU, the clip's working set and the sink's buffer share host
RAM and are checked together. Refusals are `BudgetError`s that name the setting that would fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from h3director.errors import BudgetError
from h3director.units import MiB, format_size
from h3director.video.decoder import ClipExecution, VideoDecoderAdapter
from h3director.video.sinks.contract import FrameSink, StreamSpec

LEAST_MEMORY = ClipExecution(tiles_per_call=1)
ARGUMENT = "the budget argument"
FILE_SINK_FIX = "a file sink (video_decode.sink: memmap or video; --sink memmap, or --out *.mp4)"


@dataclass(frozen=True)
class DecodeBudget:
    """Byte budgets for a decode; None = unlimited. `source` says where they came from."""

    device_bytes: int | None
    host_bytes: int | None
    source: str


@dataclass(frozen=True)
class PreflightResult:
    """What the preflight estimated and chose: bytes per clip and for the sink, and the execution."""

    clip_bytes: int
    sink_bytes: int
    execution: ClipExecution
    budget: DecodeBudget


def resolve_budget(budget_bytes: int | None, device: torch.device, safety=None) -> DecodeBudget:
    """The budget for a decode on `device`: `budget_bytes` if given, else `safety` (the config's
    `memory_safety` section; None = no configured limits)."""
    host_bytes = config_device = None
    if safety is not None and safety.enabled:
        host_bytes = safety.max_host_memory_bytes
        config_device = host_bytes if device.type == "cpu" else safety.max_gpu_memory_bytes
    if budget_bytes is not None:
        return DecodeBudget(device_bytes=budget_bytes, host_bytes=host_bytes, source=ARGUMENT)
    return DecodeBudget(device_bytes=config_device, host_bytes=host_bytes, source="h3_config.yaml memory_safety")


def _setting_for_device(device: torch.device) -> str:
    return "memory_safety.max_host_memory_mb" if device.type == "cpu" else "memory_safety.max_gpu_memory_mb"


def preflight(adapter: VideoDecoderAdapter, latents_shape: tuple[int, ...], spec: StreamSpec,
              sink: FrameSink, execution: ClipExecution, budget: DecodeBudget,
              *, tiles_per_call_given: bool) -> PreflightResult:
    """The `PreflightResult` for decoding `latents_shape` into `sink` with `adapter`: bytes per clip and for
    the sink, and the execution to start with, checked against `budget` (bytes) before any work. A request
    that cannot fit raises `BudgetError` naming the setting that would make it fit.

    When `tiles_per_call` was not given and the reference path does not fit but the streamed
    one-tile-per-call path does, that one is chosen (same output, less memory). Otherwise a
    `BudgetError` names the setting that would make it fit.
    """
    batch, _, _, height, width = latents_shape
    device = adapter.device
    clip_bytes = adapter.clip_working_set_bytes(batch, height, width, execution)
    sink_bytes = int(sink.bytes_needed(spec))
    on_host = device.type == "cpu"
    device_need = clip_bytes + (sink_bytes if on_host else 0)
    device_budget = budget.device_bytes

    if device_budget is not None and device_need > device_budget:
        least = adapter.clip_working_set_bytes(batch, height, width, LEAST_MEMORY)
        least_need = least + (sink_bytes if on_host else 0)
        if least_need <= device_budget and not tiles_per_call_given:
            execution, clip_bytes = LEAST_MEMORY, least
        else:
            fixes = []
            if least < clip_bytes:
                fixes.append(f"video_decode.tiles_per_call: 1 (one clip then needs {format_size(least)})")
            if on_host and sink_bytes > 0 and not sink.writes_to_disk:
                fixes.append(FILE_SINK_FIX)
            needed_mb = -(-min(least_need, device_need) // MiB)
            if budget.source == ARGUMENT:
                fixes.append(f"a budget of {needed_mb} MiB or more")
            else:
                fixes.append(f"{_setting_for_device(device)}: {needed_mb} or more")
            raise BudgetError(
                f"decoding needs about {format_size(device_need)} on {device} (one clip with "
                f"{execution.describe()}: {format_size(clip_bytes)}"
                + (f", sink buffer: {format_size(sink_bytes)}" if on_host else "")
                + f"), but the budget from {budget.source} is {format_size(device_budget)}. "
                f"To fit, set " + "; or ".join(fixes)
            )
    if not on_host and budget.host_bytes is not None and sink_bytes > budget.host_bytes:
        file_sink = "" if sink.writes_to_disk else f"use {FILE_SINK_FIX}, or "
        raise BudgetError(
            f"the {type(sink).__name__} holds {format_size(sink_bytes)} of frames in host RAM, but "
            f"memory_safety.max_host_memory_mb allows {format_size(budget.host_bytes)}. To fit, {file_sink}set "
            f"memory_safety.max_host_memory_mb: {-(-sink_bytes // MiB)} or more"
        )
    return PreflightResult(clip_bytes=clip_bytes, sink_bytes=sink_bytes, execution=execution, budget=budget)


__all__ = ["DecodeBudget", "PreflightResult", "preflight", "resolve_budget"]
