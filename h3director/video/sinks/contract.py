"""The contract between the streaming decode scheduler and the places decoded frames go.

The scheduler calls, in order:

    sink.begin(spec)                    once, before any decoding (sinks allocate or open here)
    sink.write_audio(samples, rate)     at most once, before or between frames (sinks that take audio)
    sink.write(start, frames)           as each run of frames becomes final, in increasing order
    result = sink.finish()              once, after the last frame: commit (file sinks rename now)
    sink.abort()                        instead of finish() when decoding failed: drop partial output

`frames` is always a float32 (or the decoder's dtype) CPU-or-device tensor `[B, C, n, H, W]` in the
decoder's own pixel space (see `StreamSpec.pixel_mean` / `pixel_std`); `start` is the index of its
first frame in the whole video. A sink must copy what it keeps: the scheduler releases `frames`
after `write` returns.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class StreamSpec:
    """Shape and pixel convention of a decoded video, known before decoding starts.

    `pixel_mean`/`pixel_std` map decoder output to [0, 1] pixels as ``x * std + mean`` per channel
    (H3: ImageNet statistics); both None means the ``(x + 1) / 2`` convention of [-1, 1] decoders.
    `fps` is frames per second of the video; `frames` is the total the scheduler will write.
    """

    batch: int
    channels: int
    frames: int
    height: int
    width: int
    fps: float
    pixel_mean: tuple[float, ...] | None = None
    pixel_std: tuple[float, ...] | None = None

    @property
    def frame_pixels(self) -> int:
        """Values in one frame of one batch item: C * H * W."""
        return self.channels * self.height * self.width


class FrameSink(ABC):
    """Receives finished frames from the scheduler. Subclasses document their own memory cost."""

    supports_audio: bool = False
    writes_to_disk: bool = False
    """True for sinks that stream frames to a file, holding only a clip or so in RAM."""

    @abstractmethod
    def begin(self, spec: StreamSpec) -> None:
        """Prepare for `spec.frames` frames; raise `InvalidInputError` if the spec cannot be stored."""

    @abstractmethod
    def write(self, start: int, frames: torch.Tensor) -> None:
        """Store final frames `[B, C, n, H, W]` that start at frame index `start`."""

    def write_audio(self, samples: torch.Tensor, sample_rate: int) -> None:
        """Store decoded audio `[B, channels, samples]` (float, [-1, 1]); only for `supports_audio` sinks."""
        raise NotImplementedError(f"{type(self).__name__} does not take audio")

    def use_buffers(self, buffers: Any) -> None:
        """Called by the scheduler before the first write with its `ClipBuffers`
        (`h3director.video.clip_buffers`); a sink that stages frames per clip may take its staging
        buffer from there (`buffers.staging_uint8`). The base sink stages nothing."""
        return None

    def resume_from(self) -> int:
        """Frames (from the start) already stored by an earlier, interrupted run; valid after `begin`.

        0 unless the sink resumed partial output (`MemmapSink(resume=True)`). A scheduler may skip
        clips whose frames all lie before this index; frames it writes again anyway are ignored.
        """
        return 0

    def bytes_needed(self, spec: StreamSpec) -> int:
        """Bytes of host memory this sink holds at its peak for `spec` (used by the preflight)."""
        return 0

    @abstractmethod
    def finish(self) -> Any:
        """All frames written: commit and return the result (tensor, array, path)."""

    def abort(self) -> None:
        """Decoding failed: release buffers and remove temporary files. Never touches committed output.

        The base sink holds nothing, so there is nothing to drop.
        """
        return None


__all__ = ["FrameSink", "StreamSpec"]
