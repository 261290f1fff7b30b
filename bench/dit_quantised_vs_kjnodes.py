"""Quantised H3 block, side by side in one run: ComfyUI's stock block, H3 Director's tiers and KJNodes' H3 nodes.

    .venv/bin/python bench/dit_quantised_vs_kjnodes.py --kjnodes PATH [--rows 8192] [--chunks 4x8]
        [--layouts int8_tensorwise fp8_e4m3fn bf16] [--threads 2] [--out FILE] [--smoke]

One block of H3's DiT at its released width (hidden 5376, 56 heads x 128, SwiGLU FFN 14336, AdaLN over 2688) in
the vendored ComfyUI ($COMFYUI_DIR, else .comfy/ComfyUI), built as ComfyUI builds a quantised H3 file on this
device (`bench/_comfy_block.py`: `comfy.ops.pick_operations` with the layer quantisation detected from the state
dict): qkv, out, fc1 and fc2 in the layout, everything else bf16. On the CPU, int8_tensorwise runs its own kernel
(comfy_kitchen's eager int8 matmul, activations quantised per row) and fp8 runs ComfyUI's fallback (the weight
dequantised to bf16 on each call); bf16 is the unquantised block. Per layout, in one process, back to back:

- stock: ComfyUI's `DiTBlock.forward`;
- director HxF: `h3director.integrations.comfy_dit.run_block` with H head groups and F FFN row chunks (what the
  H3Director DiT Memory node runs per block; its `kept_stock` notes say which projections kept their stock call);
- kjnodes HxF: KJNodes' `MiniMaxLowVRAMAttention` (H head chunks) and `MiniMaxChunkFeedForward` (F chunks) from the
  checkout `--kjnodes` names, loaded as a custom node folder, their object patches set on the block as ComfyUI's
  `ModelPatcher` sets them (`bench/_comfy_block.py:KJNodes`). Without `--kjnodes` these rows are left out.

Under `torch.inference_mode()` (ComfyUI's executor's), PyTorch SDPA attention, `--threads` CPU threads. "peak" is
`LiveBytesTracker`'s exact peak of tensor storage made inside the block call (the block's input and weights
excluded; weights dequantised inside the call count), "wall" the same call's time (noisy on a shared machine: only
the ratios within one layout, run back to back, mean much). "output" compares with the stock block of the same
layout: `torch.equal`, else the largest absolute difference. Results: bench/results/dit_quantised_vs_kjnodes.json
(`bench/_results.py`; tables `peaks`, figures per layout), unless `--out`. `--smoke`: toy widths, 300 rows (the
plumbing, for tests), written only to `--out`.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from _comfy_block import KJNodes, block_inputs, build_block, import_comfy  # noqa: E402
from _results import table, write_results  # noqa: E402

from h3director.dit.tiers import DiTMemoryPlan  # noqa: E402
from h3director.plan.activations import DiTShape  # noqa: E402
from h3director.plan.live_bytes import LiveBytesTracker  # noqa: E402

BENCH = "dit_quantised_vs_kjnodes"
SHAPE = DiTShape()            # the released widths
TIME_EMBED = 2688
SMOKE_SHAPE = DiTShape(hidden=256, heads=4, head_dim=128, ffn=512)   # rope needs head_dim 128
SMOKE_TIME_EMBED = 64
MIB = 2 ** 20


def parse_chunks(text: str) -> tuple[int, int]:
    """"4x8" -> (4 head groups, 8 FFN chunks)."""
    try:
        heads, ffn = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"chunks look like 4x8 (head groups x FFN chunks), got {text!r}") from None
    if heads < 1 or ffn < 1:
        raise argparse.ArgumentTypeError(f"chunk counts must be >= 1, got {text!r}")
    return heads, ffn


def measure(call, x) -> tuple[int, float, torch.Tensor]:
    """(peak bytes made inside `call(x_copy)`, its seconds, its output), on a fresh copy of `x` (the block
    updates its input in place)."""
    fresh = x.clone()
    with torch.inference_mode():
        tracker = LiveBytesTracker()
        start = time.perf_counter()
        with tracker:
            out = call(fresh)
        wall = time.perf_counter() - start
    out = out.detach().clone()
    del fresh
    gc.collect()
    return tracker.peak_bytes, wall, out


def compare(out: torch.Tensor, stock: torch.Tensor) -> tuple[bool, float]:
    equal = bool(torch.equal(out, stock))
    return equal, 0.0 if equal else float((out.float() - stock.float()).abs().max())


def run_layout(h3, layout: str, shape: DiTShape, time_embed: int, rows: int, chunks: list[tuple[int, int]],
               kjnodes: KJNodes | None, seq_threshold: int = 4096, device="cpu", measure=measure) -> list[dict]:
    """Every setup on one block of `layout` on `device`; one dict per setup. `seq_threshold`: KJNodes' FFN node
    chunks only above this many rows (its default, 4096). `measure(call, x)` -> (peak bytes, seconds, output)."""
    from h3director.integrations.comfy_dit import run_block

    block, path = build_block(h3, shape, time_embed, layout, device)
    x, t_emb, segments, rope = block_inputs(h3, rows, shape.hidden, time_embed, device)
    results = []

    def record(setup: str, describe: str, peak: int, wall: float, out, stock_out, kept=()):
        equal, diff = compare(out, stock_out)
        row = {"layout": layout, "path": path, "rows": rows, "setup": setup, "describe": describe,
               "peak_bytes": int(peak), "wall_s": round(wall, 3), "equal": equal, "max_abs_diff": diff,
               "kept_stock": sorted(kept)}
        results.append(row)
        print(f"  {layout} ({path}) {setup}: peak {peak / MIB:,.1f} MiB, {wall:.1f} s, "
              f"{'equal' if equal else f'max diff {diff:.3g}'}{'; kept stock: ' + '; '.join(sorted(kept)) if kept else ''}",
              flush=True)

    peak, wall, stock_out = measure(lambda v: block(v, t_emb, segments, rope, transformer_options={}), x)
    record("stock", "ComfyUI stock block", peak, wall, stock_out, stock_out)
    for heads, ffn in chunks:
        plan = DiTMemoryPlan(head_chunks=heads, ffn_chunks=ffn)
        kept: set[str] = set()
        peak, wall, out = measure(lambda v, plan=plan, kept=kept: run_block(block, plan, v, t_emb, segments, rope, {},
                                                                             kept), x)
        record(f"director {heads}x{ffn}", f"H3 Director: {plan.describe()}", peak, wall, out, stock_out, kept)
        del out
        if kjnodes is not None:
            with kjnodes.patched(block, heads, ffn, seq_threshold) as options:
                peak, wall, out = measure(lambda v, options=options: block(v, t_emb, segments, rope,
                                                                           transformer_options=options), x)
            record(f"kjnodes {heads}x{ffn}", f"KJNodes: {heads} head chunks + {ffn} FFN chunks", peak, wall, out,
                   stock_out)
            del out
    return results              # the block and its outputs go with this frame


def peaks_table(results: list[dict]) -> dict:
    rows = []
    for r in results:
        stock = next(s for s in results if s["layout"] == r["layout"] and s["setup"] == "stock")
        rows.append([r["layout"], r["path"], f"{r['rows']:,}", r["describe"], f"{r['peak_bytes'] / MIB:,.1f}",
                     f"{r['peak_bytes'] / stock['peak_bytes']:.2f}", f"{r['wall_s']:.1f}",
                     f"{r['wall_s'] / stock['wall_s']:.2f}",
                     "torch.equal" if r["equal"] else f"max diff {r['max_abs_diff']:.3g}",
                     "; ".join(r["kept_stock"]) or "-"])
    return table(["layout", "kernel", "rows", "setup", "peak MiB", "x stock", "wall s", "x stock", "output vs stock",
                  "director kept stock"], rows,
                 note="peak: LiveBytesTracker, tensor storage made inside one block call (input and weights "
                      "excluded); x stock: against the stock block of the same layout in the same run; wall: that "
                      "call's time on a shared CPU (ratios only)")


def figures(results: list[dict]) -> dict:
    """One sentence per layout and chunk count: the director's and KJNodes' peaks against stock."""
    out = {}
    for r in results:
        if not r["setup"].startswith("director"):
            continue
        stock = next(s for s in results if s["layout"] == r["layout"] and s["setup"] == "stock")
        chunks = r["setup"].split()[1]
        kj = next((s for s in results if s["layout"] == r["layout"] and s["setup"] == f"kjnodes {chunks}"), None)
        text = (f"{r['layout']} ({r['path']}), {r['rows']:,} rows, {chunks}: director {r['peak_bytes'] / MIB:,.0f} MiB "
                f"= {r['peak_bytes'] / stock['peak_bytes']:.2f}x stock ({stock['peak_bytes'] / MIB:,.0f} MiB)")
        if kj is not None:
            text += f", KJNodes {kj['peak_bytes'] / MIB:,.0f} MiB = {kj['peak_bytes'] / stock['peak_bytes']:.2f}x"
        out[f"{r['layout']}_{chunks}"] = text
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kjnodes", type=Path, help="a checkout of ComfyUI-KJNodes (its H3 nodes run as a third "
                                                     "setup); without it only stock and the director run")
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--chunks", type=parse_chunks, nargs="+", default=[(4, 8)],
                        help="head groups x FFN chunks, for the director and KJNodes alike (default 4x8)")
    parser.add_argument("--layouts", nargs="+", default=["int8_tensorwise", "fp8_e4m3fn", "bf16"],
                        choices=["int8_tensorwise", "fp8_e4m3fn", "fp8_e5m2", "bf16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, help=f"results file (default bench/results/{BENCH}.json)")
    parser.add_argument("--smoke", action="store_true", help="toy widths and 300 rows; needs --out")
    args = parser.parse_args(argv)
    if args.smoke and args.out is None:
        parser.error("--smoke writes only to --out FILE")
    shape, time_embed = (SMOKE_SHAPE, SMOKE_TIME_EMBED) if args.smoke else (SHAPE, TIME_EMBED)
    rows = 300 if args.smoke else args.rows
    for heads, _ in args.chunks:
        if shape.heads % heads:
            parser.error(f"head groups must divide the {shape.heads} heads, got {heads}")
    torch.set_num_threads(args.threads)
    h3 = import_comfy(cpu=True)
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, {args.threads} threads, {rows} rows", flush=True)
    with tempfile.TemporaryDirectory(prefix="h3-kjnodes-") as work:
        kjnodes = KJNodes(args.kjnodes, Path(work) / "custom_nodes") if args.kjnodes else None
        results = []
        for layout in args.layouts:
            results += run_layout(h3, layout, shape, time_embed, rows, args.chunks, kjnodes,
                                  seq_threshold=256 if args.smoke else 4096)
    kj_commit = None
    if kjnodes is not None:
        import subprocess

        probe = subprocess.run(["git", "-C", str(kjnodes.path), "rev-parse", "HEAD"], capture_output=True, text=True)
        kj_commit = probe.stdout.strip() or None
    data = {"rows_measured": results, "threads": args.threads, "kjnodes": {"given": kjnodes is not None,
                                                                            "commit": kj_commit},
            "tables": {"peaks": peaks_table(results)}, "figures": figures(results)}
    out = args.out or REPO / "bench" / "results" / f"{BENCH}.json"
    arguments = {"rows": rows, "chunks": [f"{h}x{f}" for h, f in args.chunks], "layouts": args.layouts,
                 "threads": args.threads, "smoke": args.smoke, "kjnodes": bool(args.kjnodes)}
    write_results(out, BENCH, arguments, data, sources=("bench/_comfy_block.py", "h3director/integrations/comfy_dit.py",
                                                         "h3director/dit"))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
