"""Exact peak resident memory of this process, resettable per phase (Linux), for demos and benches.

The kernel tracks the high-water mark of the resident set (``VmHWM`` in ``/proc/self/status``)
exactly, with no sampling gaps; writing ``5`` to ``/proc/self/clear_refs`` resets it to the current
resident set (Linux >= 4.0). Elsewhere `peak_rss_bytes` falls back to ``getrusage`` (a lifetime
peak that cannot be reset) and `reset_peak_rss` returns False. All values are bytes.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import resource
import sys

_STATUS = "/proc/self/status"


def _status_bytes(field: str) -> int | None:
    try:
        with open(_STATUS, encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        return None
    return None


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS; False where that is not possible."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def peak_rss_bytes() -> int:
    """Peak resident set of this process since the last successful `reset_peak_rss` (or since start)."""
    value = _status_bytes("VmHWM")
    if value is not None:
        return value
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def current_rss_bytes() -> int | None:
    """Resident set of this process now (Linux ``VmRSS``), None where unavailable."""
    return _status_bytes("VmRSS")


def release_free_heap() -> None:
    """Hand freed heap pages back to the OS (glibc ``malloc_trim``), so the next phase starts clean."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)
