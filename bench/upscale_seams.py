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

Writes bench/results/upscale_seams.json (`--out`): tables `seams` and `full_size` (the receptive field of released sizes), figures
`exact` and `upscale_md` (README,
UPSCALE.md, BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures" / "comfy_harness"))

from _results import table, table_markdown, write_results  # noqa: E402

SOURCES = ("h3director/video/upscale.py", "h3director/video/upscale_field.py",
           "h3director/integrations/spandrel_models.py", "fixtures/comfy_harness/upscale_models.py")

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


FULL_SIZE = {   # released sizes, random init: only the receptive field is derived
    "ESRGAN x4, 23 blocks, 64 filters": ("ESRGAN", dict(in_nc=3, out_nc=3, num_filters=64, num_blocks=23, scale=4)),
    "RealESRGAN Compact x4, 64 features, 32 convolutions (realesr-general-x4v3's size)":
        ("Compact", dict(num_in_ch=3, num_out_ch=3, num_feat=64, num_conv=32, upscale=4)),
}


def full_size_fields() -> dict[str, int]:
    """The derived receptive field (input px) of full-size configurations, through spandrel and `from_descriptor`."""
    import spandrel
    from spandrel.architectures.Compact import Compact
    from spandrel.architectures.ESRGAN import ESRGAN

    from h3director.integrations.spandrel_models import from_descriptor

    classes = {"ESRGAN": ESRGAN, "Compact": Compact}
    fields = {}
    for label, (arch, kwargs) in FULL_SIZE.items():
        net = classes[arch](**kwargs).eval()
        descriptor = spandrel.ModelLoader().load_from_state_dict(net.state_dict()).eval()
        fields[label] = from_descriptor(descriptor).receptive_field
    return fields


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--height", type=int, default=96)
    parser.add_argument("--width", type=int, default=160)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "upscale_seams.json")
    args = parser.parse_args()
    torch.set_num_threads(2)
    rows = [measure(name, tile, args.height, args.width) for name, tile in CONFIGS.items()]
    body = []
    for r in rows:
        field = f"{r['field_derived']} / {r['field_measured']}" if r["exact"] else "not derivable"
        path = "centre crop" if r["exact"] else "feathered, not exact"
        body.append([f"{r['model']} ({r['arch']} {r['scale']}x, {r['params']:,} params)", field,
                     f"{r['tile']} / {r['overlap']}", r["tiles"], f"{r['auto']:.2e} ({path})", f"{r['overlap0']:.2e}",
                     f"{r['feather']:.2e}"])
    seams = table(["model", "field derived / measured (px)", "tile / overlap (px)", "tiles", "max abs diff, auto",
                   "overlap 0 (no context)", "feathered blend, same overlap"], body,
                  f"One random {args.width}x{args.height} frame, CPU float32, torch {torch.__version__}: max abs "
                  "difference of the tiled output to the untiled one (values in [0, 1]); \"measured\" is the one-pixel "
                  "probe, a lower bound of the field.")
    exact = [r for r in rows if r["exact"]]
    figures = {"exact": f"at most {max(r['auto'] for r in exact):.0e} on {len(exact)} random-init spandrel models "
                        f"(CPU float32) against {min(r['overlap0'] for r in exact):.0e} or more with plain tiling"}
    plain = [r["overlap0"] for r in exact]
    feathered = [r["feather"] for r in exact]
    figures["upscale_md"] = (
        f"with auto overlap the tiled frame differs from the untiled one by at most {max(r['auto'] for r in exact):.0e} "
        f"(values in [0, 1]) on random-init {', '.join(r['model'] for r in exact)}; without context (overlap 0) by "
        f"{min(plain):.1e} to {max(plain):.1e}, feathered with the same overlap by {min(feathered):.1e} to "
        f"{max(feathered):.1e}"
        + "".join(f"; {r['model']}, feathered (not exact): {r['auto']:.1e}" for r in rows if not r["exact"]))
    fields = full_size_fields()
    full = table(["configuration (random init)", "derived receptive field (input px)", "exact tiles larger than (px)"],
                 [[label, field, 2 * field + 1] for label, field in fields.items()],
                 "The field is derived from the layers (`from_descriptor(...).receptive_field`); a tile must be larger "
                 "than twice the overlap.")
    write_results(args.out, "upscale_seams", {"height": args.height, "width": args.width},
                  {"rows": rows, "full_size_fields": fields, "tables": {"seams": seams, "full_size": full},
                   "figures": figures}, sources=SOURCES)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(table_markdown(seams))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
