"""A/V offset measurement (h3director.av): known offsets on synthetic clips, no-event clips, envelopes."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from synthetic_av import synthetic_tracks, write_synthetic_clip

from h3director.av.envelopes import GRID_S, AudioFlux, motion_envelope
from h3director.av.measure import measure_arrays, measure_file
from h3director.errors import InvalidInputError

FPS, RATE, SIZE = 24.0, 32000, (64, 48)
TOLERANCE_MS = 10.0


@pytest.mark.parametrize("kind,offset_ms,seed", [
    ("flash", -160.0, 1), ("flash", 17.5, 2), ("flash", 0.0, 3),
    ("mouth", 62.5, 4), ("mouth", -8.3, 5), ("mouth", 190.0, 6),
])
def test_known_offsets_in_memory_are_measured_within_tolerance(kind, offset_ms, seed):
    frames, samples = synthetic_tracks(kind, offset_ms, seconds=8.0, fps=FPS, sample_rate=RATE, size=SIZE, seed=seed)
    result = measure_arrays(frames, FPS, samples, RATE)
    assert result.usable and result.reason == "ok"
    assert abs(result.offset_ms - offset_ms) <= TOLERANCE_MS, result
    assert result.confidence >= 0.25


@pytest.mark.parametrize("kind,offset_ms", [("flash", 104.2), ("mouth", -29.0)])
def test_known_offsets_in_mp4_files_are_measured_within_tolerance(tmp_path, kind, offset_ms):
    """Through the real codecs (H.264 + AAC written and read with PyAV): sub-frame offsets survive."""
    path = write_synthetic_clip(tmp_path / "clip.mp4", kind, offset_ms, seconds=5.0, fps=FPS,
                                sample_rate=RATE, size=SIZE, seed=7)
    result = measure_file(path)
    assert result.usable
    assert abs(result.offset_ms - offset_ms) <= TOLERANCE_MS, result
    assert result.to_dict()["convention"] == "positive offset_ms = audio late"


def test_audio_late_reads_positive_and_early_negative():
    late = measure_arrays(*_tracks("flash", 120.0), RATE)
    early = measure_arrays(*_tracks("flash", -120.0), RATE)
    assert late.offset_ms > 100 and early.offset_ms < -100


def _tracks(kind, offset_ms, seconds=5.0, seed=11):
    frames, samples = synthetic_tracks(kind, offset_ms, seconds=seconds, fps=FPS, sample_rate=RATE, size=SIZE,
                                       seed=seed)
    return frames, FPS, samples


def test_no_events_is_an_explicit_answer_with_zero_confidence():
    result = measure_arrays(*_tracks("none", 0.0), RATE)
    assert not result.usable and result.offset_ms is None and result.confidence == 0.0
    assert result.reason.startswith("no usable events")
    assert result.to_dict()["offset_ms"] is None


def test_events_in_the_picture_only_are_not_usable():
    frames, fps, _ = _tracks("flash", 0.0)
    _, _, quiet = _tracks("none", 0.0)
    result = measure_arrays(frames, fps, quiet, RATE)
    assert not result.usable and result.picture_events >= 2 and result.sound_events < 2


def test_unrelated_events_get_low_confidence():
    frames, fps, _ = _tracks("flash", 0.0, seed=21)
    _, _, other = _tracks("flash", 0.0, seed=22)
    assert measure_arrays(frames, fps, other, RATE).confidence < 0.25


def test_windows_follow_the_file():
    result = measure_arrays(*_tracks("flash", 50.0, seconds=8.0, seed=12), RATE, window_s=4.0)
    assert len(result.windows) == 3
    assert [w.start_s for w in result.windows] == pytest.approx([0.0, 2.0, 4.0], abs=0.05)
    assert result.windows[-1].end_s == pytest.approx(8.0, abs=0.05)
    measured = [w.offset_ms for w in result.windows if w.offset_ms is not None]
    assert len(measured) >= 2
    assert all(abs(m - 50.0) <= 2 * TOLERANCE_MS for m in measured)


def test_drift_is_the_slope_of_the_window_offsets():
    """Two halves with different offsets: the windows see both and the slope is positive."""
    a_frames, _, a_sound = _tracks("flash", -60.0, seconds=6.0, seed=31)
    b_frames, _, b_sound = _tracks("flash", 60.0, seconds=6.0, seed=32)
    result = measure_arrays(np.concatenate([a_frames, b_frames]), FPS, np.concatenate([a_sound, b_sound]), RATE,
                            window_s=4.0)
    first, last = result.windows[0], result.windows[-1]
    assert abs(first.offset_ms + 60) <= 2 * TOLERANCE_MS and abs(last.offset_ms - 60) <= 2 * TOLERANCE_MS
    assert result.drift_ms_per_min > 0


def test_audio_flux_is_the_same_whatever_the_block_sizes():
    rng = np.random.default_rng(0)
    samples = rng.standard_normal(RATE // 2).astype(np.float32) * np.linspace(0, 1, RATE // 2, dtype=np.float32)
    whole = AudioFlux(RATE)
    whole.feed(samples, 0.25)
    pieces = AudioFlux(RATE)
    cuts = [0, 7, 500, 513, 4000, 9001, len(samples)]
    for first, last in itertools.pairwise(cuts):
        pieces.feed(samples[first:last], 0.25 if first == 0 else 0.0)
    a, b = whole.envelope(), pieces.envelope()
    assert a.start_s == b.start_s == pytest.approx(0.25 + GRID_S / 2)
    np.testing.assert_allclose(a.values, b.values, rtol=1e-5, atol=1e-7)


def test_a_frame_difference_stands_at_the_first_frame_that_shows_it():
    envelope = motion_envelope(np.array([0.0, 0.04, 0.08]), np.array([0.0, 3.0]))
    position = envelope.start_s + np.argmax(envelope.values) * envelope.step_s
    assert position == pytest.approx(0.08)
    assert envelope.values.sum() == pytest.approx(3.0)


def test_bad_arguments_are_refused():
    frames, fps, samples = _tracks("flash", 0.0, seconds=2.0)
    with pytest.raises(InvalidInputError, match="fps"):
        measure_arrays(frames, 0.0, samples, RATE)
    with pytest.raises(InvalidInputError, match="at least 2 frames"):
        measure_arrays(frames[:1], fps, samples, RATE)
    with pytest.raises(InvalidInputError, match="no samples"):
        measure_arrays(frames, fps, np.zeros(0, np.float32), RATE)


@pytest.mark.parametrize("flash,tone,offset_ms", [("step", "smooth", 63.0), ("step", "step", 0.0),
                                                   ("smooth", "step", -137.5), ("fade", "click", 171.0)])
def test_beep_and_flash_onsets_without_half_frame_bias(tmp_path, flash, tone, offset_ms):
    """The calibration pattern: a flash drawn on a frame (a step that stays 3 frames, or a smooth rise) against a
    200 ms tone burst of another shape, through H.264 + AAC. Onsets, not envelope centres, are paired, and a frame
    stands at its own timestamp: a beep starting with the flash frame reads 0, not half a frame."""
    from synthetic_av import beep_flash_tracks, write_clip

    frames, samples = beep_flash_tracks(offset_ms, flash=flash, flash_frames=3, tone=tone, burst_ms=200.0,
                                        seconds=6.0, fps=FPS, sample_rate=RATE, size=SIZE, seed=3)
    result = measure_file(write_clip(tmp_path / "pattern.mp4", frames, samples, FPS, RATE))
    assert result.usable and result.reason == "ok"
    assert abs(result.offset_ms - offset_ms) <= 5.0, result.to_dict()
    assert result.confidence >= 0.9 and result.pairs == min(result.picture_events, result.sound_events)


def test_a_periodic_pattern_that_two_lags_explain_gets_low_confidence():
    """Flashes exactly every half second and beeps 100 ms after each: within +-500 ms, -400 ms pairs every event
    as well as +100 ms does, so whichever is reported, the confidence says it cannot be trusted."""
    count, period = int(6 * FPS), 12
    frames = np.full((count, SIZE[1], SIZE[0], 3), 60, np.uint8)
    for start in range(6, count - 3, period):
        frames[start:start + 3] = 200
    times = np.arange(int(6 * RATE)) / RATE
    samples = 0.01 * np.random.default_rng(0).standard_normal(len(times))
    for start in range(6, count - 3, period):
        burst = (times >= start / FPS + 0.1) & (times < start / FPS + 0.2)
        samples[burst] += 0.5 * np.sin(2 * np.pi * 1000 * times[burst])
    result = measure_arrays(frames, FPS, samples.astype(np.float32), RATE)
    assert result.usable and result.confidence < 0.25 and result.reason.startswith("low confidence")
    narrow = measure_arrays(frames, FPS, samples.astype(np.float32), RATE, max_offset_ms=200.0)
    assert abs(narrow.offset_ms - 100.0) <= 3.0 and narrow.confidence >= 0.9    # one lag in range: trusted
