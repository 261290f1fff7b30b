"""ComfyUI's quantised linear layers (`comfy.ops.mixed_precision_ops` Linear with a `QuantizedTensor` weight)
run in row chunks and weight-row slices through the layout's own op.

The decisions (which layout chunks how, and how exact that is) are `h3director.dit.quantised`'s; this
module reads a ComfyUI layer (`layout_of`, `kernel_path`), and runs its arithmetic the way its forward
does (`QuantWeights`):

- the weight is cast once per block with the same `comfy.ops.cast_bias_weight` call the layer's forward
  makes (`want_requant` as it passes it), so offloading, LoRA `weight_function`s and Dynamic VRAM act as in
  the stock call, and released with `uncast_bias_weight`;
- "input_quant" (fp8 / nvfp4 / mxfp8 where the device computes them): the input is multiplied by
  `pre_quant_scale` and quantised with `QuantizedTensor.from_float(x, layout, scale=input_scale)` as the
  forward does, then `F.linear(qx, weight, bias)` dispatches to the layout's linear op;
- "weight_only" (int8_tensorwise, convrot_w4a4, asym_w4a8_int8: `quantize_input` False):
  `F.linear(x, weight, bias)` dispatches to the layout's linear op, which quantises the activations per row;
- "int8_act": fc2 of the FFN, which the stock block runs through `comfy.ops.linear_input_act` (the SwiGLU
  folded into the int8 kernel's quantiser): `comfy_kitchen.int8_linear` as that function calls it; on the
  CPU the SwiGLU is applied first per chunk with the stock call's thread cuts
  (`h3director.dit.blocks.swiglu_rows`), which is what the eager kernel computes over all rows;
- "dense" (a format the device cannot compute, `_full_precision_mm`, or a LoRA weight function): the
  cast hands back a dequantised weight, or a `QuantizedTensor` that `F.linear` hands to the layout op,
  which dequantises it on each call (a chunk's call, or a weight-row slice's: only those rows), as the
  stock call does: no dequantised weight outlives a call.

Weight rows (`slice_rows`): a `QuantizedTensor` of rows `start:stop` of the weight, sharing the storage
(per-tensor scales shared, per-row scales and block scales sliced); NVFP4 / MXFP8 block scales only in
whole 128-row tiles.

Units: rows are rows of a 2-D `[rows, features]` operand; bytes are bytes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from h3director.dit.quantised import EMULATED, NATIVE, ROWS, SWIZZLE_ROWS, WEIGHT_ROWS, decide
from h3director.errors import InvalidInputError

INT8 = "TensorWiseINT8Layout"
BLOCK_SCALED = ("TensorCoreNVFP4Layout", "TensorCoreMXFP8Layout")
PER_TENSOR_SCALE = ("TensorCoreFP8E4M3Layout", "TensorCoreFP8E5M2Layout", "TensorCoreFP8Layout", INT8,
                    "TensorCoreNVFP4Layout")


def _comfy():
    import comfy.model_management as mm
    import comfy.ops as ops
    import comfy.quant_ops as quant_ops

    return mm, ops, quant_ops


def is_quantised(layer) -> bool:
    """Whether `layer` is a ComfyUI quantised linear (a `QuantizedTensor` weight, a layout or a pre-quant scale)."""
    _, _, quant_ops = _comfy()
    return (isinstance(getattr(layer, "weight", None), quant_ops.QuantizedTensor)
            or getattr(layer, "layout_type", None) is not None
            or getattr(layer, "pre_quant_scale", None) is not None)


def layout_of(layer) -> str:
    """The layout name `h3director.dit.quantised.LAYOUTS` is keyed by: the weight's comfy_kitchen layout
    (TensorWise INT8 with a Hadamard rotation is "TensorWiseINT8Layout+convrot"), else the layer's
    `layout_type`, else "unknown"."""
    _, _, quant_ops = _comfy()
    weight = getattr(layer, "weight", None)
    if isinstance(weight, quant_ops.QuantizedTensor):
        name = weight._layout_cls
        if name == INT8 and getattr(weight._params, "convrot", False):
            return INT8 + "+convrot"
        if name == "TensorCoreFP8Layout":
            return "TensorCoreFP8E4M3Layout"   # ComfyUI's alias of the E4M3 layout
        return str(name)
    layout = getattr(layer, "layout_type", None)
    return str(layout) if layout is not None else "unknown"


def _functions(layer) -> bool:
    return bool(getattr(layer, "weight_function", None) or getattr(layer, "bias_function", None))


def kernel_mode(layer, for_act: bool = False) -> str:
    """How the layer's stock call computes ("input_quant", "weight_only", "int8_act" or "dense"), by the
    same tests `MixedPrecisionOps.Linear.forward` (and, for `for_act`, `comfy.ops.linear_input_act`) make."""
    mm, _, quant_ops = _comfy()
    weight = getattr(layer, "weight", None)
    quantised = isinstance(weight, quant_ops.QuantizedTensor)
    if (for_act and quantised and weight._layout_cls == INT8 and not getattr(weight._params, "transposed", False)
            and not mm.in_training and not _functions(layer)):
        return "int8_act"
    use_quantized = (getattr(layer, "layout_type", None) is not None and not getattr(layer, "_full_precision_mm", False)
                     and not getattr(layer, "comfy_force_cast_weights", False) and not _functions(layer))
    quantize_input = quant_ops.QUANT_ALGOS.get(getattr(layer, "quant_format", None), {}).get("quantize_input", True)
    if use_quantized and quantize_input:
        return "input_quant"
    if use_quantized and quantised:
        return "weight_only"
    return "dense"


def kernel_path(layer, for_act: bool = False) -> str:
    """`h3director.dit.quantised.NATIVE` when the layer runs its layout's kernel, else EMULATED."""
    return EMULATED if kernel_mode(layer, for_act) == "dense" else NATIVE


