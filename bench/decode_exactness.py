"""Measure what docs/DECODE.md states about decode exactness (tiny configs of the real classes, CPU).

1. Audio decoder receptive field: the derived influence interval (`decoder_influence`) and the
   measured one (perturb one latent frame by +1, find the samples that change), in samples and in
   latent frames, for several frames and seeds.
2. Audio chunked vs full decode: max |difference| for several chunk lengths.
3. H3 video: max |difference| to `vae.decode` for each execution (reference path, streamed tiles,
   batched tiles).

Run: .venv/bin/python bench/decode_exactness.py
"""

from __future__ import annotations

import platform

import torch

from h3director.commands.demo_vaes import tiny_h3_audio_vae, tiny_h3_vae
from h3director.integrations.diffusers_h3 import H3VideoAdapter, denormalize_video
from h3director.integrations.diffusers_h3_audio import H3AudioAdapter, context_latents, decoder_influence
from h3director.video.scheduler import stream_decode
from h3director.video.sinks import TensorSink


def receptive_field(vae) -> None:
    hop = vae.hop_length
    first, last = decoder_influence(vae)
    print(f"derived influence of one latent frame: samples [{first}, {last}] = "
          f"latent frames [{first / hop:.2f}, {last / hop:.2f}]; context used: {context_latents(vae)} frames")
    print("| seed | latent frames | perturbed frame | first changed | last changed | in latent frames |")
    print("|---|---|---|---|---|---|")
    for seed, frames, frame in ((0, 160, 80), (1, 120, 30), (2, 120, 90)):
        z = torch.randn(1, 32, frames, generator=torch.Generator().manual_seed(seed))
        bumped = z.clone()
        bumped[:, :, frame] += 1.0
        with torch.no_grad():
            delta = (vae.decode(z).sample - vae.decode(bumped).sample).abs()[0, 0]
        changed = delta.nonzero().flatten()
        lo, hi = changed.min().item() - frame * hop, changed.max().item() - frame * hop
        print(f"| {seed} | {frames} | {frame} | {lo} | {hi} | [{lo / hop:.2f}, {hi / hop:.2f}] |")


def chunked_error(vae) -> None:
    adapter = H3AudioAdapter(vae)
    z = torch.randn(2, 32, 200, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = adapter.decode_reference(z)
        print(f"\nfull decode of 200 latent frames (5 s): max |sample| {full.abs().max().item():.4f}")
        print("| chunk (s) | chunk (latent frames) | max abs error vs full | bit-identical |")
        print("|---|---|---|---|")
        for seconds in (0.25, 0.5, 1.0, 2.0):
            out = adapter.decode(z, chunk_seconds=seconds)
            error = (out - full).abs().max().item()
            print(f"| {seconds} | {adapter.chunk_latents(seconds)} | {error:.3e} | {torch.equal(out, full)} |")


def video_executions(vae) -> None:
    adapter = H3VideoAdapter(vae)
    z = torch.randn(1, 24, 12, 24, 40, generator=torch.Generator().manual_seed(7))
    print("\nH3 video, 12 latent frames at 384x640 (2x3 tiles of 256 px):")
    print("| threads | execution | max abs error vs vae.decode | bit-identical |")
    print("|---|---|---|---|")
    for threads in (1, 2):
        torch.set_num_threads(threads)
        with torch.no_grad():
            stock = vae.decode(denormalize_video(z, vae.config.latents_mean, vae.config.latents_std,
                                                 z.device)).sample
            for tiles in (None, 1, 2, 6):
                out = stream_decode(adapter, z, TensorSink(), tiles_per_call=tiles).result
                label = "reference path" if tiles is None else f"{tiles} tile(s) per call"
                print(f"| {threads} | {label} | {(out - stock).abs().max().item():.3e} | {torch.equal(out, stock)} |")


def main() -> None:
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, {platform.machine()}, 1 thread unless stated\n")
    receptive_field(tiny_h3_audio_vae())
    chunked_error(tiny_h3_audio_vae())
    video_executions(tiny_h3_vae())


if __name__ == "__main__":
    main()
