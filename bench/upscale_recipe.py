"""Restoring at a lower resolution: pre-resize -> restore -> Lanczos back, against restoring at full size.

One clip (a moving gradient with texture, uint8 `.npy`, default 1920x1080) and one random-init real spandrel
architecture (RealESRGAN Compact at scale 1, a restoration model; `--feat`/`--conv` set its size) go through
`h3director upscale`, each variant in a fresh process, one after another in the same run:

- full:    restore every frame at the clip's size;
- recipe:  `--pre-resize` to half each side (area), restore there, `--post-resize` back (Lanczos);
- recipe fp16 x4: the same with `--dtype fp16 --tile-batch 4` (its output is compared with the fp32 recipe's).

Recorded per variant, from the run's report: wall time of the streaming loop (`seconds`, model loading excluded),
the model stage's time, the process's peak resident set (VmHWM, fresh process), each stage's host peak and, on CUDA,
each stage's device peak (`torch.cuda.max_memory_allocated`, reset per stage). Ratios are recipe / full from the
same run. Runs in the ComfyUI environment (spandrel needs torchvision):

    .comfy/venv/bin/python bench/upscale_recipe.py [--frames 2] [--size 1920x1080] [--feat 32] [--conv 8]
        [--tile 512 [1920 ...]] [--device cpu|cuda] [--json] [--out results.json]

Each `--tile` runs the three variants (one table each). Writes bench/results/upscale_recipe.json (`--out`): tables
`tile_<TILE>`, figure `summary` (UPSCALE.md, BENCHMARKS.md); `rows` and `fp16_x4_vs_fp32_recipe_output` are the first
tile's (bench/gpu/upscale_recipe.py reads them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MIB = 2 ** 20
sys.path.insert(0, str(REPO / "bench"))
from _results import table, table_markdown, write_results  # noqa: E402

SOURCES = ("h3director/video/upscale.py", "h3director/video/upscale_stages.py", "h3director/video/upscale_tiles.py",
           "h3director/video/upscale_sources.py", "h3director/video/resize.py", "h3director/commands/upscale.py",
           "h3director/integrations/spandrel_models.py")


def _clip(path: Path, frames: int, width: int, height: int) -> None:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    texture = np.random.default_rng(0).integers(0, 32, (height, width, 3)).astype(np.float32)
    pictures = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(frames, height, width, 3))
    for index in range(frames):
        shift = 5 * index
        base = np.stack([(x + shift) % width / width, (y + shift) % height / height,
                         ((x + y + 2 * shift) % (width + height)) / (width + height)], -1) * 210
        pictures[index] = np.clip(base + texture, 0, 255).astype(np.uint8)
    pictures.flush()
    del pictures


def _model(path: Path, feat: int, conv: int) -> None:
    import safetensors.torch
    import torch
    from spandrel.architectures.Compact import Compact

    torch.manual_seed(0)
    net = Compact(num_in_ch=3, num_out_ch=3, num_feat=feat, num_conv=conv, upscale=1).eval()
    safetensors.torch.save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))


def _run(clip: Path, model: Path, out: Path, extra: list[str], tile: int, device: str) -> dict:
    command = [sys.executable, "-m", "h3director", "upscale", str(clip), "--model", str(model), "--out", str(out),
               "--tile", str(tile), "--device", device, "--json", *extra]
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}")
    return json.loads(result.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=2)
    parser.add_argument("--size", default="1920x1080", help="clip WxH (even)")
    parser.add_argument("--feat", type=int, default=32, help="Compact num_feat")
    parser.add_argument("--conv", type=int, default=8, help="Compact num_conv")
    parser.add_argument("--tile", type=int, nargs="+", default=[512])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--folder", default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "upscale_recipe.json"),
                        help="results JSON (bench/_results.write_results)")
    args = parser.parse_args()

    width, height = (int(v) for v in args.size.lower().split("x"))
    folder = Path(args.folder or tempfile.mkdtemp(prefix="h3-upscale-recipe-"))
    folder.mkdir(parents=True, exist_ok=True)
    clip, model = folder / "clip.npy", folder / "compact_x1.safetensors"
    _clip(clip, args.frames, width, height)
    _model(model, args.feat, args.conv)
    half = f"{width // 2 // 2 * 2}x{height // 2 // 2 * 2}"
    variants = {
        "full": [],
        "recipe": ["--pre-resize", half, "--post-resize", args.size],
        "recipe fp16 x4": ["--pre-resize", half, "--post-resize", args.size, "--dtype", "fp16", "--tile-batch", "4"],
    }
    by_tile = {tile: _variants(folder, clip, model, variants, tile, args.device) for tile in args.tile}
    first = by_tile[args.tile[0]]
    results = {"clip": f"{args.frames} frames {args.size} uint8", "model": f"Compact x1 num_feat={args.feat} "
               f"num_conv={args.conv} (random init)", "tile": args.tile, "device": args.device,
               "rows": first["rows"], "fp16_x4_vs_fp32_recipe_output": first["comparison"],
               "by_tile": {str(tile): run for tile, run in by_tile.items()}}
    tables = {f"tile_{tile}": _table(run, results, tile) for tile, run in by_tile.items()}
    summary = "; ".join(
        f"tile {tile}: recipe {run['rows'][1]['seconds'] / run['rows'][0]['seconds']:.3f}x the time of restoring at "
        f"full size, process peak {run['rows'][1]['peak_host_bytes'] / run['rows'][0]['peak_host_bytes']:.3f}x; "
        f"fp16 x4 vs the fp32 recipe at most {run['comparison']['max_uint8_levels']} uint8 step(s) "
        f"(mean {run['comparison']['mean_uint8_levels']:.3f})" for tile, run in by_tile.items())
    summary = f"{results['clip']}, {results['model']}, {args.device}: {summary}"
    write_results(args.out, "upscale_recipe", {k: v for k, v in vars(args).items() if k not in ("out", "folder", "json")},
                  {**results, "tables": tables, "figures": {"summary": summary}}, sources=SOURCES)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    for tile in by_tile:
        print(table_markdown(tables[f"tile_{tile}"]))
        print()
    print(summary)
    return 0


def _variants(folder: Path, clip: Path, model: Path, variants: dict, tile: int, device: str) -> dict:
    """The variants at one tile size, each in a fresh process: their report rows and the fp16 output's difference."""
    rows = []
    for name, extra in variants.items():
        out = folder / f"{name.replace(' ', '_')}_{tile}.npy"
        report = _run(clip, model, out, extra, tile, device)
        model_stage = next(s for s in report["stages"] if s["name"] == "model")
        rows.append({"variant": name, "options": " ".join(extra) or "(none)", "seconds": report["seconds"],
                     "model_seconds": model_stage["seconds"], "peak_host_bytes": report["peak_host_bytes"],
                     "model_peak_host_bytes": model_stage["peak_host_bytes"],
                     "model_peak_device_bytes": model_stage["peak_device_bytes"],
                     "tiles_per_frame": report["tiles_per_frame"], "dtype_error": report["dtype_error"],
                     "stages": report["stages"], "output": str(out)})
    recipe = np.load(folder / f"recipe_{tile}.npy", mmap_mode="r").astype(np.int16)
    fp16 = np.load(folder / f"recipe_fp16_x4_{tile}.npy", mmap_mode="r").astype(np.int16)
    difference = np.abs(recipe - fp16)
    return {"rows": rows, "comparison": {"max_uint8_levels": int(difference.max()),
                                         "mean_uint8_levels": float(difference.mean())}}


