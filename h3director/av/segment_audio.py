"""A segment's soundtrack as a sequential sample source, in its own sample type (no conversion).

`SampleReader(path).read(n)` returns the next `n` samples per channel as ``[channels, n]`` in the decoder's
dtype (int16, int32 or float32), decoding one audio frame at a time; at the end of the stream it pads with
zeros and counts them in `padded`. Samples before time 0 (negative timestamps) and beyond the stream's
declared duration (an encoder's end padding) are dropped, so `count_samples` and the reader agree.
"""

from __future__ import annotations

import os

import numpy as np

from h3director.av.open_file import import_av, open_input
from h3director.errors import InvalidInputError


def raw_samples(frame) -> np.ndarray:
    """A decoded PyAV audio frame as ``[channels, samples]`` in its own dtype (planar or packed)."""
    data = frame.to_ndarray()
    if not frame.format.is_planar:
        data = data.reshape(-1, len(frame.layout.channels)).T
    return data


class SampleReader:
    """Sequential samples of the first audio stream of `path` (see module docstring). Holds one frame."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = path
        self._container = None
        self._frames = None
        self._buffer: np.ndarray | None = None
        self._limit: int | None = None
        self._position = 0           # samples taken from the stream so far (after the dropped head)
        self.padded = 0

    def _open(self) -> None:
        self._container = open_input(self.path)
        stream = self._container.streams.audio[0]
        if stream.duration is not None and stream.time_base is not None:
            self._limit = round(stream.duration * stream.time_base * stream.codec_context.sample_rate)
        self._frames = self._container.decode(stream)

    def _next_block(self) -> np.ndarray | None:
        av = import_av()
        try:
            frame = next(self._frames, None)
        except av.FFmpegError as exc:
            raise InvalidInputError(f"{self.path}: the sound cannot be decoded ({exc})") from None
        if frame is None:
            return None
        data = raw_samples(frame)
        if frame.pts is not None and frame.pts < 0 and frame.time_base is not None:
            drop = min(data.shape[1], round(-frame.pts * frame.time_base * frame.sample_rate))
            data = data[:, drop:]
        if self._limit is not None:
            data = data[:, :max(0, self._limit - self._position)]
        self._position += data.shape[1]
        return data

    def read(self, count: int) -> np.ndarray:
        if self._container is None:
            self._open()
        parts, have = [], 0
        while have < count:
            if self._buffer is None or self._buffer.shape[1] == 0:
                self._buffer = self._next_block()
                if self._buffer is None:
                    break
                continue
            take = self._buffer[:, :count - have]
            self._buffer = self._buffer[:, take.shape[1]:]
            parts.append(take)
            have += take.shape[1]
        if have < count:
            channels = parts[0].shape[0] if parts else self._container.streams.audio[0].codec_context.channels
            dtype = parts[0].dtype if parts else np.float32
            parts.append(np.zeros((channels, count - have), dtype))
            self.padded += count - have
        return np.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]

    def close(self) -> None:
        container, self._container = self._container, None
        self._frames = self._buffer = None
        if container is not None:
            container.close()


def count_samples(path: str | os.PathLike) -> tuple[int, np.dtype]:
    """Samples per channel the reader yields for `path` before padding, and their dtype (decodes the sound
    once). `InvalidInputError` when the audio stream holds no samples."""
    reader = SampleReader(path)
    total, dtype = 0, None
    try:
        reader._open()
        while (block := reader._next_block()) is not None:
            total += block.shape[1]
            dtype = dtype or block.dtype
    finally:
        reader.close()
    if dtype is None:
        raise InvalidInputError(f"{path}: the audio stream holds no samples")
    return total, np.dtype(dtype)


__all__ = ["SampleReader", "count_samples"]
