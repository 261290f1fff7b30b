"""`h3director weights inspect|convert|slim|verify`: look into, quantise, extract and check weight files.

- ``inspect FILE [--json] [--vram SIZE [--ram SIZE]]``: what a .safetensors/.gguf holds (header only), and
  with --vram what fits according to the planner;
- ``convert IN.safetensors --type Q8_0 --out OUT.gguf``: streaming GGUF conversion (`weights.convert`);
- ``slim IN --keep dit [vae ...] [--dtype bf16] --out OUT``: component extraction and cast (`weights.slim`);
- ``verify FILE [--against OTHER] [--json]``: header, offsets, per-tensor SHA-256, equality to another file.

Bad input exits 2 with one line (the CLI's error handler); a verification mismatch exits 1.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

from h3director.errors import BudgetError, H3DirectorError, InvalidInputError, missing_package
from h3director.units import format_size, parse_size

HELP = "Inspect, convert (safetensors -> GGUF), slim and verify weight files."
REFERENCE_JOB = (1280, 704, 124)  # the job `inspect --vram` prices by default (width, height, frames)
PLANNER_FORMATS = {"Q8_0": "q8_0", "Q6_K": "q6_k", "Q5_K": "q5_k", "Q4_K": "q4_k", "BF16": "bf16", "F16": "fp16",
                   "F32": "fp32"}
# `weights.convert.TYPES`, spelled out so that building the parser imports nothing (a test keeps them equal)
CONVERT_TYPES = ("Q8_0", "Q6_K", "Q5_K", "Q4_K", "Q4_K_M", "Q5_1", "Q5_0", "Q4_1", "Q4_0", "BF16", "F16", "F32")
RELEASED_HIDDEN = 5376


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `h3director weights`'s options to `parser` (its argparse sub-parser)."""
    sub = parser.add_subparsers(dest="weights_action", metavar="ACTION", required=True)
    p = sub.add_parser("inspect", help="what a .safetensors or .gguf file holds (reads the header only)")
    p.add_argument("file")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.add_argument("--vram", default=None, help="accelerator memory, e.g. 16GB: say what fits")
    p.add_argument("--ram", default=None, help="host RAM for the job, e.g. 64GB (default: available RAM)")
    p.add_argument("--width", type=int, default=REFERENCE_JOB[0], help="job priced with --vram (pixels)")
    p.add_argument("--height", type=int, default=REFERENCE_JOB[1])
    p.add_argument("--frames", type=int, default=REFERENCE_JOB[2], help="frames on the 17n+5 grid")

    p = sub.add_parser("convert", help="safetensors H3 DiT -> GGUF, one tensor in memory at a time")
    p.add_argument("input")
    p.add_argument("--type", required=True, help=f"GGML type or mix: {', '.join(CONVERT_TYPES)} (case-insensitive)")
    p.add_argument("--out", required=True, help="output .gguf")

    p = sub.add_parser("slim", help="extract components of a safetensors checkpoint, optionally cast")
    p.add_argument("input")
    p.add_argument("--keep", nargs="+", required=True, metavar="COMPONENT",
                   help="dit, vae, audio-vae, text-encoder (one or more)")
    p.add_argument("--dtype", default=None, choices=("bf16", "fp16", "fp32"), help="cast floating tensors")
    p.add_argument("--strip-prefix", action="store_true", help="drop model.diffusion_model./vae./... prefixes")
    p.add_argument("--out", required=True, help="output .safetensors")

    p = sub.add_parser("verify", help="header, offsets, SHA-256 per tensor; equality to another file")
    p.add_argument("file")
    p.add_argument("--against", default=None, help="the file this one was made from (or should match)")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    p.add_argument("--hashes", action="store_true", help="list every tensor's SHA-256 in the text output")


def run(args: argparse.Namespace) -> int:
    """Run `weights inspect|convert|slim|verify` on the files in `args`; returns 0, or 1 when `verify` finds a
    mismatch. Raises InvalidInputError for unreadable or malformed files, bad options, or a missing `gguf`
    package."""
    try:
        return {"inspect": _inspect, "convert": _convert, "slim": _slim, "verify": _verify}[args.weights_action](args)
    except H3DirectorError:
        raise
    except OSError as exc:  # unreadable input, full disk ...: one line, no traceback
        raise InvalidInputError(f"{exc.strerror or exc} ({exc.filename or ''})".strip()) from None
    except ImportError as exc:
        raise InvalidInputError(missing_package("h3director weights", f"the {exc.name!r} package", "gguf")) from None


# ---------------------------------------------------------------------------------------------- inspect


