"""Shared bookkeeping of the concrete sinks: spec checks and in-order, gap-free runs of frames."""

from __future__ import annotations

import torch

from h3director.errors import InvalidInputError
from h3director.geometry import CLIP_LENGTH, H3_TEMPORAL
from h3director.video.sinks.contract import FrameSink, StreamSpec

LONGEST_RUN_FRAMES = CLIP_LENGTH + H3_TEMPORAL.frame_overlap
"""Most frames an H3 decode hands a sink in one `write`: the last clip's body and its tail (22)."""


def check_spec(spec: StreamSpec, owner: str) -> None:
    """Refuse a spec no sink can store: non-positive sizes or a pixel convention of the wrong length."""
    sizes = {"batch": spec.batch, "channels": spec.channels, "frames": spec.frames, "height": spec.height,
             "width": spec.width}
    bad = [f"{name}={value}" for name, value in sizes.items() if int(value) < 1]
    if bad:
        raise InvalidInputError(f"{owner}: every size must be >= 1, got {', '.join(bad)}")
    if (spec.pixel_mean is None) != (spec.pixel_std is None):
        raise InvalidInputError(f"{owner}: pixel_mean and pixel_std must both be given or both be None")
    for name, values in (("pixel_mean", spec.pixel_mean), ("pixel_std", spec.pixel_std)):
        if values is not None and len(values) != spec.channels:
            raise InvalidInputError(
                f"{owner}: {name} has {len(values)} values, expected one per channel ({spec.channels})"
            )


def require_single_video(spec: StreamSpec, owner: str) -> None:
    """Refuse a batch: file and fingerprint sinks hold one video (batch item) each."""
    if spec.batch != 1:
        raise InvalidInputError(
            f"{owner} takes one video, got a batch of {spec.batch}: decode each batch item on its own"
        )


class OrderedSink(FrameSink):
    """A sink that takes frames in order without gaps and checks every run against the spec.

    Subclasses implement `_open(spec)` and `_store(start, frames)`; `write` validates first, so
    `_store` only sees runs `[B, C, n, H, W]` with ``start == frames_written``. A run that repeats
    frames already stored (a resumed job) is trimmed to its new part.
    """

    def __init__(self) -> None:
        self._spec: StreamSpec | None = None
        self.frames_written = 0

    @property
    def spec(self) -> StreamSpec:
        if self._spec is None:
            raise RuntimeError(f"{type(self).__name__}: begin(spec) has not been called")
        return self._spec

    def begin(self, spec: StreamSpec) -> None:
        check_spec(spec, type(self).__name__)
        self._spec = spec
        self.frames_written = 0
        self._open(spec)

    def _open(self, spec: StreamSpec) -> None:
        """Allocate or open storage for `spec` (called by `begin`)."""

    def _store(self, start: int, frames: torch.Tensor) -> None:
        raise NotImplementedError

    def write(self, start: int, frames: torch.Tensor) -> None:
        spec = self.spec
        expected = (spec.batch, spec.channels, spec.height, spec.width)
        got = tuple(frames.shape)
        if frames.dim() != 5 or (got[0], got[1], got[3], got[4]) != expected:
            raise InvalidInputError(
                f"{type(self).__name__}: expected frames [B={spec.batch}, C={spec.channels}, n, "
                f"H={spec.height}, W={spec.width}], got shape {list(got)}"
            )
        count = got[2]
        if start < 0 or start + count > spec.frames:
            raise InvalidInputError(
                f"{type(self).__name__}: frames {start}..{start + count - 1} fall outside the video's "
                f"{spec.frames} frames"
            )
        if start > self.frames_written:
            raise InvalidInputError(
                f"{type(self).__name__}: frames must arrive in order without gaps: next expected frame "
                f"{self.frames_written}, got a run starting at {start}"
            )
        skip = self.frames_written - start
        if skip >= count:
            return
        if skip:
            frames, start = frames[:, :, skip:], self.frames_written
        self._store(start, frames)
        self.frames_written = start + frames.shape[2]

    def _check_complete(self) -> None:
        if self.frames_written != self.spec.frames:
            raise InvalidInputError(
                f"{type(self).__name__}: finish() after {self.frames_written} of {self.spec.frames} frames"
            )


class BufferSink(OrderedSink):
    """An `OrderedSink` whose result is one buffer allocated in `_open`: `finish()` hands it over, `abort()` drops it."""

    def __init__(self) -> None:
        super().__init__()
        self._out = None

    def finish(self):
        self._check_complete()
        out, self._out = self._out, None
        return out

    def abort(self) -> None:
        self._out = None


__all__ = ["LONGEST_RUN_FRAMES", "BufferSink", "OrderedSink", "require_single_video"]
