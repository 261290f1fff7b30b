"""A/V offset measurement: picture motion against sound onsets, over the whole file and per window.

`measure_envelopes` takes the picture's motion envelope and the sound's flux envelope (see
`envelopes`), puts both on the 1 ms grid, removes their slow level, smooths both by the same
Gaussian (sigma = half a frame), and cross-correlates them for lags within ``+-max_offset_ms``.
The result's `offset_ms` is positive when the audio is late (subtract it from the sound's times, or
add it to the picture's, to bring them together). The same is done in windows of `window_s` seconds
(hop `window_s / 2`; a tail of more than a quarter window gets one ending with the file) to show
drift along it.

"No usable events" is an explicit answer, not a guess: when the picture or the sound has fewer than
`MIN_EVENTS` distinct events (`envelopes.count_events`), `offset_ms` is None, `usable` is False and
`confidence` is 0. Precision: sub-millisecond peak refinement on the grid; accuracy on the synthetic
sweep is in docs/AV.md (bench/avsync_accuracy.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from h3director.av.correlate import correlation_curve, find_peak
from h3director.av.envelopes import (
    AUDIO_FLOOR,
    GRID_S,
    MOTION_FLOOR,
    TREND_S,
    AudioFlux,
    Envelope,
    count_events,
    gaussian_smooth,
    motion_energy,
    motion_envelope,
    prepare,
    resample,
)
from h3director.errors import InvalidInputError

MIN_EVENTS = 2
DEFAULT_MAX_OFFSET_MS = 500.0
DEFAULT_WINDOW_S = 10.0
LOW_CONFIDENCE = 0.25        # below this an offset is reported but flagged as unreliable
CONFIDENCE_SPAN_S = 3.0     # the peak is judged against the correlation over lags of +-this (or the search)
SOUND_EVENT_SIGMA_S = 0.010  # the sound's flux is smoothed by this much before its events are counted


@dataclass
class WindowOffset:
    """One window's measurement: seconds from the grid start, offset (ms, None without events), confidence."""

    start_s: float
    end_s: float
    offset_ms: float | None
    confidence: float
    picture_events: int
    sound_events: int

    def to_dict(self) -> dict:
        return {"start_s": round(self.start_s, 3), "end_s": round(self.end_s, 3),
                "offset_ms": None if self.offset_ms is None else round(self.offset_ms, 2),
                "confidence": round(self.confidence, 3), "picture_events": self.picture_events,
                "sound_events": self.sound_events}


@dataclass
class AVSyncResult:
    """The measured offset of a clip. `offset_ms` > 0: audio late; None with `usable` False: no usable events.

    `prominence` is the correlation peak's height above the rest of the curve in standard deviations,
    `confidence` its 0..1 mapping (`correlate`); `drift_ms_per_min` is the slope of the confident
    windows' offsets (None with fewer than two). `picture` / `sound` are the prepared envelopes on the
    1 ms grid from `grid_start_s` (for plots; not in `to_dict`).
    """

    offset_ms: float | None
    confidence: float
    prominence: float
    usable: bool
    reason: str
    picture_events: int
    sound_events: int
    max_offset_ms: float
    windows: list[WindowOffset] = field(default_factory=list)
    drift_ms_per_min: float | None = None
    grid_start_s: float = 0.0
    picture: np.ndarray | None = field(default=None, repr=False)
    sound: np.ndarray | None = field(default=None, repr=False)

    def to_dict(self) -> dict:
        return {
            "offset_ms": None if self.offset_ms is None else round(self.offset_ms, 2),
            "convention": "positive offset_ms = audio late",
            "confidence": round(self.confidence, 3), "prominence": round(self.prominence, 2),
            "usable": self.usable, "reason": self.reason,
            "picture_events": self.picture_events, "sound_events": self.sound_events,
            "max_offset_ms": self.max_offset_ms,
            "drift_ms_per_min": None if self.drift_ms_per_min is None else round(self.drift_ms_per_min, 2),
            "windows": [w.to_dict() for w in self.windows],
        }


def _sound_events(values: np.ndarray) -> int:
    return count_events(gaussian_smooth(values, SOUND_EVENT_SIGMA_S / GRID_S), AUDIO_FLOOR)


def _prepared(raw: np.ndarray, fps: float) -> np.ndarray:
    return prepare(raw, 0.5 / fps / GRID_S, int(round(TREND_S / GRID_S)))


def _offset(picture_raw: np.ndarray, sound_raw: np.ndarray, fps: float, max_lag: int):
    picture, sound = _prepared(picture_raw, fps), _prepared(sound_raw, fps)
    if not picture.any() or not sound.any():
        return None, picture, sound
    search = min(max_lag, len(picture) - 1)
    wide = min(max(max_lag, int(round(CONFIDENCE_SPAN_S / GRID_S))), len(picture) - 1)
    curve = correlation_curve(picture, sound, wide)
    return find_peak(curve, wide, exclude=int(round(2.5 / fps / GRID_S)), search=search), picture, sound


