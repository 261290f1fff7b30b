"""Write-then-rename for file outputs: a final name only ever holds a finished file.

Every file H3 Director writes (sinks, reports, plots, disk-tier entries) goes to a hidden temporary
name in the destination's own folder (same filesystem, so the rename is atomic), is fsynced, and is
renamed over the final name by `commit`. Until then an existing file at the final name is untouched;
a crash leaves at most the temporary, which never carries the final name or its extension.
`atomic_path` wraps the whole sequence for writers that finish in one block.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from h3director.errors import InvalidInputError


def temporary_path(final: Path, tag: str) -> Path:
    """The hidden working name of `final`: ``<folder>/.<name>.<tag>`` (never ends in the final suffix)."""
    return final.with_name(f".{final.name}.{tag}")


def check_output_path(path: str | os.PathLike, suffixes: tuple[str, ...], owner: str) -> Path:
    """Resolve an output path and refuse it early: wrong suffix, missing folder, or a directory. Returns
    the resolved `Path`; `InvalidInputError`, starting with `owner`, for a suffix not in `suffixes`, a
    directory, or a folder that is missing or not writable."""
    final = Path(path).expanduser().absolute()
    if final.suffix.lower() not in suffixes:
        raise InvalidInputError(f"{owner}: output must end in {' or '.join(suffixes)}, got {str(final)!r}")
    if final.is_dir():
        raise InvalidInputError(f"{owner}: output {str(final)!r} is a directory")
    if not final.parent.is_dir():
        raise InvalidInputError(f"{owner}: output folder {str(final.parent)!r} does not exist")
    if not os.access(final.parent, os.W_OK):
        raise InvalidInputError(f"{owner}: output folder {str(final.parent)!r} is not writable")
    return final


def fsync_path(path: Path) -> None:
    """Flush a file's (or a folder's) data to stable storage."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if path.is_dir() else os.O_RDONLY
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def commit(temporary: Path, final: Path) -> Path:
    """Make `temporary` durable and rename it to `final` in one step; returns `final`."""
    fsync_path(temporary)
    os.replace(temporary, final)
    with contextlib.suppress(OSError):  # not every filesystem lets a folder be fsynced
        fsync_path(final.parent)
    return final


def remove_quietly(*paths: Path | None) -> None:
    """Delete each of `paths` that exists (None entries are skipped): a missing file is not an error; any
    other `OSError` propagates."""
    for path in paths:
        if path is not None:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a hidden temporary path next to `path` (its folder is created); when the block succeeds,
    `commit` it to `path`, when it fails, remove it. A finished file or nothing carries the final name."""
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    temporary = temporary_path(final, f"{os.getpid()}.tmp")
    try:
        yield temporary
        commit(temporary, final)
    finally:
        remove_quietly(temporary)


__all__ = ["atomic_path", "check_output_path", "commit", "remove_quietly", "temporary_path"]
