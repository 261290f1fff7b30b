"""Synthetic test clips with a known A/V offset, written as real media files (MP4 by default; H.264 + AAC) with PyAV.

Kinds (all with background noise: gray-level noise in the picture, white noise in the sound):

* ``"flash"``: at random frame timestamps s_i the picture brightens and fades (time constant `FADE_S`);
  the sound has a click (a noise burst fading with the same constant) at ``s_i + offset``.
* ``"mouth"``: a mouth-like ellipse opens and closes with speech-like syllables (raised-cosine
  openings of 120..300 ms); the sound is a voiced burst (harmonics of 110..180 Hz) whose loudness
  follows the same opening curve, ``offset`` later.
* ``"none"``: a still picture and steady noise: nothing to line up.

`beep_flash_tracks` draws the calibration pattern instead (a flash drawn on a frame, a tone burst), with the
flash's and the tone's shapes and lengths chosen independently; each event's time is its onset as
`h3director.av.onsets` defines it (the 20 % point of its rise; a flash drawn on frame k is at frame k's
timestamp).

The picture samples a continuous scene: frame k shows the scene at ``k / fps`` (its presentation
timestamp), so a flash starting at s_i is drawn on the frame at s_i. ``offset_ms`` is positive when
the audio is late. Sizes are small on purpose: these clips feed tests and the accuracy sweep.
"""

from __future__ import annotations

import os
from fractions import Fraction
from pathlib import Path

import numpy as np

from h3director.core.atomic_file import atomic_path

FADE_S = 0.08
KINDS = ("flash", "mouth", "none")
FLASH_SHAPES = ("step", "fade", "smooth")     # drawn for `flash_frames` frames; exp fade; raised-cosine rise
TONE_SHAPES = ("step", "smooth", "click")     # 1 ms ramp; raised-cosine attack; decaying noise burst


def _event_times(rng: np.random.Generator, seconds: float, low: float, high: float) -> np.ndarray:
    times, t = [], 0.35 + rng.uniform(0, 0.2)
    while t < seconds - 0.45:
        times.append(t)
        t += rng.uniform(low, high)
    return np.asarray(times)


def _syllables(rng: np.random.Generator, seconds: float) -> list[tuple[float, float, float]]:
    """(start, duration, loudness) of each syllable."""
    out, t = [], 0.35 + rng.uniform(0, 0.2)
    while True:
        duration = rng.uniform(0.12, 0.3)
        if t + duration > seconds - 0.45:
            return out
        out.append((t, duration, rng.uniform(0.5, 1.0)))
        t += duration + rng.uniform(0.05, 0.4)


def _opening(syllables, times: np.ndarray) -> np.ndarray:
    """The mouth's opening 0..1 at `times` (seconds): a raised cosine over each syllable."""
    out = np.zeros_like(times, dtype=np.float64)
    for start, duration, loudness in syllables:
        inside = (times >= start) & (times < start + duration)
        out[inside] += loudness * 0.5 * (1 - np.cos(2 * np.pi * (times[inside] - start) / duration))
    return out


def _fade(events: np.ndarray, times: np.ndarray) -> np.ndarray:
    out = np.zeros_like(times, dtype=np.float64)
    for s in events:
        after = times >= s
        out[after] += np.exp(-(times[after] - s) / FADE_S)
    return out


def _clocks(seconds: float, fps: float, sample_rate: int) -> tuple[np.ndarray, np.ndarray]:
    """The timestamps (seconds) of the frames and of the samples of a clip `seconds` long."""
    return (np.arange(int(round(seconds * fps))) / fps,
            np.arange(int(round(seconds * sample_rate))) / sample_rate)


