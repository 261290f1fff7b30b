"""How the DiT's linear layers run in each planner weight format: the planner's view of the quantised tiers.

A planner format (`plan.formats.FORMATS` id) loads, in a target (`plan.capabilities.TARGETS`), as layers of one
layout (`LAYOUTS`, keys of `h3director.dit.quantised.LAYOUTS` and `plan.quantised_bytes.CALLS`):

- ComfyUI: int8 and int8_convrot are comfy_quant ``int8_tensorwise`` layers (without / with the Hadamard
  rotation), nvfp4 comfy_quant ``nvfp4`` layers, fp8_scaled comfy_quant ``float8_e4m3fn`` layers (scaled fp8
  files); fp8 is ``UNETLoader``'s ``weight_dtype fp8_e4m3fn`` on a float file (a one-byte float weight cast to
  the compute dtype: `CAST`); GGUF types are this pack's GGUF layers;
- diffusers: fp8 is layerwise casting (`CAST`, made per call); GGUF types are diffusers' GGUF layers
  dequantised per call (`h3director.integrations.diffusers_gguf`); no int8 or nvfp4 loader;
- bf16 / fp32 / fp16 layers are not quantised (None).

The kernel path (`plan.quantised_bytes.NATIVE` / `EMULATED`) is ComfyUI's choice at load
(`comfy.ops.pick_operations`): int8 layouts always run their own kernel; nvfp4 and fp8_scaled only on CUDA
devices from the compute capability in `NATIVE_FROM`, else they dequantise their weight per call. A budget
without a known capability (a given ``--vram``) is priced on the path that costs more, and the plan says so.

Which tiers act on the layers: every layout the planner names chunks its rows and slices its weight rows
(`h3director.dit.quantised.decide`, which decides per loaded layer; a test checks the two agree), except rows
whose call scales its input from the whole input (`LinearCall.dynamic_tensor_scale`, NVFP4's kernel without
``input_scale``). A file's per-layer input scales cannot be known from a format name, so NVFP4 is planned
without: its FFN runs whole, and the planner offers no FFN chunks for it (`tiers_for`). H3's heads are 128
rows each, NVFP4's weight tile, so every head split slices whole tiles. The DiT Memory node reads the loaded
layers and reports what runs (`h3director.integrations.comfy_quant.block_decisions`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from h3director.plan.quantised_bytes import CAST, EMULATED, GGUF, NATIVE, BlockLinears, LinearCall, call_for

NATIVE_FROM = {"TensorCoreNVFP4Layout": (10, 0), "TensorCoreFP8E4M3Layout": (8, 9)}
"""The CUDA compute capability from which ComfyUI runs a layout through its own kernel
(`comfy.model_management.supports_nvfp4_compute` / `supports_fp8_compute`); below it, or off CUDA, the layer
dequantises its weight per call."""

_GGUF_FORMATS = ("q8_0", "q6_k", "q5_k", "q4_k", "q4_k_m")
LAYOUTS: dict[str, dict[str, str]] = {
    "comfyui": {"int8": "TensorWiseINT8Layout", "int8_convrot": "TensorWiseINT8Layout+convrot",
                "nvfp4": "TensorCoreNVFP4Layout", "fp8_scaled": "TensorCoreFP8E4M3Layout", "fp8": CAST,
                **dict.fromkeys(_GGUF_FORMATS, GGUF)},
    "diffusers": {"fp8": CAST, **dict.fromkeys(_GGUF_FORMATS, GGUF)},
}
"""target -> planner format -> the layout its DiT linears load as (formats not listed: unquantised)."""


@dataclass(frozen=True)
class FormatTiers:
    """How one format's DiT linears run in one target on one kernel path.

    `layout`: the `LAYOUTS` value (None: unquantised); `path`: NATIVE / EMULATED; `ffn_chunks`: FFN chunks act
    on the layers (head groups slice qkv's weight rows in every planned layout); `kept`: why a layer is kept
    whole (one line each); `call`: what one call makes (`plan.quantised_bytes.LinearCall`, None when
    unquantised)."""

    fmt: str
    target: str
    layout: str | None
    path: str
    ffn_chunks: bool = True
    kept: tuple[str, ...] = ()
    call: LinearCall | None = None

    def block_linears(self, device: str) -> BlockLinears | None:
        """The `BlockLinears` the ledger prices for a block run on `device` ("cuda", "mps" or "cpu")."""
        if self.call is None:
            return None
        return BlockLinears(qkv=self.call, fc1=self.call, fc2=self.call, ffn_chunked=self.ffn_chunks, device=device)


def kernel_paths(fmt: str, target: str, device: str, compute_capability: tuple[int, int] | None) -> tuple[str, ...]:
    """The kernel paths `fmt`'s layers may run on: one when the device decides it, both (native first) for a
    CUDA budget whose compute capability is not known."""
    layout = LAYOUTS[target].get(fmt)
    if layout in (None, CAST, GGUF):
        return (EMULATED,)
    if layout not in NATIVE_FROM:
        return (NATIVE,)                                # the int8 layouts: ComfyUI always runs their kernel
    if device != "cuda":
        return (EMULATED,)
    if compute_capability is None:
        return (NATIVE, EMULATED)
    return (NATIVE,) if tuple(compute_capability) >= NATIVE_FROM[layout] else (EMULATED,)


@functools.lru_cache(maxsize=64)
def format_tiers(fmt: str, target: str, path: str, e: int = 2) -> FormatTiers:
    """`FormatTiers` of planner format `fmt` in `target` on kernel `path`, computing in an `e`-byte dtype."""
    layout = LAYOUTS[target].get(fmt)
    if layout is None:
        return FormatTiers(fmt, target, None, path)
    call = call_for(layout, path, e)
    if layout in (CAST, GGUF):
        if target == "diffusers":                       # diffusers makes them per call, tiers or not
            call = dataclasses.replace(call, held_per_block=False)
        return FormatTiers(fmt, target, layout, path, call=call)
    if call.dynamic_tensor_scale:                       # planned without input_scale: rows are kept whole
        kept = (f"mlp.fc1 / mlp.fc2: kept whole ({layout}, {path}: without input_scale its activation scale comes "
                "from the whole input on each call; a file that stores input_scale chunks them, and the DiT Memory "
                "node says so)",)
        return FormatTiers(fmt, target, layout, path, ffn_chunks=False, kept=kept, call=call)
    return FormatTiers(fmt, target, layout, path, call=call)


def tiers_for(fmt: str, target: str) -> FormatTiers:
    """The tiers `fmt` offers in `target` on whichever kernel path it runs (a chunking acts on every path)."""
    paths = kernel_paths(fmt, target, "cuda", None)
    options = [format_tiers(fmt, target, path) for path in paths]
    return FormatTiers(fmt, target, options[0].layout, options[0].path, ffn_chunks=all(o.ffn_chunks for o in options),
                       kept=tuple(dict.fromkeys(line for o in options for line in o.kept)), call=options[0].call)


__all__ = ["LAYOUTS", "NATIVE_FROM", "FormatTiers", "format_tiers", "kernel_paths", "tiers_for"]
