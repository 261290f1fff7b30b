"""One decode feeding several outputs: `TeeSink` hands every call to each of its sinks (e.g. a video file and a
preview)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from h3director.errors import InvalidInputError
from h3director.video.sinks.contract import FrameSink, StreamSpec


class TeeSink(FrameSink):
    """Forward every call to each sink in `sinks`, in order. Audio goes to those that take it.

    `finish()` returns a list of the sinks' results. If one sink fails, every sink is aborted (no
    partial outputs). Memory: the sum of its sinks'.
    """

    def __init__(self, sinks: Sequence[FrameSink]) -> None:
        if not sinks:
            raise InvalidInputError("TeeSink needs at least one sink")
        self.sinks = list(sinks)
        self.supports_audio = any(sink.supports_audio for sink in self.sinks)
        self.writes_to_disk = all(sink.writes_to_disk for sink in self.sinks)

    def bytes_needed(self, spec: StreamSpec) -> int:
        return sum(sink.bytes_needed(spec) for sink in self.sinks)

    def resume_from(self) -> int:
        return min(sink.resume_from() for sink in self.sinks)

    def begin(self, spec: StreamSpec) -> None:
        for index, sink in enumerate(self.sinks):
            try:
                sink.begin(spec)
            except BaseException:
                for started in self.sinks[:index]:
                    started.abort()
                raise

    def write_audio(self, samples: torch.Tensor, sample_rate: int) -> None:
        for sink in self.sinks:
            if sink.supports_audio:
                sink.write_audio(samples, sample_rate)

    def write(self, start: int, frames: torch.Tensor) -> None:
        for sink in self.sinks:
            sink.write(start, frames)

    def finish(self) -> list[Any]:
        results = []
        for index, sink in enumerate(self.sinks):
            try:
                results.append(sink.finish())
            except BaseException:
                for other in self.sinks[index + 1:]:
                    other.abort()
                raise
        return results

    def abort(self) -> None:
        for sink in self.sinks:
            sink.abort()


__all__ = ["TeeSink"]