def _dit_format(summary: dict) -> str | None:
    """The planner's name for the DiT's format: a ComfyUI quantised file's by its layers
    (`capabilities.comfy_quant_format`), else its dominant matrix type's (None when the planner has no such
    format)."""
    if summary.get("comfy_quant"):
        from h3director.plan.capabilities import comfy_quant_format

        try:
            return comfy_quant_format(summary["comfy_quant"])
        except InvalidInputError:
            return None
    quantised = {t: r for t, r in summary["types"].items() if t not in ("F32", "F16", "BF16")}
    pool = quantised or summary["types"]
    if not pool:
        return None
    main = max(pool, key=lambda t: pool[t]["bytes"])
    if main == "Q4_K" and "Q6_K" in summary["types"]:
        return "q4_k_m"
    return PLANNER_FORMATS.get(main)


def _fits(summary: dict, args: argparse.Namespace) -> dict:
    from h3director.plan import Budget, PlanRequest, recommend

    vram = parse_size(args.vram, binary_gb=True)
    if args.ram:
        ram = parse_size(args.ram, binary_gb=True)
    else:
        import psutil

        ram = psutil.virtual_memory().available
    budget = Budget(vram, ram, "cuda")
    result: dict = {"device_usable_bytes": budget.device_usable, "host_usable_bytes": budget.host_usable}
    dit = summary["dit"]
    if dit is None:
        result["note"] = "no H3 DiT in this file; nothing priced"
        return result
    total = dit["block_bytes"] + dit["outside_blocks_bytes"]
    per_block = dit["block_bytes"] / max(dit["blocks"], 1)
    result["dit_weight_bytes"] = total
    result["dit_resident"] = total <= budget.device_usable
    if not result["dit_resident"]:
        # blocks streamed from host RAM, one block's buffer on the device while it runs
        excess = total + dit["largest_block_bytes"] - budget.device_usable
        needed = math.ceil(excess / per_block) if per_block else None
        result["offload_blocks"] = needed if needed is not None and needed <= dit["blocks"] else None
        result["offload_host_bytes"] = None if result["offload_blocks"] is None else \
            int(result["offload_blocks"] * per_block)
        if result["offload_host_bytes"] is not None and result["offload_host_bytes"] > budget.host_usable:
            result["offload_blocks"] = result["offload_host_bytes"] = None  # the offloaded blocks do not fit RAM
    from h3director.plan.formats import FORMATS

    fmt = _dit_format(summary)
    if fmt not in FORMATS or dit["hidden"] != RELEASED_HIDDEN:
        result["planner"] = ("not priced: the planner models the released DiT widths and formats "
                             f"{', '.join(sorted(set(PLANNER_FORMATS.values()) & set(FORMATS)))}; this file is "
                             f"{fmt or 'another format'} at hidden {dit['hidden']}")
        return result
    request = PlanRequest(args.width, args.height, args.frames, weights=fmt, dit_config={"num_layers": dit["blocks"]})
    try:
        advice = recommend(request, budget, formats=[fmt])
        result["planner"] = {"job": f"{args.width}x{args.height}, {args.frames} frames", "format": fmt,
                             **advice.to_dict()}
    except (BudgetError, InvalidInputError) as exc:     # InvalidInputError: no ComfyUI loader for the format
        result["planner"] = {"job": f"{args.width}x{args.height}, {args.frames} frames", "format": fmt,
                             "fits": False, "reason": str(exc)}
    return result


def _inspect(args: argparse.Namespace) -> int:
    from h3director.weights.inspect import summarise

    summary = summarise(args.file)
    if args.vram:
        summary["fits"] = _fits(summary, args)
    elif args.ram:
        raise InvalidInputError("--ram needs --vram (the accelerator memory to price)")
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(_inspect_text(summary))
    return 0


