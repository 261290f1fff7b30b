"""Runs INSIDE a fresh Python with a real ComfyUI on sys.path: the checks of tests/test_dit_comfy_foreign.py.

H3Director DiT Memory and another pack's patches on the same H3 blocks, in both orders (the other pack's
node before DiT Memory, and after it). The other pack is tests/comfy_harness/foreign_pack (object patches on
`blocks.N.forward` / `.attn.forward` / `.mlp.forward`, or a `patches_replace` entry), loaded as ComfyUI loads a
custom node folder; with `KJNODES_DIR` set to a checkout of ComfyUI-KJNodes, also KJNodes' own H3 nodes
(`MiniMaxChunkFeedForward`, `MiniMaxLowVRAMAttention`, from its `nodes/minimax_nodes.py`).

Usage: python dit_foreign_worker.py COMFYUI_DIR WORK_DIR -> one JSON line {check: {"ok", "detail"}}.

The model is the tiny ComfyUI `MiniMaxH3Model` of tests/comfy_harness/dit_worker.py (2 blocks, 4 heads of 16,
FFN 96; float32, CPU, PyTorch SDPA).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path

from dit_worker import CONFIG, equal, forward, import_comfy, load, tiny_state_dict
from packs import load_pack_module

HERE = Path(__file__).resolve().parent
PLAN = dict(head_chunks=2, ffn_chunks=3)
FOREIGN = "H3TestForeignPack"
DIRECTOR = "H3 Director"


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def run_checks(root: str, work: str) -> dict:
    h3 = import_comfy(root)
    import torch
    from worker_checks import Checks

    from h3director.integrations import comfy_dit

    checks = Checks()
    check = checks.check
    records = Records()
    logging.getLogger(comfy_dit.__name__).addHandler(records)
    pack = load_pack_module(HERE / "foreign_pack", Path(work) / "custom_nodes", FOREIGN)

    sd = tiny_state_dict(h3)
    blocks = CONFIG["num_layers"]
    base = load(sd, torch.float32)
    reference = forward(base, torch.float32)
    counted = {"block": "block", "attention": "attention", "ffn": "ffn", "replace": "replace"}
    # whose code runs each part, per patched part of the foreign pack
    owners = {"block": ("foreign", "foreign"), "replace": ("foreign", "foreign"),
              "attention": ("foreign", DIRECTOR), "ffn": (DIRECTOR, "foreign")}

    def both_orders(part: str, order: str):
        pack.reset()
        if order == "before":       # the other pack's node first, DiT Memory on its MODEL
            ours, handle = comfy_dit.install(pack.patch(base, [part]), **PLAN)
            model = ours
        else:                       # DiT Memory first, the other pack's node on its MODEL
            ours, handle = comfy_dit.install(base, **PLAN)
            model = pack.patch(ours, [part])
        notified = []
        handle.notify = notified.append        # what the node shows as its progress text
        at_install = [p.origin for p in handle.foreign_at_install]
        logged = len(records.messages)
        out = forward(model, torch.float32)
        calls = pack.CALLS[counted[part]]
        report = handle.last_report
        runs = report["runs"]
        expect_attention, expect_ffn = (
            [who] for who in owners[part])
        who_attention = list(runs["attention"])
        who_ffn = list(runs["ffn"])

        def names(owner, expected):
            return (len(owner) == 1 and (FOREIGN in owner[0] if expected == ["foreign"] else owner[0] == DIRECTOR))
        new_logs = records.messages[logged:]
        director_parts = sum(1 for who in (expect_attention, expect_ffn) if who == [DIRECTOR])
        ok = (equal(reference, out) and calls == blocks
              and names(who_attention, expect_attention) and names(who_ffn, expect_ffn)
              and all(FOREIGN in line for line in report["foreign_patches"]) and report["foreign_patches"]
              and any("stepped aside" in line for line in report["skipped"])
              and report["director_blocks"] == (blocks if director_parts else 0)
              and handle.block_calls == (blocks if director_parts else 0)
              and (bool(at_install) and all(FOREIGN in o for o in at_install)) == (order == "before")
              and any(FOREIGN in m and "Who ran what" in m for m in new_logs) and notified == new_logs[-1:])
        return ok, {"calls": calls, "runs": runs, "foreign": report["foreign_patches"], "skipped": report["skipped"],
                    "at_install": at_install, "logs": new_logs, "notified": notified, "block_calls": handle.block_calls}

    for part in ("ffn", "attention", "block", "replace"):
        for order in ("before", "after"):
            check(f"foreign/{part}/{order}", lambda part=part, order=order: both_orders(part, order))

    def replaced_after_reports_missing_entry():
        # a replacement set after DiT Memory takes the block loop's entry: ours never runs for those blocks
        ours, handle = comfy_dit.install(base, **PLAN)
        forward(pack.patch(ours, ["replace"]), torch.float32)
        skipped = handle.last_report["skipped"]
        return (any("did not run for blocks 0-1" in line for line in skipped)
                and handle.last_report["director_blocks"] == 0, skipped)
    check("foreign/replace/after-says-entry-did-not-run", replaced_after_reports_missing_entry)

    def quiet_without_foreign():
        logged = len(records.messages)
        ours, handle = comfy_dit.install(base, **PLAN)
        out = forward(ours, torch.float32)
        report = handle.last_report
        ok = (equal(reference, out) and report["foreign_patches"] == [] and report["skipped"] == []
              and report["runs"] == {"attention": {DIRECTOR: [0, 1]}, "ffn": {DIRECTOR: [0, 1]}}
              and report["director_blocks"] == blocks and len(records.messages) == logged
              and handle.foreign_at_install == [])
        return ok, report
    check("foreign/none-found-nothing-logged", quiet_without_foreign)

    def logged_once_per_change():
        ours, handle = comfy_dit.install(pack.patch(base, ["ffn"]), **PLAN)
        logged = len(records.messages)
        forward(ours, torch.float32)
        forward(ours, torch.float32)
        return len(records.messages) - logged == 1, records.messages[logged:]
    check("foreign/logged-once-while-unchanged", logged_once_per_change)

    def node_text():
        from h3director.comfy.nodes_dit import DiTMemoryNode

        output = DiTMemoryNode.execute(pack.patch(base, ["attention"]), "fixed", 2, 3, 0.0)
        text = output.ui["text"][0]
        return ("other packs' patches" in text and FOREIGN in text and "attn.forward" in text
                and "stepped aside" in text), text
    check("foreign/node-text-names-the-pack", node_text)

    kjnodes = os.environ.get("KJNODES_DIR")
    if kjnodes and Path(kjnodes, "nodes", "minimax_nodes.py").is_file():
        kj = load_pack_module(Path(kjnodes), Path(work) / "custom_nodes", "ComfyUI-KJNodes", "nodes/minimax_nodes.py")
        kj_calls = {"ffn": 0, "attention": 0, "block": 0}
        real = {"ffn": kj.minimax_mlp_chunked_forward, "attention": kj.minimax_attn_lowmem_forward,
                "block": kj.minimax_block_lowmem_forward}

        def counting(part):
            @functools.wraps(real[part])  # keeps KJNodes' module and name: the report names the patch's origin
            def wrapped(*args, **kwargs):
                kj_calls[part] += 1
                return real[part](*args, **kwargs)
            return wrapped
        kj.minimax_mlp_chunked_forward = counting("ffn")          # looked up at call time by its FFN patch
        kj.minimax_attn_lowmem_forward = counting("attention")    # bound by the node when it runs
        kj.minimax_block_lowmem_forward = counting("block")

        def kj_node(name):
            if name == "chunk-ffn":
                return lambda m: kj.MiniMaxChunkFeedForward.execute(m, 2, 256).result[0]
            return lambda m: kj.MiniMaxLowVRAMAttention.execute(m, 2).result[0]

        def kjnodes_case(name: str, order: str):
            apply = kj_node(name)
            alone = forward(apply(base), torch.float32)
            for key in kj_calls:
                kj_calls[key] = 0
            if order == "before":
                model, handle = comfy_dit.install(apply(base), **PLAN)
            else:
                ours, handle = comfy_dit.install(base, **PLAN)
                model = apply(ours)
            out = forward(model, torch.float32)
            report = handle.last_report
            runs = report["runs"]
            ran = kj_calls["ffn"] if name == "chunk-ffn" else kj_calls["block"]
            if name == "chunk-ffn":
                owners_ok = (list(runs["attention"]) == [DIRECTOR] and len(runs["ffn"]) == 1
                             and "ComfyUI-KJNodes" in next(iter(runs["ffn"])))
            else:
                owners_ok = all(len(runs[p]) == 1 and "ComfyUI-KJNodes" in next(iter(runs[p])) for p in runs)
            ok = (ran == blocks and owners_ok and equal(alone, out)
                  and all("ComfyUI-KJNodes" in line for line in report["foreign_patches"]))
            return ok, {"calls": dict(kj_calls), "runs": runs, "foreign": report["foreign_patches"],
                        "skipped": report["skipped"]}
        for name in ("chunk-ffn", "lowvram-attention"):
            for order in ("before", "after"):
                check(f"kjnodes/{name}/{order}", lambda name=name, order=order: kjnodes_case(name, order))
    return checks.results


if __name__ == "__main__":
    from worker_checks import emit

    emit("H3FOREIGN-RESULTS", run_checks(sys.argv[1], sys.argv[2]))
