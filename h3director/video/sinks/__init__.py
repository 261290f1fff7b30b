"""Where decoded frames go: the contract, one module per sink, and the choice of a sink from an output path.

`contract` holds what the scheduler calls (`FrameSink`, `StreamSpec`); `ordered` the in-order bookkeeping the
concrete sinks share; `pixels` the one conversion of decoder output to display pixels. The sinks:

| sink | module | result | host memory held |
|---|---|---|---|
| `TensorSink` | `memory` | decoder output `[B, C, F, H, W]` (float32 bit-identical, or float16/bfloat16) | the whole tensor |
| `Uint8FrameSink` | `memory` | uint8 display frames `[B * F, H, W, 3]` (numpy) | the whole array (1/4 of float32) |
| `MemmapSink` | `memmap` | `.npy` file, uint8 (or float32) `[F, H, W, 3]`, resumable | about one clip of frames |
| `VideoFileSink` | `video_file` | H.264 yuv420p video file with AAC audio | one clip + the encoder's frames in flight |
| `TeeSink` | `tee` | the results of several sinks fed by one decode | the sum of its sinks' |
| `DigestSink` | `digest` | SHA-256 per frame (decoder output and uint8 pixels), the audio | one run |

Each documents its exact cost in `bytes_needed(spec)`. File sinks take one video (batch 1) and write
atomically: temporary name in the destination folder, renamed in `finish()`.
"""

from __future__ import annotations

import os
from pathlib import Path

from h3director.errors import InvalidInputError
from h3director.video.sinks.contract import FrameSink, StreamSpec
from h3director.video.sinks.digest import DigestSink
from h3director.video.sinks.memmap import MemmapSink
from h3director.video.sinks.memory import TensorSink, Uint8FrameSink
from h3director.video.sinks.tee import TeeSink
from h3director.video.sinks.video_file import CONTAINER_FORMATS, VideoFileSink

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
