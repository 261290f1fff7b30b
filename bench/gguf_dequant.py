"""Per-layer GGUF dequantisation at H3's real shapes, and the memory of opening a real GGUF.

    .venv/bin/python bench/gguf_dequant.py [--only speed|memory] [--types Q4_K Q8_0 Q6_K] [--repeats 3]
        [--shape 28672 5376] [--threads 1] [--keep-files DIR]

1. speed: one DiT matrix (default fc1, 28672 x 5376 in ComfyUI's layout: [gate; value] x hidden) of random
   blocks with ordinary float16 scales, dequantised to float32 by
   - the native core through `weights.dequant.dequantize_tensor` into a reused out= buffer (the CPU path),
   - the torch kernels on the CPU (`backend="torch"`, the code the CUDA path runs),
   - `gguf.quants.dequantize` (the reference),
   median of --repeats runs after a warm-up (gguf: one run); every output is checked bit for bit against
   gguf's. Ratios are the result; the absolute times are this machine's.
2. memory: a real GGUF of a few hundred MB written by `h3director weights convert` (a one-block H3 DiT at the
   released widths, bf16 safetensors -> Q8_0), then in a fresh process: RSS before and after
   `open_gguf` (the check: the increase is <= 5% of the file size), and the peak RSS above that while
   dequantising the largest layer into a preallocated buffer (the per-layer peak: one layer's output).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from _gguf_blocks import random_blocks  # noqa: E402
from _results import table, table_markdown, write_results  # noqa: E402
from _timing import median_seconds  # noqa: E402

from h3director import native  # noqa: E402
from h3director.weights.dequant import dequantize_tensor  # noqa: E402

MiB = 1 << 20


def bench_speed(args, figures: dict) -> dict:
    import gguf
    from gguf import quants

    rows, cols = args.shape
    rng = np.random.default_rng(0)
    cells, native_vs_gguf = [], []
    for name in args.types:
        raw = random_blocks(name, rows * cols, rng)
        qtype = gguf.GGMLQuantizationType[name]
        out = torch.empty((rows, cols), dtype=torch.float32)
        start = time.perf_counter()
        ref = quants.dequantize(raw.reshape(rows, -1), qtype)
        t_gguf = time.perf_counter() - start
        t_torch = median_seconds(partial(dequantize_tensor, raw, qtype, (rows, cols), backend="torch"), args.repeats)
        t_native = median_seconds(partial(dequantize_tensor, raw, qtype, (rows, cols), out=out), args.repeats)
        by_torch = dequantize_tensor(raw, qtype, (rows, cols), backend="torch")
        equal = bool(np.array_equal(by_torch.numpy().view(np.uint32), ref.view(np.uint32))
                     and np.array_equal(out.numpy().view(np.uint32), ref.view(np.uint32)))
        del ref, by_torch
        cells.append([name, f"{raw.size / MiB:.0f}", f"{t_gguf:.3f}", f"{t_torch:.3f}", f"{t_native:.4f}",
                      f"{t_gguf / t_torch:.1f}x", f"{t_gguf / t_native:.0f}x", f"{t_torch / t_native:.0f}x", equal])
        native_vs_gguf.append(t_gguf / t_native)
        print("| " + " | ".join(map(str, cells[-1])) + " |", flush=True)
    figures["native_vs_gguf"] = (f"{min(native_vs_gguf):.0f}-{max(native_vs_gguf):.0f}x on one {rows}x{cols} layer "
                                 f"({', '.join(args.types)})")
    return table(["type", "quantised MiB", "gguf.quants (s)", "torch CPU (s)", "native (s)", "torch vs gguf",
                  "native vs gguf", "native vs torch", "bits equal"], cells,
                 note=f"Dequantise one [{rows}, {cols}] matrix ({rows * cols * 4 / MiB:.0f} MiB float32 out) per type; "
                      f"median of {args.repeats} after a warm-up (gguf: 1 run); native backend: {native.backend()}, "
                      f"torch threads: {torch.get_num_threads()}; \"x vs y\" = y's time / x's, same run.")


def _write_block_file(folder: Path) -> Path:
    """A one-block H3 DiT at the released widths (every tensor of ComfyUI's model, so `convert` takes it; time
    embedding width 256 and text width 5120 assumed), bf16 safetensors."""
    from safetensors.torch import save_file

    from h3director.weights.h3_keys import comfy_dit_keys

    g = torch.Generator().manual_seed(0)
    hidden, t_dim = 5376, 256
    shapes = {"video_patch_proj.weight": (hidden, 96), "audio_patch_proj.weight": (hidden, 32),
              "condition_proj.weight": (hidden, 5120), "rope.inv_freq": (64,),
              "time_embedder.proj_in.weight": (512, 256), "time_embedder.proj_in.bias": (512,),
              "time_embedder.proj_out.weight": (t_dim, 512), "time_embedder.proj_out.bias": (t_dim,),
              "final_layer.adaln_proj.linear.weight": (2 * hidden, t_dim),
              "final_layer.adaln_proj.linear.bias": (2 * hidden,), "final_layer.video_out.weight": (96, hidden),
              "final_layer.video_out.bias": (96,), "final_layer.audio_out.weight": (32, hidden),
              "final_layer.audio_out.bias": (32,), "blocks.0.attn.qkv_proj.weight": (21504, hidden),
              "blocks.0.attn.out_proj.weight": (hidden, 7168), "blocks.0.mlp.fc1.weight": (28672, hidden),
              "blocks.0.mlp.fc2.weight": (hidden, 14336), "blocks.0.attn.q_norm.weight": (128,),
              "blocks.0.attn.k_norm.weight": (128,), "blocks.0.adaln_proj.linear.weight": (18 * hidden, t_dim),
              "blocks.0.adaln_proj.linear.bias": (18 * hidden,)}
    state = {}
    for name in sorted(comfy_dit_keys({"blocks.0.norm1.weight"})):
        t = torch.empty(shapes.get(name, (hidden,)), dtype=torch.bfloat16)
        t.normal_(0, 0.02, generator=g)
        state[name] = t
    path = folder / "h3_block.safetensors"
    save_file(state, str(path))
    return path


_CHILD = """
import json, sys, torch
sys.path.insert(0, {bench!r})
from native import current_rss_bytes, reset_peak_rss, vm_hwm_bytes
from h3director.weights.gguf_file import open_gguf
from h3director.weights.dequant import dequantize_tensor
path = {path!r}
import gguf, h3director.weights.dequant  # imports paid before the measurement
before = current_rss_bytes()
f = open_gguf(path)
after = current_rss_bytes()
big = max(f.tensors.values(), key=lambda t: t.nbytes)
out = torch.empty(big.shape, dtype=torch.float32)
out.fill_(0)  # pre-faulted: the output buffer is the caller's
base = current_rss_bytes()
reset_peak_rss()
dequantize_tensor(big, out=out)
peak = vm_hwm_bytes() - base
print(json.dumps(dict(before=before, after=after, name=big.name, shape=list(big.shape), qtype=big.qtype.name,
                      out_bytes=out.numel() * 4, raw_bytes=big.nbytes, peak_extra=peak)))
