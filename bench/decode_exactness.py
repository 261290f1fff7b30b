"""Measure what docs/DECODE.md states about decode exactness (tiny configs of the real classes, CPU).

1. Audio decoder receptive field: the derived influence interval (`decoder_influence`) and the
   measured one (perturb one latent frame by +1, find the samples that change), in samples and in
   latent frames, for several frames and seeds.
2. Audio chunked vs full decode: max |difference| for several chunk lengths.
3. H3 video: max |difference| to `vae.decode` for each execution (reference path, streamed tiles,
   batched tiles).

Run: .venv/bin/python bench/decode_exactness.py [--out bench/results/decode_exactness.json]
Prints the tables and writes them to the results file docs/BENCHMARKS.md and docs/DECODE.md render them from.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import torch
from _results import table, table_markdown, write_results

from h3director.commands.demo_vaes import tiny_h3_audio_vae, tiny_h3_vae
from h3director.integrations.diffusers_h3 import H3VideoAdapter, denormalize_video
from h3director.integrations.diffusers_h3_audio import H3AudioAdapter, context_latents, decoder_influence
from h3director.video.scheduler import stream_decode
from h3director.video.sinks import TensorSink

RESULTS = Path(__file__).resolve().parent / "results" / "decode_exactness.json"
SOURCES = ("h3director/integrations/diffusers_h3.py", "h3director/integrations/diffusers_h3_audio.py",
           "h3director/video/scheduler.py", "h3director/video/decoder.py", "h3director/video/sinks.py")


def receptive_field(vae, figures: dict) -> dict:
    hop = vae.hop_length
    first, last = decoder_influence(vae)
    figures["derived_influence"] = (f"samples [{first}, {last}] around its first sample = latent frames "
                                    f"[{first / hop:.2f}, {last / hop:.2f}]")
    figures["context"] = f"{context_latents(vae)} latent frames"
    rows = []
    for seed, frames, frame in ((0, 160, 80), (1, 120, 30), (2, 120, 90)):
        z = torch.randn(1, 32, frames, generator=torch.Generator().manual_seed(seed))
        bumped = z.clone()
        bumped[:, :, frame] += 1.0
        with torch.no_grad():
            delta = (vae.decode(z).sample - vae.decode(bumped).sample).abs()[0, 0]
        changed = delta.nonzero().flatten()
        lo, hi = changed.min().item() - frame * hop, changed.max().item() - frame * hop
        rows.append([seed, frames, frame, lo, hi, f"[{lo / hop:.2f}, {hi / hop:.2f}]"])
    return table(["seed", "latent frames", "perturbed frame", "first changed", "last changed", "in latent frames"], rows,
                 note=f"One latent frame perturbed by +1 (tiny audio VAE, real class); the samples that change, "
                      f"relative to the frame's first sample; derived bound: {figures['derived_influence']}.")


def chunked_error(vae, figures: dict) -> dict:
    adapter = H3AudioAdapter(vae)
    z = torch.randn(2, 32, 200, generator=torch.Generator().manual_seed(5))
    rows, errors = [], []
    with torch.no_grad():
        full = adapter.decode_reference(z)
        for seconds in (0.25, 0.5, 1.0, 2.0):
            out = adapter.decode(z, chunk_seconds=seconds)
            errors.append((out - full).abs().max().item())
            rows.append([seconds, adapter.chunk_latents(seconds), f"{errors[-1]:.3e}", torch.equal(out, full)])
    figures["audio_chunk_max_error"] = f"{max(errors):.3e}"
    return table(["chunk (s)", "chunk (latent frames)", "max abs error vs full", "bit-identical"], rows,
                 note=f"Chunked vs full decode of 200 latent frames (5 s, max |sample| {full.abs().max().item():.2f}), "
                      "tiny audio VAE, CPU, 1 thread.")


def video_executions(vae, figures: dict) -> dict:
    adapter = H3VideoAdapter(vae)
    z = torch.randn(1, 24, 12, 24, 40, generator=torch.Generator().manual_seed(7))
    rows, batched = [], []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with torch.no_grad():
            stock = vae.decode(denormalize_video(z, vae.config.latents_mean, vae.config.latents_std,
                                                 z.device)).sample
            for tiles in (None, 1, 2, 6):
                out = stream_decode(adapter, z, TensorSink(), tiles_per_call=tiles).result
                label = "reference path" if tiles is None else f"{tiles} tile(s) per call"
                error = (out - stock).abs().max().item()
                if tiles and tiles > 1:
                    batched.append(error)
                rows.append([threads, label, f"{error:.3e}", torch.equal(out, stock)])
    figures["batched_tiles_max_error"] = f"{max(batched):.3e}"
    return table(["threads", "execution", "max abs error vs vae.decode", "bit-identical"], rows,
                 note="H3 video, 12 latent frames at 384x640 = 2x3 tiles of 256 px (tiny video VAE, real class, "
                      "CPU), streamed executions vs `vae.decode`.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS, help="results file (default: %(default)s)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {platform.machine()}, 1 thread unless stated\n")
    figures: dict = {}
    tables = {"receptive_field": receptive_field(tiny_h3_audio_vae(), figures),
              "audio_chunks": chunked_error(tiny_h3_audio_vae(), figures),
              "video_executions": video_executions(tiny_h3_vae(), figures)}
    for found in tables.values():
        print(table_markdown(found) + "\n")
    write_results(args.out, "decode_exactness", {}, {"tables": tables, "figures": figures}, sources=SOURCES)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
