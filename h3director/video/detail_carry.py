"""Carry the detail of detailed keyframes to every frame, one frame at a time (approximate by nature).

Inputs: the original frames `[F, H, W, C]` (torch, numpy or a memory-mapped `.npy`; float in [0, 1] or
uint8), the detailed keyframes `[K, H', W', C]` and their K indices (sorted, unique, in range; see
`keyframes.check_indices`). Output frames are float32 `[H', W', C]` in [0, 1].

Rule, with O_t the original frame t resized to H' x W' (when the sizes differ) and
R_k = D_k - O_k the detail residual at keyframe k (D_k its detailed frame):
- at a keyframe, the output is D_k itself, bit for bit;
- between neighbouring keyframes a < t < b, with w = (t - a) / (b - a):
  ``out_t = clip(O_t + (1 - w) * M(R_a, t, a) + w * M(R_b, t, b), 0, 1)``;
- before the first keyframe (after the last) the first (last) keyframe's residual is held at full weight.
M(R_k, t, k) is R_k itself, or with `flow_warp` R_k moved along the motion onto frame t's grid:
``warp(R_k, flow(t, k))`` with the Farneback flow from the original frame t to the original frame k
(`optical_flow`: pixel x of frame t shows what x + flow[x] of frame k shows, and `cv2.remap` samples
R_k there; samples from outside frame k count as no detail). The flow is measured on the originals at
their own size and scaled to H' x W'.

Sizes: the keyframes may be larger or smaller than the originals (an upscaling detailer) when all
have the same size and it is the originals' at one scale for both sides (within rounding to whole
pixels or 2%, `check_aspect`); the originals are then resized to that size (OpenCV, bicubic when
enlarging, area when shrinking) before the residual is taken and added. Channels must match.

Memory: `carry_detail` yields frames in order and holds the two neighbouring keyframes' residuals and
gray images, one original frame and (with `flow_warp`) two flow fields; `merge_into` writes into one
preallocated output (the ComfyUI IMAGE) with the same working set. Every input check runs before the
first frame is produced.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from h3director.errors import InvalidInputError
from h3director.video import optical_flow
from h3director.video.keyframes import check_indices, frame_count, frame_float


@dataclass(frozen=True)
class CarryPlan:
    """Checked geometry of one merge: F frames of `source` size (H, W) out at `size` (H', W'), C channels."""

    count: int
    source: tuple[int, int]
    size: tuple[int, int]
    channels: int
    indices: tuple[int, ...]


def plan_carry(frames, detailed, indices: Sequence[int]) -> CarryPlan:
    """The `CarryPlan` (geometry) of merging `detailed` keyframes `[K, H', W', C]` at `indices` into
    `frames` `[F, H, W, C]`, once the three are checked against each other (see the module docstring);
    `InvalidInputError` naming the first mismatch."""
    count = frame_count(frames)
    shape = tuple(detailed.shape)
    if len(shape) != 4 or min(shape) < 1:
        raise InvalidInputError(f"detailed keyframes must be [K, H, W, C], got shape {list(shape)}")
    frame_count(detailed)
    index = check_indices(indices, count)
    if shape[0] != len(index):
        raise InvalidInputError(f"{shape[0]} detailed keyframes for {len(index)} keyframe indices; "
                                "the detailer must return one frame per keyframe, in order")
    if shape[-1] != frames.shape[-1]:
        raise InvalidInputError(f"detailed keyframes have {shape[-1]} channels, the frames {frames.shape[-1]}")
    check_aspect((int(frames.shape[1]), int(frames.shape[2])), (shape[1], shape[2]))
    return CarryPlan(count, (int(frames.shape[1]), int(frames.shape[2])), (shape[1], shape[2]), shape[-1], index)


ASPECT_TOLERANCE = 0.02
"""Largest relative difference between the vertical and horizontal scale of detailed keyframes vs the originals
(beyond rounding each side to whole pixels), e.g. a detailer that rounds sizes to multiples of 8."""


def check_aspect(source: tuple[int, int], size: tuple[int, int]) -> None:
    """Refuse keyframes `size` (H', W') that are not the originals `source` (H, W) at one scale for both sides: a
    detailer that crops or changes the aspect ratio cannot be merged by resizing the originals."""
    (height, width), (out_height, out_width) = source, size
    rounding = (height + width) / 2                          # |H' W - W' H| when each side is rounded to a pixel
    skew = abs(out_height * width - out_width * height)
    if skew > max(rounding, ASPECT_TOLERANCE * max(out_height * width, out_width * height)):
        raise InvalidInputError(
            f"detailed keyframes are {out_width}x{out_height}, the frames {width}x{height}: a different aspect ratio "
            f"(x {out_width / width:.3f} wide, x {out_height / height:.3f} high); the detailer must return whole "
            "frames at one scale (no crop)")


def carry_detail(frames, detailed, indices: Sequence[int], *, flow_warp: bool = False) -> Iterator[np.ndarray]:
    """Every output frame, in order, as float32 `[H', W', C]` (see the module docstring). The inputs are
    checked now; frames are computed as the iterator is consumed. A yielded array may be a view of
    `detailed` (at a keyframe): copy it to keep or change it."""
    plan = plan_carry(frames, detailed, indices)
    if flow_warp or plan.size != plan.source:
        optical_flow.opencv()
    return _Carrier(plan, frames, detailed, flow_warp).run()


def merge_into(out, frames, detailed, indices: Sequence[int], *, flow_warp: bool = False):
    """Write every output frame into `out` `[F, H', W', C]` (float32; numpy or a CPU torch tensor) and
    return it. Checked before the first write. `InvalidInputError` for inputs that do not fit each other
    (see `plan_carry`) or an `out` of another shape."""
    plan = plan_carry(frames, detailed, indices)
    expected = (plan.count, *plan.size, plan.channels)
    if tuple(out.shape) != expected:
        raise InvalidInputError(f"output must be {list(expected)}, got {list(out.shape)}")
    target = out.numpy() if hasattr(out, "numpy") else out
    for t, frame in enumerate(carry_detail(frames, detailed, plan.indices, flow_warp=flow_warp)):
        target[t] = frame
    return out


def output_shape(frames, detailed, indices: Sequence[int]) -> tuple[int, int, int, int]:
    """`[F, H', W', C]` of the merge's output, after the input checks."""
    plan = plan_carry(frames, detailed, indices)
    return (plan.count, *plan.size, plan.channels)


