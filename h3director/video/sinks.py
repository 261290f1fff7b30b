"""The concrete frame sinks, and the choice of one from an output path.

| sink | result | host memory held |
|---|---|---|
| `TensorSink` | decoder output `[B, C, F, H, W]` (float32 bit-identical, or float16/bfloat16) | the whole tensor |
| `Uint8FrameSink` | uint8 display frames `[B * F, H, W, 3]` (numpy) | the whole array (1/4 of float32) |
| `MemmapSink` | `.npy` file, uint8 (or float32) `[F, H, W, 3]`, resumable | about one clip of frames |
| `VideoFileSink` | H.264 yuv420p video file with AAC audio | about one clip + the encoder's frames in flight |
| `TeeSink` | the results of several sinks fed by one decode | the sum of its sinks' |
| `DigestSink` | SHA-256 per frame (decoder output and uint8 pixels), the audio | one run |

Each documents its exact cost in `bytes_needed(spec)`. File sinks take one video (batch 1) and write
atomically: temporary name in the destination folder, renamed in `finish()`.
"""

from __future__ import annotations

import os
from pathlib import Path

from h3director.errors import InvalidInputError
from h3director.video.sink import FrameSink, StreamSpec
from h3director.video.sinks_compose import DigestSink, TeeSink
from h3director.video.sinks_memmap import MemmapSink
from h3director.video.sinks_memory import TensorSink, Uint8FrameSink
from h3director.video.sinks_video import CONTAINER_FORMATS, VideoFileSink

__all__ = [
    "FrameSink", "StreamSpec", "TensorSink", "Uint8FrameSink", "MemmapSink", "VideoFileSink",
    "TeeSink", "DigestSink", "FILE_SINK_KINDS", "file_sink_for",
]

# Output kinds a file path can take, by extension.
FILE_SINK_KINDS = {".npy": "memmap", **{suffix: "video" for suffix in CONTAINER_FORMATS}}


def file_sink_for(path: str | os.PathLike, *, fps: float | None = None, crf: int = 18,
                  npy_dtype: str = "uint8", resume: bool = False, job: str | None = None,
                  audio_sample_rate: int | None = None, threads: int = 1) -> FrameSink:
    """The file sink an output path asks for: `.npy` -> `MemmapSink`, `.mp4`/`.mov`/`.mkv` -> `VideoFileSink`."""
    suffix = Path(path).suffix.lower()
    kind = FILE_SINK_KINDS.get(suffix)
    if kind is None:
        raise InvalidInputError(
            f"cannot tell the output kind of {str(path)!r}: use one of {', '.join(sorted(FILE_SINK_KINDS))} "
            "(.npy: uint8 frames [F, H, W, 3]; .mp4/.mov/.mkv: H.264 video)"
        )
    if kind == "memmap":
        return MemmapSink(path, dtype=npy_dtype, resume=resume, job=job, threads=threads)
    return VideoFileSink(path, fps=fps, crf=crf, audio_sample_rate=audio_sample_rate, threads=threads)
