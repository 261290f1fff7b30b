"""Synthetic test clips with a known A/V offset, written as real media files (MP4 by default; H.264 + AAC) with PyAV.

Kinds (all with background noise: gray-level noise in the picture, white noise in the sound):

* ``"flash"``: at random instants s_i the picture brightens and fades (time constant `FADE_S`);
  the sound has a click (a noise burst fading with the same constant) at ``s_i + offset``.
* ``"mouth"``: a mouth-like ellipse opens and closes with speech-like syllables (raised-cosine
  openings of 120..300 ms); the sound is a voiced burst (harmonics of 110..180 Hz) whose loudness
  follows the same opening curve, ``offset`` later.
* ``"none"``: a still picture and steady noise: nothing to line up.

The picture samples a continuous scene: frame k shows the scene at ``k / fps`` (a flash is seen
first on the first frame at or after its instant), as a camera would. ``offset_ms`` is positive when
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


def synthetic_tracks(kind: str, offset_ms: float, seconds: float = 6.0, fps: float = 24.0,
                     sample_rate: int = 32000, size: tuple[int, int] = (96, 64), seed: int = 0,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The clip as arrays: uint8 frames ``[F, H, W, 3]`` (``size`` is width, height) and mono float32
    samples ``[L]`` in [-1, 1], with the sound `offset_ms` late (negative: early)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    rng = np.random.default_rng(seed)
    width, height = size
    frames_count = int(round(seconds * fps))
    frame_times = np.arange(frames_count) / fps
    samples_count = int(round(seconds * sample_rate))
    sample_times = np.arange(samples_count) / sample_rate - offset_ms / 1000.0  # scene time of each sample

    ys, xs = np.mgrid[0:height, 0:width].astype(np.float32)
    base = 70.0 + 30.0 * xs / max(1, width - 1)
    sound = np.zeros(samples_count)
    if kind == "flash":
        events = _event_times(rng, seconds, 0.3, 0.9)
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


def write_clip(path: str | os.PathLike, frames: np.ndarray, samples: np.ndarray | None, fps: float,
               sample_rate: int = 32000, crf: int = 18, container_format: str = "mp4") -> Path:
    """Write uint8 ``[F, H, W, 3]`` frames (H.264, yuv420p) and float samples in [-1, 1] (AAC; mono ``[n]``
    or ``[channels, n]`` with 1 or 2 channels) to a `container_format` file ("mp4", "matroska", ...), atomically."""
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
                audio = container.add_stream("aac", rate=int(sample_rate), layout=layout)
                frame = av.AudioFrame.from_ndarray(planes, format="fltp", layout=layout)
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