def classify(layer, use: str, for_act: bool = False):
    """`("quant", None, rule)` when a quantised layer may be chunked for `use` (`ROWS` / `WEIGHT_ROWS`),
    `("stock", reason, rule or None)` when it keeps its stock call (`rule`: the layout's
    `h3director.dit.quantised.LayoutRule`, None for a layout the director does not know)."""
    if getattr(layer, "weight", None) is None:
        return "stock", "weights not materialised", None
    layout, path = layout_of(layer), kernel_path(layer, for_act)
    static = getattr(layer, "input_scale", None) is not None
    rule, reason = decide(layout, path, use, static_scale=static)
    if reason is not None:
        return "stock", reason, rule
    return "quant", None, rule


def check_head_groups(layer, heads: int, head_dim: int, head_chunks: int, name: str = "attn.qkv_proj") -> None:
    """`InvalidInputError` (naming the layout) when `head_chunks` would slice `layer`'s weight rows off its
    layout's row group; nothing for unquantised layers or layouts the director keeps whole."""
    from h3director.dit.quantised import check_weight_row_groups

    if not is_quantised(layer) or getattr(layer, "weight", None) is None:
        return
    kind, _, _ = classify(layer, WEIGHT_ROWS)
    if kind == "quant":
        check_weight_row_groups(layout_of(layer), kernel_path(layer), heads, head_dim, head_chunks, name)


def slice_rows(weight, start: int, stop: int):
    """Rows `start:stop` of a weight (a plain tensor, or a `QuantizedTensor` of a known layout) for
    `F.linear`; a `QuantizedTensor` keeps its layout and shares storage. `InvalidInputError` for a range a
    block-scaled layout cannot slice, `ValueError` for a layout with no row slicing here."""
    _, _, quant_ops = _comfy()
    if not isinstance(weight, quant_ops.QuantizedTensor):
        return weight[start:stop]
    name, params, qdata = weight._layout_cls, weight._params, weight._qdata
    rows, cols = params.orig_shape
    if getattr(params, "transposed", False):
        raise ValueError(f"{name}: a transposed weight has no row slices")
    changes: dict[str, Any] = {"orig_shape": (stop - start, cols)}
    end = stop
    if name in BLOCK_SCALED:
        if start % SWIZZLE_ROWS or (stop % SWIZZLE_ROWS and stop != rows):
            raise InvalidInputError(f"{name} weight rows {start}:{stop}: block scales are stored in "
                                    f"{SWIZZLE_ROWS}-row tiles; a slice must start (and end, unless at the last "
                                    "row) on a multiple of that")
        end = qdata.shape[0] if stop == rows else stop       # the padded tail goes with the last slice
        scales = "block_scale" if name == "TensorCoreNVFP4Layout" else "scale"
        table = getattr(params, scales)
        changes[scales] = table[start:table.shape[0] if stop == rows else stop]
    elif name in ("TensorCoreFP8E4M3Layout", "TensorCoreFP8E5M2Layout", "TensorCoreFP8Layout"):
        pass                                                  # one per-tensor scale
    elif name in (INT8, "TensorCoreConvRotW4A4Layout"):
        if params.scale.numel() > 1:                         # per output row; a scalar is shared
            changes["scale"] = params.scale[start:stop]
    elif name == "AsymW4A8Int8Layout":
        if getattr(params, "correction", None) is not None:
            raise ValueError(f"{name}: a weight with a correction term has no row slices here")
        changes["scale"] = params.scale[start:stop]
        if getattr(params, "s_channel", None) is not None:
            changes["s_channel"] = params.s_channel[start:stop]
    else:
        raise ValueError(f"{name}: no weight-row slicing for this layout")
    return quant_ops.QuantizedTensor(qdata[start:end], name, dataclasses.replace(params, **changes))


