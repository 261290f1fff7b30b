"""Per-stage time and peak memory of a streaming upscale, and the model dtype option.

A frame passes through up to five stages: ``read`` (the source decodes it), ``pre-resize``, ``model`` (tiles
through the upscale/restoration model), ``post-resize`` and ``write`` (the sink). `StageClock.measure(name)`
wraps one stage of one frame: wall time is summed over frames; the host peak is the process's resident-set high
water mark during the stage (`VmHWM`, reset on entry through `h3director.core.devices.reset_peak_rss`, so it is the
stage's own peak, counting everything resident then: weights, interpreter, buffers), the maximum over frames; the
device peak (CUDA only: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` on entry) likewise.
Resetting the marks means the process's lifetime `VmHWM` is no longer readable afterwards: `StageClock` keeps the
mark it found at the start, and `peak_host_bytes` is the larger of that and every stage's peak.

`parse_dtype("fp16")` maps the option to a torch dtype; `dtype_refusal(device, dtype)` says why a device cannot
run it (None when it can).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass

import torch

from h3director.core.devices import peak_rss_bytes, reset_peak_rss
from h3director.errors import InvalidInputError

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
"""Model dtypes by option name."""


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    """The torch dtype for "fp32", "fp16" or "bf16" (a torch dtype among those passes through); else
    `InvalidInputError`."""
    if isinstance(name, torch.dtype) and name in DTYPES.values():
        return name
    key = str(name).strip().lower()
    if key not in DTYPES:
        raise InvalidInputError(f"dtype {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """The `DTYPES` name ("fp32", "fp16", "bf16") of a torch dtype; other dtypes by their torch name."""
    return next((key for key, value in DTYPES.items() if value == dtype), str(dtype).replace("torch.", ""))


def dtype_refusal(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Why `device` cannot run `dtype`, from what the device reports (None: it can).

    CUDA: float16 needs compute capability >= 5.3 (`torch.cuda.get_device_capability`), bfloat16 needs
    `torch.cuda.is_bf16_supported(including_emulation=False)` (Ampere and newer). Other devices are not refused
    here; a model whose layers the device cannot run in the dtype is refused by the probe forward in
    `h3director.video.upscale.check_dtype`."""
    device = torch.device(device)
    if dtype == torch.float32 or device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        return f"{device} is not available (no CUDA device)"
    index = device.index if device.index is not None else torch.cuda.current_device()
    name = torch.cuda.get_device_name(index)
    major, minor = torch.cuda.get_device_capability(index)
    if dtype == torch.float16 and (major, minor) < (5, 3):
        return f"{device} ({name}, compute capability {major}.{minor}) has no float16 arithmetic (needs >= 5.3)"
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported(including_emulation=False):
        return f"{device} ({name}, compute capability {major}.{minor}) has no native bfloat16 (needs >= 8.0)"
    return None


@dataclass
class StageStats:
    """One stage of a run: `frames` passed through it, `seconds` summed wall time, `peak_host_bytes` the process's
    resident-set peak during it (max over frames; None where /proc cannot be reset), `peak_device_bytes` the CUDA
    allocator's peak during it (None off CUDA), `exactness` what the stage does to the picture."""

    name: str
    exactness: str
    frames: int = 0
    seconds: float = 0.0
    peak_host_bytes: int | None = None
    peak_device_bytes: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


class StageClock:
    """Measures the stages of a run (see the module doc). `device`: where the model runs (CUDA peaks read there)."""

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.stages: dict[str, StageStats] = {}
        self.start_peak = peak_rss_bytes()
        self._can_reset = reset_peak_rss()

    def add(self, name: str, exactness: str) -> None:
        """Declare a stage (in the order of a frame's path); `measure` needs it declared."""
        self.stages[name] = StageStats(name, exactness)

    @contextmanager
    def measure(self, name: str) -> Iterator[dict]:
        """Time one frame's pass through stage `name`; record its host and device peaks. The yielded dict's
        ``"frame"`` set False makes the pass not count as a frame (a source's final, empty read)."""
        stats = self.stages[name]
        cuda = self.device.type == "cuda"
        if self._can_reset:
            reset_peak_rss()
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        started = time.perf_counter()
        state = {"frame": True}
        try:
            yield state
        finally:
            if cuda:
                torch.cuda.synchronize(self.device)
            stats.seconds += time.perf_counter() - started
            stats.frames += int(state["frame"])
            if self._can_reset:
                peak = peak_rss_bytes()
                if peak is not None:
                    stats.peak_host_bytes = max(stats.peak_host_bytes or 0, peak)
            if cuda:
                peak = int(torch.cuda.max_memory_allocated(self.device))
                stats.peak_device_bytes = max(stats.peak_device_bytes or 0, peak)

    def peak_host_bytes(self) -> int | None:
        """The process's peak resident set over its life so far (the mark found at the start and every stage's)."""
        values = [v for v in [self.start_peak, peak_rss_bytes(), *(s.peak_host_bytes for s in self.stages.values())]
                  if v is not None]
        return max(values) if values else None

    def report(self) -> list[StageStats]:
        return list(self.stages.values())


__all__ = ["DTYPES", "StageClock", "StageStats", "dtype_name", "dtype_refusal", "parse_dtype"]
