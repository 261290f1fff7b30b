"""A/V offset measurement: picture onsets against sound onsets, over the whole file and per window.

`measure_tracks` finds the onsets of the picture's events (from frame differences and frame signatures) and of
the sound's (from its RMS level), and the lag that pairs them (`onsets`: the conventions, in particular that a
frame stands at its presentation timestamp and an onset is the 20 % point of an event's rise). The result's
`offset_ms` is positive when the audio is late (subtract it from the sound's times, or add it to the picture's,
to bring them together). The same is done in windows of `window_s` seconds (hop `window_s / 2`; a tail of more
than a quarter window gets one ending with the file) to show drift along it.

"No usable events" is an explicit answer, not a guess: when the picture or the sound has fewer than
`MIN_EVENTS` onsets, `offset_ms` is None, `usable` is False and `confidence` is 0. Confidence (`onsets.match_onsets`)
is the share of events that found a partner, lowered when another lag pairs them nearly as well. Accuracy on the
beep-and-flash and speech-like sets is in docs/AV.md (bench/avsync_accuracy.py). The motion and flux envelopes
(`envelopes`) are kept for the plot.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from h3director.av.envelopes import (
    GRID_S,
    TREND_S,
    AudioFlux,
    Envelope,
    block_signature,
    motion_energy,
    motion_envelope,
    prepare,
    resample,
)
from h3director.av.onsets import SoundLevel, match_onsets, picture_onsets, sound_onsets
from h3director.errors import InvalidInputError

MIN_EVENTS = 2
DEFAULT_MAX_OFFSET_MS = 500.0
DEFAULT_WINDOW_S = 10.0
LOW_CONFIDENCE = 0.25        # below this an offset is reported but flagged as unreliable


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

    `pairs` is the number of picture onsets that found a sound partner at that offset, `confidence` the 0..1
    answer of `onsets.match_onsets`; `drift_ms_per_min` is the slope of the confident windows' offsets (None with
    fewer than two). `picture` / `sound` are the prepared motion and flux envelopes on the 1 ms grid from
    `grid_start_s` (for plots; not in `to_dict`).
    """

    offset_ms: float | None
    confidence: float
    pairs: int
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
            "confidence": round(self.confidence, 3), "pairs": self.pairs,
            "usable": self.usable, "reason": self.reason,
            "picture_events": self.picture_events, "sound_events": self.sound_events,
            "max_offset_ms": self.max_offset_ms,
            "drift_ms_per_min": None if self.drift_ms_per_min is None else round(self.drift_ms_per_min, 2),
            "windows": [w.to_dict() for w in self.windows],
        }


def _prepared(raw: np.ndarray, fps: float) -> np.ndarray:
    return prepare(raw, 0.5 / fps / GRID_S, int(round(TREND_S / GRID_S)))


def _plot_envelopes(times: np.ndarray, energies: np.ndarray, flux: Envelope | None, fps: float):
    """(grid start, picture, sound): the prepared envelopes on the 1 ms grid, for `plot`."""
    picture_env = motion_envelope(times, energies)
    if flux is None:
        flux = Envelope(np.zeros(0), picture_env.start_s)
    start = min(picture_env.start_s, flux.start_s)
    count = int(np.ceil((max(picture_env.end_s, flux.end_s) - start) / GRID_S))
    return start, _prepared(resample(picture_env, start, count), fps), _prepared(resample(flux, start, count), fps)


