"""Where chained segments land in the stitched output: frame starts, audio join instants, cross-fade weights.

Conventions. Segment i has `lengths[i]` frames; consecutive segments share `overlap` frames: the last
`overlap` frames of segment i show the same instants as the first `overlap` frames of segment i+1. In the
output, segment i starts at frame ``S_i`` (``S_0 = 0``, ``S_{i+1} = S_i + lengths[i] - overlap``) and the
output has ``sum(lengths) - (k - 1) * overlap`` frames.

Audio join instant. Frame f starts at ``f / fps`` seconds, i.e. at sample ``f * rate / fps`` (4000/3 =
1333.33 samples per frame at 24 fps and 32 kHz, 800 samples per audio latent at 40 Hz). `sample_at(f)` rounds
that to the nearest whole sample (halves up), always from the absolute output frame index, so rounding never
accumulates. Segment i+1's audio sample 0 is placed at ``P = sample_at(S_{i+1})`` (the start of the overlap:
the join instant) and the two soundtracks are cross-faded with equal power over ``[P, E)``, ``E =
sample_at(S_{i+1} + overlap)`` (the overlap's end); outside those windows every output sample is a sample of
one segment, unchanged. At 24 fps / 32 kHz the instants are exact when the frame index is a multiple of 3 and
otherwise 1/3 sample (10.4 us) from the true instant. The output soundtrack has ``sample_at(total_frames)``
samples: it ends with the picture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from h3director.errors import InvalidInputError


def sample_at(frame: int, fps: Fraction, rate: int) -> int:
    """The audio sample at which video frame `frame` starts: ``frame * rate / fps`` rounded half up."""
    exact = Fraction(frame) * rate / fps
    return math.floor(exact + Fraction(1, 2))


def video_weight(index: int, overlap: int) -> float:
    """Linear cross-fade: the later segment's weight on overlap frame `index` (0-based), ``(index + 1) / (overlap + 1)``.

    Neither end is a pure copy: frame 0 is 1/(overlap+1) the later segment, the last frame 1/(overlap+1) the earlier."""
    return (index + 1) / (overlap + 1)


CORRELATED = 0.5
"""Overlapping soundtracks whose normalised correlation is at least this are cross-faded linearly."""


def fade_gains(earlier: np.ndarray, later: np.ndarray) -> tuple[np.ndarray, np.ndarray, str]:
    """Cross-fade gains for the overlap of two soundtracks ``[..., samples]`` (the same shape): ``(gains of the
    earlier, gains of the later, "linear" or "equal power")``, one gain per sample at ``t = (i + 0.5) / samples``.

    The law follows the measured correlation ``rho = <a, b> / (|a| |b|)`` of the two: at or above `CORRELATED`
    (the later segment was conditioned on the earlier one's last frames, so their sound often matches) the fade
    is linear, ``(1 - t, t)``, which keeps the level of matching sound (equal power would raise it by up to
    3 dB at the middle); below it, or when either side is silent, equal power ``(cos(pi t / 2), sin(pi t / 2))``,
    which keeps the level of unrelated sound."""
    length = earlier.shape[-1]
    t = (np.arange(length, dtype=np.float64) + 0.5) / max(length, 1)
    a, b = np.asarray(earlier, np.float64), np.asarray(later, np.float64)
    norms = float(np.sqrt((a * a).sum() * (b * b).sum()))
    if norms > 0 and float((a * b).sum()) / norms >= CORRELATED:
        return 1.0 - t, t, "linear"
    return np.cos(np.pi * t / 2), np.sin(np.pi * t / 2), "equal power"


@dataclass(frozen=True)
class AudioRegion:
    """Output samples ``[start, stop)`` taken from segment `first` alone, or cross-faded from `first` into
    `second` (over the whole region, by the law `fade_gains` picks) when `second` is not None."""

    start: int
    stop: int
    first: int
    second: int | None = None


@dataclass(frozen=True)
class Timeline:
    """The stitched layout of `lengths` (frames per segment) sharing `overlap` frames, at `fps` and `rate`."""

    lengths: tuple[int, ...]
    overlap: int
    fps: Fraction
    rate: int

    @property
    def starts(self) -> tuple[int, ...]:
        """Output frame at which each segment's frame 0 lands."""
        starts, at = [], 0
        for length in self.lengths:
            starts.append(at)
            at += length - self.overlap
        return tuple(starts)

    @property
    def total_frames(self) -> int:
        return sum(self.lengths) - (len(self.lengths) - 1) * self.overlap

    @property
    def total_samples(self) -> int:
        """Samples per channel of the output soundtrack: the picture's duration."""
        return sample_at(self.total_frames, self.fps, self.rate)

    def audio_starts(self) -> tuple[int, ...]:
        """Output sample at which each segment's audio sample 0 lands (the join instants)."""
        return tuple(sample_at(s, self.fps, self.rate) for s in self.starts)

    def audio_regions(self) -> tuple[AudioRegion, ...]:
        """The output soundtrack as solo and cross-fade regions, in order, covering ``[0, total_samples)``."""
        starts = self.starts
        regions, at = [], 0
        for i in range(len(self.lengths) - 1):
            join = sample_at(starts[i + 1], self.fps, self.rate)
            end = sample_at(starts[i + 1] + self.overlap, self.fps, self.rate)
            if join > at:
                regions.append(AudioRegion(at, join, i))
            if end > join:
                regions.append(AudioRegion(join, end, i, i + 1))
            at = end
        if self.total_samples > at:
            regions.append(AudioRegion(at, self.total_samples, len(self.lengths) - 1))
        return tuple(regions)

    def samples_needed(self, segment: int) -> int:
        """Samples of segment `segment`'s own audio the output uses (from its sample 0)."""
        begin = self.audio_starts()[segment]
        stop = max(r.stop for r in self.audio_regions() if segment in (r.first, r.second))
        return stop - begin


def check_chain(lengths: tuple[int, ...], overlap: int) -> None:
    """Refuse a chain whose overlaps do not fit: every segment longer than `overlap`, every middle one at least
    ``2 * overlap`` frames (its head and tail overlaps must not meet), `overlap` >= 0, two segments or more."""
    if len(lengths) < 2:
        raise InvalidInputError(f"stitching needs at least two segments, got {len(lengths)}")
    if overlap < 0:
        raise InvalidInputError(f"overlap must be >= 0 frames, got {overlap}")
    for i, length in enumerate(lengths):
        middle = 0 < i < len(lengths) - 1
        need = 2 * overlap if middle else overlap + 1
        if length < need:
            what = f"at least 2 x overlap = {need} frames (a middle segment)" if middle else \
                f"more frames than the overlap ({overlap})"
            raise InvalidInputError(f"segment {i + 1} has {length} frames; with an overlap of {overlap} it needs {what}")


__all__ = ["AudioRegion", "Timeline", "check_chain", "fade_gains", "sample_at", "video_weight"]
