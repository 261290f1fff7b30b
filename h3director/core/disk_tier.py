"""DiskTier: a folder of safetensors entries that the shared store spills to (the conditioning cache).

Ownership
---------
The tier owns one folder, marked by a file named ``.h3director-disk-tier`` that it writes when it
creates the folder or adopts an empty one; a folder that has other files and no marker is refused.
It only ever deletes regular files inside that folder whose names match its own patterns:
``entry-<key>.safetensors`` (entries) and ``.tmp-<key>-<pid>-<hex>.partial`` (writes in progress).
Anything else (including symlinks, sub-folders, and the marker) is never touched.

Writes are atomic: the bytes go to a temporary name, are flushed and fsynced, then renamed over the
entry name and the folder is fsynced, so a crash leaves either the old entry, the new one, or an
orphaned temporary file (swept later), never a half-written entry.

Reads validate before loading (`h3director.core.safetensors_header.read_header`: header length
within ``max_header_bytes`` and the file, known dtypes, offsets inside the data and matching the
shapes, no overlaps). A file that fails validation is proved corrupt: a miss, and (being the tier's own file)
removed (`corrupt_removed`). A read that fails with an `OSError` (a full or flaky disk, a permission change, an
NFS hiccup) proves nothing about the file: it is a miss, the file is kept (it may be the only copy of a shared
entry), the error is logged at WARNING and counted in `read_errors`.

Eviction: least recently used first, by last use (file modification time, refreshed on every read),
when the total exceeds ``max_bytes``; entries unused for more than ``max_age_s`` are dropped.
Keys are 1-128 characters of ``[A-Za-z0-9_-]`` (`content_key` produces 64 hex digits).
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from h3director.core.atomic_file import commit
from h3director.core.safetensors_header import SafetensorsLimits, read_header
from h3director.errors import H3DirectorError, InvalidInputError

_log = logging.getLogger("h3director.disk_tier")
MARKER_NAME = ".h3director-disk-tier"
MARKER_TEXT = "h3director disk tier v1: files named entry-*.safetensors and .tmp-*.partial here belong to it\n"
_KEY_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_ENTRY_RE = re.compile(r"^entry-([A-Za-z0-9_-]{1,128})\.safetensors$")
_TEMP_RE = re.compile(r"^\.tmp-[A-Za-z0-9_-]{1,128}-[0-9]+-[0-9a-f]{16}\.partial$")
DEFAULT_MAX_HEADER_BYTES = 1 << 20


class DiskTierError(H3DirectorError):
    """The disk tier cannot use the folder it was given (not its own, unreadable)."""


@dataclass(frozen=True)
class DiskEntry:
    """One entry of a `DiskTier`: its `key`, `nbytes` (bytes on disk) and `last_used` (seconds since the
    epoch, the file's modification time)."""

    key: str
    nbytes: int
    last_used: float   # seconds since the epoch (file modification time)


def check_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY_RE.match(key):
        raise InvalidInputError(f"disk tier keys are 1-128 characters of [A-Za-z0-9_-], got {key!r}")
    return key


class DiskTier:
    """safetensors entries in a folder this object owns (see the module docstring).

    ``max_bytes``: total size kept (None = no limit); ``max_age_s``: entries unused for longer are
    dropped (None = no limit); ``orphan_age_s``: temporary files older than this are swept on open
    and by `sweep_orphans` (a younger one may be another process's write in progress).
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        max_bytes: int | None = None,
        max_age_s: float | None = None,
        max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
        orphan_age_s: float = 3600.0,
    ) -> None:
        if max_bytes is not None and max_bytes <= 0:
            raise InvalidInputError(f"max_bytes must be positive or None, got {max_bytes}")
        if max_age_s is not None and max_age_s <= 0:
            raise InvalidInputError(f"max_age_s must be positive or None, got {max_age_s}")
        self.folder = Path(folder).absolute()
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self._limits = SafetensorsLimits(max_header_bytes=max_header_bytes)
        self.orphan_age_s = orphan_age_s
        self._lock = threading.RLock()
        self.corrupt_removed = 0
        self.read_errors = 0
        self._claim_folder()
        self.sweep_orphans()

    def _claim_folder(self) -> None:
        marker = self.folder / MARKER_NAME
        if self.folder.is_symlink() or (self.folder.exists() and not self.folder.is_dir()):
            raise DiskTierError(f"disk tier path {self.folder} exists and is not a plain folder")
        if marker.is_file() and not marker.is_symlink():
            if marker.read_text(errors="replace") != MARKER_TEXT:
                raise DiskTierError(f"{marker} exists but was not written by this version of the disk tier")
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        if any(self.folder.iterdir()):
            raise DiskTierError(
                f"refusing to use {self.folder} as a disk tier: it holds files and has no {MARKER_NAME} marker "
                "(give an empty or new folder)"
            )
        self._write_atomically(marker, MARKER_TEXT.encode(), key="marker")

    # ------------------------------------------------------------------ names and removal

    def _entry_path(self, key: str) -> Path:
        return self.folder / f"entry-{check_key(key)}.safetensors"

    def _owns(self, path: Path) -> bool:
        return (
            path.parent == self.folder
            and (_ENTRY_RE.match(path.name) is not None or _TEMP_RE.match(path.name) is not None)
            and path.is_file()
            and not path.is_symlink()
        )

    def _remove_owned(self, path: Path) -> bool:
        """Delete ``path`` only if it is one of this tier's own files; returns whether it did."""
        if not self._owns(path):
            return False
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        return True

    def _write_atomically(self, final: Path, data: bytes, *, key: str) -> None:
        tmp = self.folder / f".tmp-{key}-{os.getpid()}-{secrets.token_hex(8)}.partial"
        try:
            with open(tmp, "xb") as handle:
                handle.write(data)
            commit(tmp, final)
        except BaseException:
            self._remove_owned(tmp)
            raise

    # ------------------------------------------------------------------ entries

    def put(self, key: str, tensors: Mapping[str, torch.Tensor] | torch.Tensor,
            metadata: Mapping[str, str] | None = None) -> int:
        """Store ``tensors`` (one tensor is stored as ``"tensor"``) under ``key``, replacing any entry; returns bytes."""
        from safetensors.torch import save

        check_key(key)
        if isinstance(tensors, torch.Tensor):
            tensors = {"tensor": tensors}
        payload = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}
        data = save(payload, metadata=dict(metadata) if metadata else None)
        with self._lock:
            self._write_atomically(self._entry_path(key), data, key=key)
            self.enforce_limits()
        return len(data)

    def get(self, key: str) -> dict[str, torch.Tensor] | None:
        """The tensors stored under ``key``, or None: missing; corrupt (the entry is removed); or unreadable now
        (an `OSError`: the entry is kept, the error logged and counted in `read_errors`)."""
        from safetensors import SafetensorError
        from safetensors.torch import load

        path = self._entry_path(key)
        with self._lock:
            if not path.is_file():
                return None
            try:
                read_header(path, self._limits)
                tensors = load(path.read_bytes())
            except (InvalidInputError, SafetensorError):
                if self._remove_owned(path):
                    self.corrupt_removed += 1
                return None
            except OSError as error:
                self.read_errors += 1
                _log.warning("disk tier: could not read %s (%s); the entry is kept and counted as a miss",
                             path, error)
                return None
            os.utime(path)  # last use, for LRU and age limits
            return tensors

    def contains(self, key: str) -> bool:
        return self._entry_path(key).is_file()

    def remove(self, key: str) -> bool:
        with self._lock:
            return self._remove_owned(self._entry_path(key))

    def entries(self) -> list[DiskEntry]:
        """Entries, least recently used first."""
        found = []
        for path in self.folder.iterdir():
            match = _ENTRY_RE.match(path.name)
            if match and self._owns(path):
                stat = path.stat()
                found.append(DiskEntry(match.group(1), stat.st_size, stat.st_mtime))
        return sorted(found, key=lambda e: (e.last_used, e.key))

    def total_bytes(self) -> int:
        return sum(e.nbytes for e in self.entries())

    def enforce_limits(self, now: float | None = None) -> list[str]:
        """Drop entries past ``max_age_s``, then least recently used ones until under ``max_bytes``; returns keys."""
        now = time.time() if now is None else now
        dropped = []
        with self._lock:
            entries = self.entries()
            if self.max_age_s is not None:
                for entry in entries:
                    if now - entry.last_used > self.max_age_s and self.remove(entry.key):
                        dropped.append(entry.key)
                entries = [e for e in entries if e.key not in dropped]
            if self.max_bytes is not None:
                total = sum(e.nbytes for e in entries)
                for entry in entries:
                    if total <= self.max_bytes:
                        break
                    if self.remove(entry.key):
                        dropped.append(entry.key)
                        total -= entry.nbytes
        return dropped

    def sweep_orphans(self, older_than_s: float | None = None) -> int:
        """Remove this tier's temporary files older than ``older_than_s`` (default ``orphan_age_s``)."""
        limit = self.orphan_age_s if older_than_s is None else older_than_s
        now = time.time()
        removed = 0
        with self._lock:
            for path in self.folder.iterdir():
                if _TEMP_RE.match(path.name) and now - path.stat().st_mtime >= limit and self._remove_owned(path):
                    removed += 1
        return removed

    def purge(self) -> int:
        """Remove every entry and temporary file of this tier (the marker and foreign files stay)."""
        removed = 0
        with self._lock:
            for path in self.folder.iterdir():
                if self._remove_owned(path):
                    removed += 1
        return removed


__all__ = ["MARKER_NAME", "DiskEntry", "DiskTier", "DiskTierError"]
