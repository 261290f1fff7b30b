"""Synthetic chained segments for tests and benchmarks: picture and sound that continue across the overlaps.

Segment s of a chain starts at global frame ``s * (frames - overlap)``; frame f of the chain is a moving
gradient with a bright bar at ``f`` (plus a per-segment brightness offset, so a segment's overlap frames differ
a little from its neighbour's, as generated segments do); its sound is a tone whose pitch depends on the
segment, plus noise, written as int16 (`pcm_s16le`, `flac`) or float (`aac`). Written with PyAV in one pass,
one frame at a time.
"""

from __future__ import annotations

import os
from fractions import Fraction

import numpy as np

from h3director.av.open_file import import_av

CONTAINERS = {".mp4": "mp4", ".mov": "mov", ".mkv": "matroska"}


def chain_frame(frame: int, segment: int, width: int, height: int) -> np.ndarray:
    """The chain's picture at global frame `frame` as drawn by `segment`: ``[height, width, 3]`` uint8 RGB."""
    x = np.arange(width, dtype=np.int32)[None, :]
    y = np.arange(height, dtype=np.int32)[:, None]
    red = (x + 3 * frame) % 256
    green = (y * 2 + frame) % 256
    blue = np.where(np.abs(x - (frame * 7) % width) < max(2, width // 32), 255, (x + y) % 128 + 8 * segment)
    return np.stack(np.broadcast_arrays(red, green, blue), axis=-1).astype(np.uint8)


def write_segment(path: str | os.PathLike, *, segment: int, frames: int, overlap: int, width: int, height: int,
                  fps: int = 24, rate: int = 32_000, channels: int = 2, video_codec: str = "ffv1",
                  pix_fmt: str = "yuv420p", video_options: dict | None = None, audio_codec: str = "pcm_s16le",
                  audio: bool = True, audio_samples: int | None = None) -> None:
    """Write segment `segment` of a synthetic chain (see module docstring) to `path`.

    `audio_samples`: samples per channel (default: the picture's duration, ``round(frames * rate / fps)``);
    `audio=False` writes a file with no sound (a bad input for stitching)."""
    av = import_av()
    start = segment * (frames - overlap)
    container = av.open(str(path), mode="w", format=CONTAINERS[os.path.splitext(str(path))[1].lower()])
    try:
        video = container.add_stream(video_codec, rate=fps, options=dict(video_options or {}))
        video.width, video.height, video.pix_fmt = width, height, pix_fmt
        sound = None
        if audio:
            sound = container.add_stream(audio_codec, rate=rate, layout={1: "mono", 2: "stereo"}[channels])
            fmt = sound.codec_context.format.name
            total = round(frames * rate / fps) if audio_samples is None else audio_samples
            t = (np.arange(total) + round(start * rate / fps)) / rate
            rng = np.random.default_rng(segment)
            wave = 0.4 * np.sin(2 * np.pi * (220 + 55 * segment) * t) + 0.05 * rng.standard_normal(total)
            block = np.stack([wave * (1 - 0.3 * c) for c in range(channels)]).astype(np.float32)
            if fmt in ("s16", "s16p"):
                block = np.clip(np.rint(block * 32767), -32768, 32767).astype(np.int16)
            data = block if fmt.endswith("p") else block.T.reshape(1, -1)
            aframe = av.AudioFrame.from_ndarray(np.ascontiguousarray(data), format=fmt, layout=sound.layout.name)
            aframe.sample_rate, aframe.pts, aframe.time_base = rate, 0, Fraction(1, rate)
            container.mux(sound.encode(aframe))
            container.mux(sound.encode(None))
        for i in range(frames):
            picture = av.VideoFrame.from_ndarray(chain_frame(start + i, segment, width, height), format="rgb24")
            picture = picture.reformat(format=pix_fmt)
            picture.pts = i
            container.mux(video.encode(picture))
        container.mux(video.encode(None))
    finally:
        container.close()


__all__ = ["write_segment"]