class QuantWeights:
    """One quantised linear layer's weight cast once for a block's calls, used as its stock call uses it.

    `like`: a tensor of the input's dtype and device. `for_act`: the layer is fc2, which the stock block
    calls through `comfy.ops.linear_input_act(fc2, x, "swiglu")`. Release with `release()`."""

    def __init__(self, layer, like, for_act: bool = False):
        _, ops, quant_ops = _comfy()
        self.layer = layer
        self.mode = kernel_mode(layer, for_act)
        self.stream = None
        dtype, device = like.dtype, like.device
        if self.mode == "int8_act":
            cast = ops.cast_bias_weight(layer, like, offloadable=True, compute_dtype=dtype, want_requant=True)
        elif self.mode == "input_quant":
            cast = ops.cast_bias_weight(layer, None, dtype=dtype, device=device, bias_dtype=dtype, offloadable=True,
                                        compute_dtype=dtype, want_requant=True)
        elif self.mode == "weight_only":
            cast = ops.cast_bias_weight(layer, None, dtype=layer.weight.dtype, device=device, bias_dtype=dtype,
                                        offloadable=True, compute_dtype=dtype, want_requant=True)
        else:
            cast = ops.cast_bias_weight(layer, like, offloadable=True, compute_dtype=dtype)
        self.weight, self.bias, self.stream = cast
        if self.mode == "weight_only":
            self.weight = self.weight.to(dtype=dtype)
        # The forward decides to quantise its input before the cast; the cast may still hand back a
        # dequantised weight (Dynamic VRAM on the CPU always does), and then `F.linear(qx, weight)` reaches the
        # layout op with a quantised input, which dequantises it: the input stays quantised here too.
        self.quantise_input = self.mode == "input_quant"
        if not isinstance(self.weight, quant_ops.QuantizedTensor):
            self.mode = "dense"                       # the cast dequantised it (a LoRA weight function, ...)

    def prepare(self, x):
        """The layer's input transform for `x` (whole or a row chunk): `pre_quant_scale`, and the input
        quantisation of "input_quant" layers with the layer's input scale (`QuantizedTensor`)."""
        mm, _, quant_ops = _comfy()
        if self.mode == "int8_act":
            return x
        pre = getattr(self.layer, "pre_quant_scale", None)
        if pre is not None:
            x = x * mm.cast_to_device(pre, x.device, x.dtype)
        if self.quantise_input:
            scale = getattr(self.layer, "input_scale", None)
            if scale is not None:
                scale = mm.cast_to_device(scale, x.device, None)
            x = quant_ops.QuantizedTensor.from_float(x, self.layer.layout_type, scale=scale)
        return x

    def linear(self, x, start: int | None = None, stop: int | None = None, prepared: bool = False):
        """The layer's output columns `start:stop` (all when None) for input rows `x` (`[rows, in]`)."""
        import torch.nn.functional as F

        weight, bias = self.weight, self.bias
        if start is not None:
            weight = slice_rows(weight, start, stop)
            bias = None if bias is None else bias[start:stop]
        if not prepared:
            x = self.prepare(x)
        if self.mode == "int8_act":
            return self._int8(x, weight, bias, None)
        return F.linear(x, weight, bias)

    def _fused_act(self, x) -> bool:
        """fc2's SwiGLU runs inside the int8 kernel's quantiser (off the CPU, as `linear_input_act` runs it)."""
        return self.mode == "int8_act" and x.device.type != "cpu"

    def act_input(self, h, swiglu, start: int, stop: int, total: int):
        """fc2's input from fc1's output rows `start:stop` of `total`: `h` itself where the kernel folds the
        SwiGLU in, else SwiGLU(`h`) with the stock call's CPU thread cuts (`blocks.swiglu_rows`, what the eager
        kernel computes over all rows)."""
        from h3director.dit.blocks import swiglu_rows

        return h if self._fused_act(h) else swiglu_rows(swiglu, h, start, stop, total)

    def linear_act(self, x):
        """`linear_input_act(layer, h, "swiglu")` given `act_input`'s result."""
        if self._fused_act(x):
            return self._int8(x, self.weight, self.bias, "swiglu")   # the fused quantiser, as the stock call
        return self.linear(x)

    def linear_swiglu(self, h, swiglu, start: int, stop: int, total: int):
        """`linear_input_act(layer, h, "swiglu")` for fc1 output rows `start:stop` of `total` (`act_input`
        then `linear_act`; `h` stays alive through fc2: the block runs the two steps)."""
        return self.linear_act(self.act_input(h, swiglu, start, stop, total))

    @staticmethod
    def _int8(x, weight, bias, act):
        _, _, quant_ops = _comfy()
        qdata, scale = quant_ops.TensorWiseINT8Layout.get_plain_tensors(weight)
        return quant_ops.ck.int8_linear(x, qdata, scale, bias, x.dtype,
                                        convrot=getattr(weight._params, "convrot", False),
                                        convrot_groupsize=getattr(weight._params, "convrot_groupsize", 256),
                                        input_act=act)

    def release(self) -> None:
        if self.stream is not None:
            _, ops, _ = _comfy()
            ops.uncast_bias_weight(self.layer, self.weight, self.bias, self.stream)
        self.weight = self.bias = self.stream = None


