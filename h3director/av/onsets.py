"""Event onsets of sound and picture, and the offset that lines them up (plain numpy).

Why onsets: an envelope's centre depends on the event's shape and length (a flash that stays three frames
against a 200 ms tone burst), so correlating whole envelopes is biased by the difference of the two shapes.
The start of an event is what a viewer lines up, and what calibration patterns (beep-and-flash) define.

Conventions (both sides use the same rule, so equal shapes give equal times):

* **Onset**: the instant an event's level first reaches `ONSET_FRACTION` of its rise above the level
  before it ("the 20 % point"; for an instant step, the step itself).
* **A frame's time** is its presentation timestamp, and frame k shows the scene *at* that time: a change
  that completes between frames k-1 and k is first shown by frame k and stands at ``t[k]`` (a flash drawn
  on frame k is at frame k's timestamp, as in beep-and-flash patterns; no half-frame shift). A rise that
  spans several frames is interpolated between the frames' times.
* **The picture's level** within an event is the cumulative frame difference (mean |gray change| per frame,
  less the noise floor) from the last quiet frame on: for a monotone rise that is the change in the picture
  so far. Its rise ends at the first frame difference below half the largest one seen in the event.
* **The sound's level** is the RMS of the mono samples in `LEVEL_HOP_S` hops (placed at each hop's
  centre), lightly smoothed; its rise ends at the event's first peak (the maximum within `ATTACK_S`).

Matching: every picture onset is paired with the sound onset nearest to it plus a trial lag; the lag whose
pairs agree best (a Gaussian vote of width `VOTE_SIGMA_S` over lags within the search range) wins, and the
offset is the median of the pairs' differences within `PAIR_TOLERANCE_S` of it. Positive offset = audio late.
Confidence is the share of events on the smaller side that found a partner, scaled down by how close the
runner-up lag (at least `RUNNER_UP_GAP_S` away) came to the winner's vote: a periodic or unrelated pair of
tracks, where another lag explains the events about as well, gets a low confidence.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ONSET_FRACTION = 0.2        # an onset is where the rise reaches this fraction of its height
LEVEL_HOP_S = 0.001         # the sound's RMS level: one value per 1 ms hop ...
LEVEL_SMOOTH_HOPS = 11      # ... its power averaged over this many hops (a voice's pitch period or two) ...
LEVEL_LEAD_HOPS = 2         # ... of which this many after the hop       # ... averaged over this many hops (3 ms)
NOISE_PERCENTILE = 10       # the sound's noise floor: this percentile of its level
ATTACK_S = 0.15             # the sound's rise is looked for within this long after an event's start
QUIET_GAP_S = 0.03          # sound above its threshold with gaps shorter than this is one event
PICTURE_QUIET_FRAMES = 1    # frames below the threshold that end a picture event
QUIET_SHARE = 0.6           # the floor and spread are read from this share of the lowest values
EVENT_MADS = 8.0            # an event stands this many scaled MADs above the floor ...
EVENT_REL = 0.10            # ... and this fraction of the loudest level above it (sound only)
MOTION_FLOOR = 0.25         # ... and at least this much (mean |gray change|, 0..255) for the picture
SAME_WAY = 0.5              # picture changes whose signature differences have a cosine above this go one way
VOTE_SIGMA_S = 0.006        # width of each pair's vote for a lag
PAIR_TOLERANCE_S = 0.030    # pairs within this of the winning lag are averaged
RUNNER_UP_GAP_S = 0.030     # the runner-up lag is at least this far from the winner


@dataclass(frozen=True)
class Onsets:
    """Onset times (seconds) of one side, in order, with each event's rise height (in that side's units)."""

    times: np.ndarray
    heights: np.ndarray

    def __len__(self) -> int:
        return len(self.times)

    def between(self, start_s: float, end_s: float) -> Onsets:
        keep = (self.times >= start_s) & (self.times < end_s)
        return Onsets(self.times[keep], self.heights[keep])


@dataclass(frozen=True)
class OnsetMatch:
    """The offset (ms, audio late positive) that lines the onsets up, how many pairs agree, and a 0..1
    confidence (module docstring); `pairs` is the number of picture onsets with a sound partner."""

    offset_ms: float
    pairs: int
    picture_events: int
    sound_events: int
    confidence: float
    runner_up_ms: float | None


class SoundLevel:
    """Streaming RMS level of mono samples: one value per `LEVEL_HOP_S` hop, fed in consecutive blocks.

    `feed(samples, time_s)`: the first block's first sample stands at `time_s`; later blocks follow on
    contiguously (their `time_s` is ignored). Memory: less than one hop of pending samples plus one float per
    hop (3.6 MB an hour)."""

    def __init__(self, sample_rate: int) -> None:
        self.sample_rate = int(sample_rate)
        self.hop = max(1, int(round(self.sample_rate * LEVEL_HOP_S)))
        self._pending = np.zeros(0, np.float32)
        self._values: list[np.ndarray] = []
        self._start: float | None = None

    def feed(self, samples: np.ndarray, time_s: float) -> None:
        if self._start is None:
            self._start = float(time_s)
        self._pending = np.concatenate([self._pending, np.asarray(samples, np.float32).reshape(-1)])
        whole = len(self._pending) // self.hop
        if whole:
            block = self._pending[:whole * self.hop].reshape(whole, self.hop).astype(np.float64)
            self._values.append(np.sqrt((block ** 2).mean(axis=1)))
            self._pending = self._pending[whole * self.hop:]

    def levels(self) -> tuple[np.ndarray, float, float]:
        """(RMS per hop, its power averaged over `LEVEL_SMOOTH_HOPS` hops centred on it; time of value 0 in seconds;
        hop in seconds)."""
        power = np.concatenate(self._values) ** 2 if self._values else np.zeros(0)
        if len(power) >= LEVEL_SMOOTH_HOPS:
            # Hop i averages hops i - (LEVEL_SMOOTH_HOPS - LEVEL_LEAD_HOPS - 1) .. i + LEVEL_LEAD_HOPS: a window
            # reaching mostly back, so a step's 20 % point moves early by about as much as a slow rise's moves late.
            full = np.convolve(power, np.ones(LEVEL_SMOOTH_HOPS) / LEVEL_SMOOTH_HOPS, mode="full")
            power = full[LEVEL_LEAD_HOPS:LEVEL_LEAD_HOPS + len(power)]
        values = np.sqrt(power)
        step = self.hop / self.sample_rate
        return values, (self._start or 0.0) + step / 2, step


def _floor_and_spread(values: np.ndarray) -> tuple[float, float]:
    """The level and spread (scaled MAD) of the quiet part: the lowest `QUIET_SHARE` of the values (events, such
    as speech, can fill a good part of the time and would inflate both)."""
    quiet = values[values <= np.percentile(values, QUIET_SHARE * 100)]
    floor = float(np.median(quiet))
    return floor, 1.4826 * float(np.median(np.abs(quiet - floor)))


def _crossing(times: np.ndarray, levels: np.ndarray, target: float) -> float:
    """The first time `levels` reaches `target` (levels[0] < target <= max), between samples on the monotone
    cubic (Fritsch-Carlson) through them: a rise sampled a few times (a fade-in over three frames) is curved,
    and a straight chord would put a low fraction of it early."""
    index = int(np.argmax(levels >= target))
    if index == 0:
        return float(times[0])
    t0, t1 = float(times[index - 1]), float(times[index])
    y0, y1 = float(levels[index - 1]), float(levels[index])
    width = t1 - t0
    secant = (y1 - y0) / width

    def slope(at: int) -> float:                 # the tangent at sample `at` (0 at an extremum or an end)
        if at <= 0 or at >= len(levels) - 1:
            return secant
        before = (levels[at] - levels[at - 1]) / (times[at] - times[at - 1])
        after = (levels[at + 1] - levels[at]) / (times[at + 1] - times[at])
        return 0.0 if before * after <= 0 else 2.0 / (1.0 / before + 1.0 / after)

    m0, m1 = slope(index - 1), slope(index)
    low, high = 0.0, 1.0
    for _ in range(40):                          # the cubic rises monotonically on [t0, t1]: bisection
        u = 0.5 * (low + high)
        value = ((2 * u**3 - 3 * u**2 + 1) * y0 + (u**3 - 2 * u**2 + u) * width * m0
                 + (-2 * u**3 + 3 * u**2) * y1 + (u**3 - u**2) * width * m1)
        low, high = (u, high) if value < target else (low, u)
    return t0 + 0.5 * (low + high) * width


def sound_onsets(levels: np.ndarray, start_s: float, step_s: float) -> Onsets:
    """Onsets of the sound from its RMS level (`SoundLevel.levels`): each event is a run above
    ``floor + max(EVENT_MADS * MAD, EVENT_REL * (loudest - floor))`` (gaps under `QUIET_GAP_S` bridged); its rise
    goes from the floor to its first peak (the maximum within `ATTACK_S` of the run's start), and its onset
    is where the level first reaches `ONSET_FRACTION` of that rise, interpolated between hops."""
    levels = np.asarray(levels, np.float64)
    if len(levels) < 3:
        return Onsets(np.zeros(0), np.zeros(0))
    # Noise adds in power: a tone at 20 % of its peak over a floor of similar level reads 30 % of the peak.
    # The floor's power (its 10th percentile: speech can fill more than half the time) is taken out first.
    noise = float(np.percentile(levels, NOISE_PERCENTILE))
    levels = np.sqrt(np.clip(levels ** 2 - noise ** 2, 0.0, None))
    floor, spread = _floor_and_spread(levels)
    loudest = float(np.percentile(levels, 99.9))
    threshold = floor + max(EVENT_MADS * spread, EVENT_REL * (loudest - floor), 1e-6)
    above = levels > threshold
    gap = max(1, int(round(QUIET_GAP_S / step_s)))
    attack = max(2, int(round(ATTACK_S / step_s)))
    times, heights = [], []
    index, count = 0, len(levels)
    while index < count:
        if not above[index]:
            index += 1
            continue
        first = index
        quiet = 0
        while index < count and quiet < gap:        # the run, with short gaps bridged
            quiet = 0 if above[index] else quiet + 1
            index += 1
        stop = min(count, first + attack)
        top = first + int(np.argmax(levels[first:stop]))   # the event's first peak
        peak = float(levels[top])
        target = ONSET_FRACTION * peak                   # the floor's power is already taken out
        below = np.flatnonzero(levels[max(0, top - attack):top + 1] < target)
        begin = max(0, top - attack) + (int(below[-1]) if len(below) else 0)   # the last hop under the target
        grid = start_s + np.arange(begin, top + 1) * step_s
        rising = levels[begin:top + 1]
        times.append(_crossing(grid, rising, target))
        heights.append(peak)
    return Onsets(np.asarray(times), np.asarray(heights))


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    return float(a @ b) / norms if norms > 0 else 0.0


def picture_onsets(frame_times: np.ndarray, energies: np.ndarray, signatures: np.ndarray) -> Onsets:
    """Onsets of the picture from frame times (presentation timestamps, seconds), the frame differences
    ``energies[k]`` between frames k and k+1 (mean |gray change|) and each frame's signature
    (`envelopes.block_signature`, ``[frames, cells]``). See the module docstring for the rule.

    An event is a run of frame differences above ``floor + max(EVENT_MADS * MAD, MOTION_FLOOR)``. Its rise goes
    on while each next difference points the same way (cosine of consecutive signature differences above
    `SAME_WAY`) and is at least half the largest so far; a rise that completes within one frame interval is at the
    timestamp of the first frame showing it. An event whose change undoes the previous event's (cosine below
    `-SAME_WAY`: a flash going off, a mouth closing) is a return to rest, not an onset."""
    frame_times = np.asarray(frame_times, np.float64)
    energies = np.asarray(energies, np.float64)
    signatures = np.asarray(signatures, np.float64)
    if len(energies) < 3 or len(frame_times) != len(energies) + 1 or len(signatures) != len(frame_times):
        return Onsets(np.zeros(0), np.zeros(0))
    floor, spread = _floor_and_spread(energies)
    threshold = floor + max(EVENT_MADS * spread, MOTION_FLOOR)
    change = np.clip(energies - floor, 0.0, None)        # change[k]: frame k -> k+1, shown at frame k+1
    steps = np.diff(signatures, axis=0)                   # steps[k]: the same change, per signature cell
    times, heights = [], []
    previous_change: np.ndarray | None = None
    k, count = 0, len(change)
    while k < count:
        if energies[k] <= threshold:
            k += 1
            continue
        first = k                                          # walk back over the start of a slow rise
        while first > 0 and energies[first - 1] > floor + 2 * spread and _cosine(steps[first - 1], steps[first]) > 0:
            first -= 1
        event_end = k                                      # and on while the picture keeps changing the same way
        while event_end + 1 < count and energies[event_end + 1] > threshold \
                and _cosine(steps[event_end], steps[event_end + 1]) > 0:
            event_end += 1
        total_change = signatures[event_end + 1] - signatures[first]
        if previous_change is None or _cosine(total_change, previous_change) >= -SAME_WAY:   # not a return
            previous_change = total_change
            level = np.concatenate([[0.0], np.cumsum(change[first:event_end + 1])])  # at frames first .. event_end+1
            grid = frame_times[first:event_end + 2]
            total = float(level[-1])
            if level[1] >= (1 - ONSET_FRACTION) * total:      # completed within one frame: that frame's timestamp
                times.append(float(grid[1]))
            else:
                times.append(_crossing(grid, level, ONSET_FRACTION * total))
            heights.append(total)
        k = event_end + 1
    return Onsets(np.asarray(times), np.asarray(heights))


def match_onsets(picture: Onsets, sound: Onsets, max_offset_s: float) -> OnsetMatch | None:
    """The lag within ``+-max_offset_s`` that lines `sound` up with `picture` (module docstring), or None when
    either side has no onsets."""
    if len(picture) == 0 or len(sound) == 0:
        return None
    differences = (sound.times[None, :] - picture.times[:, None]).ravel()
    differences = differences[np.abs(differences) <= max_offset_s + PAIR_TOLERANCE_S]
    if len(differences) == 0:
        return None
    lags = np.arange(-max_offset_s, max_offset_s + 1e-9, 0.0005)
    votes = np.exp(-0.5 * ((lags[:, None] - differences[None, :]) / VOTE_SIGMA_S) ** 2).sum(axis=1)
    best = int(np.argmax(votes))
    lag = float(lags[best])
    nearest = sound.times[None, :] - picture.times[:, None] - lag
    closest = np.abs(nearest).min(axis=1)
    paired = closest <= PAIR_TOLERANCE_S
    pair_differences = np.take_along_axis(nearest, np.abs(nearest).argmin(axis=1)[:, None], axis=1)[:, 0][paired]
    offset = lag + float(np.median(pair_differences)) if paired.any() else lag
    far = np.abs(lags - lag) >= RUNNER_UP_GAP_S
    runner_up = float(votes[far].max()) if far.any() else 0.0
    runner_up_lag = float(lags[far][int(np.argmax(votes[far]))]) if far.any() else None
    share = int(paired.sum()) / min(len(picture), len(sound))
    distinct = 1.0 - runner_up / votes[best] if votes[best] > 0 else 0.0
    confidence = float(np.clip(share * min(1.0, 2.0 * distinct), 0.0, 1.0))
    return OnsetMatch(offset * 1000.0, int(paired.sum()), len(picture), len(sound), confidence,
                      None if runner_up_lag is None else runner_up_lag * 1000.0)


__all__ = ["ONSET_FRACTION", "OnsetMatch", "Onsets", "SoundLevel", "match_onsets", "picture_onsets",
           "sound_onsets"]