def _table(run: dict, results: dict, tile: int) -> dict:
    rows, comparison = run["rows"], run["comparison"]
    full = rows[0]
    body = []
    for r in rows:
        device = "n/a (CPU)" if r["model_peak_device_bytes"] is None else f"{r['model_peak_device_bytes'] / MIB:.0f} MiB"
        body.append([r["variant"], r["options"], f"{r['seconds']:.2f}", f"{r['model_seconds']:.2f}",
                     f"{r['seconds'] / full['seconds']:.3f}", f"{r['peak_host_bytes'] / MIB:.0f} MiB",
                     f"{r['peak_host_bytes'] / full['peak_host_bytes']:.3f}", f"{r['model_peak_host_bytes'] / MIB:.0f} MiB",
                     device])
    error = rows[2]["dtype_error"]
    note = (f"{results['clip']}, {results['model']}, tile {tile} ({rows[0]['tiles_per_frame']} tile(s) per frame at full "
            f"size), device {results['device']}; each variant in a fresh process, one after another; seconds = the "
            "streaming loop (model loading excluded), process peak = VmHWM. fp16 x4 vs fp32 (the run's own check, "
            f"{error['crop']}): max {error['max_abs']:.3g}, mean {error['mean_abs']:.3g}; whole output vs the fp32 "
            f"recipe's: max {comparison['max_uint8_levels']} uint8 levels, mean {comparison['mean_uint8_levels']:.4f}.")
    if full["model_peak_device_bytes"]:
        note += (f" Device peak recipe / full: "
                 f"{rows[1]['model_peak_device_bytes'] / full['model_peak_device_bytes']:.3f}.")
    return table(["variant", "options", "seconds", "model stage s", "time / full", "process peak (VmHWM)",
                  "peak / full", "model stage host peak", "model stage device peak"], body, note)


if __name__ == "__main__":
    raise SystemExit(main())
