"""H3 across two or more GPUs: the planner's placement applied to real-architecture components, measured.

    python bench/gpu/multi_gpu_placement.py [--devices cuda:0,cuda:1] [--capacities cuda:0=24GB,cuda:1=12GB]
        [--width 640 --height 352 --frames 124] [--dit-layers 4] [--text-tokens 512] [--out FILE] [--plan-only]

1. Plan: `h3director.plan.placement.place` for the render with the DiT at the released width and `--dit-layers`
   blocks (random weights, bf16; the released VAEs at full size, the audio VAE in float32), policy resident
   (what a diffusers pipeline does), over `--capacities` (default: each device's free memory now).
2. Build the diffusers H3 modular pipeline's t2va denoise and decode blocks over those components (random
   init, seeded), apply the placement (`integrations.diffusers_placement.apply_placement`) and run one
   generation (2 scheduler steps) from seeded random prompt embeddings (`--text-tokens` x 5120: the 32B text
   encoder is NOT instantiated; its predicted bytes are reported but subtracted before comparing).
3. Per device: `torch.cuda.max_memory_allocated` over the run vs the plan's predicted peak (sampling and
   decode, without the text encoder); the video VAE's encoder weights, which diffusers keeps loaded but the
   plan does not count, are reported beside it.
4. If the whole render fits the first device alone (the planner says so) with no DiT block offloaded and the
   same DiT chunking, run it there too and compare the videos and audio with `torch.equal` (exact by
   construction: only placement differs); otherwise the JSON says why it was not run.

With fewer than 2 CUDA devices it exits 2 with a message; `--plan-only` prints the placement and exits (runs
anywhere). JSON goes to --out, else $OUT/multi_gpu_placement.json, else ./multi_gpu_placement.json.
Not run yet: no multi-GPU machine was available when it was written.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from h3director.errors import H3DirectorError  # noqa: E402
from h3director.plan.estimate import PlanRequest  # noqa: E402
from h3director.plan.placement import DeviceSpec, parse_devices, place  # noqa: E402
from h3director.units import parse_size  # noqa: E402

TEXT_DIM = 5120
STEPS = 2


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default=None, help="CUDA devices to use, e.g. cuda:0,cuda:1 (default: all)")
    parser.add_argument("--capacities", default=None,
                        help="plan for these capacities, e.g. cuda:0=24GB,cuda:1=12GB (default: free memory now)")
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=352)
    parser.add_argument("--frames", type=int, default=124)
    parser.add_argument("--dit-layers", type=int, default=4, help="DiT blocks at the released width (default 4)")
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--ram", default="64GB", help="host RAM to plan with (default 64GB)")
    parser.add_argument("--plan-only", action="store_true", help="print the placement and exit")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.capacities:
        parse_devices(args.capacities)                   # refuse a malformed spec before touching a GPU
    return args


def plan(args, devices: list[DeviceSpec]):
    request = PlanRequest(width=args.width, height=args.height, frames=args.frames, text_tokens=args.text_tokens,
                          dit_config={"num_layers": args.dit_layers}, audio=True, vae_dtype="bf16")
    return place(request, devices, host_bytes=parse_size(args.ram, binary_gb=True), formats=["bf16"],
                 policy="resident")


def build_pipeline(args, seed: int = 0):
    import torch
    from diffusers import (
        AutoencoderKLMiniMaxH3,
        AutoencoderKLMiniMaxH3Audio,
        MiniMaxH3Scheduler,
        MiniMaxH3Transformer3DModel,
    )
    from diffusers.modular_pipelines import SequentialPipelineBlocks
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import (
        MiniMaxH3CoreDenoiseStep,
        MiniMaxH3DecodeStep,
    )

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        transformer = MiniMaxH3Transformer3DModel(num_layers=args.dit_layers).to(torch.bfloat16).eval()
        vae = AutoencoderKLMiniMaxH3().to(torch.bfloat16).eval()
        audio_vae = AutoencoderKLMiniMaxH3Audio(latents_mean=[0.0] * 32, latents_std=[1.0] * 32).eval()
    blocks = SequentialPipelineBlocks.from_blocks_dict({"denoise": MiniMaxH3CoreDenoiseStep(),
                                                       "decode": MiniMaxH3DecodeStep()})
    pipe = blocks.init_pipeline()
    pipe.load_components()
    pipe.update_components(transformer=transformer, vae=vae, audio_vae=audio_vae,
                           scheduler=MiniMaxH3Scheduler(shift=12.0), audio_scheduler=MiniMaxH3Scheduler(shift=3.0))
    return pipe


def generate(pipe, args, device) -> dict:
    import torch

    embeds = torch.randn(1, args.text_tokens, TEXT_DIM, generator=torch.Generator().manual_seed(1))
    out = pipe(prompt_embeds=embeds.to(device, pipe.transformer.dtype),
               text_token_tags=torch.ones(args.text_tokens, dtype=torch.long), height=args.height, width=args.width,
               num_frames=args.frames, num_inference_steps=STEPS, generator=torch.Generator().manual_seed(3),
               output_type="pt", output=["videos", "audio"])
    return {k: v.cpu() for k, v in out.items() if v is not None}


def one_device_plan(args, placement, device: DeviceSpec):
    """(plan, None) for the whole render on `device` alone, or (None, why it is not run): it must fit, offload
    no DiT block (this script runs none) and chunk the DiT as `placement` does (so that only where the
    tensors live differs between the two runs compared with torch.equal)."""
    try:
        single = plan(args, [device])
    except H3DirectorError as error:
        return None, f"not run: {error}"
    if single.request.offload_blocks:
        return None, (f"not run: on {device.name} alone the plan offloads {single.request.offload_blocks} DiT "
                      "blocks, which this script does not run")
    chunks = (single.request.head_chunks, single.request.ffn_chunks)
    if chunks != (placement.request.head_chunks, placement.request.ffn_chunks):
        return None, (f"not run: on {device.name} alone the plan chunks the DiT {chunks[0]} head / {chunks[1]} FFN, "
                      f"the placement {placement.request.head_chunks} / {placement.request.ffn_chunks}")
    return single, None


def measure(args, placement, names: list[str]) -> dict:
    import torch

    from h3director.integrations.diffusers_placement import apply_placement

    # A previous run's pipeline is garbage in reference cycles (the placement hooks hold their modules), which
    # `del` does not free: collect it so its tensors are neither counted here nor in the way.
    gc.collect()
    torch.cuda.empty_cache()
    pipe = build_pipeline(args)
    encoder_bytes = sum(p.numel() * p.element_size() for p in pipe.vae.encoder.parameters())
    apply_placement(pipe, placement)
    chunks = (placement.request.head_chunks, placement.request.ffn_chunks)
    if chunks != (1, 1):                                   # the DiT memory tier the plan chose
        from h3director.integrations.diffusers_dit import apply_memory_plan

        apply_memory_plan(pipe.transformer, head_chunks=chunks[0], ffn_chunks=chunks[1])
    for name in names:
        torch.cuda.synchronize(name)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(name)
    base = {name: torch.cuda.memory_allocated(name) for name in names}
    start = time.perf_counter()
    with torch.no_grad():
        result = generate(pipe, args, pipe._execution_device)
    for name in names:
        torch.cuda.synchronize(name)
    wall = time.perf_counter() - start
    te = next(n for n in placement.needs if n.component == "text_encoder")
    rows = []
    for name in names:
        predicted = placement.device_phase_bytes[name]
        te_share = te.weights_bytes if placement.assignment["text_encoder"] == name else 0
        predicted_run = max(predicted["sampling"], predicted["decode"]) - te_share
        measured = torch.cuda.max_memory_allocated(name)
        rows.append({"device": name, "measured_peak_bytes": measured, "resident_before_run_bytes": base[name],
                     "predicted_peak_without_text_encoder_bytes": predicted_run,
                     "video_vae_encoder_bytes_not_planned": encoder_bytes
                     if placement.assignment["video_vae"] == name else 0,
                     "measured_over_predicted": measured / predicted_run if predicted_run else None})
    del pipe
    return {"wall_s": wall, "devices": rows, "result": result}


def main(argv=None) -> int:
    try:
        args = parse_args(argv)
    except H3DirectorError as error:
        print(f"multi_gpu_placement: {error}", file=sys.stderr)
        return 2
    import torch

    count = torch.cuda.device_count()
    if args.plan_only:
        devices = parse_devices(args.capacities or "cuda:0=24GB,cuda:1=12GB")
    else:
        if count < 2:
            print(f"multi_gpu_placement needs at least 2 CUDA devices, found {count}: nothing measured "
                  "(--plan-only prints the placement anywhere)", file=sys.stderr)
            return 2
        names = args.devices.split(",") if args.devices else [f"cuda:{i}" for i in range(count)]
        if args.capacities:
            devices = parse_devices(args.capacities)
        else:
            devices = tuple(DeviceSpec(n, torch.cuda.mem_get_info(torch.device(n))[0]) for n in names)
    try:
        placement = plan(args, list(devices))
    except H3DirectorError as error:
        print(f"multi_gpu_placement: {error}", file=sys.stderr)
        return 2
    summary = {"placement": placement.to_dict(), "args": vars(args)}
    print(placement.summary())
    if not args.plan_only:
        if placement.request.offload_blocks:
            print("multi_gpu_placement: the plan offloads DiT blocks, which this script does not run; use fewer "
                  "--frames or --dit-layers", file=sys.stderr)
            return 2
        names = [d.name for d in devices]
        multi = measure(args, placement, names)
        summary["multi_device"] = {k: v for k, v in multi.items() if k != "result"}
        single, why = one_device_plan(args, placement, devices[0])
        if single is None:
            summary["single_device"] = why
        else:
            one = measure(args, single, [devices[0].name])
            summary["single_device"] = {k: v for k, v in one.items() if k != "result"}
            summary["identical"] = {k: bool(torch.equal(multi["result"][k], one["result"][k])) for k in multi["result"]}
        for row in summary["multi_device"]["devices"]:
            print(f"{row['device']}: measured {row['measured_peak_bytes'] / 2**30:.2f} GiB, predicted "
                  f"{row['predicted_peak_without_text_encoder_bytes'] / 2**30:.2f} GiB (without the text encoder)")
        print("identical to one device:", summary.get("identical", summary.get("single_device")))
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "multi_gpu_placement.json")
    out.write_text(json.dumps(summary, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
