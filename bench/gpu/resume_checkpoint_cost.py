"""A sampling checkpoint's cost against a measured H3 denoising step on one CUDA GPU.

    COMFYUI_DIR=/path/to/ComfyUI python bench/gpu/resume_checkpoint_cost.py [--out results.json]
        [--width 1344 --height 768 --frames 124] [--layers 50] [--repeats 5] [--dir FOLDER]

Needs a CUDA GPU with room for H3's DiT in bf16 (61.7 GiB: an 80 GB card or larger) and ComfyUI's source
tree (as bench/gpu/dit_12gb.py, whose model builder and step this script reuses: ComfyUI's own
`MiniMaxH3Model`, 50 blocks, random weights, PyTorch SDPA). `--smoke` runs the plumbing at toy widths on
any device. Not run on the build machine (no GPU there); bench/resume_checkpoint_cost.py gives the CPU side.

Measures, into the JSON (--out, else $OUT/resume_checkpoint_cost.json, else ./resume_checkpoint_cost.json):
1. one denoising step = one DiT forward at the geometry (H3 is guidance-distilled: no CFG pass), the median
   of --repeats after a warm-up, CUDA-synchronised;
2. for the sampler state each resumable sampler saves (euler: the latent; euler_ancestral: the latent and the
   CUDA generator's state; dpmpp_2m: the latent and the previous denoised), with the flat float32 latent on
   the GPU as ComfyUI's sampler holds it: how long `CheckpointStore.save_in_background` blocks the sampling
   thread (the device-to-host copy) and how long until the file is written and fsynced in --dir (default:
   a temporary folder under $OUT or the current directory), and both as a fraction of the step.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--frames", type=int, default=124)
    parser.add_argument("--layers", type=int, default=50)
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None)
    parser.add_argument("--smoke", action="store_true", help="toy widths on any device (plumbing check)")
    args = parser.parse_args(argv)

    import dit_12gb
    import torch

    from h3director.resume.checkpoint import CheckpointStore, SamplingCheckpoint

    if args.smoke:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        config, width, height, frames, text_tokens = dict(dit_12gb.SMOKE_CONFIG), 128, 64, 22, 16
    else:
        if not torch.cuda.is_available():
            print("resume_checkpoint_cost: needs a CUDA GPU; --smoke checks the plumbing here", file=sys.stderr)
            return 2
        device = torch.device("cuda", torch.cuda.current_device())
        config, width, height, frames, text_tokens = ({"num_layers": args.layers}, args.width, args.height,
                                                      args.frames, args.text_tokens)
    out_dir = Path(os.environ.get("OUT", "."))
    out_dir.mkdir(parents=True, exist_ok=True)
    out_path = Path(args.out) if args.out else out_dir / "resume_checkpoint_cost.json"
    result: dict = {"argv": sys.argv[1:] if argv is None else argv, "smoke": args.smoke, "device": str(device),
                    "torch": torch.__version__, "python": platform.python_version(), "config": config,
                    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if device.type == "cuda":
        result["device_name"] = torch.cuda.get_device_properties(device).name

    comfy = dit_12gb.import_comfy(cpu=device.type != "cuda", smoke=args.smoke)
    patcher = dit_12gb.build_patcher(comfy, config, device, torch.bfloat16, 0)
    inputs = dit_12gb.make_inputs(config, width, height, frames, text_tokens, 0.9, device, torch.bfloat16, 0)
    result["geometry"] = inputs["geometry"]
    steps = [dit_12gb.step(comfy, patcher, inputs, device)["seconds"] for _ in range(args.repeats + 1)][1:]
    step_s = statistics.median(steps)
    result["step_seconds"] = {"median": step_s, "all": steps}

    latent = torch.cat([t.float().reshape(1, -1) for t in inputs["x"]], dim=1)   # the sampler's flat float32 pack
    generator = torch.Generator(device=device).manual_seed(1)
    payloads = {"euler": {"latent": latent},
                "euler_ancestral": {"latent": latent, "generator_state": generator.get_state()},
                "dpmpp_2m": {"latent": latent, "old_denoised": latent.clone()}}
    result["latent_shape"], result["samplers"] = list(latent.shape), {}
    with tempfile.TemporaryDirectory(dir=args.dir or out_dir, prefix=".resume_bench_") as folder:
        for name, tensors in payloads.items():
            store = CheckpointStore(Path(folder) / name)
            blocked, durable = [], []
            for i in range(args.repeats + 1):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                began = time.perf_counter()
                store.save_in_background(SamplingCheckpoint(step=i + 1, total_steps=args.repeats + 2,
                                                            key={"bench": "1"}, tensors=tensors))
                returned = time.perf_counter()
                store.wait()
                blocked.append(returned - began)
                durable.append(time.perf_counter() - began)
            blocked, durable = blocked[1:], durable[1:]
            result["samplers"][name] = {
                "blocked_median_seconds": statistics.median(blocked), "durable_median_seconds": statistics.median(durable),
                "blocked_fraction_of_step": statistics.median(blocked) / step_s,
                "durable_fraction_of_step": statistics.median(durable) / step_s, "stopped": store.stopped}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
