"""Runs INSIDE a fresh Python with a real ComfyUI on sys.path: the quantised-layer DiT checks of
tests/test_dit_quant_comfy.py.

Usage: python dit_quant_worker.py COMFYUI_DIR  -> prints one JSON object {check name: {"ok": bool, "detail": str}}.

ComfyUI's own `MiniMaxH3Model` (2 blocks, hidden 256, 4 heads of 64, FFN 512: wide enough for the 256-wide
Hadamard rotations and the 128-row scale tiles), loaded by `comfy.sd.load_diffusion_model_state_dict` from a
random bf16 state dict whose block linears (qkv, out, fc1, fc2) are quantised by the layout and written with
ComfyUI's `comfy_quant` metadata (`quant_layers.py`), run on the CPU in bfloat16 with PyTorch SDPA. "native"
configurations are loaded as on a device that computes the format (comfy_kitchen's eager kernels run the
layout ops); "emulated" is what the loader builds here for fp8 / nvfp4 (dequantised weight, float GEMM).

Every exact/... check runs the stock forward and the director's tiers (head_chunks 2/4 x ffn_chunks 2/4/8)
and asserts torch.equal (every chunked layout here is reported exact: by construction or where verified),
that each quantised layer is named in the report, and that none was kept stock.
"""

from __future__ import annotations

import json
import sys
import traceback

OVERRIDES = dict(hidden_size=256, num_attention_heads=4, attention_head_dim=64, ffn_hidden_size=512)
TIERS = [(h, f) for h in (2, 4) for f in (2, 4, 8)]
CONFIGS = [  # (check id, format, native, input_scale)
    ("int8_tensorwise", "int8_tensorwise", True, None),
    ("int8_convrot", "int8_convrot", True, None),
    ("float8_e4m3fn-emulated", "float8_e4m3fn", False, None),
    ("float8_e4m3fn-native", "float8_e4m3fn", True, None),
    ("float8_e5m2-native-input_scale", "float8_e5m2", True, 0.05),
    ("nvfp4-emulated", "nvfp4", False, None),
    ("nvfp4-native-input_scale", "nvfp4", True, 0.05),
    ("mxfp8-native", "mxfp8", True, None),
    ("convrot_w4a4", "convrot_w4a4", True, None),
    ("asym_w4a8_int8", "asym_w4a8_int8", True, None),
]
ROW_GROUPED = ("nvfp4", "mxfp8")   # 4 heads of 64 in 4 groups: 64-row slices, off the 128-row tiles


