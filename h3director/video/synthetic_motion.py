"""Synthetic moving content with a known detail layer, for keyframe-detailing tests and benchmarks.

A `MovingScenes` clip is analytic: every pixel is a sum of sinusoids evaluated where the camera looks,
so frame t can be rendered alone (no clip in memory) at any sub-pixel offset. The picture is a
smooth texture (wavelengths 10-40 px: enough structure for optical flow) that translates by
`shift` = (dx, dy) px per frame (content moves left/up for positive values); the detail layer is a fine
texture (wavelengths 2.5-5 px, `detail_amplitude` peak) painted on the same moving surface, so the
"all frames detailed" truth is ``render(t, detail=True)``. From frame `cut_at` on, a second scene
(a different texture, brighter: values in about [0.55, 0.9] instead of [0.1, 0.45]) replaces the first.
Values are float32 in [0, 1], layout `[H, W, 3]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def _waves(rng: np.random.Generator, count: int, shortest: float, longest: float) -> np.ndarray:
    """`count` rows of (kx, ky, phase) for channel-shared sinusoids with wavelengths in [shortest, longest] px."""
    wavelength = rng.uniform(shortest, longest, count)
    angle = rng.uniform(0, np.pi, count)
    k = 2 * np.pi / wavelength
    return np.stack([k * np.cos(angle), k * np.sin(angle), rng.uniform(0, 2 * np.pi, count)], axis=1)


@dataclass
class MovingScenes:
    """A translating two-scene clip with a known detail layer (see the module docstring)."""

    frames: int = 24
    height: int = 64
    width: int = 96
    shift: tuple[float, float] = (2.0, 1.0)
    cut_at: int | None = None
    detail_amplitude: float = 0.06
    seed: int = 0
    _scenes: list = field(init=False, repr=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        self._scenes = [(_waves(rng, 6, 10.0, 40.0), _waves(rng, 6, 2.5, 5.0), rng.uniform(-0.04, 0.04, 3))
                        for _ in range(2)]

    def render(self, t: int, detail: bool = False) -> np.ndarray:
        """Frame t, float32 `[H, W, 3]`; with `detail` the fine layer is added (the detailed truth)."""
        scene = 1 if self.cut_at is not None and t >= self.cut_at else 0
        base_waves, detail_waves, tint = self._scenes[scene]
        x = np.arange(self.width, dtype=np.float64)[None, :] + self.shift[0] * t
        y = np.arange(self.height, dtype=np.float64)[:, None] + self.shift[1] * t
        gray = np.full((self.height, self.width), 0.725 if scene else 0.275)
        layers = [(base_waves, 0.15)] + ([(detail_waves, self.detail_amplitude)] if detail else [])
        for waves, amplitude in layers:                      # amplitude * mean of the sinusoids
            for kx, ky, p in waves:
                phase = kx * x + (ky * y + p)                # one [H, W] plane (x, y broadcast)
                gray += np.sin(phase, out=phase) * (amplitude / len(waves))
        out = np.empty((self.height, self.width, 3), np.float32)
        for channel in range(3):
            np.clip(gray + tint[channel], 0.0, 1.0, out=out[..., channel])
        return out

    def clip(self, detail: bool = False) -> np.ndarray:
        """All frames `[F, H, W, 3]` float32 (for small test clips; benchmarks render frame by frame)."""
        return np.stack([self.render(t, detail) for t in range(self.frames)])


__all__ = ["MovingScenes"]
