"""Out-of-memory recognition and fault injection for the decode scheduler.

`is_out_of_memory(error)` says whether an exception is an allocator failure worth retrying with a
cheaper execution: `torch.OutOfMemoryError` (CUDA, and what `torch.cuda.OutOfMemoryError` aliases)
or a `RuntimeError` whose message says "out of memory" (MPS, older CUDA paths, CPU allocators).

Fault injection: the scheduler and the adapters call the injector at fixed points of every clip
attempt (`FaultPoint`); an injector raises to simulate a failure there. `OomOnClip` raises a real
`torch.OutOfMemoryError` (constructible on a CPU-only build), so the recovery path that runs in
tests is the one a GPU takes.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

STAGE_START = "start"   # before the adapter is called for a clip attempt
STAGE_MID = "mid"       # inside the adapter, after the first decoder call of the attempt (state half-updated)


@dataclass(frozen=True)
class FaultPoint:
    """Where a clip attempt is: clip index, attempt number (0 = first try) and stage."""

    clip: int
    attempt: int
    stage: str


FaultInjector = Callable[[FaultPoint], None]


CUDA_ERROR_MEMORY_ALLOCATION = 2   # cudaErrorMemoryAllocation, as `torch.AcceleratorError.error_code`


def is_out_of_memory(error: BaseException) -> bool:
    """True for allocator failures: `torch.OutOfMemoryError`, a RuntimeError saying "out of memory", or
    an accelerator error with CUDA's allocation-failure code (what the cudaMallocAsync backend raises)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    if getattr(error, "error_code", None) == CUDA_ERROR_MEMORY_ALLOCATION and isinstance(error, RuntimeError):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def free_memory(device: torch.device | str | None) -> None:
    """Drop unreachable tensors and return cached blocks of `device`'s allocator to the driver."""
    gc.collect()
    kind = torch.device(device).type if device is not None else "cpu"
    if kind == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif kind == "mps" and hasattr(torch, "mps") and torch.backends.mps.is_available():
        torch.mps.empty_cache()


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