def measure_envelopes(motion: tuple[np.ndarray, np.ndarray], flux: Envelope, fps: float,
                      max_offset_ms: float = DEFAULT_MAX_OFFSET_MS,
                      window_s: float = DEFAULT_WINDOW_S) -> AVSyncResult:
    """Measure the offset from frame times + motion energies (`media.read_motion`) and the sound's flux."""
    if not fps > 0:
        raise InvalidInputError(f"fps must be > 0, got {fps}")
    if not max_offset_ms > 0:
        raise InvalidInputError(f"max_offset_ms must be > 0, got {max_offset_ms}")
    if not window_s > 0:
        raise InvalidInputError(f"window_s must be > 0, got {window_s}")
    times, energies = (np.asarray(a, np.float64) for a in motion)
    picture_env = motion_envelope(times, energies)
    start = min(picture_env.start_s, flux.start_s)
    count = int(np.ceil((max(picture_env.end_s, flux.end_s) - start) / GRID_S))
    picture_raw = resample(picture_env, start, count)
    sound_raw = resample(flux, start, count)
    max_lag = int(round(max_offset_ms / 1000 / GRID_S))
    middles = (times[:-1] + times[1:]) / 2 if len(times) > 1 else np.zeros(0)

    def measure_span(first: int, last: int):
        span_start, span_end = start + first * GRID_S, start + last * GRID_S
        inside = (middles >= span_start) & (middles < span_end)
        picture_events = count_events(energies[inside], MOTION_FLOOR)
        sound_events = _sound_events(sound_raw[first:last])
        if picture_events < MIN_EVENTS or sound_events < MIN_EVENTS:
            return None, picture_events, sound_events, None, None
        peak, picture, sound = _offset(picture_raw[first:last], sound_raw[first:last], fps, max_lag)
        return peak, picture_events, sound_events, picture, sound

    peak, picture_events, sound_events, picture, sound = measure_span(0, count)
    windows = []
    width = int(round(window_s / GRID_S))
    if count > width:
        hop = width // 2
        starts = list(range(0, count - width + 1, hop))
        if count - (starts[-1] + width) > hop // 2:
            starts.append(count - width)  # a tail of more than a quarter window gets a window ending with the file
        for first in starts:
            last = first + width
            w_peak, w_picture, w_sound, _, _ = measure_span(first, last)
            windows.append(WindowOffset(
                first * GRID_S, last * GRID_S, None if w_peak is None else w_peak.lag * GRID_S * 1000,
                0.0 if w_peak is None else w_peak.confidence, w_picture, w_sound))
    if peak is None:
        reason = (f"no usable events: the picture has {picture_events} and the sound {sound_events} distinct "
                  f"events (need {MIN_EVENTS} each)")
        return AVSyncResult(None, 0.0, 0.0, False, reason, picture_events, sound_events, max_offset_ms, windows,
                            grid_start_s=start, picture=_prepared(picture_raw, fps), sound=_prepared(sound_raw, fps))
    offset_ms = peak.lag * GRID_S * 1000
    reason = "ok" if peak.confidence >= LOW_CONFIDENCE else "low confidence: the events barely line up"
    if abs(abs(offset_ms) - max_offset_ms) < 1.0:
        reason = f"the best match is at the edge of the search (+-{max_offset_ms:g} ms): widen it"
    return AVSyncResult(offset_ms, peak.confidence, peak.prominence, True, reason, picture_events, sound_events,
                        max_offset_ms, windows, _drift(windows), start, picture, sound)


def _drift(windows: list[WindowOffset]) -> float | None:
    good = [w for w in windows if w.offset_ms is not None and w.confidence >= LOW_CONFIDENCE]
    if len(good) < 2:
        return None
    centres = np.array([(w.start_s + w.end_s) / 2 for w in good]) / 60.0
    offsets = np.array([w.offset_ms for w in good])
    if np.ptp(centres) == 0:
        return None
    return float(np.polyfit(centres, offsets, 1)[0])


def measure_file(path: str | os.PathLike, max_offset_ms: float = DEFAULT_MAX_OFFSET_MS,
                 window_s: float = DEFAULT_WINDOW_S) -> AVSyncResult:
    """Measure a media file's A/V offset, streaming both streams (see `media`)."""
    from h3director.av.media import probe, read_flux, read_motion

    info = probe(path)
    motion = read_motion(path)
    flux, _ = read_flux(path)
    return measure_envelopes(motion, flux, info.fps, max_offset_ms, window_s)


def measure_arrays(frames, fps: float, samples: np.ndarray, sample_rate: int,
                   max_offset_ms: float = DEFAULT_MAX_OFFSET_MS, window_s: float = DEFAULT_WINDOW_S,
                   stride: int = 1) -> AVSyncResult:
    """Measure frames already in memory: `frames` iterates ``[H, W, C]`` arrays (uint8 0..255 or float
    0..1), frame k shown at ``k / fps``; `samples` is ``[L]`` or ``[channels, L]`` float, sample 0 at
    time 0. `stride` keeps every stride-th pixel per axis before differencing (cheaper, same events)."""
    if not fps > 0:
        raise InvalidInputError(f"fps must be > 0, got {fps}")
    if sample_rate <= 0:
        raise InvalidInputError(f"sample_rate must be > 0, got {sample_rate}")
    energies, previous, count = [], None, 0
    for frame in frames:
        pixels = np.asarray(frame, np.float32)
        if pixels.ndim != 3:
            raise InvalidInputError(f"each frame must be [H, W, C], got shape {list(pixels.shape)}")
        scale = 255.0 if pixels.dtype.kind == "f" and float(pixels.max(initial=0.0)) <= 1.0 else 1.0
        gray = pixels[::stride, ::stride].mean(axis=2) * scale
        if previous is not None:
            energies.append(motion_energy(previous, gray))
        previous, count = gray, count + 1
    if count < 2:
        raise InvalidInputError(f"A/V sync needs at least 2 frames, got {count}")
    samples = np.asarray(samples, np.float32)
    mono = samples if samples.ndim == 1 else samples.reshape(-1, samples.shape[-1]).mean(axis=0)
    if mono.size == 0:
        raise InvalidInputError("A/V sync needs sound: the audio has no samples")
    flux = AudioFlux(sample_rate)
    block = sample_rate * 10
    for first in range(0, len(mono), block):
        flux.feed(mono[first:first + block], 0.0)
    return measure_envelopes((np.arange(count) / fps, np.asarray(energies)), flux.envelope(), fps,
                             max_offset_ms, window_s)
