"""Keyframe selection for keyframe-only detailing: every N frames, scene cuts, or motion peaks.

Frames are a sequence `[F, H, W, C]` (a torch tensor, a numpy array or a memory-mapped `.npy`),
float in [0, 1] or uint8 in [0, 255], C in {1, 3, 4}; they are read one at a time, so the scans
below hold two frames, never the clip. Every mode includes the first and the last frame, so every
frame lies between two keyframes (`detail_carry` carries the detail only between neighbours).

Modes (`select_keyframes`):
- ``every_n``: 0, N, 2N, ... and F - 1. A clip shorter than N frames is refused.
- ``scene``: both sides of every cut: the last frame of a scene and the first of the next, so no
  detail is carried across a cut. A cut is a frame t whose scene score is above `threshold`.
  Scene score (ffmpeg's ``select=gt(scene,T)`` on a YUV video, which scores the 8-bit limited-range
  luma plane: ``min(mafd, diff) / 100`` with luma steps of 1/219; on the 24-frame clip of
  tests/test_keyframes.py the values are within 0.0002 of ffmpeg's): with Y the BT.601 luma in [0, 1] and
  ``mafd[t] = mean |Y[t] - Y[t-1]|`` (``mafd[0] = 0``),
  ``score[t] = clip(2.19 * min(mafd[t], |mafd[t] - mafd[t-1]|), 0, 1)``, ``score[0] = 0``.
  A cut scores high once; steady motion (a high but unchanging mafd) scores low.
- ``every_n+scene``: the union of the two (keyframes inside long scenes, and no carry across a cut).
- ``motion``: frames where the mean optical-flow magnitude peaks. ``motion[t]`` = mean length, in
  pixels of the input, of the Farneback flow from frame t - 1 to frame t (``motion[0] = 0``),
  measured on frames scaled so their longer side is at most `analysis_side` px. Peaks are local
  maxima (``motion[t] >= motion[t - 1]`` and ``>= motion[t + 1]``, above 0); strongest first, a peak
  closer than `min_spacing` frames to an accepted one is dropped. Needs OpenCV (extra `flow`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from h3director.errors import InvalidInputError
from h3director.video import optical_flow

MODES = ("every_n", "scene", "every_n+scene", "motion")
LUMA = np.float32([0.299, 0.587, 0.114])
FFMPEG_SCENE_SCALE = 219 / 100
"""ffmpeg's scene score per unit of luma change: limited-range 8-bit luma spans 219 steps, and ffmpeg divides the
mean absolute difference in steps by 100."""


@dataclass(frozen=True)
class KeyframeSelection:
    """Sorted, unique keyframe indices (0-based, into the input's frames) and the per-frame score the
    mode ranked by (`scene`: scene score in [0, 1]; `motion`: mean flow magnitude in px; `every_n`: None)."""

    indices: tuple[int, ...]
    scores: np.ndarray | None
    mode: str


def frame_count(frames) -> int:
    """The number of frames F of `frames` `[F, H, W, C]` (C 1, 3 or 4; float in [0, 1] or uint8);
    `InvalidInputError` for any other shape or dtype."""
    shape = tuple(frames.shape)
    if len(shape) != 4 or shape[-1] not in (1, 3, 4) or min(shape) < 1:
        raise InvalidInputError(f"frames must be [F >= 1, H, W, C in (1, 3, 4)], got shape {list(shape)}")
    dtype = str(frames.dtype)
    if "float" not in dtype and dtype not in ("uint8", "torch.uint8"):
        raise InvalidInputError(f"frames must be float in [0, 1] or uint8, got dtype {dtype}")
    return shape[0]


def frame_float(frames, index: int) -> np.ndarray:
    """Frame `index` as float32 `[H, W, C]` in [0, 1] (uint8 divided by 255; a CPU torch float32
    frame is a view, not a copy)."""
    frame = frames[index]
    if hasattr(frame, "detach"):                             # torch: half precisions have no numpy dtype
        frame = frame.detach().cpu()
        frame = (frame if str(frame.dtype) in ("torch.float32", "torch.uint8") else frame.float()).numpy()
    frame = np.asarray(frame)
    if frame.dtype == np.uint8:
        return frame.astype(np.float32) / 255.0
    return frame.astype(np.float32, copy=False)


def luma(frame: np.ndarray) -> np.ndarray:
    """BT.601 luma `[H, W]` of a float frame `[H, W, C]` (one channel: itself; alpha ignored)."""
    return frame[..., 0] if frame.shape[-1] < 3 else frame[..., :3] @ LUMA


def every_n_indices(count: int, n: int) -> tuple[int, ...]:
    """0, n, 2n, ... below `count`, and `count - 1`. `InvalidInputError` for `n` < 1 or `count` < `n`."""
    if n < 1:
        raise InvalidInputError(f"n must be >= 1, got {n}")
    if count < n:
        raise InvalidInputError(f"every_n needs at least n={n} frames, got {count}")
    return tuple(sorted(set(range(0, count, n)) | {count - 1}))


def scene_scores(frames) -> np.ndarray:
    """Scene score per frame, float64 `[F]` in [0, 1] (see the module docstring)."""
    count = frame_count(frames)
    scores = np.zeros(count)
    previous, previous_mafd = luma(frame_float(frames, 0)), 0.0
    for t in range(1, count):
        current = luma(frame_float(frames, t))
        mafd = float(np.mean(np.abs(current - previous)))
        scores[t] = min(max(FFMPEG_SCENE_SCALE * min(mafd, abs(mafd - previous_mafd)), 0.0), 1.0)
        previous, previous_mafd = current, mafd
    return scores


def check_threshold(threshold: float) -> None:
    if not 0.0 < float(threshold) < 1.0:
        raise InvalidInputError(f"scene threshold must be in (0, 1), got {threshold}")


def scene_indices(scores: np.ndarray, threshold: float) -> tuple[int, ...]:
    """First and last frame, and t - 1 and t for every cut t (``scores[t] > threshold``)."""
    check_threshold(threshold)
    count = len(scores)
    keep = {0, count - 1}
    for t in np.flatnonzero(np.asarray(scores) > threshold):
        keep |= {int(t) - 1, int(t)}
    return tuple(sorted(keep))


def motion_magnitudes(frames, analysis_side: int = 256) -> np.ndarray:
    """Mean Farneback flow magnitude from frame t - 1 to t, in input pixels, float64 `[F]` (see module)."""
    count = frame_count(frames)
    if analysis_side < 16:
        raise InvalidInputError(f"analysis_side must be >= 16 px, got {analysis_side}")
    height, width = frames.shape[1], frames.shape[2]
    scale = min(1.0, analysis_side / max(height, width))
    cv2 = optical_flow.opencv()

    def gray(t):
        image = optical_flow.gray_u8(frame_float(frames, t))
        if scale < 1.0:
            size = (max(1, round(width * scale)), max(1, round(height * scale)))
            image = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
        return image

    magnitudes = np.zeros(count)
    previous = gray(0)
    for t in range(1, count):
        current = gray(t)
        magnitudes[t] = optical_flow.mean_magnitude(optical_flow.flow(previous, current)) / scale
        previous = current
    return magnitudes


def motion_peak_indices(magnitudes: np.ndarray, min_spacing: int) -> tuple[int, ...]:
    """First and last frame, and the motion peaks kept `min_spacing` frames apart (see module)."""
    if min_spacing < 1:
        raise InvalidInputError(f"min_spacing must be >= 1 frame, got {min_spacing}")
    values = np.asarray(magnitudes, dtype=np.float64)
    count = len(values)
    padded = np.concatenate([[-np.inf], values, [-np.inf]])
    peak = (values > 0) & (values >= padded[:-2]) & (values >= padded[2:])
    accepted: list[int] = []
    for t in sorted(np.flatnonzero(peak), key=lambda i: (-values[i], i)):
        if all(abs(int(t) - a) >= min_spacing for a in accepted):
            accepted.append(int(t))
    return tuple(sorted(set(accepted) | {0, count - 1}))


def select_keyframes(frames, mode: str, *, n: int = 5, threshold: float = 0.4, min_spacing: int = 5,
                     analysis_side: int = 256) -> KeyframeSelection:
    """Keyframe indices of `frames` `[F, H, W, C]` by `mode` (see the module docstring); every parameter is
    checked before a frame is read. Returns a `KeyframeSelection`; `InvalidInputError` for an unknown
    `mode` or a parameter out of range."""
    count = frame_count(frames)
    if mode == "every_n":
        return KeyframeSelection(every_n_indices(count, int(n)), None, mode)
    if mode in ("scene", "every_n+scene"):
        check_threshold(threshold)
        regular = every_n_indices(count, int(n)) if mode == "every_n+scene" else ()
        scores = scene_scores(frames)
        return KeyframeSelection(tuple(sorted(set(regular) | set(scene_indices(scores, threshold)))), scores, mode)
    if mode == "motion":
        if int(min_spacing) < 1:
            raise InvalidInputError(f"min_spacing must be >= 1 frame, got {min_spacing}")
        magnitudes = motion_magnitudes(frames, analysis_side)
        return KeyframeSelection(motion_peak_indices(magnitudes, int(min_spacing)), magnitudes, mode)
    raise InvalidInputError(f"unknown keyframe mode {mode!r}: use one of {', '.join(MODES)}")


def check_indices(indices: Sequence[int], count: int) -> tuple[int, ...]:
    """`indices` as a tuple after checking they are integers, strictly increasing and in [0, count).
    `InvalidInputError` for none, non-integers, unsorted or repeated indices, or indices outside the
    frames."""
    values = list(indices)
    if not values:
        raise InvalidInputError("no keyframe indices")
    if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in values):
        raise InvalidInputError(f"keyframe indices must be integers, got {values[:8]}")
    values = [int(v) for v in values]
    bad = [v for v in values if not 0 <= v < count]
    if bad:
        raise InvalidInputError(f"keyframe indices {bad[:8]} are outside the {count} frames [0, {count - 1}]")
    if any(b <= a for a, b in zip(values[:-1], values[1:], strict=True)):
        raise InvalidInputError(f"keyframe indices must be sorted and unique, got {values[:16]}")
    return tuple(values)


def gather_keyframes(frames, indices: Sequence[int]):
    """The keyframes as a batch `[K, H, W, C]` of the input's type (torch `index_select`, numpy `take`)."""
    index = check_indices(indices, frame_count(frames))
    if hasattr(frames, "index_select"):
        import torch

        return frames.index_select(0, torch.tensor(index, dtype=torch.long, device=frames.device))
    return np.take(frames, index, axis=0)


def format_indices(indices: Sequence[int]) -> str:
    """Indices as the JSON list text the ComfyUI nodes pass between them, e.g. ``"[0, 5, 9]"``."""
    return json.dumps([int(i) for i in indices])


def parse_indices(text: str) -> list[int]:
    """The inverse of `format_indices`; also takes comma-separated integers (``"0, 5, 9"``).
    `InvalidInputError` for text that is neither."""
    source = str(text).strip()
    try:
        values = json.loads(source if source.startswith("[") else f"[{source}]")
    except json.JSONDecodeError:
        raise InvalidInputError(f"keyframe indices must be a JSON list of integers, got {source[:80]!r}") from None
    if not isinstance(values, list):
        raise InvalidInputError(f"keyframe indices must be a list of integers, got {source[:80]!r}")
    return values


__all__ = ["MODES", "KeyframeSelection", "check_indices", "every_n_indices", "format_indices", "frame_count",
           "frame_float", "gather_keyframes", "parse_indices", "scene_scores", "select_keyframes"]
