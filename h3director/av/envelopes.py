"""Event envelopes of sound and picture on one fine time grid (plain numpy).

Two signals are reduced to "how much changes here", as functions of time in seconds:

* the sound: spectral flux, the summed absolute change of the short-time band magnitudes from one
  hop to the next (Hann window of `WINDOW_S`, hop `GRID_S` = 1 ms; power pooled into `BANDS`
  log-spaced bands). Both sizes matter: a noisy or voiced sound's bin magnitudes wobble from hop to
  hop in proportion to its loudness (noise; a voice's pitch period against a short window), and
  counted as change that wobble drags a fading sound's flux late and can hide a syllable's edges;
  a longer window spreads an onset over more time. 24 ms and 4 bands were chosen on the synthetic
  sweep (bench/avsync_accuracy.py, docs/AV.md).
* the picture: frame-difference energy, the mean absolute difference of consecutive frames (gray,
  0..255, downscaled by the reader). The difference between frames k-1 and k stands at ``t[k]``, the
  timestamp of the first frame that shows it (a frame shows the scene at its presentation time).

Both become `Envelope`s on the same grid (`GRID_S` seconds a step, sample i at ``start_s + i * GRID_S``),
have their slow level removed and are smoothed by the same Gaussian, so their cross-correlation
peaks where their events line up.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GRID_S = 0.001          # the common grid: 1 ms a step
WINDOW_S = 0.024        # the sound's analysis window (Hann), 24 ms
TREND_S = 1.0           # slow level removed by a moving average of this length
BANDS = 4               # the spectrum is pooled into this many log-spaced bands before differencing ...
LOWEST_HZ = 80.0        # ... from this frequency to Nyquist


@dataclass
class Envelope:
    """Samples of one event envelope: value i at time ``start_s + i * step_s`` (seconds)."""

    values: np.ndarray
    start_s: float
    step_s: float = GRID_S

    @property
    def end_s(self) -> float:
        return self.start_s + len(self.values) * self.step_s


class AudioFlux:
    """Streaming spectral flux: feed mono float samples in order, read one value per `GRID_S` hop.

    `feed(samples, time_s)` takes consecutive blocks of one channel (or a mix), the first block's
    first sample at `time_s` seconds; memory is one window plus the unconsumed tail, whatever the
    length. `envelope()` returns the flux, value j standing at the instant between analysis frames
    j and j+1 (frame j centred at ``start + j * hop``).
    """

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = int(sample_rate)
        self.hop = max(1, int(round(self.sample_rate * GRID_S)))
        self.window = max(2 * self.hop, int(round(self.sample_rate * WINDOW_S)))
        self._taper = np.hanning(self.window).astype(np.float32)
        self._scale = 2.0 / float(self._taper.sum())  # a full-scale sine's peak bin -> about 1
        self._bands = band_matrix(self.window, self.sample_rate)
        self._pending = np.zeros(0, np.float32)
        self._previous: np.ndarray | None = None
        self._values: list[np.ndarray] = []
        self._first_time: float | None = None
        self._frames = 0

    def feed(self, samples: np.ndarray, time_s: float) -> None:
        samples = np.asarray(samples, np.float32).reshape(-1)
        if self._first_time is None:
            # Pad half a window of silence in front so frame 0 is centred on the first sample.
            self._first_time = float(time_s)
            self._pending = np.zeros(self.window // 2, np.float32)
        self._pending = np.concatenate([self._pending, samples])
        usable = (len(self._pending) - self.window) // self.hop + 1
        if usable <= 0:
            return
        starts = np.arange(usable)[:, None] * self.hop + np.arange(self.window)[None, :]
        # float64: numpy 2 keeps float32 input in float32, whose rounding then depends on the batch size
        power = np.abs(np.fft.rfft(self._pending[starts].astype(np.float64) * self._taper, axis=1)) ** 2
        spectra = np.sqrt(power @ self._bands) * self._scale
        if self._previous is not None:
            spectra = np.concatenate([self._previous[None], spectra])
        if len(spectra) > 1:
            self._values.append(np.abs(np.diff(spectra, axis=0)).sum(axis=1).astype(np.float32))
        self._previous = spectra[-1]
        self._frames += usable
        self._pending = self._pending[usable * self.hop:]

    def envelope(self) -> Envelope:
        values = np.concatenate(self._values) if self._values else np.zeros(0, np.float32)
        step = self.hop / self.sample_rate
        start = (self._first_time or 0.0) + step / 2  # between frame 0 and frame 1
        return Envelope(values.astype(np.float64), start, step)


def band_matrix(window: int, sample_rate: int, bands: int = BANDS) -> np.ndarray:
    """``[bins, bands]`` 0/1 matrix pooling an rfft's power bins into `bands` log-spaced bands from
    `LOWEST_HZ` to Nyquist (each band at least one bin)."""
    bins = window // 2 + 1
    frequencies = np.arange(bins) * sample_rate / window
    edges = np.geomspace(LOWEST_HZ, sample_rate / 2, bands + 1)
    which = np.clip(np.searchsorted(edges, frequencies, side="right") - 1, -1, bands - 1)
    matrix = np.zeros((bins, bands), np.float32)
    matrix[which >= 0, which[which >= 0]] = 1.0
    return matrix[:, matrix.sum(axis=0) > 0]


SIGNATURE_GRID = 8      # a frame's signature: the mean gray level of each cell of this many x this many


def block_signature(gray: np.ndarray, grid: int = SIGNATURE_GRID) -> np.ndarray:
    """The mean gray level (0..255) of each cell of a ``grid x grid`` split of a gray frame, as float32 ``[grid**2]``
    (rows and columns split as evenly as `np.array_split` does). Two frames' signatures differ in the direction
    the picture changed: a flash and its disappearance give opposite differences."""
    gray = np.asarray(gray, np.float32)
    rows = [band.mean(axis=0) for band in np.array_split(gray, min(grid, gray.shape[0]), axis=0)]
    cells = [[cell.mean() for cell in np.array_split(row, min(grid, gray.shape[1]))] for row in rows]
    return np.asarray(cells, np.float32).reshape(-1)


def motion_energy(previous: np.ndarray, current: np.ndarray) -> float:
    """Mean absolute difference of two gray frames (uint8 or float, 0..255 levels)."""
    return float(np.abs(current.astype(np.float32) - previous.astype(np.float32)).mean())


def motion_envelope(times_s: np.ndarray, energies: np.ndarray) -> Envelope:
    """Frame differences `energies[k]` (between frames k and k+1, shown at `times_s[k]`, `times_s[k+1]`) on the
    fine grid at the timestamp of frame k+1, the first frame that shows the change (`onsets`' convention),
    linearly between grid steps."""
    times_s = np.asarray(times_s, np.float64)
    energies = np.asarray(energies, np.float64)
    if len(times_s) < 2 or len(energies) != len(times_s) - 1:
        return Envelope(np.zeros(0), float(times_s[0]) if len(times_s) else 0.0)
    shown = times_s[1:]
    start = float(times_s[0])
    count = int(np.ceil((times_s[-1] - start) / GRID_S)) + 2
    values = np.zeros(count)
    position = (shown - start) / GRID_S
    low = np.floor(position).astype(int)
    weight = position - low
    np.add.at(values, low, energies * (1 - weight))
    np.add.at(values, np.minimum(low + 1, count - 1), energies * weight)
    return Envelope(values, start)


def resample(envelope: Envelope, start_s: float, count: int) -> np.ndarray:
    """`envelope` read at ``start_s + i * GRID_S`` for i < count (linear; 0 outside its span)."""
    grid = start_s + np.arange(count) * GRID_S
    own = envelope.start_s + np.arange(len(envelope.values)) * envelope.step_s
    if len(own) == 0:
        return np.zeros(count)
    return np.interp(grid, own, envelope.values, left=0.0, right=0.0)


def _moving_average(values: np.ndarray, width: int) -> np.ndarray:
    width = max(1, min(int(width), len(values)))
    padded = np.pad(values, (width // 2, width - 1 - width // 2), mode="edge")
    sums = np.cumsum(np.concatenate([[0.0], padded]))
    return (sums[width:] - sums[:-width]) / width


def gaussian_smooth(values: np.ndarray, sigma_steps: float) -> np.ndarray:
    """`values` convolved with a unit-sum Gaussian of `sigma_steps` grid steps (same length)."""
    if sigma_steps <= 0 or len(values) == 0:
        return values
    radius = int(np.ceil(4 * sigma_steps))
    taps = np.exp(-0.5 * (np.arange(-radius, radius + 1) / sigma_steps) ** 2)
    return np.convolve(values, taps / taps.sum(), mode="same")


def prepare(values: np.ndarray, sigma_steps: float, trend_steps: int) -> np.ndarray:
    """The shape the correlation sees: slow level removed (moving average of `trend_steps`), negative
    parts cut, smoothed by a Gaussian of `sigma_steps`, then zero-mean and unit-variance (all zeros when flat)."""
    if len(values) == 0:
        return values
    peaks = np.clip(values - _moving_average(values, trend_steps), 0.0, None)
    shaped = gaussian_smooth(peaks, sigma_steps)
    shaped = shaped - shaped.mean()
    spread = shaped.std()
    return shaped / spread if spread > 1e-12 else np.zeros_like(shaped)


__all__ = ["GRID_S", "TREND_S", "AudioFlux", "Envelope", "block_signature", "motion_energy",
           "motion_envelope", "prepare", "resample"]
