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
        [--tile 512] [--device cpu|cuda] [--json] [--out results.json]
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
    parser.add_argument("--tile", type=int, default=512)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--folder", default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", default=None, help="also write the results as JSON here")
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
    rows = []
    for name, extra in variants.items():
        out = folder / f"{name.replace(' ', '_')}.npy"
        report = _run(clip, model, out, extra, args.tile, args.device)
        model_stage = next(s for s in report["stages"] if s["name"] == "model")
        rows.append({"variant": name, "options": " ".join(extra) or "(none)", "seconds": report["seconds"],
                     "model_seconds": model_stage["seconds"], "peak_host_bytes": report["peak_host_bytes"],
                     "model_peak_host_bytes": model_stage["peak_host_bytes"],
                     "model_peak_device_bytes": model_stage["peak_device_bytes"],
                     "tiles_per_frame": report["tiles_per_frame"], "dtype_error": report["dtype_error"],
                     "stages": report["stages"], "output": str(out)})
    recipe = np.load(folder / "recipe.npy", mmap_mode="r").astype(np.int16)
    fp16 = np.load(folder / "recipe_fp16_x4.npy", mmap_mode="r").astype(np.int16)
    difference = np.abs(recipe - fp16)
    comparison = {"max_uint8_levels": int(difference.max()), "mean_uint8_levels": float(difference.mean())}
    results = {"clip": f"{args.frames} frames {args.size} uint8", "model": f"Compact x1 num_feat={args.feat} "
               f"num_conv={args.conv} (random init)", "tile": args.tile, "device": args.device, "rows": rows,
               "fp16_x4_vs_fp32_recipe_output": comparison}
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=2))
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    full = rows[0]
    print(f"{results['clip']}, {results['model']}, tile {args.tile}, device {args.device}")
    print("| variant | options | seconds | model stage s | time / full | process peak (VmHWM) | peak / full | "
          "model stage host peak | model stage device peak |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        device = "n/a (CPU)" if r["model_peak_device_bytes"] is None else f"{r['model_peak_device_bytes'] / MIB:.0f} MiB"
        print(f"| {r['variant']} | {r['options']} | {r['seconds']:.2f} | {r['model_seconds']:.2f} | "
              f"{r['seconds'] / full['seconds']:.3f} | {r['peak_host_bytes'] / MIB:.0f} MiB | "
              f"{r['peak_host_bytes'] / full['peak_host_bytes']:.3f} | {r['model_peak_host_bytes'] / MIB:.0f} MiB | "
              f"{device} |")
    error = rows[2]["dtype_error"]
    print(f"fp16 x4 vs fp32 (the run's own check, {error['crop']}): max {error['max_abs']:.3g}, "
          f"mean {error['mean_abs']:.3g}; whole output vs the fp32 recipe's: max {comparison['max_uint8_levels']} "
          f"uint8 levels, mean {comparison['mean_uint8_levels']:.4f}")
    if full["model_peak_device_bytes"]:
        print(f"device peak recipe / full: {rows[1]['model_peak_device_bytes'] / full['model_peak_device_bytes']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