"""


def bench_memory(args, figures: dict) -> dict:
    folder = Path(args.keep_files) if args.keep_files else Path(tempfile.mkdtemp(prefix="h3-gguf-bench-"))
    folder.mkdir(parents=True, exist_ok=True)
    source = _write_block_file(folder)
    out = folder / "h3_block_q8_0.gguf"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "h3director", "weights", "convert", str(source), "--type", "Q8_0",
                    "--out", str(out)], check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    convert_s = time.perf_counter() - start
    child = subprocess.run([sys.executable, "-c", _CHILD.format(bench=str(ROOT / "bench"), path=str(out))],
                           check=True, capture_output=True, text=True, cwd=ROOT)
    r = json.loads(child.stdout.strip().splitlines()[-1])
    size = out.stat().st_size
    grew = r["after"] - r["before"]
    found = table(["measure", "value"], [
        ["file size", f"{size / MiB:.1f} MiB"],
        ["RSS increase from open_gguf", f"{grew / MiB:.2f} MiB ({100 * grew / size:.2f}% of the file; limit 5%)"],
        ["largest layer", f"{r['name']} {r['shape']} {r['qtype']} ({r['raw_bytes'] / MiB:.0f} MiB quantised)"],
        ["peak RSS above the preallocated out= while dequantising it",
         f"{r['peak_extra'] / MiB:.0f} MiB (the layer's bytes paged in from the map: {r['raw_bytes'] / MiB:.0f} MiB; "
         f"output {r['out_bytes'] / MiB:.0f} MiB, preallocated)"]],
        note=f"Open and dequantise a real GGUF written by `weights convert` (a complete one-block H3 DiT at the "
             f"released widths, bf16 {source.stat().st_size / MiB:.0f} MiB -> Q8_0 {size / MiB:.0f} MiB, convert took "
             f"{convert_s:.0f} s), in a fresh process.")
    figures["open_gguf_rss"] = f"{grew / MiB:.2f} MiB ({100 * grew / size:.2f}% of the file)"
    if not args.keep_files:
        for p in (source, out):
            p.unlink()
        folder.rmdir()
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("speed", "memory"), default=None)
    parser.add_argument("--types", nargs="+", default=["Q4_K", "Q8_0", "Q6_K"])
    parser.add_argument("--shape", nargs=2, type=int, default=[28672, 5376], metavar=("ROWS", "COLS"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (native runs 1 thread)")
    parser.add_argument("--keep-files", default=None, help="folder for the memory section's files (kept)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gguf_dequant.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, torch {torch.__version__}")
    tables, figures = {}, {}
    if args.only in (None, "speed"):
        tables["speed"] = bench_speed(args, figures)
    if args.only in (None, "memory"):
        tables["memory"] = bench_memory(args, figures)
    print()
    for found in tables.values():
        print(table_markdown(found) + "\n")
    write_results(args.out, "gguf_dequant", {k: v for k, v in vars(args).items() if k not in ("keep_files", "out")},
                  {"tables": tables, "figures": figures},
                  sources=("h3director/weights/dequant.py", "h3director/weights/dequant_torch.py",
                           "h3director/weights/gguf_file.py", "h3director/native",
                           "h3director/weights/convert.py"))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
