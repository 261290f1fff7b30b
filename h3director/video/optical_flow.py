"""Dense optical flow (OpenCV's Farneback) and the backward warp that uses it, for frame ops.

Conventions: a frame is a float32 array `[H, W, C]` with values in [0, 1] (ComfyUI's IMAGE layout);
a flow field is float32 `[H, W, 2]` in pixels, channel 0 = x (columns), channel 1 = y (rows).

`flow(source, target)` is the flow of `cv2.calcOpticalFlowFarneback(prev=source, next=target)`:
pixel (y, x) of `source` shows what pixel (y + flow[y, x, 1], x + flow[y, x, 0]) of `target` shows.
`warp(image, flow)` samples `image` at those positions (`cv2.remap`, Lanczos over 8x8 pixels, zero
outside; detail residuals are mostly high frequencies, which bilinear sampling at sub-pixel positions
would damp), so
``warp(target_image, flow(source, target))`` moves `target`'s content onto `source`'s pixel grid.
To bring something that lives on frame k's grid to frame t, compute ``flow(t, k)`` and warp by it.

OpenCV is the optional extra `flow` (opencv-python-headless), imported when first used.
"""

from __future__ import annotations

import numpy as np

from h3director.errors import InvalidInputError, missing_package

# Farneback parameters: a 4-level pyramid (scale 0.5) follows displacements of tens of pixels at the
# finest level; 15 px averaging windows, 3 iterations, 5 px polynomial neighbourhood (sigma 1.2).
FARNEBACK = {"pyr_scale": 0.5, "levels": 4, "winsize": 15, "iterations": 3, "poly_n": 5, "poly_sigma": 1.2,
             "flags": 0}


def opencv():
    """The `cv2` module, or a clear error naming the extra that provides it."""
    try:
        import cv2
    except ImportError as exc:
        raise InvalidInputError(missing_package("optical flow", "OpenCV (opencv-python-headless)", "flow")) from exc
    return cv2


def gray_u8(frame: np.ndarray) -> np.ndarray:
    """BT.601 luma of a float `[H, W, C]` frame in [0, 1] as uint8 `[H, W]` (Farneback's input);
    a one-channel frame is its own luma, a fourth (alpha) channel is ignored."""
    luma = frame[..., 0] if frame.shape[-1] < 3 else frame[..., :3] @ np.float32([0.299, 0.587, 0.114])
    return np.clip(np.rint(luma * 255.0), 0, 255).astype(np.uint8)


def flow(source_gray: np.ndarray, target_gray: np.ndarray) -> np.ndarray:
    """Farneback flow from `source_gray` to `target_gray` (uint8 `[H, W]`): float32 `[H, W, 2]` pixels."""
    cv2 = opencv()
    return cv2.calcOpticalFlowFarneback(source_gray, target_gray, None, **FARNEBACK)


def resize_flow(field: np.ndarray, height: int, width: int) -> np.ndarray:
    """A flow field measured on one grid, resampled (bilinear) to a `height` x `width` grid with its
    vectors scaled by the same factors, so it is in the new grid's pixels."""
    if field.shape[:2] == (height, width):
        return field
    cv2 = opencv()
    scaled = cv2.resize(field, (width, height), interpolation=cv2.INTER_LINEAR)
    scaled[..., 0] *= width / field.shape[1]
    scaled[..., 1] *= height / field.shape[0]
    return scaled


def warp(image: np.ndarray, field: np.ndarray) -> np.ndarray:
    """``out[y, x] = image[y + field[y, x, 1], x + field[y, x, 0]]`` (Lanczos; 0 where that falls outside).

    `image` is float32 `[H, W, C]` and `field` float32 `[H, W, 2]` on the same grid."""
    cv2 = opencv()
    height, width = field.shape[:2]
    grid_x, grid_y = np.meshgrid(np.arange(width, dtype=np.float32), np.arange(height, dtype=np.float32))
    warped = cv2.remap(image, grid_x + field[..., 0], grid_y + field[..., 1], interpolation=cv2.INTER_LANCZOS4,
                       borderMode=cv2.BORDER_CONSTANT, borderValue=0)
    return warped.reshape(image.shape)


def mean_magnitude(field: np.ndarray) -> float:
    """Mean length of the flow vectors, in pixels."""
    return float(np.mean(np.hypot(field[..., 0], field[..., 1])))


__all__ = ["flow", "gray_u8", "mean_magnitude", "opencv", "resize_flow", "warp"]