def report_line(layer, name: str, use: str, for_act: bool = False) -> tuple[str, str]:
    """(line, exactness) for quantised layer `name` chunked for `use`: the run report's line (its layout, kernel
    path, activation quantisation and exactness class) and the class reported (`dit.quantised.reported_exactness`)."""
    from h3director.dit.quantised import report_text, reported_exactness

    _, _, rule = classify(layer, use, for_act)
    return report_text(name, rule, use), reported_exactness(rule, use).value


def check_model_head_groups(blocks, head_chunks: int) -> None:
    """`check_head_groups` for the qkv projection of every block in `blocks` (ComfyUI H3 `DiTBlock`s)."""
    if head_chunks == 1:
        return
    for block in blocks:
        attn = block.attn
        check_head_groups(attn.qkv_proj, attn.heads, attn.head_dim, head_chunks)


def block_decisions(block) -> list[str]:
    """What the tiers do with each quantised linear of ComfyUI H3 `DiTBlock` `block` (one line per layer:
    chunked with layout, path and exactness, or kept stock with the reason); empty for an unquantised block.
    out_proj is always called whole."""
    uses = (("attn.qkv_proj", block.attn.qkv_proj, WEIGHT_ROWS, False), ("mlp.fc1", block.mlp.fc1, ROWS, False),
            ("mlp.fc2", block.mlp.fc2, ROWS, True))
    lines = []
    for name, layer, use, act in uses:
        if not is_quantised(layer):
            continue
        kind, reason, _ = classify(layer, use, act)
        if kind == "quant":
            lines.append(report_line(layer, name, use, act)[0])
        else:
            lines.append(f"{name}: kept stock ({reason})")
    if is_quantised(block.attn.out_proj):
        lines.append(f"attn.out_proj [{layout_of(block.attn.out_proj)}]: called whole (no tier chunks it)")
    return lines


def block_linears(block, device):
    """`h3director.plan.quantised_bytes.BlockLinears` of ComfyUI H3 `DiTBlock` `block` run on `device`: which
    of its linears are quantised (GGUF layers of this project's loader and fp8 `weight_dtype` casts included),
    what each call makes, and whether the tiers slice qkv and chunk the FFN (None when none is). The planner
    builds the same from a weights format (`h3director.plan.quantised_tiers`)."""
    from h3director.plan.dtypes import dtype_bytes
    from h3director.plan.quantised_bytes import CAST, GGUF, BlockLinears, call_for

    def call(layer, use, act=False):
        if getattr(layer, "gguf_qtype", None) is not None:
            return call_for(GGUF, EMULATED, 2), True
        weight = getattr(layer, "weight", None)
        if weight is None:
            return None, True
        if not is_quantised(layer):
            # stored in a one-byte float (fp8 `weight_dtype`) and cast to the 2-byte compute dtype to run
            fp8_cast = (weight.is_floating_point() and weight.element_size() == 1
                        and getattr(layer, "comfy_cast_weights", False))
            return (call_for(CAST, EMULATED, 2) if fp8_cast else None), True
        kind, _, _ = classify(layer, use, act)
        e = dtype_bytes(getattr(getattr(layer.weight, "_params", None), "orig_dtype", None) or "bf16")
        return call_for(layout_of(layer), kernel_path(layer, act), e), kind == "quant"

    qkv, sliced = call(block.attn.qkv_proj, WEIGHT_ROWS)
    fc1, rows1 = call(block.mlp.fc1, ROWS)
    fc2, rows2 = call(block.mlp.fc2, ROWS, True)
    if qkv is None and fc1 is None and fc2 is None:
        return None
    return BlockLinears(qkv=qkv, fc1=fc1, fc2=fc2, qkv_sliced=sliced, ffn_chunked=rows1 and rows2,
                        device=str(device).partition(":")[0])


__all__ = ["ROWS", "WEIGHT_ROWS", "QuantWeights", "block_decisions", "block_linears", "check_head_groups", "check_model_head_groups",
           "classify",
           "is_quantised", "kernel_mode", "kernel_path", "layout_of", "report_line", "slice_rows"]
