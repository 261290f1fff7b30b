"""Upscale seams: tiled vs untiled on small random-init spandrel models, CPU float32.

For each model (RRDB/ESRGAN x4, ESRGAN x2 with pixel-unshuffle, RealESRGAN Compact x2; random init at small widths,
built by fixtures/comfy_harness/upscale_models.py), one random frame is upscaled untiled (the spandrel descriptor on the
whole frame) and tiled with `h3director.video.upscale.TiledUpscaler` at a tile that cuts it into several tiles:

- auto: overlap = the receptive field derived from the layers, each tile keeps only its centre (the exact path);
- overlap 0: the same cores, no context (plain tiling: the seam);
- feather: the same regions as auto, blended with linear ramps instead of cropped (the approximate path).

Max abs difference against the untiled output, values in [0, 1]. Also the receptive field derived vs measured with
the one-pixel probe. Needs spandrel (so torchvision): run it with the ComfyUI environment's Python:

    PYTHONPATH=. .comfy/venv/bin/python bench/upscale_seams.py [--height 96 --width 160] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "comfy_harness"))

CONFIGS = {"esrgan_x4": 96, "esrgan_x2_unshuffle": 120, "compact_x2": 48, "plksr_x2": 64,
           "realplksr_x2": 64}   # model -> tile (input px)


def measure(name: str, tile: int, height: int, width: int) -> dict:
    import spandrel
    import upscale_models

    from h3director.integrations.spandrel_models import from_descriptor
    from h3director.video.upscale import TiledUpscaler, resolve_overlap
    from h3director.video.upscale_field import measure_field

    descriptor = spandrel.ModelLoader().load_from_state_dict(upscale_models.build(name).state_dict()).eval()
    model = from_descriptor(descriptor)
    frame = torch.rand(3, height, width, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        reference = descriptor(frame[None])[0]
    overlap, _, exact = resolve_overlap(model, "auto", tile)

    def diff(overlap_px: int, crop: bool) -> tuple[float, int]:
        tiled = TiledUpscaler(model, height, width, tile, overlap_px, crop)
        out = tiled.upscale(0, frame).clamp(0, 1)
        return float((out - reference).abs().max()), len(tiled.plan)

    auto, tiles = diff(overlap, exact)       # the path stream_upscale takes: centre crop only when exact
    return {"model": name, "arch": type(descriptor.model).__name__, "scale": model.scale,
            "params": sum(p.numel() for p in descriptor.model.parameters()), "alignment": model.alignment,
            "field_derived": model.receptive_field,
            "field_measured": measure_field(model.call, model.scale, alignment=model.alignment) if exact else None,
            "exact": exact, "tile": tile, "overlap": overlap, "tiles": tiles, "auto": auto,
            "overlap0": diff(0, True)[0], "feather": diff(overlap, False)[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=96)
    parser.add_argument("--width", type=int, default=160)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = [measure(name, tile, args.height, args.width) for name, tile in CONFIGS.items()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"frame {args.width}x{args.height}, CPU float32, torch {torch.__version__}")
    print("| model | field derived / measured (px) | tile / overlap (px) | tiles | max abs diff, auto "
          "| overlap 0 (no context) | feathered blend, same overlap |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        field = f"{r['field_derived']} / {r['field_measured']}" if r["exact"] else "not derivable"
        path = "centre crop" if r["exact"] else "feathered, not exact"
        print(f"| {r['model']} ({r['arch']} {r['scale']}x, {r['params']:,} params) | {field} | {r['tile']} / "
              f"{r['overlap']} | {r['tiles']} | {r['auto']:.2e} ({path}) | {r['overlap0']:.2e} | {r['feather']:.2e} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
