"""Tile geometry for tiled upscaling: cores that tile the frame, each fed to the model with `overlap` of context.

All coordinates are input pixels, half-open ``[start, stop)``. A frame of ``height x width`` is cut into a grid of
*cores* that cover it exactly once; each core is fed to the model inside its *region*, the core grown by `overlap`
on every side and clipped to the frame. A convolutional model's output at a pixel depends only on input pixels within
its receptive-field radius, so when ``overlap >= radius`` the core's part of the region's output equals the same
pixels of the untiled output (up to float rounding from a different grouping of the same sums): pasting only the
cores gives the untiled frame. Regions are at most `tile` pixels on a side.

`alignment` keeps core boundaries (and so region origins, since `overlap` is rounded up to it) on multiples of the
model's size requirement (e.g. 2 for a model that pixel-unshuffles its input by 2): such models are
translation-equivariant only for shifts by whole multiples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from h3director.errors import InvalidInputError


@dataclass(frozen=True)
class Tile:
    """One tile, in input pixels: the `region` fed to the model and the `core` whose output it owns.

    Invariant: ``region`` contains ``core``; the cores of a plan cover the frame exactly once.
    Boxes are ``(top, bottom, left, right)``, half-open.
    """

    region: tuple[int, int, int, int]
    core: tuple[int, int, int, int]

    @property
    def region_size(self) -> tuple[int, int]:
        """``(height, width)`` of the region in input pixels."""
        top, bottom, left, right = self.region
        return bottom - top, right - left

    @property
    def core_size(self) -> tuple[int, int]:
        top, bottom, left, right = self.core
        return bottom - top, right - left


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of `multiple` that is >= `value`."""
    return -(-int(value) // multiple) * multiple


def check_tiling(tile: int, overlap: int, alignment: int = 1) -> int:
    """The core size (input pixels, a multiple of `alignment`) that `tile` leaves after `overlap` on both sides.

    Raises `InvalidInputError` when the tile is not larger than twice the overlap plus one aligned step.
    """
    if tile < 1 or overlap < 0 or alignment < 1:
        raise InvalidInputError(f"tile must be >= 1, overlap >= 0 and alignment >= 1; got tile={tile}, "
                                f"overlap={overlap}, alignment={alignment}")
    core = (tile - 2 * overlap) // alignment * alignment
    if core < alignment:
        raise InvalidInputError(
            f"tile {tile} px must be larger than 2 x overlap ({2 * overlap} px) + {alignment}: each tile keeps only "
            f"its centre; use --tile {2 * overlap + max(alignment, 64)} or more, or a smaller overlap "
            "(a smaller overlap than the receptive field is not exact)")
    return core


def _cuts(length: int, core: int, alignment: int) -> list[int]:
    """Boundaries ``0 = c0 < c1 < ... = length`` of cores at most `core` long, on multiples of `alignment`.

    Cut in whole aligned steps (the last, partial step counts as one): `count` cores of about equal numbers of steps,
    none more than ``core // alignment`` steps."""
    steps, per_core = math.ceil(length / alignment), core // alignment
    count = max(1, math.ceil(steps / per_core))
    cuts = [(2 * index * steps + count) // (2 * count) * alignment for index in range(count)]  # round half up
    return cuts + [length]


def _axis(length: int, core: int, overlap: int, alignment: int, tile: int) -> list[tuple[int, int, int, int]]:
    """``(region_start, region_stop, core_start, core_stop)`` along one axis."""
    if length <= tile:
        return [(0, length, 0, length)]
    cuts = _cuts(length, core, alignment)
    return [(max(0, a - overlap), min(length, b + overlap), a, b) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def plan_tiles(height: int, width: int, tile: int, overlap: int, alignment: int = 1) -> list[Tile]:
    """Row-major tiles covering a ``height x width`` frame, each region at most ``tile`` px on a side
    (a frame that fits one tile is one tile, whatever the overlap: it needs no context from a neighbour)."""
    if height <= tile and width <= tile:
        return [Tile((0, height, 0, width), (0, height, 0, width))]
    core = check_tiling(tile, overlap, alignment)
    rows = _axis(height, core, overlap, alignment, tile)
    cols = _axis(width, core, overlap, alignment, tile)
    return [Tile((r0, r1, c0, c1), (a0, a1, b0, b1)) for r0, r1, a0, a1 in rows for c0, c1, b0, b1 in cols]


def _halve(start: int, stop: int, alignment: int) -> list[tuple[int, int]]:
    mid = (start + stop) // 2 // alignment * alignment
    if mid <= start or mid >= stop:
        return [(start, stop)]
    return [(start, mid), (mid, stop)]


def split_tile(tile: Tile, height: int, width: int, overlap: int, alignment: int = 1) -> list[Tile]:
    """`tile` with its core halved along each side that can be halved (up to 4 tiles, each with the same
    `overlap` of context); an empty list when the core cannot be split further."""
    top, bottom, left, right = tile.core
    rows, cols = _halve(top, bottom, alignment), _halve(left, right, alignment)
    if len(rows) == 1 and len(cols) == 1:
        return []
    return [Tile((max(0, a - overlap), min(height, b + overlap), max(0, c - overlap), min(width, d + overlap)),
                 (a, b, c, d)) for a, b in rows for c, d in cols]


def feather_weights(tile: Tile, height: int, width: int, overlap: int, scale: int) -> torch.Tensor:
    """Blend weights ``[h * scale, w * scale]`` (float32) of `tile`'s region output for the feathered path.

    On each side that borders another tile the weight rises linearly over ``2 * overlap * scale`` output pixels
    (the band two neighbouring regions share), so two neighbours' weights sum to 1 there; frame edges get 1.
    """
    r0, r1, c0, c1 = tile.region
    a0, a1, b0, b1 = tile.core

    def ramp(start: int, stop: int, core_start: int, core_stop: int, length: int) -> torch.Tensor:
        n = (stop - start) * scale
        positions = torch.arange(n, dtype=torch.float32) + 0.5
        weight = torch.ones(n)
        band = 2 * overlap * scale
        if band and core_start > 0:
            weight = torch.minimum(weight, positions / band)
        if band and core_stop < length:
            weight = torch.minimum(weight, (n - positions) / band)
        return weight.clamp_(min=1e-6)

    return ramp(r0, r1, a0, a1, height)[:, None] * ramp(c0, c1, b0, b1, width)[None, :]


__all__ = ["Tile", "feather_weights", "plan_tiles", "round_up", "split_tile"]
