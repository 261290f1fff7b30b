"""A memory-mapped `.npy` sink: frames go to disk as they are decoded, and a killed job can resume.

Files, for a final path `frames.npy`:

    .frames.npy.partial          the array being written (a valid .npy, but never under the final name)
    .frames.npy.progress.json    what has been written: shape, dtype, pixel convention, job key, frames_done
    frames.npy                   appears only in `finish()`, by an atomic rename of the partial file

Order of every write: frames are stored and `msync`ed, then the progress file is replaced atomically.
So `frames_done` never counts a frame that is not on disk, and a file under the final name is always
complete. A resumed job (``resume=True``) reopens the partial file when its progress record matches the
new job exactly (shape, dtype, pixel convention, `job` key) and skips the frames already done.
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from numpy.lib.format import open_memmap

from h3director.core.atomic_file import atomic_path, check_output_path, commit, remove_quietly, temporary_path
from h3director.errors import InvalidInputError
from h3director.video.sinks.contract import StreamSpec
from h3director.video.sinks.ordered import LONGEST_RUN_FRAMES, OrderedSink, require_single_video
from h3director.video.sinks.pixels import float_pixels, uint8_pixels

PROGRESS_FORMAT = "h3director.memmap-progress"
PROGRESS_VERSION = 1
_MAX_PROGRESS_BYTES = 64 * 1024
_DTYPES = {"uint8": np.uint8, "float32": np.float32}


class MemmapSink(OrderedSink):
    """Display frames `[F, H, W, C]` in a `.npy` file, written through a memory map as they arrive.

    ``dtype="uint8"`` (default) stores the uint8 pixels of `Uint8FrameSink`; ``dtype="float32"`` stores
    the [0, 1] float pixels before the * 255 (ComfyUI's IMAGE layout). The result loads with
    ``np.load(path, mmap_mode="r")``. One video per file: a batch of more than one is refused.

    `job` is any string identifying the work (e.g. a hash of the latents and the VAE); with
    ``resume=True`` a partial file left by a killed run of the same job is continued, and `abort()`
    keeps the partial file for a later resume. With ``resume=False`` stale partial files are replaced
    and `abort()` deletes them.

    Memory: written pages are flushed and dropped from the process after each run, so the resident
    cost is about one run of frames (an H3 clip, 17 frames) plus the conversion scratch; the disk needs
    ``F * H * W * C * itemsize`` bytes (checked in `begin`). `finish()` returns the final path.
    """

    writes_to_disk = True

    def __init__(self, path: str | os.PathLike, dtype: str = "uint8", *, resume: bool = False,
                 job: str | None = None, threads: int = 1) -> None:
        super().__init__()
        if dtype not in _DTYPES:
            raise InvalidInputError(f"MemmapSink dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        self.path = check_output_path(path, (".npy",), "MemmapSink")
        self.dtype = dtype
        self.resume = resume
        self.job = job
        self.threads = threads
        self.partial_path = temporary_path(self.path, "partial")
        self.progress_path = temporary_path(self.path, "progress.json")
        self.resumed_frames = 0
        self._array: np.memmap | None = None

    # -- sizes -------------------------------------------------------------------------------------
    def _shape(self, spec: StreamSpec) -> tuple[int, int, int, int]:
        return (spec.frames, spec.height, spec.width, spec.channels)

    def disk_bytes_needed(self, spec: StreamSpec) -> int:
        """Size of the finished file's data (the .npy header adds at most a few hundred bytes)."""
        return int(np.prod(self._shape(spec))) * np.dtype(_DTYPES[self.dtype]).itemsize

    def bytes_needed(self, spec: StreamSpec) -> int:
        return min(spec.frames, LONGEST_RUN_FRAMES) * spec.frame_pixels * np.dtype(_DTYPES[self.dtype]).itemsize

    # -- progress record ---------------------------------------------------------------------------
    def _record(self, spec: StreamSpec, frames_done: int) -> dict:
        return {
            "format": PROGRESS_FORMAT, "version": PROGRESS_VERSION, "shape": list(self._shape(spec)),
            "dtype": self.dtype, "fps": spec.fps,
            "pixel_mean": list(spec.pixel_mean) if spec.pixel_mean is not None else None,
            "pixel_std": list(spec.pixel_std) if spec.pixel_std is not None else None,
            "job": self.job, "frames_done": frames_done,
        }

    def _write_progress(self, frames_done: int) -> None:
        with atomic_path(self.progress_path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
            json.dump(self._record(self.spec, frames_done), handle)

    def _read_progress(self) -> dict:
        """The progress record on disk, validated; raises `InvalidInputError` when it is unusable."""
        where = str(self.progress_path)
        if self.progress_path.stat().st_size > _MAX_PROGRESS_BYTES:
            raise InvalidInputError(f"progress file {where!r} is larger than {_MAX_PROGRESS_BYTES} bytes")
        try:
            record = json.loads(self.progress_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise InvalidInputError(f"progress file {where!r} is unreadable: {exc}") from exc
        if not isinstance(record, dict) or record.get("format") != PROGRESS_FORMAT:
            raise InvalidInputError(f"{where!r} is not an h3director progress file")
        done = record.get("frames_done")
        if not isinstance(done, int) or isinstance(done, bool) or done < 0:
            raise InvalidInputError(f"progress file {where!r}: frames_done must be an int >= 0, got {done!r}")
        return record

    def _resume_point(self, spec: StreamSpec) -> int:
        """Frames already on disk for this exact job, or 0 when there is nothing to resume."""
        if not (self.partial_path.is_file() and self.progress_path.is_file()):
            return 0
        record = self._read_progress()
        expected = self._record(spec, record["frames_done"])
        mismatched = [key for key in expected if key != "frames_done" and record.get(key) != expected[key]]
        if mismatched:
            details = ", ".join(f"{key}: on disk {record.get(key)!r}, now {expected[key]!r}" for key in mismatched)
            raise InvalidInputError(
                f"MemmapSink: the partial output at {str(self.partial_path)!r} belongs to a different job "
                f"({details}); delete it or pass resume=False to start over"
            )
        return min(record["frames_done"], spec.frames)

    # -- sink protocol -----------------------------------------------------------------------------
    def _open(self, spec: StreamSpec) -> None:
        require_single_video(spec, "MemmapSink")
        shape, dtype = self._shape(spec), _DTYPES[self.dtype]
        done = self._resume_point(spec) if self.resume else 0
        if done:
            self._array = open_memmap(self.partial_path, mode="r+")
            if self._array.shape != shape or self._array.dtype != dtype:
                found = (self._array.shape, self._array.dtype)
                self._array = None
                raise InvalidInputError(
                    f"MemmapSink: partial file {str(self.partial_path)!r} holds {found}, expected "
                    f"{(shape, np.dtype(dtype))}; delete it or pass resume=False"
                )
        else:
            free = shutil.disk_usage(self.path.parent).free
            needed = self.disk_bytes_needed(spec)
            if needed > free:
                raise InvalidInputError(
                    f"MemmapSink: {needed} bytes needed in {str(self.path.parent)!r}, only {free} free"
                )
            remove_quietly(self.partial_path, self.progress_path)
            self._array = open_memmap(self.partial_path, mode="w+", dtype=dtype, shape=shape)
            self._write_progress(0)
        self.frames_written = self.resumed_frames = done

    def resume_from(self) -> int:
        return self.resumed_frames

    def _store(self, start: int, frames: torch.Tensor) -> None:
        stop = start + frames.shape[2]
        target = self._array[start:stop]
        if self.dtype == "uint8":
            uint8_pixels(frames[0], self.spec, out=target, threads=self.threads)
        else:
            target[...] = float_pixels(frames[0], self.spec).numpy()
        self._array.flush()
        self._drop_pages(start, stop)
        self._write_progress(stop)

    def _drop_pages(self, start: int, stop: int) -> None:
        """Release the resident pages of frames [start, stop) now that they are on disk (keeps RSS flat)."""
        raw = getattr(self._array, "_mmap", None)
        if raw is None or not hasattr(raw, "madvise"):
            return
        frame_bytes = self._array[0].nbytes
        base = self._array.offset % mmap.ALLOCATIONGRANULARITY
        first = (base + start * frame_bytes) // mmap.PAGESIZE * mmap.PAGESIZE
        last = (base + stop * frame_bytes) // mmap.PAGESIZE * mmap.PAGESIZE
        if last > first:
            raw.madvise(mmap.MADV_DONTNEED, first, last - first)

    def _close(self) -> None:
        if self._array is not None:
            self._array.flush()
            self._array = None

    def finish(self) -> Path:
        self._check_complete()
        self._close()
        commit(self.partial_path, self.path)
        remove_quietly(self.progress_path)
        return self.path

    def abort(self) -> None:
        self._close()
        if not self.resume:
            remove_quietly(self.partial_path, self.progress_path)
        remove_quietly(temporary_path(self.path, "progress.json.tmp"))


__all__ = ["MemmapSink"]
