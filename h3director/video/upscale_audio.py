"""A video-file sink that carries another file's audio stream into the output unchanged (packets copied, no
re-encode), interleaved with the picture as frames arrive.

Same files, atomic rename and memory as `VideoFileSink` (this is one, with `audio_path`'s first audio stream added from
its template in `begin`). Audio packets are muxed up to one second past each written run of frames, so the muxer never
holds more than about a second of compressed sound; `finish()` copies the rest.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from h3director.av.open_file import open_input
from h3director.video.sinks.contract import StreamSpec
from h3director.video.sinks.video_file import VideoFileSink

AUDIO_LEAD_S = 1.0


class AudioCopyVideoSink(VideoFileSink):
    """`VideoFileSink` whose audio is the first audio stream of `audio_path`, copied packet for packet.

    `audio_packets` counts the packets copied. Other arguments are `VideoFileSink`'s.
    """

    def __init__(self, path: str | os.PathLike, audio_path: str | os.PathLike, **options) -> None:
        super().__init__(path, **options)
        self.audio_path = Path(audio_path)
        self.audio_packets = 0
        self._source = None
        self._packets = None
        self._pending = None

    def _open(self, spec: StreamSpec) -> None:
        super()._open(spec)
        try:
            self._source = open_input(self.audio_path)
            stream_in = self._source.streams.audio[0]
            self._audio = self._container.add_stream_from_template(stream_in)
            self._packets = self._source.demux(stream_in)
        except Exception:
            self.abort()
            raise
        self.audio_packets = 0
        self._pending = None

    def _copy_audio_until(self, seconds: float | None) -> None:
        while True:
            packet, self._pending = self._pending, None
            if packet is None:
                packet = next(self._packets, None)
                if packet is None:
                    return
            if packet.size == 0:
                continue
            if seconds is not None and packet.pts is not None and float(packet.pts * packet.time_base) > seconds:
                self._pending = packet
                return
            if packet.dts is None:
                packet.dts = packet.pts
            packet.stream = self._audio
            self._mux([packet])
            self.audio_packets += 1

    def _store(self, start: int, frames: torch.Tensor) -> None:
        super()._store(start, frames)
        fps = self.fps if self.fps is not None else self.spec.fps
        self._copy_audio_until((start + frames.shape[2]) / fps + AUDIO_LEAD_S)

    def _close_source(self) -> None:
        source, self._source, self._packets, self._pending = self._source, None, None, None
        if source is not None:
            source.close()

    def finish(self) -> Path:
        self._check_complete()
        try:
            self._copy_audio_until(None)
        except Exception:
            self.abort()
            raise
        self._close_source()
        return super().finish()

    def abort(self) -> None:
        self._close_source()
        super().abort()


__all__ = ["AudioCopyVideoSink"]
