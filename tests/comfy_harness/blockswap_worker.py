"""Runs INSIDE a fresh Python with a real ComfyUI on sys.path: the block swap checks of tests/test_blockswap_comfy.py.

Usage: python blockswap_worker.py COMFYUI_DIR TMPDIR -> prints one line "H3SWAP-RESULTS {check: {"ok", "detail"}}".

The model is ComfyUI's own `MiniMaxH3Model` (`tests/comfy_harness/dit_worker.py`'s tiny config with 5 blocks),
loaded by `comfy.sd.load_diffusion_model_state_dict`, run through the sampler's own options
(`dit_worker.forward`: `load_models_gpu` + `prepare_model_patcher`). The CPU is the device here: the swap's
copies are real (fresh tensors per onload), its placement is read from the module's tensors.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import dit_worker  # noqa: E402
from worker_checks import Checks, emit  # noqa: E402

BLOCKS = 5


def planner_block_bytes(config: dict, fmt: str) -> int:
    """`plan/estimate.py`'s per-block weight bytes (`_weight_bytes(..., block=True)`) for a ComfyUI config."""
    from h3director.plan.estimate import _weight_bytes, model_config_key

    diffusers_config = {"hidden_size": config["hidden_size"], "num_attention_heads": config["num_attention_heads"],
                        "attention_head_dim": config["attention_head_dim"], "ffn_dim": config["ffn_hidden_size"],
                        "num_layers": config["num_layers"], "time_embed_dim": config["time_embed_dim"]}
    return _weight_bytes("dit", model_config_key(diffusers_config), fmt, block=True)


