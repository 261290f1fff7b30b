"""Frame resizing for the upscale recipe (pre-resize before the model, post-resize after it), with Pillow.

`resize_frame(frame, (height, width), "lanczos")` resizes one float32 frame ``[3, H, W]`` in [0, 1]: each channel
goes through Pillow's resampler as a 32-bit float image (mode "F": a separable convolution with double-precision
coefficients, stored as float32, no quantisation to 8 bits) and the result is clamped back to [0, 1] (Lanczos
rings past the range at sharp edges). Filters: "lanczos" (Lanczos, a = 3), "area" (Pillow's box filter: each output
pixel is the area-weighted mean of the input pixels it covers) and "bicubic".

Exactness: deterministic. Pillow's resampling is single-threaded plain C with fixed coefficients, so the same frame,
size and filter give the same bytes on every run (checked in tests/test_upscale_recipe.py); a resize changes the
picture by design, so it is not "exact" against anything. Pillow's version is part of the report.

`parse_size("1920x1080")` and `check_filter(name)` are the refusals the command and the node use before any frame
is read: a size that is not ``WxH`` with positive, even numbers (H.264's 4:2:0 needs even sides), an unknown filter.
"""

from __future__ import annotations

import numpy as np
import torch

from h3director.errors import InvalidInputError

FILTERS = ("lanczos", "area", "bicubic")
"""Resampling filters by name (Pillow's LANCZOS, BOX, BICUBIC)."""
INSTALL_HINT = "resizing frames needs Pillow: pip install 'h3director[upscale]' (or pip install pillow)"


def parse_size(text: str, what: str) -> tuple[int, int]:
    """``(height, width)`` from ``"WxH"`` (width first, as video sizes are written), for the option named `what`.

    Raises `InvalidInputError` unless both are positive even integers."""
    parts = str(text).strip().lower().split("x")
    try:
        width, height = (int(part) for part in parts) if len(parts) == 2 else (None, None)
    except ValueError:
        width = height = None
    if width is None or height is None:
        raise InvalidInputError(f"{what} must be WIDTHxHEIGHT in pixels (e.g. 1920x1080), got {text!r}")
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise InvalidInputError(f"{what} {width}x{height}: width and height must be positive and even "
                                "(4:2:0 video needs even sides)")
    return height, width


def check_filter(name: str, what: str) -> str:
    """`name` lower-cased when it is one of `FILTERS`; else `InvalidInputError` naming the choices."""
    value = str(name).strip().lower()
    if value not in FILTERS:
        raise InvalidInputError(f"{what} {name!r} is not a resampling filter; use one of {', '.join(FILTERS)}")
    return value


def import_pil():
    """Pillow's `Image` module, or an `InvalidInputError` that says how to install it."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise InvalidInputError(f"{INSTALL_HINT} ({exc})") from None
    return Image


def pillow_version() -> str:
    """The installed Pillow's version string (Pillow does the resampling; raises ImportError without it)."""
    import PIL

    return PIL.__version__


def resize_frame(frame: torch.Tensor, size: tuple[int, int], resample: str) -> torch.Tensor:
    """`frame` float32 ``[3, H, W]`` (CPU, values in [0, 1]) resized to `size` ``(height, width)`` with the filter
    `resample` (one of `FILTERS`): float32 ``[3, height, width]`` clamped to [0, 1]. Same size: a copy."""
    image_module = import_pil()
    method = {"lanczos": image_module.Resampling.LANCZOS, "area": image_module.Resampling.BOX,
              "bicubic": image_module.Resampling.BICUBIC}[check_filter(resample, "resample")]
    height, width = size
    planes = frame.detach().to("cpu", torch.float32).numpy()
    out = np.empty((planes.shape[0], height, width), np.float32)
    for channel, plane in enumerate(planes):
        image = image_module.fromarray(np.ascontiguousarray(plane))  # float32 2-D: mode "F"
        out[channel] = np.asarray(image.resize((width, height), method), dtype=np.float32)
    return torch.from_numpy(out).clamp_(0, 1)


__all__ = ["FILTERS", "check_filter", "parse_size", "pillow_version", "resize_frame"]
