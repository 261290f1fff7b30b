"""`h3director decode LATENTS --vae PATH --out video.mp4|frames.npy`: streaming decode to a file.

Everything that can be wrong with the request (output path and kind, the latent file's header,
the weights, the latents' shape and values, the memory budget) is checked before the first clip is
decoded; the output appears under its final name only when it is complete.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

HELP = "Decode H3 latents (.safetensors or ComfyUI .latent) to an .mp4 or .npy, clip by clip, in bounded memory."

SINK_CHOICES = {"memmap": (".npy",), "memmap-float32": (".npy",), "video": (".mp4", ".mov", ".mkv")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `h3director decode`'s options to `parser` (its argparse sub-parser)."""
    parser.add_argument("latents", help="latents file: .safetensors with 'latents' (and optional 'audio_latents'), "
                                        "or a ComfyUI .latent; normalized as the sampler produces them")
    parser.add_argument("--vae", required=True, help="video VAE: diffusers folder or .safetensors file")
    parser.add_argument("--audio-vae", default=None, help="audio VAE (folder or .safetensors) to decode "
                                                          "'audio_latents' into the video's soundtrack")
    parser.add_argument("--out", required=True, help="output: .mp4/.mov/.mkv (H.264 video) or .npy (uint8 frames)")
    parser.add_argument("--sink", choices=sorted(SINK_CHOICES), default=None,
                        help="output kind (default: from the extension); memmap-float32 stores [0, 1] floats")
    parser.add_argument("--budget", default=None, help="memory budget of the decoder's device, e.g. 8GB "
                                                       "(default: memory_safety in h3_config.yaml)")
    parser.add_argument("--crf", type=int, default=None, help="H.264 quality, 0..51 (default: video_decode.crf)")
    parser.add_argument("--fps", type=float, default=None, help="frames per second (default: the model's, 24)")
    parser.add_argument("--device", default="auto", help="decoder device: auto, cpu, cuda, cuda:1, mps")
    parser.add_argument("--default-config", action="store_true",
                        help="accept a single weights .safetensors without a config.json beside it: use the real "
                             "class's default config (H3 video: neutral latent statistics, mean 0 and std 1, so "
                             "latents made for a real model decode with wrong colours)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                        help="dtype the VAE weights are loaded and run in")
    parser.add_argument("--tiles-per-call", type=int, default=None,
                        help="spatial tiles per decoder call, 1 = least memory (default: video_decode.tiles_per_call)")
    parser.add_argument("--resume", action="store_true",
                        help=".npy only: continue a partial output left by a killed run of the same job")
    parser.add_argument("--config", default=None, help="h3_config.yaml to use")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _resolve_device(name: str) -> str:
    import torch

    from h3director.errors import InvalidInputError

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise InvalidInputError(f"--device {name!r} is not a device name (cpu, cuda, cuda:1, mps)") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(f"--device {name!r}: no CUDA device is available")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise InvalidInputError(f"--device {name!r}: MPS is not available")
    return str(device)


def _job_key(latents_path: Path, args: argparse.Namespace) -> str:
    """Identity of a decode for resuming: the latents' bytes, the weights' path, dtype and output kind."""
    digest = hashlib.sha256()
    with open(latents_path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    digest.update(f"|{Path(args.vae).expanduser().absolute()}|{args.dtype}|{args.sink}".encode())
    return digest.hexdigest()


def _make_sink(args: argparse.Namespace, out: Path, crf: int, audio_rate: int | None):
    """The sink `--out`/`--sink` ask for (`h3director.video.sinks.file_sink_for`), after the checks only the CLI
    has: the extension fits `--sink`, `--resume` and `--audio-vae` fit the output kind."""
    from h3director.errors import InvalidInputError
    from h3director.video.sinks import FILE_SINK_KINDS, file_sink_for

    suffix = out.suffix.lower()
    kind = args.sink or ("video" if FILE_SINK_KINDS.get(suffix) == "video" else "memmap")
    if suffix not in SINK_CHOICES[kind]:
        raise InvalidInputError(
            f"--out {str(out)!r}: {'--sink ' + kind if args.sink else 'the output'} needs a file ending in "
            f"{' or '.join(SINK_CHOICES[kind])}, got {suffix or 'no extension'!r}"
        )
    if kind == "video" and args.resume:
        raise InvalidInputError("--resume works with .npy outputs only (a video file cannot be continued)")
    if kind != "video" and args.audio_vae:
        raise InvalidInputError("--audio-vae needs a video output (.mp4/.mov/.mkv): a .npy file holds frames only")
    job = None if kind == "video" else _job_key(Path(args.latents), args)
    return file_sink_for(out, fps=args.fps, crf=crf, npy_dtype="float32" if kind == "memmap-float32" else "uint8",
                         resume=args.resume, job=job, audio_sample_rate=audio_rate)


def _progress(enabled: bool):
    """(callback, close) for a tqdm bar on stderr that counts decoded frames."""
    if not enabled:
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(total=0, unit="frame", desc="decode", file=sys.stderr, dynamic_ncols=True)

    def on_progress(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    return on_progress, bar.close


def run(args: argparse.Namespace) -> int:
    """Decode the latent file in `args` to the output file; returns 0 once the output is complete.

    Raises InvalidInputError for a bad output path or kind, latent file, device, `--crf`, `--fps` or audio
    option, before any decoding; a decode that runs out of memory on the smallest clip raises
    `DecodeOutOfMemory`."""
    from h3director.core.atomic_file import check_output_path
    from h3director.core.config import load_config
    from h3director.core.host_heap import pin_decode_threshold
    from h3director.errors import InvalidInputError
    from h3director.integrations.load_vae import audio_adapter_for, load_vae, video_adapter_for
    from h3director.units import format_size, parse_size
    from h3director.video.latent_file import read_latent_file
    from h3director.video.levels import decode_for_level
    from h3director.video.scheduler import AudioJob
    from h3director.video.sinks import FILE_SINK_KINDS

    config = load_config(args.config)
    decode_settings = config.video_decode
    pin_decode_threshold(config)           # this process is the director's own (see core/host_heap.py)
    out = check_output_path(args.out, tuple(FILE_SINK_KINDS), "--out")
    budget = parse_size(args.budget, binary_gb=True) if args.budget is not None else None
    crf = decode_settings.crf if args.crf is None else args.crf
    if not 0 <= crf <= 51:
        raise InvalidInputError(f"--crf must be in 0..51, got {crf}")
    if args.fps is not None and not args.fps > 0:
        raise InvalidInputError(f"--fps must be > 0, got {args.fps}")
    device = _resolve_device(args.device)

    latents = read_latent_file(args.latents)
    if latents.video.shape[0] != 1:
        raise InvalidInputError(
            f"{args.latents!r} holds a batch of {latents.video.shape[0]} videos; a file output takes one: "
            "save each batch item to its own latents file"
        )
    if args.audio_vae and latents.audio is None:
        raise InvalidInputError(f"--audio-vae given but {args.latents!r} holds no 'audio_latents'")
    if latents.audio is not None and not args.audio_vae:
        print("note: the file holds audio_latents; pass --audio-vae to decode the soundtrack", file=sys.stderr)

    video_adapter = video_adapter_for(load_vae(args.vae, "video", args.dtype, device,
                                               allow_default_config=args.default_config))
    audio_job = None
    if args.audio_vae:
        audio_adapter = audio_adapter_for(load_vae(args.audio_vae, "audio", args.dtype, device,
                                                   allow_default_config=args.default_config))
        audio_job = AudioJob(adapter=audio_adapter, latents=latents.audio,
                             chunk_seconds=decode_settings.audio_chunk_seconds)
    sink = _make_sink(args, out, crf, audio_job.adapter.sample_rate if audio_job else None)

    on_progress, close_bar = _progress(not args.no_progress)
    started = time.perf_counter()
    try:
        report = decode_for_level(video_adapter, latents.video, sink, budget_bytes=budget, audio=audio_job,
                                  on_progress=on_progress, tiles_per_call=args.tiles_per_call, config=config)
    finally:
        close_bar()
    seconds = time.perf_counter() - started
    resumed = getattr(sink, "resumed_frames", 0)
    print(f"wrote {report.result}: {report.frames} frames"
          + (f" ({resumed} resumed from a partial file)" if resumed else "")
          + (f", {report.audio_samples} audio samples per channel" if report.audio_samples else "")
          + f", {report.clips} clip(s), {len(report.retries)} out-of-memory retries, {seconds:.1f} s"
          + (f", clip working set estimate {format_size(report.preflight.clip_bytes)}" if report.preflight else ""))
    for note in report.notes:
        print(f"  {note}", file=sys.stderr)
    for retry in report.retries:
        print(f"  clip {retry.clip}: {retry.failed.describe()} ran out of memory; retried with "
              f"{retry.retried_with.describe()}", file=sys.stderr)
    return 0


__all__ = ["HELP", "add_arguments", "run"]