class _Carrier:
    """One pass over the frames; keeps the residuals of the (at most two) keyframes around frame t."""

    def __init__(self, plan: CarryPlan, frames, detailed, flow_warp: bool) -> None:
        self.plan, self.frames, self.detailed, self.flow_warp = plan, frames, detailed, flow_warp
        self.cache: dict[int, tuple[np.ndarray, np.ndarray]] = {}   # slot -> (residual, gray of the original)

    def original(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        """A new array holding frame t at the output size, and its gray image at the source size (for the flow)."""
        frame = frame_float(self.frames, t)
        gray = optical_flow.gray_u8(frame) if self.flow_warp else None
        if self.plan.size != self.plan.source:
            return _resize(frame, self.plan.size), gray
        return np.array(frame, dtype=np.float32, copy=True), gray

    def keyframe(self, slot: int) -> tuple[np.ndarray, np.ndarray]:
        """(residual R_k, gray of original k) of keyframe number `slot`, computed once while needed."""
        if slot not in self.cache:
            for old in [s for s in self.cache if s < slot - 1]:
                del self.cache[old]
            frame, gray = self.original(self.plan.indices[slot])
            self.cache[slot] = (frame_float(self.detailed, slot) - frame, gray)
        return self.cache[slot]

    def moved(self, slot: int, gray_t: np.ndarray | None) -> np.ndarray:
        residual, gray_k = self.keyframe(slot)
        if not self.flow_warp:
            return residual
        field = optical_flow.resize_flow(optical_flow.flow(gray_t, gray_k), *self.plan.size)
        return optical_flow.warp(residual, field)

    def run(self) -> Iterator[np.ndarray]:
        indices = self.plan.indices
        for t in range(self.plan.count):
            slot = bisect.bisect_left(indices, t)
            if slot < len(indices) and indices[slot] == t:
                yield frame_float(self.detailed, slot)
                continue
            frame, gray = self.original(t)
            if slot == 0 or slot == len(indices):
                frame += self.moved(min(slot, len(indices) - 1), gray)
            else:
                a, b = indices[slot - 1], indices[slot]
                w = np.float32((t - a) / (b - a))
                frame += (1 - w) * self.moved(slot - 1, gray)
                frame += w * self.moved(slot, gray)
            yield np.clip(frame, 0.0, 1.0, out=frame)


def _resize(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    cv2 = optical_flow.opencv()
    height, width = size
    enlarge = height * width > frame.shape[0] * frame.shape[1]
    out = cv2.resize(frame, (width, height), interpolation=cv2.INTER_CUBIC if enlarge else cv2.INTER_AREA)
    return out.reshape(height, width, frame.shape[-1])


__all__ = ["CarryPlan", "carry_detail", "merge_into", "output_shape", "plan_carry"]