def measure_tracks(frame_times: np.ndarray, energies: np.ndarray, signatures: np.ndarray, level: SoundLevel,
                   fps: float, max_offset_ms: float = DEFAULT_MAX_OFFSET_MS, window_s: float = DEFAULT_WINDOW_S,
                   flux: Envelope | None = None) -> AVSyncResult:
    """Measure the offset from the picture's frame timestamps (seconds), frame differences (``len - 1``
    values) and frame signatures (`envelopes.block_signature`, one row per frame), and the sound's
    `SoundLevel`. `flux`, the sound's spectral flux, only feeds the plot. Returns the `AVSyncResult`;
    `InvalidInputError` unless `fps`, `max_offset_ms` and `window_s` are > 0."""
    if not fps > 0:
        raise InvalidInputError(f"fps must be > 0, got {fps}")
    if not max_offset_ms > 0:
        raise InvalidInputError(f"max_offset_ms must be > 0, got {max_offset_ms}")
    if not window_s > 0:
        raise InvalidInputError(f"window_s must be > 0, got {window_s}")
    frame_times = np.asarray(frame_times, np.float64)
    energies = np.asarray(energies, np.float64)
    picture = picture_onsets(frame_times, energies, signatures)
    sound = sound_onsets(*level.levels())
    max_offset_s = max_offset_ms / 1000.0

    def measure_span(first_s: float, last_s: float):
        p, s = picture.between(first_s, last_s), sound.between(first_s - max_offset_s, last_s + max_offset_s)
        if len(p) < MIN_EVENTS or len(sound.between(first_s, last_s)) < MIN_EVENTS:
            return None, len(p), len(sound.between(first_s, last_s))
        return match_onsets(p, s, max_offset_s), len(p), len(sound.between(first_s, last_s))

    start_s = float(frame_times[0]) if len(frame_times) else 0.0
    end_s = max(float(frame_times[-1]) if len(frame_times) else 0.0, start_s)
    match, picture_events, sound_events = measure_span(-np.inf, np.inf)
    windows = []
    if end_s - start_s > window_s:
        hop = window_s / 2
        starts = list(np.arange(start_s, end_s - window_s + 1e-9, hop))
        if end_s - (starts[-1] + window_s) > hop / 2:
            starts.append(end_s - window_s)  # a tail of more than a quarter window gets a window ending with the file
        for first in starts:
            w_match, w_picture, w_sound = measure_span(first, first + window_s)
            windows.append(WindowOffset(first - start_s, first + window_s - start_s,
                                        None if w_match is None else w_match.offset_ms,
                                        0.0 if w_match is None else w_match.confidence, w_picture, w_sound))
    grid_start, picture_plot, sound_plot = _plot_envelopes(frame_times, energies, flux, fps)
    if match is None:
        reason = (f"no usable events: the picture has {picture_events} and the sound {sound_events} distinct "
                  f"events (need {MIN_EVENTS} each)")
        return AVSyncResult(None, 0.0, 0, False, reason, picture_events, sound_events, max_offset_ms, windows,
                            grid_start_s=grid_start, picture=picture_plot, sound=sound_plot)
    reason = "ok" if match.confidence >= LOW_CONFIDENCE else "low confidence: the events barely line up"
    if abs(abs(match.offset_ms) - max_offset_ms) < 1.0:
        reason = f"the best match is at the edge of the search (+-{max_offset_ms:g} ms): widen it"
    return AVSyncResult(match.offset_ms, match.confidence, match.pairs, True, reason, picture_events, sound_events,
                        max_offset_ms, windows, _drift(windows), grid_start, picture_plot, sound_plot)


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
    """The `AVSyncResult` of the media file at `path`: the offset in ms (positive = audio late) searched
    within +-`max_offset_ms`, in windows of `window_s` seconds, both streams decoded one frame at a time
    (see `media`). `InvalidInputError` for a missing or unreadable file, or one without a video and an
    audio stream."""
    from h3director.av.media import probe, read_motion, read_sound

    info = probe(path)
    times, energies, signatures = read_motion(path)
    flux, level, _ = read_sound(path)
    return measure_tracks(times, energies, signatures, level, info.fps, max_offset_ms, window_s, flux)


def measure_arrays(frames, fps: float, samples: np.ndarray, sample_rate: int,
                   max_offset_ms: float = DEFAULT_MAX_OFFSET_MS, window_s: float = DEFAULT_WINDOW_S,
                   stride: int = 1) -> AVSyncResult:
    """Measure frames already in memory: `frames` iterates ``[H, W, C]`` arrays (uint8 0..255 or float
    0..1), frame k shown at ``k / fps``; `samples` is ``[L]`` or ``[channels, L]`` float, sample 0 at time
    0. `stride` keeps every stride-th pixel per axis before differencing (cheaper, same events). Returns
    the `AVSyncResult`; `InvalidInputError` for `fps` or `sample_rate` <= 0, fewer than 2 frames, no
    samples, or a frame that is not ``[H, W, C]``."""
    if not fps > 0:
        raise InvalidInputError(f"fps must be > 0, got {fps}")
    if sample_rate <= 0:
        raise InvalidInputError(f"sample_rate must be > 0, got {sample_rate}")
    energies, signatures, previous, count = [], [], None, 0
    for frame in frames:
        pixels = np.asarray(frame, np.float32)
        if pixels.ndim != 3:
            raise InvalidInputError(f"each frame must be [H, W, C], got shape {list(pixels.shape)}")
        scale = 255.0 if pixels.dtype.kind == "f" and float(pixels.max(initial=0.0)) <= 1.0 else 1.0
        gray = pixels[::stride, ::stride].mean(axis=2) * scale
        signatures.append(block_signature(gray))
        if previous is not None:
            energies.append(motion_energy(previous, gray))
        previous, count = gray, count + 1
    if count < 2:
        raise InvalidInputError(f"A/V sync needs at least 2 frames, got {count}")
    samples = np.asarray(samples, np.float32)
    mono = samples if samples.ndim == 1 else samples.reshape(-1, samples.shape[-1]).mean(axis=0)
    if mono.size == 0:
        raise InvalidInputError("A/V sync needs sound: the audio has no samples")
    flux, level = AudioFlux(sample_rate), SoundLevel(sample_rate)
    block = sample_rate * 10
    for first in range(0, len(mono), block):
        flux.feed(mono[first:first + block], 0.0)
        level.feed(mono[first:first + block], 0.0)
    return measure_tracks(np.arange(count) / fps, np.asarray(energies), np.asarray(signatures), level, fps,
                          max_offset_ms, window_s, flux.envelope())


__all__ = ["DEFAULT_MAX_OFFSET_MS", "DEFAULT_WINDOW_S", "LOW_CONFIDENCE", "AVSyncResult", "WindowOffset",
           "measure_arrays", "measure_file", "measure_tracks"]
