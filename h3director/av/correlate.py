"""Cross-correlation of two prepared envelopes with a sub-step peak and a confidence (plain numpy).

`picture` and `sound` are zero-mean, unit-variance arrays on the same grid (`envelopes.prepare`).
The correlation at lag l (grid steps) is ``mean_t picture[t] * sound[t + l]``: a positive lag means
the sound's events come l steps after the picture's, i.e. the audio is late. The peak is refined by a
parabola through the best lag and its two neighbours (sub-step, so well below 1 ms on a 1 ms grid).

Confidence: how far the peak stands out of the rest of the curve. `prominence` is
``(peak - median(rest)) / std(rest)``, "rest" being the lags more than `exclude` steps from the
peak; `confidence` maps it to 0..1 as ``clip((prominence - PROMINENCE_LOW) / (PROMINENCE_HIGH -
PROMINENCE_LOW), 0, 1)``: a curve of pure chance (no shared events) stays near 0, a clean match reaches 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PROMINENCE_LOW = 4.0
PROMINENCE_HIGH = 10.0


@dataclass
class Peak:
    """The best lag (grid steps, fractional), the correlation there (-1..1), prominence and confidence."""

    lag: float
    correlation: float
    prominence: float
    confidence: float


def correlation_curve(picture: np.ndarray, sound: np.ndarray, max_lag: int) -> np.ndarray:
    """``curve[l + max_lag] = sum_t picture[t] * sound[t + l] / len`` for l in -max_lag..max_lag."""
    length = len(picture)
    if length == 0 or len(sound) != length:
        raise ValueError(f"envelopes must have the same non-zero length, got {len(picture)} and {len(sound)}")
    size = 1 << int(np.ceil(np.log2(2 * length + 1)))
    spectrum = np.conj(np.fft.rfft(picture, size)) * np.fft.rfft(sound, size)
    full = np.fft.irfft(spectrum, size)  # full[l] for l >= 0, full[size + l] for l < 0
    lags = np.arange(-max_lag, max_lag + 1)
    return full[lags % size] / length


def find_peak(curve: np.ndarray, max_lag: int, exclude: int, search: int | None = None) -> Peak:
    """The curve's highest point within lags ``+-search`` (default all of it; parabolic refinement) and
    how much it stands out of the whole curve (lags ``+-max_lag``) outside ``+-exclude`` steps of it."""
    search = max_lag if search is None else min(search, max_lag)
    best = int(np.argmax(curve[max_lag - search:max_lag + search + 1])) + max_lag - search
    lag = float(best - max_lag)
    if 0 < best < len(curve) - 1:
        left, middle, right = curve[best - 1], curve[best], curve[best + 1]
        bend = left - 2 * middle + right
        if bend < 0:
            lag += float(np.clip(0.5 * (left - right) / bend, -0.5, 0.5))
    far = np.abs(np.arange(len(curve)) - best) > exclude
    rest = curve[far]
    if len(rest) < 8 or rest.std() <= 1e-12:
        prominence = 0.0
    else:
        prominence = float((curve[best] - np.median(rest)) / rest.std())
    confidence = float(np.clip((prominence - PROMINENCE_LOW) / (PROMINENCE_HIGH - PROMINENCE_LOW), 0.0, 1.0))
    return Peak(lag, float(curve[best]), prominence, confidence)
