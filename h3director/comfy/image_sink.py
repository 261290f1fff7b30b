"""Sinks that produce what ComfyUI nodes pass around: IMAGE tensors `[F, H, W, C]` float32 in [0, 1].

`ComfyImageSink` writes each finished run of frames straight into the one IMAGE tensor it returns,
so the float32 video exists once (core `VAEDecode` holds a `[B, C, F, H, W]` float32 buffer and
then copies it into `[B * F, H, W, C]`: twice). `LastFrameTap` forwards every call to another sink
and keeps only the last frame as a `[1, H, W, C]` IMAGE (the video-file mode's IMAGE output, handy as
the first frame of a continuation). Pixels are `h3director.video.sinks.pixels.float_pixels`, the same
float32 operations as ComfyUI's `MiniMaxH3VideoVAE._finalize_pixels`.
"""

from __future__ import annotations

from typing import Any

import torch

from h3director.video.sinks.contract import FrameSink, StreamSpec
from h3director.video.sinks.ordered import BufferSink
from h3director.video.sinks.pixels import float_pixels


class ComfyImageSink(BufferSink):
    """Frames into one ComfyUI IMAGE `[B * F, H, W, C]` float32 (batch items one after another).

    Memory: exactly the returned tensor, ``B * F * H * W * C * 4`` bytes.
    """

    def bytes_needed(self, spec: StreamSpec) -> int:
        return spec.batch * spec.frames * spec.frame_pixels * 4

    def _open(self, spec: StreamSpec) -> None:
        self._out = torch.empty((spec.batch * spec.frames, spec.height, spec.width, spec.channels),
                                dtype=torch.float32)

    def _store(self, start: int, frames: torch.Tensor) -> None:
        count = frames.shape[2]
        for item in range(frames.shape[0]):
            first = item * self.spec.frames + start
            self._out[first:first + count].copy_(float_pixels(frames[item], self.spec))


class LastFrameTap(FrameSink):
    """Forwards everything to `inner` and keeps the video's last frame as a `[1, H, W, C]` IMAGE."""

    def __init__(self, inner: FrameSink) -> None:
        self.inner = inner
        self.supports_audio = inner.supports_audio
        self.writes_to_disk = inner.writes_to_disk
        self.last_frame: torch.Tensor | None = None
        self._spec: StreamSpec | None = None

    def begin(self, spec: StreamSpec) -> None:
        self._spec = spec
        self.inner.begin(spec)

    def write(self, start: int, frames: torch.Tensor) -> None:
        self.inner.write(start, frames)
        if start + frames.shape[2] == self._spec.frames:
            self.last_frame = float_pixels(frames[0, :, -1:], self._spec).clone()

    def use_buffers(self, buffers) -> None:
        self.inner.use_buffers(buffers)

    def write_audio(self, samples: torch.Tensor, sample_rate: int) -> None:
        self.inner.write_audio(samples, sample_rate)

    def bytes_needed(self, spec: StreamSpec) -> int:
        return self.inner.bytes_needed(spec) + spec.frame_pixels * 4

    def finish(self) -> Any:
        return self.inner.finish()

    def abort(self) -> None:
        self.inner.abort()


__all__ = ["ComfyImageSink", "LastFrameTap"]
