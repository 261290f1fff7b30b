"""Control of the host C heap (glibc malloc), so freed frame buffers leave the resident set.

glibc serves blocks above its mmap threshold with `mmap` and returns them to the OS on `free`.
The threshold is dynamic by default: each time a large mmapped block is freed, glibc raises the
threshold to that block's size (up to 32 MiB on 64-bit), so later frame-sized buffers come from
the heap and stay resident after they are freed. A streaming decode frees one clip's buffers per
clip, so with the dynamic threshold its resident set creeps up with video length (measured: +16%
between 22 and 277 frames at 640x384, `bench/decode_memory.py`). Pinning the threshold with
`mallopt(M_MMAP_THRESHOLD)` (which also switches the dynamic adjustment off) keeps it flat.

Scope: the setting is for the whole process and cannot be undone. glibc has no getter for the
threshold, and every `mallopt(M_MMAP_THRESHOLD, n)` also sets its "no dynamic threshold" flag, which no
call clears (glibc `malloc/malloc.c`, `do_set_mmap_threshold`): once set, the dynamic default cannot be
restored, only replaced by another fixed value. So the director pins it only in processes it owns (its
CLI commands that decode, `pin_decode_threshold`), never inside a host application such as ComfyUI, where
it would also change how sampling allocates for the rest of the server's life. A ComfyUI user who wants
it sets glibc's `MALLOC_MMAP_THRESHOLD_` environment variable when starting the server.

Everything here is a no-op returning False where the C library is not glibc.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools

M_MMAP_THRESHOLD = -3          # glibc <malloc.h>
MAX_MMAP_THRESHOLD = 32 * 1024 * 1024   # glibc's HEAP_MAX_SIZE / 2 on 64-bit: mallopt refuses more


@functools.lru_cache(maxsize=1)
def _glibc():
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL(name)
        if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") and hasattr(libc, "gnu_get_libc_version"):
            return libc
    return None


def pin_mmap_threshold(threshold_bytes: int) -> bool:
    """Serve every allocation of at least `threshold_bytes` with mmap, returned to the OS on free.

    Process-wide and permanent for the process (it is how glibc's `MALLOC_MMAP_THRESHOLD_`
    environment variable works; nothing restores the dynamic threshold, see the module docstring). Returns True when glibc accepted it, False elsewhere.
    Raises ValueError for a threshold outside 0..32 MiB.
    """
    if not 0 <= threshold_bytes <= MAX_MMAP_THRESHOLD:
        raise ValueError(f"mmap threshold must be 0..{MAX_MMAP_THRESHOLD} bytes, got {threshold_bytes}")
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(threshold_bytes)))


def pin_decode_threshold(config=None) -> bool:
    """Pin the threshold to `config`'s ``video_decode.host_mmap_threshold_mb`` (MiB; None: leave glibc's
    dynamic threshold) for the rest of this process; `config` an `H3Config`, default `load_config()`.

    Only for a process the director owns (its CLI commands that decode): see the module docstring.
    Returns True when glibc accepted a threshold, False when the config asks for none or the C library
    is not glibc."""
    if config is None:
        from h3director.core.config import load_config

        config = load_config()
    megabytes = config.video_decode.host_mmap_threshold_mb
    if megabytes is None:
        return False
    return pin_mmap_threshold(megabytes * 1024 * 1024)


def release_free_heap() -> bool:
    """Hand freed heap pages back to the OS (glibc `malloc_trim(0)`); True when glibc released any."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.malloc_trim(0))


__all__ = ["pin_mmap_threshold", "release_free_heap"]
