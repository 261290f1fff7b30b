"""`h3director plan --width W --height H --frames N (--vram 24GB --ram 64GB | --device auto) [--json]`.

Accepted ranges (refused with a specific message otherwise): width and height multiples of 32 up to
4096 pixels, frames on the 17n+5 grid from 5 to 86,399 (one hour at 24 fps), `--dit-layers` 1 to 100.
A CPU-only budget (`--device auto` without CUDA or MPS, or `--device cpu`) is planned as one memory,
with the text encoder on the CPU and PyTorch's composite (unfused) RMSNorm.
`--devices cuda:0=24GB,cuda:1=12GB` places the components across devices instead (plan/placement.py).
`--workflow` and `--staged` (the plan writes the workflow; staged generation): plan_workflow.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from h3director.commands import plan_workflow
from h3director.units import parse_size

HELP = "Predict H3's memory per phase for a resolution and length, and recommend settings that fit."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `h3director plan`'s options to `parser` (its argparse sub-parser)."""
    parser.add_argument("--width", type=int, required=True, help="video width in pixels (multiple of 32, <= 4096)")
    parser.add_argument("--height", type=int, required=True, help="video height in pixels (multiple of 32, <= 4096)")
    parser.add_argument("--frames", type=int, required=True,
                        help="frame count on the 17n+5 grid, 5 to 86,399 (e.g. 124, 362)")
    parser.add_argument("--vram", default=None, help="accelerator memory, e.g. 24GB (read as GiB, as cards are sold)")
    parser.add_argument("--ram", default=None, help="host RAM for this job, e.g. 64GB (default: available RAM)")
    parser.add_argument("--device", default=None,
                        help="'auto' (or cuda, cuda:N, mps, cpu): read the budget from this machine")
    parser.add_argument("--weights", default=None,
                        help="fix the DiT weights format (bf16, fp8, int8, int8_convrot, nvfp4, q8_0, q6_k, q5_k, "
                             "q4_k_m, q4_k; int8, int8_convrot and nvfp4 load in ComfyUI only)")
    parser.add_argument("--compute-capability", default=None, metavar="MAJOR.MINOR",
                        help="with --vram: the CUDA card's compute capability (e.g. 8.9, 12.0); it decides whether "
                             "nvfp4 weights run their own kernel (10.0 and up). Unknown: the costlier path is "
                             "priced. --device auto reads it")
    parser.add_argument("--refs", type=int, default=0, help="reference images packed into the sequence")
    parser.add_argument("--keyframes", type=int, default=0, help="keyframe images (one latent frame each)")
    parser.add_argument("--text-tokens", type=int, default=None, help="prompt tokens (default 512)")
    parser.add_argument("--dit-layers", type=int, default=None,
                        help="DiT blocks, 1 to 100 (default 50; the published 'pruned' checkpoints are about 30)")
    parser.add_argument("--no-audio", action="store_true", help="no audio output: the audio VAE is not loaded and its decode is not planned (H3 still samples its audio rows)")
    parser.add_argument("--attention", default="flash", choices=("flash", "efficient", "sage", "math"),
                        help="attention kernel (default flash / memory-efficient SDPA)")
    parser.add_argument("--margin", type=float, default=0.10, help="safety margin as a fraction (default 0.10)")
    parser.add_argument("--devices", default=None,
                        help="place the components on several devices, e.g. cuda:0=24GB,cuda:1=12GB, or 'auto' "
                             "(every CUDA device's free memory); replaces --vram/--device; host RAM from --ram")
    parser.add_argument("--placement-policy", default=None, choices=("auto", "resident", "phased"),
                        help="with --devices: components stay loaded (resident), are loaded per phase (phased), "
                             "or the better of both (auto, default)")
    parser.add_argument("--target", default=None, choices=("comfyui", "diffusers"),
                        help="where the settings run: ComfyUI nodes (default) or the diffusers library; only "
                             "settings with a node or call there are recommended, each printed with it")
    parser.add_argument("--json", action="store_true", help="print JSON for machines")
    plan_workflow.add_arguments(parser)


