"""`h3director demo`: decode the same latents the stock way and the director's way, side by side.

Runs on the CPU in under a minute with no download: the models are small random-initialised
configs of the REAL diffusers classes (`AutoencoderKLMiniMaxH3`, `AutoencoderKLMiniMaxH3Audio`,
see `h3director.commands.demo_vaes`) and the latents are seeded noise. Two phases, each in a process of its
own (a fresh interpreter, so neither inherits what the other left in the allocator), each
measured as the peak resident memory above the phase's starting point (the kernel's exact high-water mark,
reset in that process on Linux) and its wall time; the parent's monitor samples the running phase's RSS for the
timeline:

- stock: diffusers' H3 decode path: `vae.decode` of the whole latent, then the pipeline's pixel
  de-normalisation and `VideoProcessor` post-processing to uint8 frames; `audio_vae.decode`;
- director: `stream_decode` clip by clip (one spatial tile per decoder call, its least-memory
  execution, bit-identical on the CPU) straight into an H.264 + AAC file (`out/demo.mp4`),
  fingerprinting every frame on the way (`DigestSink`) so the two outputs can be compared exactly.

Audio: the director decodes it in chunks of 10 s (400 latent frames) with receptive-field context. Up
to one chunk's length (the default 124 frames give 207 latent frames) that is one decoder call, the same as
the stock decode, and the check is bit-identity; longer audio is decoded in several calls, which changes
float32 rounding, and the check is a maximum difference of `AUDIO_TOLERANCE` (float32 epsilon, 1.19e-7).

Writes `out/demo.mp4`, `out/memory.png` (the monitor's timeline) and `out/memory.json`, prints the
table, and exits 1 if any frame differs or the audio is outside its check.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HELP = "Decode the same H3 latents the stock way and the director's way; compare memory, time and output."

DEFAULT_FRAMES = 124  # 17 * 7 + 5: on H3's grid, 37 latent frames, 7 clips
DEFAULT_SIZE = (640, 384)  # width, height in pixels: 3x2 VAE tiles of 256 px
AUDIO_TOLERANCE = 1.2e-7   # chunked audio vs the one-call decode: float32 rounding (epsilon 1.19e-7)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `h3director demo`'s options to `parser` (its argparse sub-parser)."""
    parser.add_argument("--out", default="out", help="folder for demo.mp4, memory.png and memory.json (default: out)")
    parser.add_argument("--frames", type=int, default=DEFAULT_FRAMES,
                        help=f"video frames; 17n+5 is H3's grid (default: {DEFAULT_FRAMES})")
    parser.add_argument("--size", default=f"{DEFAULT_SIZE[0]}x{DEFAULT_SIZE[1]}",
                        help="WIDTHxHEIGHT in pixels, multiples of 16 (default: 640x384)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the models and latents")


@dataclass
class PhaseResult:
    """One phase's measurement: `peak_bytes` above `base_bytes` (its process's RSS when it started; None until
    known: where the kernel's high-water mark cannot be reset, the parent fills it from the sampled RSS)."""

    name: str
    peak_bytes: int | None
    seconds: float
    base_bytes: int = 0


def _parse_size(text: str) -> tuple[int, int]:
    from h3director.errors import InvalidInputError
    from h3director.geometry import SPATIAL_RATIO

    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise InvalidInputError(f"--size must look like 640x384, got {text!r}")
    width, height = int(parts[0]), int(parts[1])
    if width < SPATIAL_RATIO or height < SPATIAL_RATIO or width % SPATIAL_RATIO or height % SPATIAL_RATIO:
        raise InvalidInputError(
            f"--size: width and height must be positive multiples of {SPATIAL_RATIO} (the VAE's), got {text}")
    return width, height


def _measure(work) -> tuple[PhaseResult, object]:
    """Run `work()` and measure it: exact peak RSS above its start (`h3director.core.devices.reset_peak_rss`;
    the monitor's sampled peak where that is impossible) and wall time; returns (its measurement, its result)."""
    from h3director.core.devices import peak_rss_bytes, process_rss_bytes, reset_peak_rss
    from h3director.core.host_heap import release_free_heap

    release_free_heap()
    exact = reset_peak_rss()
    base = process_rss_bytes()
    started = time.perf_counter()
    result = work()
    seconds = time.perf_counter() - started
    peak = peak_rss_bytes() if exact else None
    return PhaseResult("", None if peak is None else max(0, int(peak) - base), seconds, base), result