def _inspect_text(s: dict) -> str:
    lines = [f"{s['path']}: {s['format']}, architecture {s['architecture'] or '(none)'}, {s['tensors']:,} tensors, "
             f"{s['params']:,} parameters, {format_size(s['bytes'])}"]
    if s.get("refused"):
        lines.append(f"  refused by the H3 loaders: {s['refused']}")
    lines.append("components:")
    for name, row in s["components"].items():
        lines.append(f"  {name:<13} {row['tensors']:>6,} tensors {row['params']:>16,} params  {format_size(row['bytes'])}")
    lines.append("types:")
    for name, row in s["types"].items():
        lines.append(f"  {name:<13} {row['tensors']:>6,} tensors {row['params']:>16,} params  {format_size(row['bytes'])}")
    dit = s["dit"]
    if dit:
        lines.append(f"DiT: {dit['reason']}; hidden {dit['hidden']}, largest block "
                     f"{format_size(dit['largest_block_bytes'])}, outside the blocks "
                     f"{format_size(dit['outside_blocks_bytes'])}")
    fits = s.get("fits")
    if fits:
        lines.append(f"fits (device usable {format_size(fits['device_usable_bytes'])}, host usable "
                     f"{format_size(fits['host_usable_bytes'])}):")
        if "note" in fits:
            lines.append(f"  {fits['note']}")
        else:
            if fits["dit_resident"]:
                lines.append(f"  DiT weights {format_size(fits['dit_weight_bytes'])}: resident on the device")
            elif fits.get("offload_blocks") is not None:
                lines.append(f"  DiT weights {format_size(fits['dit_weight_bytes'])}: not resident; offload "
                             f"{fits['offload_blocks']} blocks ({format_size(fits['offload_host_bytes'])} in RAM)")
            else:
                lines.append(f"  DiT weights {format_size(fits['dit_weight_bytes'])}: do not fit the device and "
                             "host RAM together, even with blocks offloaded")
            planner = fits["planner"]
            if isinstance(planner, str):
                lines.append(f"  planner: {planner}")
            elif planner.get("fits"):
                lines.append(f"  planner ({planner['job']}, {planner['format']}): fits, peak device "
                             f"{format_size(planner['peak_device_bytes'])}, host {format_size(planner['peak_host_bytes'])}; "
                             f"settings {json.dumps(planner['settings'], default=str)}")
            else:
                lines.append(f"  planner ({planner['job']}, {planner['format']}): does not fit: {planner['reason']}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- convert


def _convert(args: argparse.Namespace) -> int:
    from h3director.core.atomic_file import check_output_path
    from h3director.weights.convert import convert
    from h3director.weights.h3_keys import LOADERS

    out = check_output_path(args.out, (".gguf",), "weights convert")

    def progress(done: int, total: int, item) -> None:
        if sys.stderr.isatty():
            print(f"\r{done}/{total} {item.out_name[:60]:<60}", end="", file=sys.stderr, flush=True)

    plan = convert(args.input, out, args.type, progress=progress)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    by_out: dict[str, list[int]] = {}
    for item in plan.tensors:
        row = by_out.setdefault(f"{item.out_type} ({item.reason})", [0, 0])
        row[0] += 1
        row[1] += item.nbytes
    print(f"wrote {out}: {len(plan.tensors)} tensors, {format_size(sum(t.nbytes for t in plan.tensors))}, "
          f"{plan.key_style} keys, {'pruned' if plan.curve_form else 'unpruned'}")
    for name, (count, nbytes) in by_out.items():
        print(f"  {count:>6} tensors  {format_size(nbytes):>10}  {name}")
    if plan.dropped:
        print(f"  left out (not the DiT): {len(plan.dropped)} tensors, {format_size(sum(plan.dropped.values()))}")
    print(f"  loads with {LOADERS}")
    return 0


# ---------------------------------------------------------------------------------------------- slim


def _slim(args: argparse.Namespace) -> int:
    from h3director.core.atomic_file import check_output_path
    from h3director.weights.slim import slim

    out = check_output_path(args.out, (".safetensors",), "weights slim")
    result = slim(args.input, out, args.keep, args.dtype, strip_prefix=args.strip_prefix)
    print(f"wrote {out}")
    for label, rows in (("kept", result.kept), ("dropped", result.dropped)):
        for component, (count, source_bytes, written) in rows.items():
            extra = f" -> {format_size(written)}" if label == "kept" and written != source_bytes else ""
            print(f"  {label:<7} {component:<13} {count:>6} tensors  {format_size(source_bytes)}{extra}")
    if result.cast:
        print(f"  cast {result.cast} tensors to {args.dtype}")
    return 0


# ---------------------------------------------------------------------------------------------- verify


def _verify(args: argparse.Namespace) -> int:
    from h3director.weights.verify import summary_line, verify

    report = verify(args.file, args.against)
    if args.json:
        print(json.dumps({
            "path": report.path, "format": report.kind, "against": report.against, "ok": report.ok,
            "checked": len(report.tensors), "tensors": [vars(t) for t in report.tensors], "only_here": report.only_here,
            "only_there": report.only_there}, indent=2))
    else:
        print(summary_line(report))
        for t in report.tensors:
            if args.hashes or not t.ok:
                diff = "" if t.max_abs_diff is None else f" (max |diff| {t.max_abs_diff:.3g})"
                print(f"  {t.sha256}  {t.type:<5} {t.name}  {t.status}{diff}")
        for name in report.only_here:
            print(f"  only in {args.file}: {name}")
        for name in report.only_there:
            print(f"  only in {args.against}: {name}")
    return 0 if report.ok else 1


__all__ = ["CONVERT_TYPES", "HELP", "add_arguments", "run"]
