"""Bytes a quantised linear layer's own call allocates beyond its output: the ledger's view of the quantised
DiT tiers (`h3director.dit.quantised` decides which layouts chunk; this prices what each call makes).

`CALLS[(layout, path)]` (layout names as ComfyUI's comfy_kitchen spells them, path "native" = the layout's
kernel, "emulated" = a dequantised weight and a float GEMM) gives a `LinearCall`:

- `input_copy`: bytes per input element of the quantised activations (int8 / fp8: 1, fp4: 0.5 plus the block
  scales), made per call;
- `input_float_copy`: the kernel first makes a float copy of its input (a Hadamard rotation, comfy_kitchen's
  eager SwiGLU-in-quantiser), one element size per element;
- `cpu_accumulator`: comfy_kitchen's eager int8 GEMM (the CPU path) returns an int32 result, rescales it in
  float parts and concatenates them: 4 + one element size bytes per output element beyond the output. The
  CUDA kernels rescale in their epilogue (not priced);
- `weight_bytes`: the call materialises its weight, at this many bytes per weight element (emulated: the
  compute dtype's, i.e. the dequantised weight; asym_w4a8: its int4 groups expanded to int8);
- `dynamic_tensor_scale`: the call computes its input's per-tensor scale from the whole input when the layer
  stores no ``input_scale`` (NVFP4's kernel): its rows cannot be chunked then (`h3director.dit.quantised`);
- `held_per_block`: under the DiT tiers the dequantised (or cast) weight lives for the whole block half instead
  of one call: the tiers dequantise this project's GGUF layers, and cast a layer stored in another dtype
  (ComfyUI's fp8 `weight_dtype`), once per block half; the stock block makes it per call.

`BlockLinears` tells the ComfyUI block ledger (`plan.activations`) which calls a block makes and whether the
tiers chunk them (`qkv_sliced`: head groups slice qkv's weight rows; `ffn_chunked`: the FFN runs in row
chunks). Units: bytes; rows, k (input features) and n (output features) are counts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinearCall:
    """What one quantised linear call makes beyond its output (fields: see the module docstring)."""

    input_copy: float = 0.0
    input_float_copy: bool = False
    cpu_accumulator: bool = False
    weight_bytes: float = 0.0
    held_per_block: bool = False
    dynamic_tensor_scale: bool = False

    def extra_bytes(self, rows: int, k: int, n: int, e: int, device: str = "cuda", held: bool = False) -> int:
        """Bytes one call over `rows` input rows of `k` features to `n` outputs (element size `e`) holds at its
        peak beyond its output, on `device` ("cpu" prices comfy_kitchen's eager accumulator); the weight is not
        included when `held` (the block holds it: `held_per_block` under the tiers)."""
        total = rows * k * self.input_copy
        if self.input_float_copy:
            total += rows * k * e
        if self.cpu_accumulator and device == "cpu":
            total += rows * n * (4 + e)
        if not held:
            total += n * k * self.weight_bytes
        return int(total)


NATIVE = "native"
"""Kernel path: the layout's own kernel."""
EMULATED = "emulated"
"""Kernel path: the weight dequantised (or cast) to the compute dtype, then a float GEMM."""

_INT8 = LinearCall(input_copy=1, cpu_accumulator=True)
_ROTATED_INT8 = LinearCall(input_copy=1, input_float_copy=True, cpu_accumulator=True)
CALLS: dict[tuple[str, str], LinearCall] = {
    ("TensorWiseINT8Layout", NATIVE): _INT8,
    ("TensorWiseINT8Layout+convrot", NATIVE): _ROTATED_INT8,
    ("TensorCoreConvRotW4A4Layout", NATIVE): _ROTATED_INT8,
    ("AsymW4A8Int8Layout", NATIVE): LinearCall(input_copy=1, input_float_copy=True, cpu_accumulator=True,
                                                weight_bytes=1),
    ("TensorCoreFP8E4M3Layout", NATIVE): LinearCall(input_copy=1),
    ("TensorCoreFP8E5M2Layout", NATIVE): LinearCall(input_copy=1),
    ("TensorCoreNVFP4Layout", NATIVE): LinearCall(input_copy=0.5 + 1 / 16, dynamic_tensor_scale=True),
    ("TensorCoreMXFP8Layout", NATIVE): LinearCall(input_copy=1 + 1 / 32),
}


GGUF = "GGUF"
"""The layout key of this project's GGUF layers (dequantised to the compute dtype, then a float GEMM)."""
CAST = "cast"
"""The layout key of a layer stored in another float dtype than it computes in (fp8 `weight_dtype`): cast whole."""


def call_for(layout: str, path: str, e: int) -> LinearCall | None:
    """The `LinearCall` of `layout` on `path` with element size `e`; None when the layout is unknown.
    `GGUF` and `CAST` layers materialise their weight in the compute dtype (held per block half under the
    tiers in ComfyUI, `h3director.integrations.comfy_dit`)."""
    if layout in (GGUF, CAST):
        return LinearCall(weight_bytes=e, held_per_block=True)
    if path == EMULATED:
        return LinearCall(weight_bytes=e)
    return CALLS.get((layout, path))


@dataclass(frozen=True)
class BlockLinears:
    """The quantised linears of one DiT block as the tiers run them (None: unquantised, priced as before)."""

    qkv: LinearCall | None = None
    fc1: LinearCall | None = None
    fc2: LinearCall | None = None
    qkv_sliced: bool = True
    ffn_chunked: bool = True
    device: str = "cuda"


__all__ = ["CALLS", "CAST", "EMULATED", "GGUF", "NATIVE", "BlockLinears", "LinearCall", "call_for"]
