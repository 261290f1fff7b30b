"""Runs INSIDE a fresh Python with a real ComfyUI on sys.path: the GGUF DiT checks of tests/test_gguf_comfy.py.

Usage: python gguf_worker.py COMFYUI_DIR TMPDIR -> prints one line "H3GGUF-RESULTS {check: {"ok", "detail"}}".

The model is ComfyUI's own `MiniMaxH3Model` at a small random config (tests/gguf_helpers.CONFIG), written
to GGUF with gguf's `GGUFWriter` and quantiser. The reference is the stock
`comfy.sd.load_diffusion_model_state_dict` of the file's dequantised tensors (`gguf.quants.dequantize`):
the GGUF MODEL must give `torch.equal` outputs to it.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import dit_worker  # noqa: E402
import gguf_helpers as gh  # noqa: E402
from worker_checks import Checks, emit  # noqa: E402

dit_worker.CONFIG = gh.CONFIG


def run_checks(root: str, tmp: str) -> dict:
    dit_worker.import_comfy(root)
    import comfy.model_management
    import comfy.sd
    import gguf
    import torch

    from h3director.errors import InvalidInputError
    from h3director.integrations import comfy_dit, comfy_gguf
    from h3director.plan.live_bytes import LiveBytesTracker

    h3 = sys.modules["comfy.ldm.minimax.model"]
    Q = gguf.GGMLQuantizationType
    checks = Checks()
    results, check = checks.results, checks.check
    forward, equal = dit_worker.forward, dit_worker.equal

    def stock(sd, dtype):
        return comfy.sd.load_diffusion_model_state_dict(dict(sd), model_options={"dtype": dtype})

    sd = gh.comfy_state_dict(h3)
    files = {}
    for qtype in (Q.Q8_0, Q.Q4_0, Q.Q5_1, Q.Q4_K):
        path = os.path.join(tmp, f"h3-{qtype.name}.gguf")
        files[qtype.name] = (path, gh.write_gguf(path, sd, qtype))
    float_out = forward(stock(sd, torch.float32), torch.float32)

    for name, (path, dequantised) in files.items():
        for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            def exact(path=path, dequantised=dequantised, dtype=dtype):
                ours = comfy_gguf.load_gguf_dit(path, dtype=dtype)
                out = forward(ours, dtype)
                reference = forward(stock(dequantised, dtype), dtype)
                fc1 = ours.model.diffusion_model.blocks[0].mlp.fc1
                kept = fc1.weight.dtype == torch.uint8 and comfy_gguf.is_gguf_linear(fc1)
                differs = dtype != torch.float32 or not equal(out, float_out)
                return equal(reference, out) and kept and differs, {
                    "summary": ours.model.gguf_summary, "fc1": str(fc1.weight.dtype),
                    "differs_from_unquantised": differs}
            check(f"exact/{name}/{dtype_name}", exact)

    for type_name in ("Q6_K", "Q5_K", "Q4_K_M"):
        def converted(type_name=type_name):
            # the same real weights through `weights convert` (the project's K-quant encoders) -> the GGUF loader
            out, held = gh.converted_gguf(sd, tmp, type_name)
            ours = comfy_gguf.load_gguf_dit(out, dtype=torch.float32)
            dm = ours.model.diffusion_model
            kinds = {layer.gguf_qtype for layer in dm.modules()
                     if comfy_gguf.is_gguf_linear(layer) and getattr(layer, "gguf_qtype", None)}
            wanted = {"Q4_K", "Q6_K"} if type_name == "Q4_K_M" else {type_name}
            got = forward(ours, torch.float32)
            return (equal(forward(stock(held, torch.float32), torch.float32), got) and kinds == wanted
                    and not equal(got, float_out)), {"summary": ours.model.gguf_summary, "types": sorted(kinds)}
        check(f"convert/{type_name}", converted)

    path, dequantised = files["Q8_0"]
    reference = forward(stock(dequantised, torch.float32), torch.float32)

    def curve():
        curve_sd = gh.comfy_state_dict(h3, seed=3, curve=True)
        curve_path = os.path.join(tmp, "h3-curve-Q8_0.gguf")
        deq = gh.write_gguf(curve_path, curve_sd, Q.Q8_0)
        ours = comfy_gguf.load_gguf_dit(curve_path, dtype=torch.float32)
        dm = ours.model.diffusion_model
        return (dm.use_adaln_curves and equal(forward(stock(deq, torch.float32), torch.float32),
                                              forward(ours, torch.float32)), ours.model.gguf_summary)
    check("exact/curve-form-Q8_0", curve)

    def labels():
        wan = os.path.join(tmp, "h3-wan.gguf")
        gh.write_gguf(wan, sd, Q.Q8_0, arch="wan")
        prefixed = os.path.join(tmp, "h3-prefixed.gguf")
        gh.write_gguf(prefixed, sd, Q.Q8_0, prefix="model.diffusion_model.")
        a = forward(comfy_gguf.load_gguf_dit(wan, dtype=torch.float32), torch.float32)
        b = forward(comfy_gguf.load_gguf_dit(prefixed, dtype=torch.float32), torch.float32)
        return equal(reference, a) and equal(reference, b), "wan label and model.diffusion_model. prefix"
    check("accepts/wan-label-and-prefix", labels)

    def refusals():
        messages = {}

        def refused(label, target):
            try:
                comfy_gguf.load_gguf_dit(target, dtype=torch.float32)
                messages[label] = None
            except InvalidInputError as error:
                messages[label] = str(error)
        flux = os.path.join(tmp, "flux.gguf")
        gh.write_gguf(flux, sd, Q.Q8_0, arch="flux")
        refused("flux", flux)
        other = os.path.join(tmp, "other-wan.gguf")
        gh.write_gguf(other, {"patch_embedding.weight": torch.randn(64, 64), "head.head.weight": torch.randn(8, 64)},
                      Q.Q8_0, arch="wan")
        refused("wan-not-h3", other)
        short = os.path.join(tmp, "short.gguf")
        gh.write_gguf(short, sd, Q.Q8_0)
        gh.truncate(short, os.path.getsize(short) - 1000)
        refused("truncated", short)
        fewer = os.path.join(tmp, "fewer.gguf")
        gh.write_gguf(fewer, {k: v for k, v in sd.items() if k != "blocks.1.mlp.fc2.weight"}, Q.Q8_0)
        refused("missing", fewer)
        ok = (all(messages.values()) and "'flux'" in messages["flux"] and "not a MiniMax H3 DiT" in messages[
            "wan-not-h3"] and "short.gguf" in messages["truncated"] and "blocks.1.mlp.fc2.weight" in messages["missing"])
        return ok, messages
    check("refuse/architecture-truncated-missing", refusals)

    def lora():
        ours = comfy_gguf.load_gguf_dit(path, dtype=torch.float32)
        ref = stock(dequantised, torch.float32)
        keys = ["diffusion_model.blocks.0.attn.qkv_proj.weight", "diffusion_model.blocks.1.mlp.fc1.weight"]
        patches = dit_worker.lora_patches(ref.model.state_dict(), keys, seed=5)
        ref_l, ours_l = ref.clone(), ours.clone()
        added = (ref_l.add_patches(patches), ours_l.add_patches(patches))
        raw = ours.model.diffusion_model.blocks[0].attn.qkv_proj.weight.clone()
        expected = forward(ref_l, torch.float32)
        got = forward(ours_l, torch.float32)
        untouched = torch.equal(raw, ours.model.diffusion_model.blocks[0].attn.qkv_proj.weight)
        after = forward(ours, torch.float32)  # the clone without patches: back to the plain model
        return (len(added[0]) == len(added[1]) == 2 and not equal(expected, reference) and equal(expected, got)
                and untouched and equal(after, reference)), {"added": added, "bytes untouched": untouched}
    check("lora/full-load-on-the-fly", lora)

    def lora_lowvram():
        ours = comfy_gguf.load_gguf_dit(path, dtype=torch.float32)
        ref = stock(dequantised, torch.float32)
        keys = ["diffusion_model.blocks.0.attn.qkv_proj.weight", "diffusion_model.blocks.0.mlp.fc2.weight"]
        patches = dit_worker.lora_patches(ref.model.state_dict(), keys, seed=6)
        ref_l, ours_l = ref.clone(), ours.clone()
        ref_l.add_patches(patches)
        ours_l.add_patches(patches)
        expected = forward(ref_l, torch.float32)
        comfy.model_management.unload_all_models()
        ours_l.patch_model(lowvram_model_memory=1, load_weights=True)
        fc2 = ours_l.model.diffusion_model.blocks[0].mlp.fc2
        on_the_fly = any(getattr(f, "key", None) == keys[1] for f in fc2.weight_function)
        x, t, context, kwargs = dit_worker.inputs(torch.float32)
        with torch.no_grad():
            out = ours_l.model.diffusion_model(x, t, context, transformer_options={})
        ours_l.unpatch_model()
        return on_the_fly and equal(expected, out), f"fc2 LowVramPatch in weight_function: {on_the_fly}"
    check("lora/lowvram-weight-function", lora_lowvram)

    def dit_memory():
        ours = comfy_gguf.load_gguf_dit(path, dtype=torch.float32)
        base_out = forward(ours, torch.float32)
        patched, handle = comfy_dit.install(ours, head_chunks=2, ffn_chunks=3)
        out = forward(patched, torch.float32)
        kept = handle.last_report.get("kept_stock", [])
        # GGUF layers are dequantised once per block and sliced like cast weights: nothing kept stock
        return (equal(base_out, out) and equal(reference, out) and handle.block_calls == gh.CONFIG["num_layers"]
                and kept == []), kept
    check("compose/dit-memory-node", dit_memory)

    def peak():
        # live bytes of one forward: the GGUF model may add at most one layer's dequantised weight (float32,
        # plus its cast) over the stock model that holds every weight dequantised already
        ours = comfy_gguf.load_gguf_dit(path, dtype=torch.float32)
        ref = stock(dequantised, torch.float32)
        peaks = {}
        for label, patcher in (("stock", ref), ("gguf", ours)):
            forward(patcher, torch.float32)
            with LiveBytesTracker() as tracker:
                forward(patcher, torch.float32)
            peaks[label] = tracker.peak_bytes
        layers = [m for m in ours.model.diffusion_model.modules() if comfy_gguf.is_gguf_linear(m)]
        largest = max(m.out_features * m.in_features * 4 for m in layers)
        total = sum(m.out_features * m.in_features * 4 for m in layers)
        extra = peaks["gguf"] - peaks["stock"]
        return 0 < extra <= 2 * largest < total, {"peaks": peaks, "extra": extra, "largest_layer_f32": largest,
                                                 "all_layers_f32": total}
    check("memory/per-layer-dequant-peak", peak)

    def mapped():
        # nothing copied at load: every quantised weight's bytes are the memory map's (addresses inside it)
        import numpy as np

        ours = comfy_gguf.load_gguf_dit(path, dtype=torch.float32)
        gguf_file = ours.model.gguf_file
        start = min(np.asarray(info.raw).ctypes.data - info.offset for info in gguf_file.tensors.values())
        layers = [m for m in ours.model.diffusion_model.modules() if comfy_gguf.is_gguf_linear(m)]
        inside = [start <= m.weight.data_ptr() < start + gguf_file.file_bytes for m in layers]
        # ComfyUI's lowvram planning sees a quantised layer's offload cost as its decode, not bytes x dtype
        entries = {entry[-3]: entry for entry in ours._load_list()}
        fc1 = entries["diffusion_model.blocks.0.mlp.fc1"]
        expected = fc1[-4] + 4 * fc1[-2].out_features * fc1[-2].in_features
        return (len(layers) == 15 and all(inside) and fc1[0] == expected,
                {"layers": len(layers), "inside the map": sum(inside), "fc1 offload": (fc1[0], expected)})
    check("memory/quantised-weights-view-the-map", mapped)

    def node():
        import folder_paths

        from h3director.comfy.nodes_gguf import GGUFDiTLoader

        folder = os.path.join(tmp, "models_unet")
        os.makedirs(folder, exist_ok=True)
        os.replace(path, os.path.join(folder, "h3-Q8_0.gguf"))
        folder_paths.add_model_folder_path("diffusion_models", folder)
        schema = GGUFDiTLoader.GET_SCHEMA()
        options = schema.inputs[0].options
        output = GGUFDiTLoader.execute("h3-Q8_0.gguf", "float32")
        out = forward(output.result[0], torch.float32)
        refused = None
        try:
            GGUFDiTLoader.execute("absent.gguf", "default")
        except InvalidInputError as error:
            refused = str(error)
        return (schema.node_id == "H3DirectorGGUFDiTLoader" and schema.display_name == "H3Director GGUF DiT Loader"
                and "h3-Q8_0.gguf" in options and equal(reference, out) and refused and "absent.gguf" in refused,
                {"options": options, "text": output.ui["text"][0], "refused": refused})
    check("node/lists-loads-refuses", node)
    return results


if __name__ == "__main__":
    try:
        out = run_checks(sys.argv[1], sys.argv[2])
    except Exception:
        traceback.print_exc()
        sys.exit(1)
    emit("H3GGUF-RESULTS", out)