def _phase_process(kind: str, frames: int, width: int, height: int, seed: int, video_path: str, connection,
                   one_thread: bool = False) -> None:
    """One phase in a process of its own (so neither phase inherits what the other left in the allocator): build
    the seeded models and latents, warm up, measure the phase, send (PhaseResult, digests, audio) back through
    `connection`. `one_thread`: run torch on one thread (a forked child must not use the OpenMP pool it inherited
    from a parent that already ran torch: GNU OpenMP is not fork-safe and hangs)."""
    if one_thread:
        import torch

        torch.set_num_threads(1)
    try:
        measured, raw, uint8, audio, chunk = _run_phase(kind, frames, width, height, seed, video_path)
        audio = None if audio is None else audio.detach().cpu().numpy()   # plain bytes: torch would share an fd
        connection.send(("ok", (measured, raw, uint8, audio, chunk)))
    except BaseException as error:  # noqa: BLE001 - reported by the parent
        connection.send(("error", f"{type(error).__name__}: {error}"))
    finally:
        connection.close()


def _run_phase(kind: str, frames: int, width: int, height: int, seed: int, video_path: str):
    import torch

    from h3director.commands import demo_stock
    from h3director.commands.demo_vaes import tiny_h3_audio_vae, tiny_h3_vae
    from h3director.core.host_heap import pin_decode_threshold
    from h3director.geometry import (
        AUDIO_LATENT_CHANNELS,
        SPATIAL_RATIO,
        VIDEO_LATENT_CHANNELS,
        audio_latent_frames_for,
        latent_frames_for,
    )
    from h3director.integrations import load_vae
    from h3director.video.scheduler import AudioJob, stream_decode
    from h3director.video.sinks import DigestSink, TeeSink, VideoFileSink
    from h3director.video.sinks.digest import frame_digests

    generator = torch.Generator().manual_seed(seed)
    latents = torch.randn((1, VIDEO_LATENT_CHANNELS, latent_frames_for(frames), height // SPATIAL_RATIO,
                           width // SPATIAL_RATIO), generator=generator)
    audio_latents = torch.randn((2, AUDIO_LATENT_CHANNELS, audio_latent_frames_for(frames)), generator=generator)
    vae, audio_vae = tiny_h3_vae(seed=seed), tiny_h3_audio_vae(seed=seed)
    with torch.no_grad():  # warm-up (thread pools, lazy initialisation) so the phase does not pay for it
        vae.decode(latents[:, :, :3, :4, :4])
    if kind == "stock":
        def work():
            video = demo_stock.stock_video_decode(vae, latents)
            return video, demo_stock.stock_uint8_frames(video), demo_stock.stock_audio_decode(audio_vae, audio_latents)

        measured, (video, uint8, audio) = _measure(work)
        return measured, frame_digests(video[0], frame_axis=1), frame_digests(uint8[0], frame_axis=0), audio, None
    video_adapter, audio_adapter = load_vae.video_adapter_for(vae), load_vae.audio_adapter_for(audio_vae)
    digest = DigestSink()

    def work():
        pin_decode_threshold()             # this process is the director's own (see core/host_heap.py)
        sink = TeeSink([VideoFileSink(video_path, audio_sample_rate=audio_adapter.sample_rate), digest])
        stream_decode(video_adapter, latents, sink, audio=AudioJob(audio_adapter, audio_latents), tiles_per_call=1)

    measured, _ = _measure(work)
    return measured, digest.raw_digests, digest.uint8_digests, digest.audio, audio_adapter.chunk_latents()


def _in_own_process(kind: str, args, width: int, height: int, video_path: Path, monitor):
    """Run one phase in a process of its own (`START_METHOD`) while `monitor` samples that process's RSS (series
    "phase.rss_bytes")."""
    import multiprocessing

    import psutil

    from h3director.errors import H3DirectorError

    context = multiprocessing.get_context(START_METHOD)
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_phase_process, args=(kind, args.frames, width, height, args.seed,
                                                           str(video_path), send, START_METHOD == "fork"),
                              daemon=True)
    name = f"{kind} decode"
    with monitor.phase(name):
        process.start()
        send.close()
        _CURRENT["process"] = psutil.Process(process.pid)
        try:
            status, payload = receive.recv()
        except EOFError:
            status, payload = "error", f"the {kind} phase's process ended (exit code {process.exitcode})"
        finally:
            process.join()
            _CURRENT["process"] = None
    if status != "ok":
        raise H3DirectorError(f"demo: the {kind} phase failed: {payload}")
    measured = payload[0]
    if measured.peak_bytes is None:      # no exact high-water mark here: the monitor's sampled peak
        sampled = monitor.report().phase_peaks.get(name, {}).get("phase.rss_bytes") or 0
        measured.peak_bytes = max(0, int(sampled) - measured.base_bytes)
    measured.name = name
    return payload


_CURRENT: dict = {"process": None}
START_METHOD = "spawn"
"""How the phase processes start: "spawn" (a fresh interpreter; safe after torch ran threads, on every OS). Tests
that patch a module for the phases use "fork" (the child then inherits the patch and runs torch on one thread)."""


def _phase_rss() -> float | None:
    process = _CURRENT["process"]
    try:
        return float(process.memory_info().rss) if process is not None else None
    except Exception:  # noqa: BLE001 - the process ended between two samples
        return None


def _table(stock: PhaseResult, director: PhaseResult, checks: dict[str, str], video: Path) -> str:
    from h3director.units import format_size

    rows = [
        ("", "peak memory above baseline", "wall time", "output"),
        ("stock (vae.decode + post-processing)", format_size(stock.peak_bytes), f"{stock.seconds:.2f} s",
         "uint8 frames in RAM"),
        ("director (stream_decode -> MP4)", format_size(director.peak_bytes), f"{director.seconds:.2f} s", str(video)),
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * width for width in widths))
    ratio = stock.peak_bytes / director.peak_bytes if director.peak_bytes else float("inf")
    lines.append(f"memory: director needs {ratio:.1f}x less; time: director/stock = "
                 f"{director.seconds / stock.seconds:.2f} (the director also encodes H.264 + AAC)")
    lines += [f"{what}: {verdict}" for what, verdict in checks.items()]
    return "\n".join(lines)