def _request(args: argparse.Namespace):
    from h3director.plan.estimate import DEFAULT_TEXT_TOKENS, PlanRequest

    return PlanRequest(
        width=args.width, height=args.height, frames=args.frames, weights=args.weights or "bf16",
        refs=args.refs, keyframes=args.keyframes + (1 if args.image else 0),
        text_tokens=DEFAULT_TEXT_TOKENS if args.text_tokens is None else args.text_tokens,
        audio=not args.no_audio, attention=args.attention,
        dit_config=None if args.dit_layers is None else {"num_layers": args.dit_layers},
    )


def _budget(args: argparse.Namespace):
    from h3director.errors import InvalidInputError
    from h3director.plan.machine import detect_budget
    from h3director.plan.recommend import Budget

    if not 0 <= args.margin < 1:
        raise InvalidInputError(f"--margin must be in [0, 1), got {args.margin}")
    ram = parse_size(args.ram, binary_gb=True) if args.ram else None
    if args.vram is None:
        if args.device is None:
            raise InvalidInputError("give a budget: --vram SIZE (and --ram SIZE), or --device auto")
        if args.compute_capability is not None:
            raise InvalidInputError("--compute-capability goes with --vram; --device reads the card's own")
        budget, source = detect_budget(args.device, host_bytes=ram)
        return dataclasses.replace(budget, margin=args.margin), source
    if ram is None:
        import psutil

        ram = int(psutil.virtual_memory().available)
    vram = parse_size(args.vram, binary_gb=True)
    capability = _compute_capability(args.compute_capability)
    return (Budget(vram, ram, "cuda", margin=args.margin, compute_capability=capability),
            f"given: {args.vram} accelerator" + (f" (compute capability {args.compute_capability})" if capability
                                                 else "") + f", {ram / 2**30:.1f} GiB RAM")


def _compute_capability(text: str | None) -> tuple[int, int] | None:
    """"8.9" -> (8, 9); None -> None; `InvalidInputError` for anything else."""
    from h3director.errors import InvalidInputError

    if text is None:
        return None
    major, dot, minor = text.strip().partition(".")
    if not (dot and major.isdigit() and minor.isdigit() and int(major) < 100 and int(minor) < 100):
        raise InvalidInputError(f"--compute-capability must be MAJOR.MINOR, e.g. 8.9 or 12.0, got {text!r}")
    return int(major), int(minor)


def run(args: argparse.Namespace) -> int:
    """Estimate the request in `args` and print the plan and recommendation (text or `--json`), or write the
    workflow/script it names; returns 0. Raises InvalidInputError for a bad size, frame count, budget or
    option mix, before any estimate."""
    from h3director.plan.estimate import estimate
    from h3director.plan.recommend import recommend

    request = _request(args)
    request.validate()
    plan_workflow.check_args(args)
    if args.devices is not None:
        return _run_devices(args, request)
    if args.placement_policy is not None:
        from h3director.errors import InvalidInputError

        raise InvalidInputError("--placement-policy places components across devices: give it with --devices")
    budget, source = _budget(args)
    request = dataclasses.replace(request, target=args.target, device=budget.device,
                                  compute_capability=budget.compute_capability)
    if budget.device == "cpu":       # no accelerator: the text encoder runs on the CPU, RMSNorm unfused
        request = dataclasses.replace(request, text_encoder_device="cpu", fused_norms=False)
    formats = plan_workflow.formats(args)
    if args.staged:
        return plan_workflow.run_staged(args, request, budget, source, formats)
    as_asked = estimate(request)
    advice = recommend(request, budget, formats=formats, target=args.target)
    written = plan_workflow.write_outputs(args, advice)
    if args.json:
        out = as_asked.to_dict()
        out["budget"] = {"source": source, "device": budget.device, "device_bytes": budget.device_bytes,
                         "host_bytes": budget.host_bytes, "margin": budget.margin}
        out["recommendation"] = advice.to_dict()
        out["recommendation"]["phases"] = advice.estimate.to_dict()["phases"]
        out["written"] = written
        print(json.dumps(out, indent=2))
        return 0
    geo = as_asked.geometry
    print(f"H3 {request.width}x{request.height}, {request.frames} frames -> {geo.latent_frames} latent frames x "
          f"{geo.tokens_per_latent_frame} tokens = {geo.video_tokens:,} video tokens; packed sequence "
          f"{geo.packed_tokens:,} = {geo.text_rows} text + {geo.cond_rows} cond + {geo.audio_rows} audio + "
          f"{geo.video_tokens:,} video")
    print(f"Budget: {source}")
    where = {"cpu": "everything on the CPU, one memory", "mps": "everything on the accelerator, unified memory"}
    print(f"\nAs asked ({request.weights}, {where.get(budget.device, 'everything on the accelerator')}):")
    print(as_asked.summary_table())
    print("\n" + advice.summary())
    print("\nRecommended settings, per phase:")
    print(advice.estimate.summary_table())
    print(f"\nPool (h3_config.yaml pre_allocated_pool_mb): {advice.pool_mb} MB; {advice.pool_note}")
    for note in as_asked.notes:
        print(f"note: {note}")
    for line in written:
        print(line)
    return 0


