"""The temporal cross-fade between consecutive decoded clips, bit-identical to the references.

diffusers' `AutoencoderKLMiniMaxH3._blend` and ComfyUI's `MiniMaxH3VideoVAE.blend` compute, for a
blend over `e = min(len(a), len(b), blend_extent)` positions p = 0..e-1 along `dim`:

    out[p] = a[len(a) - e + p] * (1 - p / e) + b[p] * (p / e)        for p < e
    out[p] = b[p]                                                     for p >= e

with `p` an `arange` in `b`'s dtype on `b`'s device, so the weights are rounded in that dtype. This
module performs the same float operations in the same order (weights first, then one multiply per
operand and one add), so its output equals the references' bit for bit on every device.
"""

from __future__ import annotations

import torch


def blend_extent(a: torch.Tensor, b: torch.Tensor, nominal: int, dim: int) -> int:
    """Positions actually blended: ``min(a.shape[dim], b.shape[dim], nominal)`` (the references' rule)."""
    return min(a.shape[dim], b.shape[dim], nominal)


def crossfade_parts(a: torch.Tensor, b: torch.Tensor, nominal_extent: int, dim: int) -> list[torch.Tensor]:
    """The cross-fade of `crossfade` as its parts along `dim`: the blended positions, then (when `b` is
    longer than the blend) the rest of `b` unchanged, as a view. Concatenated they are `crossfade`'s
    result; a caller can concatenate them into a buffer of its own (`torch.cat(..., out=)`)."""
    extent = blend_extent(a, b, nominal_extent, dim)
    positions = torch.arange(extent, device=b.device, dtype=b.dtype)
    shape = [1] * a.ndim
    shape[dim] = extent
    weight_a = (1 - positions / extent).view(shape)
    weight_b = (positions / extent).view(shape)
    blended = a.narrow(dim, a.shape[dim] - extent, extent) * weight_a + b.narrow(dim, 0, extent) * weight_b
    if extent == b.shape[dim]:
        return [blended]
    return [blended, b.narrow(dim, extent, b.shape[dim] - extent)]


def crossfade(a: torch.Tensor, b: torch.Tensor, nominal_extent: int, dim: int) -> torch.Tensor:
    """Fade from the end of `a` into the start of `b` along `dim`; returns a tensor shaped like `b`.

    `a` is the previous clip's tail, `b` the next clip's body. Only the blended positions are
    computed; the rest of `b` is concatenated unchanged (a new tensor, as the references return).
    """
    parts = crossfade_parts(a, b, nominal_extent, dim)
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=dim)


__all__ = ["crossfade", "crossfade_parts"]
