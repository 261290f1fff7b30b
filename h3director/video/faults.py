"""Out-of-memory recognition and fault injection for the decode scheduler.

`is_out_of_memory(error)` says whether an exception is an allocator failure worth retrying with a
cheaper execution. It is `h3director.core.oom.is_out_of_memory`, re-exported: the same recogniser
the `oom` log parser uses (`torch.OutOfMemoryError`, CUDA's allocation-failure code, and the
allocators' messages, the CPU's "DefaultCPUAllocator: can't allocate memory" included).

Fault injection: the scheduler and the adapters call the injector at fixed points of every clip
attempt (`FaultPoint`); an injector raises to simulate a failure there (the tests' injector is
`fixtures/oom_injection.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from h3director.core.oom import CUDA_ERROR_MEMORY_ALLOCATION, is_out_of_memory

__all__ = ["CUDA_ERROR_MEMORY_ALLOCATION", "STAGE_MID", "STAGE_START", "FaultInjector", "FaultPoint",
           "is_out_of_memory"]

STAGE_START = "start"   # before the adapter is called for a clip attempt
STAGE_MID = "mid"       # inside the adapter, after the first decoder call of the attempt (state half-updated)


@dataclass(frozen=True)
class FaultPoint:
    """Where a clip attempt is: clip index, attempt number (0 = first try) and stage."""

    clip: int
    attempt: int
    stage: str


FaultInjector = Callable[[FaultPoint], None]
