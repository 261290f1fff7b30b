"""Hot host-side paths: fused frame packing, GGUF dequantisation and a host arena.

Two backends compute the same bytes:

- ``"c"``: ``h3_core.c`` compiled to a shared library by the package build (or on demand with
  ``python -m h3director.native.build``), called through ctypes;
- ``"numpy"``: a pure numpy fallback, used when the library is missing or has another ABI version
  (one log line says so), or when the environment sets ``H3_NATIVE=numpy``.

``backend()`` names the active one; every public function takes ``backend=`` to force one
(``implementation(name)`` returns the module behind a name). Bad arguments raise
`h3director.errors.InvalidInputError` (a ValueError) or TypeError before any work starts.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from h3director.native import _common
from h3director.native._arena import Arena, ArenaFullError, ArenaStats, Lease
from h3director.native._loader import BACKEND_ENV, implementation


def describe() -> str:
    """One line for `h3director doctor`: the active backend and, for C, the library's path."""
    if os.environ.get(BACKEND_ENV, "").strip().lower() == "numpy":
        return f"numpy (forced by {BACKEND_ENV}=numpy)"
    from h3director.native import _loader

    return _loader.describe()


def backend() -> str:
    """The active backend: "c" when the shared library loaded with the right ABI, else "numpy"."""
    return implementation().NAME


def pack_frames(
    x: Any,
    *,
    layout: str = "CFHW",
    mean: Any = None,
    std: Any = None,
    threads: int = 1,
    out: Any = None,
    backend: str | None = None,
) -> Any:
    """Decoded video -> uint8 frames ``[F, H, W, C]`` in one pass.

    `x`: numpy array or torch tensor (float32, float16 or bfloat16; any strides; a non-CPU tensor is
    first copied to the CPU), laid out ``"CFHW"`` or ``"FCHW"``. `mean`/`std`: per-channel
    (or scalar) affine mapping decoder output to [0, 1]; both None means the ``(x + 1) / 2``
    convention. The bytes equal the PyTorch reference

        ((x.float() * std + mean).clamp(0, 1) * 255).round().to(torch.uint8)    # then permuted

    with `mean`/`std` as float32, multiply then add (no fused multiply-add), and round half to even
    (mean = std = 0.5 gives the same bytes as ``(x + 1) / 2``). NaN maps to 0: the clamp keeps NaN
    and PyTorch's float -> uint8 cast turns it into 0 on x86-64 CPU builds (the tests check this
    against torch; C leaves that cast undefined, so h3_core maps NaN to 0 explicitly). +inf maps to
    255, -inf to 0. `threads` > 1 splits the frames across threads (C backend).
    Returns a new numpy uint8 array, or `out` (a C-contiguous numpy array or CPU torch tensor of
    uint8 and shape ``[F, H, W, C]``) filled in place.
    """
    impl = implementation(backend)
    inp = _common.frame_input(x, layout)
    threads = _common.check_threads(threads)
    mean_v, std_v = _common.affine(mean, std, inp.channels)
    shape = (inp.frames, inp.height, inp.width, inp.channels)
    if out is None:
        result = target = np.empty(shape, dtype=np.uint8)
    else:
        _common.check_out(out, shape, "uint8", "pack_frames")
        result, target = out, out if isinstance(out, np.ndarray) else out.numpy()
    impl.pack_frames(inp, mean_v, std_v, target, threads)
    return result


def dequantize(
    data: np.ndarray,
    qtype: Any,
    dtype: Any = np.float32,
    *,
    out: Any = None,
    threads: int = 1,
    backend: str | None = None,
) -> Any:
    """Dequantise GGML blocks like ``gguf.quants.dequantize(data, qtype)``, bit for bit.

    `data`: uint8 array whose last axis holds whole blocks of `qtype` (a ``gguf.GGMLQuantizationType``,
    its name such as "Q4_K", or its integer value; Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K).
    The result has the same leading axes and ``blocks * values_per_block`` values on the last one.
    `dtype`: float32 (the reference values), float16 (those values rounded as numpy's
    ``astype(np.float16)`` does) or bfloat16 (rounded as torch's ``.to(torch.bfloat16)``: nearest,
    ties to even, every NaN -> 0xFFFF as its vectorised CPU cast writes). Float32 and float16 results
    are numpy arrays; bfloat16 results are torch tensors (numpy has no bfloat16). `out`: a caller buffer (numpy array, or CPU torch tensor,
    C-contiguous, of the result shape and dtype; a numpy uint16 array takes bfloat16 bits) to fill
    instead, e.g. an arena lease view.
    """
    impl = implementation(backend)
    qt = _common.quant_type(qtype)
    blocks, shape = _common.check_quantized(data, qt)
    name = _common.dtype_name(dtype)
    threads = _common.check_threads(threads)
    if out is None:
        if name == "bfloat16":
            import torch

            result = torch.empty(shape, dtype=torch.bfloat16)
        else:
            result = np.empty(shape, dtype=name)
    else:
        _common.check_out(out, shape, name, "dequantize")
        result = out
    if isinstance(result, np.ndarray):
        flat = result.reshape(-1)
    else:
        import torch

        flat = (result.view(torch.int16) if name == "bfloat16" else result).numpy().reshape(-1)
    if name == "bfloat16":
        flat = flat.view(np.uint16)  # the backends write bfloat16 as its 16 bits
    impl.dequantize(blocks, qt, flat, name, threads)
    return result


__all__ = ["Arena", "ArenaFullError", "ArenaStats", "Lease", "backend", "dequantize", "describe",
           "implementation", "pack_frames"]
