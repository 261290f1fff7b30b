"""Receptive field of an upscale model, in input pixels: derived from its layers, or measured with a probe.

`derive_field(module, ...)` runs the module once on a small zero input with forward hooks on every leaf module and
adds up, over every convolution, how far its output reaches into its input (``max(padding, dilation * (k - 1) -
padding)`` pixels of *its* input), converted to model-input pixels by the scale at that layer (a convolution after a
2x upsampling reaches half as far in input pixels; after a pixel-unshuffle by 2, twice as far). The sum over all
convolutions bounds the longest path from input to output from above, whatever the skips, residuals and dense
connections: each path passes through each convolution at most once. Pointwise layers (activations, dropout,
identity), pixel shuffles and nearest upsampling add no reach beyond one aligned step, which is added once per
scale change as margin. A leaf module of any other kind (linear layers in attention, normalisation over space,
pooling) makes the derivation refuse (returns None): such a model is not treated as convolutional.

`measure_field(call, scale, ...)` is the fallback for modules the derivation cannot read: it changes one input pixel
of a random image and finds how far from it the output changed (exactly: any change), growing the image until the
change stays inside. It bounds the field from below (a dead ReLU path hides reach), so `auto_overlap` adds margin.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

POINTWISE = (nn.ReLU, nn.LeakyReLU, nn.PReLU, nn.ReLU6, nn.SiLU, nn.GELU, nn.Sigmoid, nn.Tanh, nn.ELU, nn.Mish,
             nn.Hardswish, nn.Hardsigmoid, nn.Softplus, nn.Identity, nn.Dropout, nn.Dropout2d)
"""Leaf layers that act on each pixel alone (reach 0)."""
RESAMPLING = (nn.PixelShuffle, nn.PixelUnshuffle, nn.Upsample)
"""Leaf layers that change the scale; reach: nearest upsampling 0, a pixel (un)shuffle less than one aligned step."""


@dataclass(frozen=True)
class FieldInfo:
    """What the derivation found: `radius` in input pixels (None: not derivable), `alignment` (input pixels a shift
    must be a multiple of for the model to be translation-equivariant), `convolutional` (every leaf layer is a
    convolution, pointwise or resampling), `unknown` (the leaf layer kinds that stopped the derivation)."""

    radius: int | None
    alignment: int
    convolutional: bool
    unknown: tuple[str, ...] = ()


def _conv_reach(module: nn.Conv2d) -> float:
    """Input pixels (of the conv's own input) its output reaches, the larger of the two sides, max over axes."""
    reach = 0.0
    padding = module.padding
    for axis in range(2):
        k, d = module.kernel_size[axis], module.dilation[axis]
        if isinstance(padding, str):
            pad = 0 if padding == "valid" else d * (k - 1) // 2  # 'same': centred
        else:
            pad = padding[axis]
        reach = max(reach, pad, d * (k - 1) - pad)
    return reach


def derive_field(module: nn.Module, *, channels: int = 3, probe_size: int = 32,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> FieldInfo:
    """Derive the receptive field of `module` from its leaf layers (see the module doc). `probe_size` is
    the side of the zero input used to read each layer's scale; it should be a multiple of the model's size
    requirement. Returns the `FieldInfo` (radius None when a layer's field is not known)."""
    if device is None or dtype is None:
        first = next(module.parameters(), None)
        device = device or (first.device if first is not None else "cpu")
        dtype = dtype or (first.dtype if first is not None else torch.float32)
    records: list[tuple[nn.Module, int, int]] = []
    unknown: set[str] = set()
    hooks = []

    def hook(layer, inputs, output):
        if inputs and isinstance(inputs[0], torch.Tensor) and inputs[0].dim() == 4 and isinstance(output, torch.Tensor):
            records.append((layer, inputs[0].shape[-2], output.shape[-2]))

    for layer in module.modules():
        if any(True for _ in layer.children()):
            continue
        if isinstance(layer, (nn.Conv2d, *POINTWISE, *RESAMPLING)):
            hooks.append(layer.register_forward_hook(hook))
        else:
            unknown.add(type(layer).__name__)
    try:
        with torch.inference_mode():
            module(torch.zeros(1, channels, probe_size, probe_size, device=device, dtype=dtype))
    finally:
        for handle in hooks:
            handle.remove()
    scales = [size_in / probe_size for _, size_in, _ in records] + [size_out / probe_size
                                                                    for _, _, size_out in records]
    smallest = min(scales, default=1.0)
    alignment = max(1, round(1 / smallest)) if smallest < 1 else 1
    if unknown:
        return FieldInfo(None, alignment, False, tuple(sorted(unknown)))
    radius = 0.0
    scale_changes = 0
    for layer, size_in, size_out in records:
        scale_in = size_in / probe_size
        if isinstance(layer, nn.Conv2d):
            radius += _conv_reach(layer) / scale_in
            if layer.stride != (1, 1):
                scale_changes += 1
        elif isinstance(layer, nn.Upsample) and layer.mode not in ("nearest", "nearest-exact"):
            radius += 1 / scale_in
            scale_changes += 1
        elif size_in != size_out:
            scale_changes += 1
    radius += scale_changes * alignment
    return FieldInfo(math.ceil(radius - 1e-9), alignment, True)


def measure_field(call: Callable[[torch.Tensor], torch.Tensor], scale: int, *, channels: int = 3,
                  alignment: int = 1, start: int = 32, limit: int = 512, device: torch.device | str = "cpu",
                  dtype: torch.dtype = torch.float32, seed: int = 0) -> int:
    """The farthest input distance (Chebyshev, input pixels, rounded up) at which changing one input pixel changed
    any output value, on a random image grown from `start` px until the change stays away from the edges (at most
    `limit` px; at the limit the result is ``limit // 2``)."""
    generator = torch.Generator().manual_seed(seed)
    size = round_to(start, 2 * alignment)
    while True:
        image = torch.rand(1, channels, size, size, generator=generator)
        centre = size // 2 // alignment * alignment
        bumped = image.clone()
        bumped[..., centre, centre] = (bumped[..., centre, centre] + 0.5) % 1.0
        with torch.inference_mode():
            base = call(image.to(device, dtype)).float().cpu()
            moved = call(bumped.to(device, dtype)).float().cpu()
        changed = (base != moved).flatten(0, 1).any(0).nonzero()
        if changed.numel() == 0:
            return 0
        lo, hi = centre * scale, centre * scale + scale - 1
        reach = max(int((lo - changed).max()), int((changed - hi).max()), 0)
        radius = math.ceil(reach / scale)
        touches = bool((changed == 0).any() or (changed == size * scale - 1).any())
        if not touches or size >= limit:
            return radius if not touches else max(radius, limit // 2)
        size = min(limit, size * 2)


def round_to(value: int, multiple: int) -> int:
    return max(multiple, -(-int(value) // multiple) * multiple)


def auto_overlap(measured: int, alignment: int = 1) -> int:
    """Overlap for a measured (lower-bound) radius: 25% + 2 px margin, rounded up to `alignment`."""
    return round_to(math.ceil(measured * 1.25) + 2, alignment)


__all__ = ["FieldInfo", "auto_overlap", "derive_field", "measure_field"]
