"""Real ComfyUI quantised linear layers, built the way ComfyUI's loader builds them (runs INSIDE a Python with
ComfyUI importable; used by tests/comfy_harness/dit_quant_worker.py and bench/dit_quantised_exactness.py).

A float weight is quantised with the layout's own `QuantizedTensor.from_float`, written in ComfyUI's
checkpoint key layout (`<layer>.weight`, the layout's scale keys, `<layer>.comfy_quant` JSON), and loaded by
ComfyUI: one layer through `comfy.ops.mixed_precision_ops(...).Linear.load_state_dict` (`_load_quantized_module`),
a whole H3 model through `comfy.sd.load_diffusion_model_state_dict` (which detects the quantisation metadata).

`native=True` builds what the loader builds on a device that computes the format (fp8 / nvfp4 / mxfp8 are
in `pick_operations`' disabled set on the CPU, so the layer dequantises: `native=False`); the kernels are then
comfy_kitchen's eager backend, the CPU implementation of the same layout ops.
"""

from __future__ import annotations

import contextlib
import json

FORMATS = {
    # name: (QUANT_ALGOS format, extra comfy_quant keys, from_float kwargs)
    "int8_tensorwise": ("int8_tensorwise", {}, {}),
    "int8_convrot": ("int8_tensorwise", {"convrot": True, "convrot_groupsize": 256},
                     {"per_channel": True, "convrot": True, "convrot_groupsize": 256}),
    "float8_e4m3fn": ("float8_e4m3fn", {}, {}),
    "float8_e5m2": ("float8_e5m2", {}, {}),
    "nvfp4": ("nvfp4", {}, {}),
    "mxfp8": ("mxfp8", {}, {}),
    "convrot_w4a4": ("convrot_w4a4", {}, {}),
    "asym_w4a8_int8": ("asym_w4a8_int8", {}, {}),
}
EMULATED_ON_CPU = ("float8_e4m3fn", "float8_e5m2", "nvfp4", "mxfp8")
"""Formats ComfyUI's loader runs dequantised on a device without their compute (the CPU)."""


def quantised_keys(prefix: str, weight, name: str, input_scale=None) -> dict:
    """ComfyUI checkpoint keys for layer `prefix` holding `weight` (float `[out, in]`) quantised as `name`."""
    import torch
    from comfy.quant_ops import QUANT_ALGOS, QuantizedTensor, get_layout_class

    fmt, conf, kwargs = FORMATS[name]
    layout = QUANT_ALGOS[fmt]["comfy_tensor_layout"]
    qt = QuantizedTensor.from_float(weight, layout, **kwargs)
    keys = {f"{prefix}.weight{suffix}": t for suffix, t in
            get_layout_class(layout).state_dict_tensors(qt._qdata, qt._params).items() if t is not None}
    keys[f"{prefix}.comfy_quant"] = torch.tensor(list(json.dumps({"format": fmt, **conf}).encode()),
                                                 dtype=torch.uint8)
    if input_scale is not None:
        keys[f"{prefix}.input_scale"] = torch.tensor(float(input_scale), dtype=torch.float32)
    return keys


def quantise_state_dict(sd: dict, name: str, layers=("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2"),
                        dtype=None, input_scale=None) -> dict:
    """`sd` (an H3 state dict in ComfyUI's key layout) with every block linear in `layers` quantised as
    `name` (weights first cast to `dtype`, default bfloat16)."""
    import torch

    dtype = dtype or torch.bfloat16
    out = dict(sd)
    for key in list(sd):
        if key.startswith("blocks.") and key.endswith(".weight") and any(f".{n}." in key for n in layers):
            prefix = key[:-len(".weight")]
            del out[key]
            out.update(quantised_keys(prefix, sd[key].to(dtype), name, input_scale))
    return out


@contextlib.contextmanager
def device_computes_everything():
    """While inside, `comfy.model_management` reports fp8 / nvfp4 / mxfp8 compute on any device, so the loader
    builds native layers (`pick_operations`' disabled set is empty)."""
    import comfy.model_management as mm

    names = ("supports_fp8_compute", "supports_nvfp4_compute", "supports_mxfp8_compute")
    saved = {n: getattr(mm, n) for n in names}
    try:
        for n in names:
            setattr(mm, n, lambda *args, **kwargs: True)
        yield
    finally:
        for n, f in saved.items():
            setattr(mm, n, f)


def build_linear(weight, bias, name: str, native: bool, compute_dtype=None, input_scale=None):
    """One `MixedPrecisionOps.Linear` loaded from `quantised_keys` (`native`: the format not disabled)."""
    import comfy.ops
    import torch

    compute_dtype = compute_dtype or torch.bfloat16
    fmt = FORMATS[name][0]
    ops = comfy.ops.mixed_precision_ops({}, compute_dtype, disabled=set() if native else {fmt})
    layer = ops.Linear(weight.shape[1], weight.shape[0], bias=bias is not None)
    sd = quantised_keys("layer", weight.to(compute_dtype), name, input_scale)
    if bias is not None:
        sd["layer.bias"] = bias.to(compute_dtype)
    layer.load_state_dict({k[len("layer."):]: v for k, v in sd.items()}, strict=False)
    return layer
