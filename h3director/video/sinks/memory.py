"""In-memory sinks: the whole decoded video in one preallocated buffer.

Both allocate their buffer once in `begin`, so their memory cost is known before decoding starts
and never grows: the scheduler's clip working set plus this buffer is the whole peak.
"""

from __future__ import annotations

import numpy as np
import torch

from h3director.errors import InvalidInputError
from h3director.video.sinks.contract import StreamSpec
from h3director.video.sinks.ordered import BufferSink
from h3director.video.sinks.pixels import uint8_pixels

_TENSOR_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class TensorSink(BufferSink):
    """The decoder's own output `[B, C, F, H, W]` in a preallocated tensor (what `vae.decode` returns).

    Values are the decoder's, in its pixel space (no de-normalisation). With ``dtype=torch.float32``
    they are bit-identical to the reference decode; float16/bfloat16 round each value once.

    Memory: ``B * C * F * H * W * itemsize`` bytes on `device` (the result), nothing else.
    `finish()` returns the tensor.
    """

    def __init__(self, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        super().__init__()
        if dtype not in _TENSOR_DTYPES:
            raise InvalidInputError(f"TensorSink dtype must be one of {_TENSOR_DTYPES}, got {dtype}")
        self.dtype = dtype
        self.device = torch.device(device)

    def bytes_needed(self, spec: StreamSpec) -> int:
        return spec.batch * spec.frames * spec.frame_pixels * torch.empty((), dtype=self.dtype).element_size()

    def _open(self, spec: StreamSpec) -> None:
        shape = (spec.batch, spec.channels, spec.frames, spec.height, spec.width)
        self._out = torch.empty(shape, dtype=self.dtype, device=self.device)

    def _store(self, start: int, frames: torch.Tensor) -> None:
        self._out[:, :, start:start + frames.shape[2]].copy_(frames)


class Uint8FrameSink(BufferSink):
    """Display frames as uint8 `[B * F, H, W, 3]` (a numpy array; `[F, H, W, 3]` for one video).

    Each frame is converted once, as it arrives, with the pixel conversion of `h3director.video.sinks.pixels`
    (de-normalise, clamp to [0, 1], * 255, round half to even): value for value what diffusers' H3
    pipeline returns as PIL/uint8 frames. Batch items are stacked frame-major per item, item 0 first
    (ComfyUI's IMAGE convention), so `result[b * F + f]` is frame f of batch item b.

    Memory: the result, ``B * F * H * W * 3`` bytes, plus the conversion's scratch for one run of
    frames (bounded by the scheduler's clip). `finish()` returns the array.
    """

    def __init__(self, threads: int = 1) -> None:
        super().__init__()
        self.threads = threads

    def bytes_needed(self, spec: StreamSpec) -> int:
        return spec.batch * spec.frames * spec.frame_pixels

    def _open(self, spec: StreamSpec) -> None:
        self._out = np.empty((spec.batch * spec.frames, spec.height, spec.width, spec.channels), dtype=np.uint8)

    def _store(self, start: int, frames: torch.Tensor) -> None:
        spec, count = self.spec, frames.shape[2]
        for item in range(spec.batch):
            first = item * spec.frames + start
            uint8_pixels(frames[item], spec, out=self._out[first:first + count], threads=self.threads)


__all__ = ["TensorSink", "Uint8FrameSink"]
