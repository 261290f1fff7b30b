"""Check a stitched file against its segments: frames and samples outside the overlaps must be the inputs' own.

`compare_stitch(paths, out, overlap, blend)` decodes the output and the segments side by side, one frame at a
time, and compares every output frame that has a single source (outside the overlaps; with `cut`, the overlap
frames too, which are the earlier segment's) plane by plane, and every output sample outside the audio
cross-fade windows with the segment sample it was placed from (`Timeline`). Byte- and sample-equality hold only
for lossless output codecs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from h3director.av.open_file import open_input
from h3director.av.segment_audio import SampleReader
from h3director.av.stitch import inspect_segment
from h3director.av.timeline import Timeline


@dataclass
class StitchComparison:
    """Counts of what `compare_stitch` checked and how much of it was equal; `output_*` are the file's totals."""

    output_frames: int
    frames_checked: int
    frames_equal: int
    output_samples: int
    samples_checked: int
    samples_equal: int

    @property
    def exact(self) -> bool:
        return self.frames_equal == self.frames_checked and self.samples_equal == self.samples_checked


def _planes(frame) -> list[np.ndarray]:
    return [np.frombuffer(p, np.uint8).reshape(p.height, p.line_size)[:, :p.width].copy() for p in frame.planes]


def _expected(paths: Sequence[str | os.PathLike], timeline: Timeline, blend: str) -> Iterator[tuple[int, list | None]]:
    """(output index, planes) for every output frame in output order; planes None for a blended frame."""
    starts, o, last = timeline.starts, timeline.overlap, len(paths) - 1
    for i, path in enumerate(paths):
        with open_input(path) as source:
            for t, frame in enumerate(source.decode(source.streams.video[0])):
                head, tail = i > 0 and t < o, i < last and t >= timeline.lengths[i] - o
                if (head and blend == "cut") or (tail and blend == "crossfade"):
                    continue                # this output frame comes from the other segment of the overlap
                yield starts[i] + t, (None if head else _planes(frame))


def compare_stitch(paths: Sequence[str | os.PathLike], out: str | os.PathLike, overlap: int,
                   blend: str) -> StitchComparison:
    """Compare the stitched file `out` with its source segment files `paths` (joined with `overlap` frames
    and `blend`), frame by frame and sample by sample, where the stitch copies the source; returns a
    `StitchComparison`. Raises AssertionError when an output frame has no source frame."""
    infos = [inspect_segment(p) for p in paths]
    timeline = Timeline(tuple(i.frames for i in infos), overlap, infos[0].fps, infos[0].rate)
    checked = equal = produced = 0
    expected = _expected(paths, timeline, blend)
    with open_input(out) as result:
        for index, frame in enumerate(result.decode(result.streams.video[0])):
            produced += 1
            g, planes = next(expected, (None, None))
            if g != index:
                raise AssertionError(f"output frame {index} has no source frame (got {g})")
            if planes is not None:
                checked += 1
                equal += all(np.array_equal(a, b) for a, b in zip(planes, _planes(frame), strict=True))
    regions = [r for r in timeline.audio_regions() if r.second is None]
    starts = timeline.audio_starts()
    samples_checked = samples_equal = 0
    output = SampleReader(out)
    try:
        at = 0
        for region in regions:
            output.read(region.start - at) if region.start > at else None
            got = output.read(region.stop - region.start)
            at = region.stop
            source = SampleReader(paths[region.first])
            try:
                local = region.start - starts[region.first]
                if local:
                    source.read(local)
                want = source.read(region.stop - region.start)
            finally:
                source.close()
            samples_checked += got.shape[1]                       # per channel: all channels equal
            samples_equal += int(np.count_nonzero((got == want).all(axis=0)))
        output_samples = at + output.read(1 << 24).shape[1] - output.padded
    finally:
        output.close()
    return StitchComparison(output_frames=produced, frames_checked=checked, frames_equal=equal,
                            output_samples=output_samples, samples_checked=samples_checked,
                            samples_equal=samples_equal)


__all__ = ["StitchComparison", "compare_stitch"]
