"""Quantised H3 block on a CUDA GPU, side by side: ComfyUI's stock block, H3 Director's tiers, KJNodes' H3 nodes.

    COMFYUI_DIR=/path/to/ComfyUI python bench/gpu/dit_quantised_kjnodes.py [--out results.json]
        [--kjnodes PATH] [--rows 8192] [--chunks 4x8] [--layouts bf16 int8_tensorwise fp8_e4m3fn nvfp4 mxfp8]
        [--smoke]

The GPU counterpart of bench/dit_quantised_vs_kjnodes.py (same block, same setups, same code:
`bench/_comfy_block.py` and that bench's `run_layout`): one block of H3's DiT at its released width in ComfyUI
(hidden 5376, 56 x 128 heads, FFN 14336), its qkv / out / fc1 / fc2 in each layout, built with the operations
ComfyUI picks on this GPU (`comfy.ops.pick_operations`): a layout whose kernel the card has runs natively
(int8_tensorwise everywhere ComfyUI's int8 path runs; fp8 from SM 8.9; nvfp4 and mxfp8 on SM 10+), one it has
not runs ComfyUI's fallback (weight dequantised per call; "emulated" in the results). Per layout: stock, the
director's `run_block` at each `--chunks` (head groups x FFN chunks), and KJNodes' `MiniMaxLowVRAMAttention` +
`MiniMaxChunkFeedForward` at the same counts when a KJNodes checkout is given (`--kjnodes`, else
$KJNODES_DIR, else `.kjnodes/` in the repository: carry it there for a lent machine; without one those rows
are left out and the JSON says so).

"peak" is `torch.cuda.max_memory_allocated` during the call above what was allocated before it (the caching
allocator's view: weights and input excluded, weights dequantised inside the call included); "wall" the call's
time after one warm-up call of the same setup (CUDA synchronised); "output" `torch.equal` against the stock block
of the same layout, else the largest absolute difference. A layout that fails to build or run is recorded with
its error and the rest still run.

Without a GPU it says so and exits 2; `--smoke` runs the same steps at toy widths on the CPU (the plumbing).
Writes JSON to --out (else $OUT/dit_quantised_kjnodes.json, else ./dit_quantised_kjnodes.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def cuda_measure(call, x):
    """(peak bytes above what was allocated before, seconds of a second call, output of the first call)."""
    import torch

    fresh = x.clone()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with torch.inference_mode():
        out = call(fresh)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        out = out.detach().clone()
        fresh = x.clone()
        torch.cuda.synchronize()
        start = time.perf_counter()
        call(fresh)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
    del fresh
    return int(peak), wall, out


def default_kjnodes() -> Path | None:
    for candidate in (os.environ.get("KJNODES_DIR"), REPO / ".kjnodes"):
        if candidate and Path(candidate, "nodes", "minimax_nodes.py").is_file():
            return Path(candidate)
    return None


def main(argv=None) -> int:
    import dit_quantised_vs_kjnodes as bench

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--kjnodes", type=Path, default=None)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--chunks", type=bench.parse_chunks, nargs="+", default=[(4, 8)])
    parser.add_argument("--layouts", nargs="+", default=["bf16", "int8_tensorwise", "fp8_e4m3fn", "nvfp4", "mxfp8"])
    parser.add_argument("--smoke", action="store_true", help="toy widths on the CPU (the plumbing, no GPU numbers)")
    args = parser.parse_args(argv)
    out_path = args.out or Path(os.environ.get("OUT") or ".") / "dit_quantised_kjnodes.json"
    import torch
    from _comfy_block import LAYOUTS, KJNodes, import_comfy

    unknown = [layout for layout in args.layouts if layout not in LAYOUTS]
    if unknown:
        parser.error(f"unknown layouts {unknown}; known: {list(LAYOUTS)}")
    if not args.smoke and not torch.cuda.is_available():
        print("dit_quantised_kjnodes: no CUDA GPU here (use --smoke for the CPU plumbing)", file=sys.stderr)
        return 2
    device = "cpu" if args.smoke else "cuda"
    shape, time_embed = (bench.SMOKE_SHAPE, bench.SMOKE_TIME_EMBED) if args.smoke else (bench.SHAPE, bench.TIME_EMBED)
    rows = 300 if args.smoke else args.rows
    h3 = import_comfy(cpu=args.smoke)
    kj_path = args.kjnodes or default_kjnodes()
    record = {"bench": "dit_quantised_kjnodes", "smoke": args.smoke, "device": device, "rows": rows,
              "chunks": [f"{h}x{f}" for h, f in args.chunks], "torch": torch.__version__,
              "platform": platform.platform(), "gpu": torch.cuda.get_device_name(0) if device == "cuda" else None,
              "capability": list(torch.cuda.get_device_capability(0)) if device == "cuda" else None,
              "kjnodes": str(kj_path) if kj_path else None, "results": [], "errors": {}}
    with tempfile.TemporaryDirectory(prefix="h3-kjnodes-") as work:
        kjnodes = KJNodes(kj_path, Path(work) / "custom_nodes") if kj_path else None
        for layout in args.layouts:
            try:
                record["results"] += bench.run_layout(
                    h3, layout, shape, time_embed, rows, args.chunks, kjnodes,
                    seq_threshold=256 if args.smoke else 4096, device=device,
                    measure=bench.measure if args.smoke else cuda_measure)
            except Exception as error:  # one layout's failure (no kernel, no memory) must not lose the rest
                record["errors"][layout] = f"{type(error).__name__}: {error}"
                print(f"  {layout}: failed: {traceback.format_exc()[-1500:]}", flush=True)
            if device == "cuda":
                torch.cuda.empty_cache()
    if record["results"]:
        summary = bench.peaks_table(record["results"])
        print(" | ".join(summary["columns"]))
        for row in summary["rows"]:
            print(" | ".join(row))
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(f"wrote {out_path}")
    return 0 if record["results"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
