"""Out-of-memory recognition and fault injection for the decode scheduler.

`is_out_of_memory(error)` says whether an exception is an allocator failure worth retrying with a
cheaper execution. It is `h3director.core.oom.is_out_of_memory`, re-exported: the same recogniser
the `oom` log parser uses (`torch.OutOfMemoryError`, CUDA's allocation-failure code, and the
allocators' messages, the CPU's "DefaultCPUAllocator: can't allocate memory" included).

Fault injection: the scheduler and the adapters call the injector at fixed points of every clip
attempt (`FaultPoint`); an injector raises to simulate a failure there. `OomOnClip` raises a real
`torch.OutOfMemoryError` (constructible on a CPU-only build), so the recovery path that runs in
tests is the one a GPU takes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from h3director.core.guard import free_caches
from h3director.core.oom import CUDA_ERROR_MEMORY_ALLOCATION, is_out_of_memory

__all__ = ["CUDA_ERROR_MEMORY_ALLOCATION", "STAGE_MID", "STAGE_START", "FaultInjector", "FaultPoint", "OomOnClip",
           "free_memory", "is_out_of_memory"]

STAGE_START = "start"   # before the adapter is called for a clip attempt
STAGE_MID = "mid"       # inside the adapter, after the first decoder call of the attempt (state half-updated)


@dataclass(frozen=True)
class FaultPoint:
    """Where a clip attempt is: clip index, attempt number (0 = first try) and stage."""

    clip: int
    attempt: int
    stage: str


FaultInjector = Callable[[FaultPoint], None]


def free_memory(device: torch.device | str | None) -> None:
    """Drop unreachable tensors and return cached blocks of `device`'s allocator to the driver
    (`h3director.core.guard.free_caches`; ``None`` means the CPU)."""
    free_caches("cpu" if device is None else device)


@dataclass
class OomOnClip:
    """Raise `torch.OutOfMemoryError` on the first `times` attempts of each clip in `clips` at `stage`.

    `hits` records every point where it raised, for tests to check.
    """

    clips: Iterable[int]
    stage: str = STAGE_START
    times: int = 1
    hits: list[FaultPoint] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.clips = frozenset(self.clips)
        if self.stage not in (STAGE_START, STAGE_MID):
            raise ValueError(f"stage must be {STAGE_START!r} or {STAGE_MID!r}, got {self.stage!r}")

    def __call__(self, point: FaultPoint) -> None:
        if point.clip in self.clips and point.stage == self.stage and point.attempt < self.times:
            self.hits.append(point)
            raise torch.OutOfMemoryError(
                f"CUDA out of memory (injected by OomOnClip at clip {point.clip}, attempt {point.attempt}, "
                f"stage {point.stage})"
            )