def main(root: str) -> None:
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    import dit_worker as base
    from quant_layers import device_computes_everything, quantise_state_dict

    h3 = base.import_comfy(root)
    import torch

    from h3director.errors import InvalidInputError
    from h3director.integrations import comfy_dit

    sd = base.tiny_state_dict(h3, **OVERRIDES)
    results: dict[str, dict] = {}

    def check(name, fn):
        try:
            ok, detail = fn()
        except Exception:
            ok, detail = False, traceback.format_exc()
        results[name] = {"ok": bool(ok), "detail": str(detail)[-3000:]}

    def load(fmt, native, scale=None, layers=("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")):
        qsd = quantise_state_dict(sd, fmt, layers=layers, input_scale=scale)
        if native:
            with device_computes_everything():
                return base.load(qsd, torch.bfloat16)
        return base.load(qsd, torch.bfloat16)

    def tiers_exact(fmt, native, scale):
        patcher = load(fmt, native, scale)
        stock = base.forward(patcher, torch.bfloat16)
        failures, reports = [], {}
        for heads, ffn in TIERS:
            if fmt in ROW_GROUPED and heads == 4:
                continue                                    # refused: see refuse/row-group
            ours, handle = comfy_dit.install(patcher, head_chunks=heads, ffn_chunks=ffn)
            out = base.forward(ours, torch.bfloat16)
            report = handle.last_report
            named = report["quantised"]
            layers_named = all(any(n in line for line in named) for n in ("qkv_proj", "mlp.fc1", "mlp.fc2"))
            if not base.equal(stock, out) or report["kept_stock"] or not layers_named:
                diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(stock, out, strict=True))
                failures.append((heads, ffn, diff, report["kept_stock"], named))
            reports = {"quantised": named, "handle": handle.quantised}
        return not failures, failures or reports

    for cid, fmt, native, scale in CONFIGS:
        check(f"exact/{cid}", lambda fmt=fmt, native=native, scale=scale: tiers_exact(fmt, native, scale))

    def nvfp4_dynamic_scale():
        # no input_scale: NVFP4 computes its activation scale from the whole input per call -> FFN whole
        patcher = load("nvfp4", True)
        stock = base.forward(patcher, torch.bfloat16)
        ours, handle = comfy_dit.install(patcher, head_chunks=2, ffn_chunks=4)
        out = base.forward(ours, torch.bfloat16)
        kept = handle.last_report["kept_stock"]
        named = handle.last_report["quantised"]
        ok = (base.equal(stock, out) and any("mlp.fc1" in k and "input_scale" in k for k in kept)
              and any("qkv_proj" in line and "TensorCoreNVFP4Layout" in line for line in named)
              and any("mlp.fc1: kept stock" in line for line in handle.quantised))
        return ok, {"kept": kept, "quantised": named, "handle": handle.quantised}
    check("kept/nvfp4-dynamic-activation-scale-ffn-whole-named", nvfp4_dynamic_scale)

    def unknown_layout():
        import comfy.quant_ops as quant_ops
        from comfy_kitchen.tensor import register_layout_class

        class ThirdPartyINT8Layout(quant_ops.TensorWiseINT8Layout):
            """A layout some other pack registers: the director has no rule for it."""

        register_layout_class("ThirdPartyINT8Layout", ThirdPartyINT8Layout)
        patcher = load("int8_tensorwise", True)
        for block in patcher.model.diffusion_model.blocks:
            w = block.mlp.fc1.weight
            block.mlp.fc1.weight = torch.nn.Parameter(
                quant_ops.QuantizedTensor(w._qdata, "ThirdPartyINT8Layout", w._params), requires_grad=False)
        stock = base.forward(patcher, torch.bfloat16)
        ours, handle = comfy_dit.install(patcher, head_chunks=2, ffn_chunks=4)
        out = base.forward(ours, torch.bfloat16)
        kept = handle.last_report["kept_stock"]
        ok = (base.equal(stock, out)
              and any("mlp.fc1" in k and "ThirdPartyINT8Layout" in k and "not guessed" in k for k in kept)
              and any("qkv_proj" in line for line in handle.last_report["quantised"]))
        return ok, {"kept": kept, "quantised": handle.last_report["quantised"]}
    check("kept/unknown-layout-stock-and-named", unknown_layout)

    def row_group_refused():
        messages = {}
        for fmt in ROW_GROUPED:
            patcher = load(fmt, True, 0.05 if fmt == "nvfp4" else None)
            before = repr(patcher.model_options)
            try:
                comfy_dit.install(patcher, head_chunks=4, ffn_chunks=2)
                messages[fmt] = None
            except InvalidInputError as error:
                messages[fmt] = str(error)
            if repr(patcher.model_options) != before:
                return False, f"{fmt}: the refused install changed the MODEL"
        layouts = {"nvfp4": "TensorCoreNVFP4Layout", "mxfp8": "TensorCoreMXFP8Layout"}
        ok = all(m is not None and layouts[f] in m and "128" in m and "head_chunks=4" in m
                 for f, m in messages.items())
        return ok, messages
    check("refuse/row-group-of-the-layout-named", row_group_refused)

    def row_group_refused_before_forward():
        # an installation that fits (head_chunks=2), then a forward whose tier would slice off the tiles
        patcher = load("mxfp8", True)
        ours, handle = comfy_dit.install(patcher, head_chunks=2)
        handle.floor = type(handle.floor)(head_chunks=4)        # as an escalation in "auto" could choose
        try:
            base.forward(ours, torch.bfloat16)
        except InvalidInputError as error:
            return handle.block_calls == 0 and "TensorCoreMXFP8Layout" in str(error), str(error)
        return False, "the forward ran"
    check("refuse/row-group-before-the-forward", row_group_refused_before_forward)

    print("H3DITQ-RESULTS " + json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1])
