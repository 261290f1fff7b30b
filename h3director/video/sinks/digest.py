"""A fingerprint of what was decoded: `DigestSink` keeps no frames, only a SHA-256 per frame of the decoder's exact
output and of its uint8 display pixels, so two decodes (in two processes, or stock vs streamed) can be compared
value for value without holding either video.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from h3director.video.sinks.contract import StreamSpec
from h3director.video.sinks.ordered import OrderedSink, require_single_video
from h3director.video.sinks.pixels import uint8_pixels


def frame_digests(frames: torch.Tensor | np.ndarray, frame_axis: int) -> list[str]:
    """SHA-256 (hex) of each frame's bytes along `frame_axis` (C order, the tensor's own dtype), on the CPU.

    Any strides and dtypes (bfloat16 included): each frame is made contiguous by PyTorch, then hashed.
    """
    tensor = torch.from_numpy(frames) if isinstance(frames, np.ndarray) else frames.detach().to("cpu")
    digests = []
    for index in range(tensor.shape[frame_axis]):
        frame = tensor.select(frame_axis, index).contiguous().reshape(-1).view(torch.uint8)
        digests.append(hashlib.sha256(frame.numpy()).hexdigest())
    return digests


class DigestSink(OrderedSink):
    """Fingerprints of a decode: per frame, SHA-256 of the decoder output and of the uint8 pixels.

    `raw_digests[f]` hashes frame f of batch item 0 as the decoder returned it (`[C, H, W]`, its dtype,
    C order); `uint8_digests[f]` hashes its uint8 display pixels (`[H, W, C]`, as `Uint8FrameSink`
    stores them). Audio is kept as given (it is small) in `audio`. Only batch 1. Memory: one run's
    uint8 conversion plus the audio. `finish()` returns the sink itself.
    """

    supports_audio = True

    def __init__(self) -> None:
        super().__init__()
        self.raw_digests: list[str] = []
        self.uint8_digests: list[str] = []
        self.audio: torch.Tensor | None = None
        self.sample_rate: int | None = None

    def _open(self, spec: StreamSpec) -> None:
        require_single_video(spec, "DigestSink")
        self.raw_digests, self.uint8_digests = [], []

    def write_audio(self, samples: torch.Tensor, sample_rate: int) -> None:
        self.audio, self.sample_rate = samples.detach().to("cpu").clone(), int(sample_rate)

    def _store(self, start: int, frames: torch.Tensor) -> None:
        self.raw_digests += frame_digests(frames[0], frame_axis=1)
        self.uint8_digests += frame_digests(uint8_pixels(frames[0], self.spec), frame_axis=0)

    def finish(self) -> DigestSink:
        self._check_complete()
        return self

    def abort(self) -> None:
        self.raw_digests, self.uint8_digests, self.audio = [], [], None


__all__ = ["DigestSink", "frame_digests"]
