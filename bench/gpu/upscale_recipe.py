"""Restoring at a lower resolution on a GPU: bench/upscale_recipe.py with `--device cuda`, where the device peaks
exist (each stage's `torch.cuda.max_memory_allocated`, reset per stage) beside the host peaks.

    python bench/gpu/upscale_recipe.py [--size 3840x2160] [--frames 4] [--feat 64] [--conv 16] [--tile 2160]
        [--out results.json] [--smoke]

Default: a 3840x2160 clip, 4 frames, a random-init RealESRGAN Compact x1 of 64 features and 16 convolutions, one
tile per frame (as "restoring at full size" does without tiling), on cuda: full size against pre-resize to
1920x1080 (area) -> restore -> Lanczos back to 3840x2160, and the same in fp16 with a tile batch of 4 (its output
compared with the fp32 recipe's). Needs spandrel and a torchvision that matches torch (the ComfyUI environment, or
pip install 'h3director[upscale]'). Without CUDA it exits 2; `--smoke` runs a small clip on the CPU to check the
plumbing (no device numbers there). JSON goes to --out, else $OUT/upscale_recipe.json, else ./upscale_recipe.json.
Not run in this project's CI (no GPU); see docs/BENCHMARKS.md for whether a run has been recorded.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="3840x2160")
    parser.add_argument("--frames", type=int, default=4)
    parser.add_argument("--feat", type=int, default=64)
    parser.add_argument("--conv", type=int, default=16)
    parser.add_argument("--tile", type=int, default=None, help="tile side (default: the clip's longer side)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--smoke", action="store_true", help="a small CPU run of the same steps")
    args = parser.parse_args()
    import torch

    if args.smoke:
        device, size, frames, feat, conv = "cpu", "128x72", 1, 8, 2
    else:
        if not torch.cuda.is_available():
            print("bench/gpu/upscale_recipe.py needs a CUDA device (use --smoke on a CPU)", file=sys.stderr)
            return 2
        device, size, frames, feat, conv = "cuda", args.size, args.frames, args.feat, args.conv
    tile = args.tile or max(int(v) for v in size.lower().split("x"))
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "upscale_recipe.json")
    command = [sys.executable, str(REPO / "bench" / "upscale_recipe.py"), "--size", size, "--frames", str(frames),
               "--feat", str(feat), "--conv", str(conv), "--tile", str(tile), "--device", device, "--out", str(out)]
    result = subprocess.run(command, cwd=REPO)
    if result.returncode == 0:
        print(f"results: {out}")
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