def _audio_check(error: float, latent_frames: int, chunk_latents: int) -> tuple[str, str]:
    """(what was checked, verdict) for the director's audio against the stock decode's."""
    calls = -(-latent_frames // chunk_latents)
    if calls == 1:
        return (f"identical audio (one decoder call for its {latent_frames} latent frames, not chunked)",
                "yes" if error == 0 else f"NO (max |difference| {error:.3g})")
    ok = error <= AUDIO_TOLERANCE
    return (f"audio within {AUDIO_TOLERANCE:.1e} of the stock decode (decoded in {calls} chunks of up to "
            f"{chunk_latents} latent frames, which changes float32 rounding)",
            f"{'yes' if ok else 'NO'} (max |difference| {error:.3g})")


def run(args: argparse.Namespace) -> int:
    """Run the stock and the director's decode of the same small random-initialised latents in child processes
    and print the comparison; returns 0 when every check says yes, else 1.

    Raises InvalidInputError for `--frames` outside 1..2000 or a bad `--size`; H3DirectorError when a phase
    fails."""
    from h3director.core.monitor import Monitor
    from h3director.errors import InvalidInputError
    from h3director.geometry import audio_latent_frames_for, latent_frames_for

    if args.frames < 1 or args.frames > 2000:
        raise InvalidInputError(f"--frames must be in 1..2000, got {args.frames}")
    width, height = _parse_size(args.size)
    latent_frames = latent_frames_for(args.frames)
    if latent_frames < 3:
        raise InvalidInputError(
            f"--frames {args.frames} gives {latent_frames} latent frame(s); the stock decode needs at least 3 "
            "(diffusers' vae.decode raises on 1 or 2), so use --frames 6 or more"
        )
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    video_path = out_dir / "demo.mp4"

    print(f"H3 Director demo: {latent_frames} latent frames -> {args.frames} frames of {width}x{height} + stereo "
          "audio, on the CPU, with small random-initialised configs of the real diffusers H3 video and audio VAEs; "
          "each phase in a process of its own", file=sys.stderr)
    with Monitor(interval_ms=20, devices=()) as monitor:
        monitor.add_series("phase.rss_bytes", _phase_rss)
        stock, stock_raw, stock_uint8, stock_audio, _ = _in_own_process("stock", args, width, height, video_path,
                                                                         monitor)
        director, raw, uint8, audio, chunk = _in_own_process("director", args, width, height, video_path, monitor)
    report = monitor.report(metadata={"frames": args.frames, "size": f"{width}x{height}"})
    report.to_json(out_dir / "memory.json")
    report.plot(out_dir / "memory.png", title=f"H3 decode, {args.frames} frames {width}x{height}: stock vs director")

    audio_error = float(abs(audio - stock_audio).max()) if audio is not None else float("nan")
    audio_what, audio_verdict = _audio_check(audio_error, audio_latent_frames_for(args.frames), chunk)
    checks = {
        "identical decoded video (float32, every frame)": "yes" if raw == stock_raw else "NO",
        "identical uint8 frames (vs the pipeline's post-processing)": "yes" if uint8 == stock_uint8 else "NO",
        audio_what: audio_verdict,
    }
    print(_table(stock, director, checks, video_path))
    print(f"wrote {video_path}, {out_dir / 'memory.png'}, {out_dir / 'memory.json'}")
    return 0 if all(verdict.startswith("yes") for verdict in checks.values()) else 1


__all__ = ["HELP", "START_METHOD", "PhaseResult", "add_arguments", "run"]