def synthetic_tracks(kind: str, offset_ms: float, seconds: float = 6.0, fps: float = 24.0,
                     sample_rate: int = 32000, size: tuple[int, int] = (96, 64), seed: int = 0,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The clip as arrays: uint8 frames ``[F, H, W, 3]`` (``size`` is width, height) and mono float32
    samples ``[L]`` in [-1, 1], with the sound `offset_ms` late (negative: early)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    rng = np.random.default_rng(seed)
    width, height = size
    frame_times, sample_times = _clocks(seconds, fps, sample_rate)
    frames_count, samples_count = len(frame_times), len(sample_times)
    sample_times = sample_times - offset_ms / 1000.0  # scene time of each sample

    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    base = 70.0 + 30.0 * xs / max(1, width - 1)
    sound = np.zeros(samples_count)
    if kind == "flash":
        events = np.round(_event_times(rng, seconds, 0.3, 0.9) * fps) / fps   # drawn from a frame on
        light = _fade(events, frame_times)
        pictures = [base + 140.0 * min(1.0, b) for b in light]
        sound += 0.5 * _fade(events, sample_times) * rng.standard_normal(samples_count)
    elif kind == "mouth":
        syllables = _syllables(rng, seconds)
        opening = _opening(syllables, frame_times)
        cy, cx, half_width = height / 2, width / 2, width / 4
        pictures = []
        for a in opening:
            half_height = 1.0 + 0.35 * height * a
            distance = np.sqrt(((xs - cx) / half_width) ** 2 + ((ys - cy) / half_height) ** 2)
            inside = np.clip((1.0 - distance) * half_height, 0.0, 1.0)  # soft edge, about one pixel
            pictures.append(base * (1 - inside) + 20.0 * inside)
        voice = np.zeros(samples_count)
        pitch = rng.uniform(110, 180)
        for harmonic in range(1, 12):
            voice += np.sin(2 * np.pi * pitch * harmonic * sample_times + rng.uniform(0, 6.28)) / harmonic
        voice += 0.3 * rng.standard_normal(samples_count)
        sound += 0.25 * _opening(syllables, sample_times) * voice
    else:
        pictures = [base] * frames_count
    sound += 0.02 * rng.standard_normal(samples_count)
    frames = np.empty((frames_count, height, width, 3), np.uint8)
    for k, picture in enumerate(pictures):
        noisy = picture + 3.0 * rng.standard_normal(picture.shape)
        frames[k] = np.clip(noisy, 0, 255).astype(np.uint8)[..., None]
    return frames, np.clip(sound, -1, 1).astype(np.float32)


def _rise_to_onset_s(rise_s: float) -> float:
    """Seconds from the start of a raised-cosine rise (0 -> 1 over `rise_s`) to its `ONSET_FRACTION` point."""
    from h3director.av.onsets import ONSET_FRACTION

    return 2 * rise_s / np.pi * float(np.arcsin(np.sqrt(ONSET_FRACTION)))


def _burst(times: np.ndarray, start: float, rise_s: float, hold_s: float) -> np.ndarray:
    """0..1: a raised-cosine rise over `rise_s` from `start`, `hold_s` at 1, then a fall as long as the rise."""
    t = times - start
    out = np.zeros_like(times, dtype=np.float64)
    if rise_s > 0:
        rising = (t >= 0) & (t < rise_s)
        out[rising] = np.sin(0.5 * np.pi * t[rising] / rise_s) ** 2
    out[(t >= rise_s) & (t < rise_s + hold_s)] = 1.0
    falling = (t >= rise_s + hold_s) & (t < 2 * rise_s + hold_s)
    out[falling] = np.cos(0.5 * np.pi * (t[falling] - rise_s - hold_s) / max(rise_s, 1e-9)) ** 2
    return out


def beep_flash_tracks(offset_ms: float, *, flash: str = "step", flash_frames: int = 3, flash_rise_ms: float = 100.0,
                      tone: str = "step", burst_ms: float = 200.0, tone_rise_ms: float = 30.0,
                      seconds: float = 8.0, fps: float = 24.0, sample_rate: int = 32000,
                      size: tuple[int, int] = (96, 64), seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Beep-and-flash: uint8 frames ``[F, H, W, 3]`` and mono float32 samples with each tone's onset
    `offset_ms` after its flash's onset (positive: audio late). Events fall on frame timestamps 0.6-1.2 s apart.

    `flash` (`FLASH_SHAPES`): "step" drawn on `flash_frames` frames; "fade" drawn at full brightness then fading
    (time constant `FADE_S`); "smooth" a raised-cosine rise over `flash_rise_ms`, held `flash_frames` frames.
    `tone` (`TONE_SHAPES`): a 1 kHz tone burst of `burst_ms` with a 1 ms ramp ("step") or a raised-cosine attack
    of `tone_rise_ms` ("smooth"), or a noise click fading with `FADE_S` ("click"). Picture and sound noise as
    the other kinds."""
    if flash not in FLASH_SHAPES or tone not in TONE_SHAPES:
        raise ValueError(f"flash must be one of {FLASH_SHAPES} and tone one of {TONE_SHAPES}")
    rng = np.random.default_rng(seed)
    width, height = size
    frame_times, sample_times = _clocks(seconds, fps, sample_rate)
    frames_count, samples_count = len(frame_times), len(sample_times)
    events, t = [], 0.4 + rng.uniform(0, 0.3)
    while t < seconds - 1.0:
        events.append(round(t * fps) / fps)                       # on a frame's timestamp
        t += rng.uniform(0.6, 1.2)
    light = np.zeros(frames_count)
    sound = np.zeros(samples_count)
    hold = flash_frames / fps
    for onset in events:
        if flash == "step":
            light[(frame_times >= onset - 1e-9) & (frame_times < onset + hold - 1e-9)] = 1.0
        elif flash == "fade":
            after = frame_times >= onset - 1e-9
            light[after] += np.exp(-(frame_times[after] - onset) / FADE_S)
        else:
            rise = flash_rise_ms / 1000
            light += _burst(frame_times, onset - _rise_to_onset_s(rise), rise, hold)
        start = onset + offset_ms / 1000
        if tone == "click":
            after = sample_times >= start
            sound[after] += 0.5 * np.exp(-(sample_times[after] - start) / FADE_S) * rng.standard_normal(after.sum())
            continue
        rise = 0.001 if tone == "step" else tone_rise_ms / 1000
        first = start - _rise_to_onset_s(rise)
        envelope = _burst(sample_times, first, rise, max(0.0, burst_ms / 1000 - 2 * rise))
        sound += 0.5 * envelope * np.sin(2 * np.pi * 1000.0 * (sample_times - first))
    sound += 0.02 * rng.standard_normal(samples_count)
    xs = np.mgrid[0:height, 0:width][1].astype(np.float32)
    base = 70.0 + 30.0 * xs / max(1, width - 1)
    frames = np.empty((frames_count, height, width, 3), np.uint8)
    for k in range(frames_count):
        noisy = base + 140.0 * min(1.0, light[k]) + 3.0 * rng.standard_normal(base.shape)
        frames[k] = np.clip(noisy, 0, 255).astype(np.uint8)[..., None]
    return frames, np.clip(sound, -1, 1).astype(np.float32)


def write_clip(path: str | os.PathLike, frames: np.ndarray, samples: np.ndarray | None, fps: float,
               sample_rate: int = 32000, crf: int = 18, container_format: str = "mp4",
               audio_codec: str = "aac") -> Path:
    """Write uint8 ``[F, H, W, 3]`` frames (H.264, yuv420p) and float samples in [-1, 1] (`audio_codec` "aac", or
    "pcm_s16le" in a container that takes it, e.g. "matroska"; mono ``[n]`` or ``[channels, n]`` with 1 or 2
    channels) to a `container_format` file ("mp4", "matroska", ...), atomically."""
    from h3director.av.open_file import import_av

    av = import_av()

    final = Path(path)
    planes = None if samples is None else np.atleast_2d(np.asarray(samples, np.float32))
    if planes is not None and (planes.ndim != 2 or planes.shape[0] not in (1, 2)):
        raise ValueError(f"samples must be [n] or [channels, n] with 1 or 2 channels, got shape {np.shape(samples)}")
    with atomic_path(final) as temporary:
        with av.open(str(temporary), mode="w", format=container_format) as container:
            video = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1001),
                                         options={"crf": str(crf), "preset": "veryfast"})
            video.height, video.width = frames.shape[1], frames.shape[2]
            video.pix_fmt = "yuv420p"
            if planes is not None:
                layout = "mono" if planes.shape[0] == 1 else "stereo"
                audio = container.add_stream(audio_codec, rate=int(sample_rate), layout=layout)
                if audio_codec == "aac":
                    frame = av.AudioFrame.from_ndarray(planes, format="fltp", layout=layout)
                else:                                # packed 16-bit PCM
                    pcm = np.round(np.clip(planes, -1, 1) * 32767).astype(np.int16).T.reshape(1, -1)
                    frame = av.AudioFrame.from_ndarray(pcm, format="s16", layout=layout)
                frame.sample_rate, frame.pts = int(sample_rate), 0
                container.mux(audio.encode(frame))
                container.mux(audio.encode(None))
            for index, pixels in enumerate(frames):
                picture = av.VideoFrame.from_ndarray(pixels, format="rgb24")
                picture.pts = index
                container.mux(video.encode(picture))
            container.mux(video.encode(None))
    return final


def write_synthetic_clip(path: str | os.PathLike, kind: str, offset_ms: float, seconds: float = 6.0,
                         fps: float = 24.0, sample_rate: int = 32000, size: tuple[int, int] = (96, 64),
                         seed: int = 0) -> Path:
    """`synthetic_tracks` written to an MP4 at `path` (atomically); returns the path."""
    frames, samples = synthetic_tracks(kind, offset_ms, seconds, fps, sample_rate, size, seed)
    return write_clip(path, frames, samples, fps, sample_rate)


__all__ = ["FLASH_SHAPES", "TONE_SHAPES", "beep_flash_tracks", "synthetic_tracks", "write_clip",
           "write_synthetic_clip"]
