"""Frame sources for streaming upscaling: a video file, a memory-mapped `.npy`, or an in-memory batch.

A source knows its frame count, size and rate before any frame is read (a sink needs them in `begin`), and
`frames(start)` yields float32 RGB frames ``[H, W, 3]`` in [0, 1] from index `start` on, one at a time, so a source
never holds more than one decoded frame. Each source is checked when it is built: a missing or unreadable file, an
array of the wrong dtype or shape, an empty video are refused with `InvalidInputError` before any output exists.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from h3director.errors import InvalidInputError

DEFAULT_FPS = 24.0


@dataclass
class FrameSource:
    """Base: `count` frames of ``height x width`` RGB at `fps`; `audio_path` names a file whose audio stream is
    carried into a video output unchanged (None: no audio), `identity` a string that names the content for resume."""

    count: int
    height: int
    width: int
    fps: float
    identity: str
    audio_path: Path | None = None

    def frames(self, start: int = 0) -> Iterator[torch.Tensor]:  # pragma: no cover - abstract
        raise NotImplementedError


def _to_float(frame: np.ndarray | torch.Tensor) -> torch.Tensor:
    tensor = torch.from_numpy(np.array(frame)) if not isinstance(frame, torch.Tensor) else frame
    if tensor.dtype == torch.uint8:
        return tensor.to(torch.float32) / 255.0
    return tensor.to(torch.float32)


def _check_shape(shape: tuple[int, ...], what: str) -> None:
    if len(shape) != 4 or shape[-1] != 3 or min(shape) < 1:
        raise InvalidInputError(f"{what}: expected frames [F, H, W, 3] with F, H, W >= 1, got shape {list(shape)}")


class ArraySource(FrameSource):
    """Frames from an array-like ``[F, H, W, 3]``: uint8 (0..255) or float (ComfyUI's IMAGE, [0, 1]); numpy,
    a numpy memory map or a torch tensor. Only the frame being read is converted."""

    def __init__(self, array, *, fps: float = DEFAULT_FPS, identity: str = "array", what: str = "frames") -> None:
        shape = tuple(array.shape)
        _check_shape(shape, what)
        kind = str(array.dtype)
        if not (kind in ("uint8", "torch.uint8") or "float" in kind):
            raise InvalidInputError(f"{what}: expected uint8 or float frames, got dtype {kind}")
        if not fps > 0:
            raise InvalidInputError(f"fps must be > 0, got {fps}")
        super().__init__(shape[0], shape[1], shape[2], float(fps), identity)
        self.array = array

    def frames(self, start: int = 0) -> Iterator[torch.Tensor]:
        for index in range(start, self.count):
            yield _to_float(self.array[index])


def npy_source(path: str | os.PathLike, *, fps: float = DEFAULT_FPS) -> ArraySource:
    """A `.npy` file of uint8 frames ``[F, H, W, 3]``, memory-mapped (float32 in [0, 1] is also taken).
    `fps`: the frame rate to report (frames per second). `InvalidInputError` for a missing or unreadable
    file, or another dtype."""
    source = Path(path)
    if not source.is_file():
        raise InvalidInputError(f"{source}: no such file")
    try:
        array = np.load(source, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"{source}: not a readable .npy file ({exc})") from None
    if array.dtype not in (np.uint8, np.float32):
        raise InvalidInputError(f"{source}: expected uint8 frames [F, H, W, 3] (or float32 in [0, 1]), "
                                f"got dtype {array.dtype}")
    stat = source.stat()
    return ArraySource(array, fps=fps, what=str(source),
                       identity=f"npy:{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}:{array.shape}")


class VideoFileSource(FrameSource):
    """A video file decoded with PyAV one frame at a time (RGB24). Frame count, size and rate come from
    `h3director.av.media.probe` (every packet demuxed, nothing decoded); the first audio stream, when there is one,
    is the audio to carry."""

    def __init__(self, path: str | os.PathLike) -> None:
        from h3director.av.media import probe

        source = Path(path)
        info = probe(source, need_audio=False)
        stat = source.stat()
        super().__init__(info.frames, info.height, info.width, info.fps,
                         f"video:{source.resolve()}:{stat.st_size}:{stat.st_mtime_ns}",
                         source if info.sample_rate else None)
        self.path = source

    def frames(self, start: int = 0) -> Iterator[torch.Tensor]:
        from h3director.av.open_file import import_av, open_input

        av = import_av()
        with open_input(self.path) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            try:
                for index, frame in enumerate(container.decode(stream)):
                    if index >= self.count:
                        break
                    if index >= start:
                        yield _to_float(frame.to_ndarray(format="rgb24"))
            except av.FFmpegError as exc:
                raise InvalidInputError(f"{self.path}: the picture cannot be decoded ({exc})") from None


def open_source(path: str | os.PathLike, *, fps: float | None = None) -> FrameSource:
    """The source a path asks for: `.npy` -> memory-mapped frames, anything else -> a video file."""
    if Path(path).suffix.lower() == ".npy":
        return npy_source(path, fps=fps or DEFAULT_FPS)
    source = VideoFileSource(path)
    if fps:
        source.fps = float(fps)
    return source


__all__ = ["ArraySource", "FrameSource", "VideoFileSource", "npy_source", "open_source"]