def run_checks(root: str, tmp: str) -> dict:
    dit_worker.import_comfy(root)
    import comfy.model_management
    import comfy.patcher_extension
    import comfy.sd
    import torch

    from h3director.comfy.nodes_blockswap import BlockSwapNode
    from h3director.errors import InvalidInputError
    from h3director.integrations import comfy_blockswap, comfy_dit

    h3 = sys.modules["comfy.ldm.minimax.model"]
    checks = Checks()
    results, check = checks.results, checks.check
    forward, equal, load = dit_worker.forward, dit_worker.equal, dit_worker.load
    sd = dit_worker.tiny_state_dict(h3, num_layers=BLOCKS)

    def probe(swap_holder, seen):
        """A block entry (below the swap's) that records, per block call, which blocks compute from device
        tensors (every tensor not backed by a host copy) and which offloaded ones are resident."""
        def entry(args, extra):
            swap = swap_holder()
            rows = swap.placement()
            seen.append({"resident_blocks": sum(1 for r in rows if r["host_bytes"] == 0),
                         "resident_offloaded": swap.resident_offloaded()})
            return extra["original_block"](args)
        return {"patches_replace": {"dit": {("double_block", i): entry for i in range(BLOCKS)}}}

    references = {}
    for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        base = load(sd, dtype)
        references[dtype_name] = reference = forward(base, dtype)
        for count in (0, 1, 2, BLOCKS):
            def exact(count=count, base=base, reference=reference, dtype=dtype):
                ours, handle = comfy_blockswap.install(base, count)
                seen = []
                out = forward(ours, dtype, extra_options=probe(lambda: handle.swap, seen) if count else None)
                if not count:
                    return equal(reference, out) and handle.swap is None, "0: nothing installed"
                offloaded = set(handle.offloaded)
                expected = [BLOCKS - count + (1 if i in offloaded else 0) for i in range(BLOCKS)]
                counted = [s["resident_blocks"] for s in seen]
                report = handle.last_report
                ok = (equal(reference, out) and counted == expected
                      and [s["resident_offloaded"] for s in seen] == [[i] if i in offloaded else [] for i in range(BLOCKS)]
                      and report["onloads"] == count and report["peak_offloaded_on_device"] == min(count, 2)
                      and report["prefetched"] == count and len(offloaded) == count and BLOCKS - 1 in offloaded)
                after = [r["host_bytes"] > 0 and r["device_bytes"] == 0 for r in handle.swap.placement()]
                ok = ok and after == [i in offloaded for i in range(BLOCKS)]
                return ok, {"resident per block call": counted, "expected": expected, "report": report,
                            "offloaded": sorted(offloaded), "host-backed after": after}
            check(f"exact/{dtype_name}/offload{count}", exact)

    base32 = load(sd, torch.float32)
    reference = references["float32"]

    def with_dit_memory():
        outs = {}
        for order in ("swap-then-dit", "dit-then-swap"):
            if order == "swap-then-dit":
                swapped, swap = comfy_blockswap.install(base32, 3)
                both, dit = comfy_dit.install(swapped, head_chunks=2, ffn_chunks=3)
            else:
                memory, dit = comfy_dit.install(base32, head_chunks=2, ffn_chunks=3)
                both, swap = comfy_blockswap.install(memory, 3)
            out = forward(both, torch.float32)
            outs[order] = (equal(reference, out), dit.block_calls, swap.last_report.get("onloads"))
        ok = all(v == (True, BLOCKS, 3) for v in outs.values())
        return ok, outs
    check("compose/dit-memory-either-order", with_dit_memory)

    def lora():
        ok = {}
        for dtype_name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
            base = load(sd, dtype)
            plain = forward(base, dtype)
            patched = base.clone()
            keys = [f"diffusion_model.blocks.{BLOCKS - 1}.mlp.fc1.weight", "diffusion_model.blocks.1.attn.qkv_proj.weight",
                    f"diffusion_model.blocks.{BLOCKS - 1}.adaln_proj.linear.bias"]
            added = patched.add_patches(dit_worker.lora_patches(base.model.state_dict(), keys, seed=7))
            stock = forward(patched, dtype)
            ours, handle = comfy_blockswap.install(patched, 2)  # blocks 1 and 4: both carry patches
            out = forward(ours, dtype)
            again = forward(patched, dtype)  # the LoRA MODEL after the clone: its layers re-patched by ComfyUI
            twice = forward(ours, dtype)
            unpatched = forward(base, dtype)  # ComfyUI unpatches for the plain MODEL
            ok[dtype_name] = (len(added) == 3, not equal(plain, stock), equal(stock, out), equal(stock, again),
                              equal(stock, twice), equal(plain, unpatched), sorted(handle.offloaded) == [1, BLOCKS - 1])
        return all(all(v) for v in ok.values()), ok
    check("lora/patched-weights-are-what-moves", lora)

    def bytes_vs_planner():
        detail = {}
        ok = True
        for fmt, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            ours, handle = comfy_blockswap.install(load(sd, dtype), 2)
            forward(ours, dtype)
            rows = handle.swap.placement()
            predicted = planner_block_bytes({**dit_worker.CONFIG, "num_layers": BLOCKS}, fmt)
            host = [r["host_bytes"] for r in rows if r["offloaded"]]
            device = [r["device_bytes"] for r in rows if not r["offloaded"]]
            within = all(abs(b - predicted) <= 0.10 * predicted for b in host + device)
            shape_ok = (len(host) == 2 and len(device) == BLOCKS - 2
                        and all(r["device_bytes"] == 0 for r in rows if r["offloaded"])
                        and all(r["host_bytes"] == 0 for r in rows if not r["offloaded"]))
            ok = ok and within and shape_ok
            detail[fmt] = {"predicted per block": predicted, "host bytes (offloaded)": host,
                           "device bytes (resident)": device}
        return ok, detail
    check("bytes/per-block-vs-planner-within-10pct", bytes_vs_planner)

    def stock_model_after_swap():
        # the input MODEL sampled after the swap's clone (ComfyUI detaches the clone without unloading the
        # model): the blocks are back as ordinary tensors and the stock MODEL gives the reference again
        ours, handle = comfy_blockswap.install(base32, 3)
        a = forward(ours, torch.float32)
        b = forward(base32, torch.float32)
        slots = sum(len(v) for v in handle.swap._slots.values())
        c = forward(ours, torch.float32)
        return (equal(reference, a) and equal(reference, b) and equal(reference, c) and slots == 0
                and handle.last_report["forwards"] == 2), {"slots after detach": slots}
    check("detach/stock-model-runs-after-the-clone", stock_model_after_swap)

    def gguf():
        import gguf as gguf_lib
        import gguf_helpers as gh

        from h3director.integrations import comfy_gguf

        saved = dit_worker.CONFIG
        dit_worker.CONFIG = gh.CONFIG
        try:
            sd_g = gh.comfy_state_dict(h3)
            path = os.path.join(tmp, "swap-q8.gguf")
            gh.write_gguf(path, sd_g, gguf_lib.GGMLQuantizationType.Q8_0)
            stock = forward(comfy_gguf.load_gguf_dit(path, dtype=torch.float32), torch.float32)
            model = comfy_gguf.load_gguf_dit(path, dtype=torch.float32)
            ours, handle = comfy_blockswap.install(model, 2)
            both, dit = comfy_dit.install(ours, ffn_chunks=2)
            out = forward(both, torch.float32)
            fc1 = model.model.diffusion_model.blocks[1].mlp.fc1
            slot_dtypes = sorted({str(s.host.dtype) for s in handle.swap._slots[1]})
        finally:
            dit_worker.CONFIG = saved
        return (equal(stock, out) and fc1.weight.dtype == torch.uint8 and "torch.uint8" in slot_dtypes
                and handle.last_report["onloads"] == 2), {"slot dtypes": slot_dtypes, "report": handle.last_report}
    check("compose/gguf-quantised-bytes-move", gguf)

    def refusals():
        def wrappers(p):
            return repr(p.wrappers), repr(p.callbacks)
        before = wrappers(base32)
        messages = {}
        for label, count in (("too many", BLOCKS + 1), ("negative", -1)):
            try:
                comfy_blockswap.install(base32, count)
                messages[label] = None
            except InvalidInputError as error:
                messages[label] = str(error)
        other = comfy.model_patcher.ModelPatcher(torch.nn.Linear(2, 2), torch.device("cpu"), torch.device("cpu"))
        try:
            comfy_blockswap.install(other, 1)
            messages["other model"] = None
        except InvalidInputError as error:
            messages["other model"] = str(error)
        try:
            BlockSwapNode.execute(model=base32, blocks_offloaded=BLOCKS + 1)
            messages["node"] = None
        except InvalidInputError as error:
            messages["node"] = str(error)
        ok = (all(messages.values()) and f"has {BLOCKS} DiT blocks" in messages["too many"]
              and "out of range" in messages["negative"] and "H3Director Block Swap" in messages["other model"]
              and f"has {BLOCKS} DiT blocks" in messages["node"] and wrappers(base32) == before)
        return ok, messages
    check("refuse/bad-counts-before-loading", refusals)

    def node():
        out = BlockSwapNode.execute(model=base32, blocks_offloaded=2)
        patched = out.args[0] if hasattr(out, "args") else out[0]
        text = out.ui["text"][0] if isinstance(out.ui, dict) else str(out.ui)
        handle = comfy_blockswap.installed_handle(patched)
        result = forward(patched, torch.float32)
        return (handle is not None and handle.count == 2 and comfy_blockswap.installed_handle(base32) is None
                and "2 of 5 DiT blocks offloaded" in text and "exact by construction" in text
                and equal(reference, result)), text
    check("node/installs-and-reports", node)
    return results


if __name__ == "__main__":
    emit("H3SWAP-RESULTS", run_checks(sys.argv[1], sys.argv[2]))
