"""What a sampling checkpoint costs at H3's real latent size, against a step time derived for a named GPU.

    .venv/bin/python bench/resume_checkpoint_cost.py [--width 1344 --height 768 --frames 124]
        [--repeats 10] [--dir FOLDER] [--gpu-tflops 989] [--out results.json]

Writes bench/results/resume_checkpoint_cost.json (`--out`): table `cost`, figures `setup` and `digest` (RESUME.md,
BENCHMARKS.md).

Payloads are the sampler state `integrations/comfy_resume.py` saves, on the flat packed latent ComfyUI's
sampler runs on (video [1, 24, T, H/16, W/16] plus audio [1, 32, 2, Ta], float32): euler = the latent;
euler_ancestral = the latent and a CPU generator state; dpmpp_2m = the latent and the previous denoised
output. Each is saved as the samplers save it, with `CheckpointStore.save_in_background`, into --dir
(default: a temporary folder under the current directory, i.e. this disk), --repeats times after a
warm-up: "blocked" is how long the sampling thread waits (the host copy), "written" how long until the
file is complete and fsynced on the writer thread (CRC32, serialize, write, fsync, rename, prune to
two); the key's digest of the initial latent (once per run) is timed too.

Step time: the planner has no step-time model, so one is derived from FLOP counts: one H3 DiT forward
(guidance-distilled, one forward per step) at the packed row count of the geometry (text + audio + video
rows, `h3director.geometry`, --text-tokens) with H3's widths (50 blocks, hidden 5376, attention 56 x 128,
SwiGLU FFN 14336: QKV, output projection, FFN GEMMs, and the QK^T and PV products) divided by --gpu-tflops
(default 989: NVIDIA's dense BF16 peak of the H100 SXM). A real step runs below peak, so this step time
is a lower bound and the cost ratios printed are upper bounds. bench/gpu/resume_checkpoint_cost.py
measures both on a GPU instead.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from h3director import geometry  # noqa: E402
from h3director.resume.checkpoint import CheckpointStore, SamplingCheckpoint  # noqa: E402
from h3director.resume.fingerprint import tensor_digest  # noqa: E402

sys.path.insert(0, str(REPO / "bench"))
from _results import table, table_markdown, write_results  # noqa: E402

SOURCES = ("h3director/resume/checkpoint.py", "h3director/resume/fingerprint.py", "h3director/geometry.py")

H3_LAYERS, H3_HIDDEN, H3_ATTENTION, H3_FFN = 50, 5376, 56 * 128, 14336


def h3_forward_flops(rows: int) -> float:
    """Multiply-add FLOPs (2 per MAC) of one H3 DiT forward over `rows` packed rows (GEMMs and attention)."""
    gemm_macs = rows * (H3_HIDDEN * 3 * H3_ATTENTION + H3_ATTENTION * H3_HIDDEN + H3_HIDDEN * 2 * H3_FFN
                        + H3_FFN * H3_HIDDEN)
    attention_macs = 2 * rows * rows * H3_ATTENTION
    return 2.0 * H3_LAYERS * (gemm_macs + attention_macs)


def packed_latent(width: int, height: int, frames: int) -> torch.Tensor:
    """The flat float32 latent ComfyUI's sampler runs on for an H3 AV latent of this geometry."""
    latent_t = geometry.latent_frames_for(frames)
    video = 24 * latent_t * (height // geometry.SPATIAL_RATIO) * (width // geometry.SPATIAL_RATIO)
    audio = geometry.AUDIO_LATENT_CHANNELS * 2 * geometry.audio_latent_frames_for(frames)
    return torch.randn(1, video + audio, generator=torch.Generator().manual_seed(0))


def time_save(store: CheckpointStore, tensors: dict, repeats: int) -> tuple[list[float], list[float]]:
    """(seconds the sampling thread is blocked by `save_in_background`, seconds until the file is durable)
    per repeat, after one warm-up save (folder creation, first-touch pages)."""
    blocked, durable = [], []
    for step in range(repeats + 1):
        store.wait()
        began = time.perf_counter()
        store.save_in_background(SamplingCheckpoint(step=step + 1, total_steps=repeats + 2, key={"bench": "1"},
                                                    tensors=tensors))
        returned = time.perf_counter()
        store.wait()
        done = time.perf_counter()
        assert store.stopped is None, store.stopped
        blocked.append(returned - began)
        durable.append(done - began)
    return blocked[1:], durable[1:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--frames", type=int, default=124)
    parser.add_argument("--text-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--dir", default=".")
    parser.add_argument("--gpu-tflops", type=float, default=989.0)
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "resume_checkpoint_cost.json"))
    args = parser.parse_args(argv)

    x = packed_latent(args.width, args.height, args.frames)
    rows = (geometry.video_tokens(args.width, args.height, args.frames)
            + 2 * geometry.audio_latent_frames_for(args.frames) + args.text_tokens)
    flops = h3_forward_flops(rows)
    step_s = flops / (args.gpu_tflops * 1e12)
    payloads = {"euler": {"latent": x},
                "euler_ancestral": {"latent": x, "generator_state": torch.Generator().manual_seed(1).get_state()},
                "dpmpp_2m": {"latent": x, "old_denoised": x.clone()}}
    result = {"latent_shape": list(x.shape), "latent_bytes": x.numel() * 4, "packed_rows": rows,
              "forward_tflop": round(flops / 1e12, 1), "gpu_tflops": args.gpu_tflops,
              "step_seconds_lower_bound": round(step_s, 3), "samplers": {}}
    began = time.perf_counter()
    for _ in range(args.repeats):
        tensor_digest(x)
    result["key_digest_seconds"] = round((time.perf_counter() - began) / args.repeats, 4)
    with tempfile.TemporaryDirectory(dir=args.dir, prefix=".resume_bench_") as folder:
        for name, tensors in payloads.items():
            store = CheckpointStore(Path(folder) / name)
            blocked, durable = time_save(store, tensors, args.repeats)
            size = sum((Path(folder) / name / p.name).stat().st_size for p in (Path(folder) / name).iterdir())
            result["samplers"][name] = {
                "file_bytes": size // 2,
                "blocked_median_seconds": round(statistics.median(blocked), 4), "blocked_max_seconds": round(max(blocked), 4),
                "durable_median_seconds": round(statistics.median(durable), 4), "durable_max_seconds": round(max(durable), 4),
                "blocked_fraction_of_step": round(statistics.median(blocked) / step_s, 4),
                "durable_fraction_of_step": round(statistics.median(durable) / step_s, 4)}
    body = [[name, f"{row['file_bytes'] / 2**20:.1f} MiB",
             f"{row['blocked_median_seconds'] * 1e3:.1f} ms ({row['blocked_max_seconds'] * 1e3:.1f})",
             f"{row['blocked_fraction_of_step']:.2%}",
             f"{row['durable_median_seconds'] * 1e3:.0f} ms ({row['durable_max_seconds'] * 1e3:.0f})",
             f"{row['durable_fraction_of_step']:.2%}"] for name, row in result["samplers"].items()]
    cost = table(["sampler", "checkpoint file", "sampling thread blocked, median (max)", "of one step",
                  "written and fsynced, median (max)", "of one step"], body,
                 f"{args.width}x{args.height}, {args.frames} frames, {args.repeats} saves per sampler after a warm-up, "
                 f"on this machine's CPU and disk, against one step of {step_s:.2f} s (the FLOP count at "
                 f"{args.gpu_tflops:g} TFLOPS, a lower bound: the fractions are upper bounds).")
    setup = (f"{args.width}x{args.height}, {args.frames} frames (the flat float32 latent ComfyUI samples: "
             f"{x.numel():,} values, {x.numel() * 4 / 2**20:.1f} MiB; {rows:,} packed rows, one forward "
             f"{flops / 1e15:.2f} PFLOP, {step_s:.2f} s at {args.gpu_tflops:g} TFLOPS)")
    digest = f"{result['key_digest_seconds'] * 1e3:.1f} ms"
    print(setup)
    print(f"key digest of the initial latent (once per run): {digest}\n")
    print(table_markdown(cost))
    write_results(args.out, "resume_checkpoint_cost", {k: v for k, v in vars(args).items() if k not in ("out", "dir")},
                  {**result, "tables": {"cost": cost}, "figures": {"setup": setup, "digest": digest}},
                  sources=SOURCES)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