def _auto_devices():
    """`--devices auto`: every CUDA device with its free memory now (`torch.cuda.mem_get_info`)."""
    import torch

    from h3director.errors import InvalidInputError
    from h3director.plan.placement import DeviceSpec

    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        raise InvalidInputError("--devices auto: no CUDA device here; give DEVICE=SIZE entries, e.g. cuda:0=24GB")
    return tuple(DeviceSpec(f"cuda:{i}", int(torch.cuda.mem_get_info(i)[0])) for i in range(torch.cuda.device_count()))


def _run_devices(args: argparse.Namespace, request) -> int:
    """`--devices`: place the text encoder, the DiT and the VAEs across the devices (plan/placement.py)."""
    from h3director.errors import InvalidInputError
    from h3director.plan.estimate import estimate
    from h3director.plan.formats import weight_format
    from h3director.plan.placement import parse_devices, place

    if args.vram is not None or args.device is not None or args.compute_capability is not None:
        raise InvalidInputError("--devices replaces --vram, --device and --compute-capability: give one of them")
    if not 0 <= args.margin < 1:
        raise InvalidInputError(f"--margin must be in [0, 1), got {args.margin}")
    devices = _auto_devices() if args.devices.strip().lower() == "auto" else parse_devices(args.devices)
    if args.ram:
        host = parse_size(args.ram, binary_gb=True)
        source = f"given: {args.devices}, {host / 2**30:.1f} GiB RAM"
    else:
        import psutil

        host = int(psutil.virtual_memory().available)
        source = f"given: {args.devices}; host RAM {host / 2**30:.1f} GiB available"
    from h3director.plan import capabilities

    if args.weights:
        capabilities.check_offered(weight_format(args.weights).name, args.target)
    formats = [args.weights] if args.weights else list(capabilities.dit_formats(args.target))
    placement = place(request, devices, host_bytes=host, margin=args.margin, formats=formats,
                      policy=args.placement_policy or "auto")
    if args.json:
        out = estimate(request).to_dict()
        out["budget"] = {"source": source, "devices": {d.name: d.capacity_bytes for d in devices},
                         "host_bytes": host, "margin": args.margin}
        out["placement"] = placement.to_dict()
        print(json.dumps(out, indent=2))
        return 0
    geo = estimate(request).geometry
    print(f"H3 {request.width}x{request.height}, {request.frames} frames -> {geo.latent_frames} latent frames x "
          f"{geo.tokens_per_latent_frame} tokens = {geo.video_tokens:,} video tokens; packed sequence "
          f"{geo.packed_tokens:,}")
    print(f"Budget: {source}\n")
    print(placement.summary())
    return 0


__all__ = ["HELP", "add_arguments", "run"]
