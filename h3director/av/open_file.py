"""Opening media files with PyAV (A/V sync, shifting, stitching), with one clear error for every way that fails."""

from __future__ import annotations

import os
from pathlib import Path

from h3director.errors import InvalidInputError, missing_package


def import_av():
    """PyAV, or an `InvalidInputError` naming the extra that installs it."""
    try:
        import av
    except ImportError as exc:  # pragma: no cover - av is a declared dependency of the "video" extra
        raise InvalidInputError(missing_package("reading and writing media files", "PyAV", "video")) from exc
    return av


def open_input(path: str | os.PathLike):
    """Open `path` for reading; a missing file or one FFmpeg cannot open is an `InvalidInputError`. Returns
    PyAV's input container (close it, or use it in a ``with`` block)."""
    av = import_av()
    source = Path(path)
    if not source.is_file():
        raise InvalidInputError(f"{source}: no such file")
    try:
        return av.open(str(source), mode="r")
    except (av.FFmpegError, OSError, ValueError) as exc:
        raise InvalidInputError(f"{source}: not a readable media file ({exc})") from None


__all__ = ["import_av", "open_input"]
