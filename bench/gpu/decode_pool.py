"""The slot pool on a GPU: the caching allocator's slack (reserved minus allocated) with and without it.

    python bench/gpu/decode_pool.py [--frames 362] [--size 640x384] [--dtype bf16] [--out results.json] [--smoke]

One streaming decode of the same seeded latents through the real diffusers H3 VAE (`tiny_h3_vae()`: the
real `AutoencoderKLMiniMaxH3` with a small decoder, so the per-clip buffers, not the weights, dominate)
on `cuda`, in four settings, each in a fresh caching-allocator state (`empty_cache`, peak stats reset):

- level 0: the model's own whole-video decode (`reference_decode`);
- level 2, `pre_allocated_pool_mb: 0`: streaming, per-clip buffers from PyTorch's caching allocator;
- level 1 and level 2 with a 1 GiB pool of 64 MiB slots: the per-clip buffers leased from the pool.

Recorded per setting: `max_memory_allocated`, `max_memory_reserved`, the slack `memory_reserved -
memory_allocated` sampled after every clip (mean and max: the fragmentation the pool is there to cut),
the decode report's leases, fallbacks and collections, wall time, and the frames' SHA-256 digests, which
must agree across the four settings (the run fails otherwise). Without a GPU it exits 2; `--smoke` runs
the same steps on the CPU at a small size to check the plumbing (no allocator numbers there).
JSON goes to --out, else $OUT/decode_pool.json, else ./decode_pool.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from h3director.commands.demo_vaes import tiny_h3_vae  # noqa: E402
from h3director.core.config import validate_config  # noqa: E402
from h3director.geometry import latent_frames_for  # noqa: E402
from h3director.integrations.diffusers_h3 import H3VideoAdapter  # noqa: E402
from h3director.video.levels import decode_for_level  # noqa: E402
from h3director.video.sinks.digest import DigestSink  # noqa: E402

SETTINGS = {
    "level 0 (reference)": {"memory_optimization_level": 0},
    "level 2, no pool": {"memory_optimization_level": 2, "pre_allocated_pool_mb": 0},
    "level 1, 1 GiB pool": {"memory_optimization_level": 1, "pre_allocated_pool_mb": 1024, "pool_slot_mb": 64},
    "level 2, 1 GiB pool": {"memory_optimization_level": 2, "pre_allocated_pool_mb": 1024, "pool_slot_mb": 64},
}


def _slack(device: torch.device) -> int:
    return torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def run(setting: str, adapter, latents, device) -> dict:
    config = validate_config({**SETTINGS[setting], "memory_safety": {"enabled": False}}, env={})
    cuda = device.type == "cuda"
    slack: list[int] = []
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)

    def on_progress(*_args, **_kwargs):
        if cuda:
            slack.append(_slack(device))

    sink = DigestSink()
    start = time.perf_counter()
    with torch.no_grad():
        report = decode_for_level(adapter, latents, sink, config=config, on_progress=on_progress)
    if cuda:
        torch.cuda.synchronize(device)
    result = {"setting": setting, "wall_s": time.perf_counter() - start, "path": report.path,
              "digest": sink.uint8_digests, "notes": list(report.notes)}
    buffers = getattr(report, "buffers", None)
    if buffers is not None:
        result.update(pool_leases=buffers.pool_leases, pool_fallbacks=buffers.pool_fallbacks,
                      collections=buffers.collections)
    if cuda:
        result.update(peak_allocated_bytes=torch.cuda.max_memory_allocated(device) - base,
                      peak_reserved_bytes=torch.cuda.max_memory_reserved(device),
                      slack_mean_bytes=int(sum(slack) / len(slack)) if slack else None,
                      slack_max_bytes=max(slack) if slack else None, slack_samples=len(slack))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, default=362)
    parser.add_argument("--size", default="640x384")
    parser.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--smoke", action="store_true", help="small CPU run: plumbing only")
    args = parser.parse_args()
    if args.smoke:
        device, args.frames, args.size = torch.device("cpu"), 39, "128x128"
    elif not torch.cuda.is_available():
        print("decode_pool.py needs a CUDA device (use --smoke for a CPU plumbing check)", file=sys.stderr)
        return 2
    else:
        device = torch.device("cuda")
    width, height = (int(v) for v in args.size.lower().split("x"))
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    vae = tiny_h3_vae().to(device=device, dtype=dtype).eval()
    latents = torch.randn((1, 24, latent_frames_for(args.frames), height // 16, width // 16),
                          generator=torch.Generator().manual_seed(0)).to(device=device, dtype=dtype)
    adapter = H3VideoAdapter(vae)
    results = [run(setting, adapter, latents, device) for setting in SETTINGS]
    digests = {tuple(r.pop("digest")) for r in results}
    summary = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "torch": torch.__version__, "frames": args.frames, "size": args.size, "dtype": args.dtype,
               "identical_frames": len(digests) == 1, "results": results}
    out = args.out or Path(os.environ.get("OUT", ".")) / "decode_pool.json"
    out.write_text(json.dumps(summary, indent=1))
    for r in results:
        print(json.dumps(r))
    print(f"identical frames across settings: {summary['identical_frames']}; wrote {out}")
    return 0 if summary["identical_frames"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
