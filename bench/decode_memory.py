"""Peak host memory and time of decoding H3 latents: stock diffusers vs H3 Director, by video length.

    .venv/bin/python bench/decode_memory.py [--frames 22 73 141 209 277] [--size 640x384]
        [--repeats 1] [--threads 2] [--plot docs/img/decode_memory.png] [--json out.json]
        [--out bench/results/decode_memory.json]

Every measurement runs in a fresh subprocess (one process per measurement). In it the VAE is
built and warmed up first; then freed heap is returned to the OS, the kernel's peak-RSS mark is
reset (`/proc/self/clear_refs`) and the decode runs. "peak" is the exact high-water mark of the
resident set minus the resident set just before the decode, i.e. above the loaded weights; "wall"
and "cpu" (user + system seconds of the process) cover the decode alone.

Modes, all on the same seeded latents through the same model object:

- `stock`: diffusers' H3 decode path, `vae.decode` of the whole latent, then the pipeline's
  post-processing to uint8 frames (`h3director.commands.demo_stock`);
- `stock-mp4`: that, then diffusers' own PyAV writer (`diffusers.utils.export_utils.encode_video`:
  libx264, CRF 23, preset medium, yuv420p);
- `director-uint8`: `stream_decode` into `Uint8FrameSink` (the uint8 video in RAM);
- `director-mp4`: `stream_decode` into `VideoFileSink` with libx264 at the same CRF 23 and preset
  medium, frames encoded as they are decoded; its rate-control lookahead is the sink's default, 10
  frames (x264's medium uses 40, which `stock-mp4` keeps), which bounds the encoder's memory.

Allocator: the workers run with glibc's defaults. The director pins glibc's mmap threshold itself
(`video_decode.host_mmap_threshold_mb`, default 1 MiB, `h3director.core.host_heap`), so its freed
per-clip buffers leave the resident set; the stock path does not. `--malloc-threshold N` sets
``MALLOC_MMAP_THRESHOLD_=N`` for every worker, to compare both under the same allocator setting.

The director runs with `tiles_per_call=1` (its least-memory execution, bit-identical on the CPU);
every mode's uint8 frames (before any encoding) are fingerprinted and must agree, or the run fails; the MP4 modes'
files are also decoded back (after the measurement): each must hold every frame, and the director's must be as
close to the frames as the stock encode at the same CRF (PSNR within `MP4_PSNR_SLACK_DB`; both are lossy).
The model is `tiny_h3_vae()`: the real `AutoencoderKLMiniMaxH3` with a small decoder, so compute is
small and the numbers isolate what grows with video length (the host-side buffers). Prints a
Markdown table and writes the results file (`--out`) docs/BENCHMARKS.md and the README render from; optionally
writes the plot and the raw results as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("stock", "director-uint8", "stock-mp4", "director-mp4")
MP4_PSNR_SLACK_DB = 1.0  # the director's MP4 may be at most this much further from the frames than the stock MP4
CRF, PRESET = 23, "medium"  # libx264's defaults, which diffusers' encode_video uses
SOURCES = ("h3director/video", "h3director/core/host_heap.py", "h3director/integrations/diffusers_h3.py",
           "h3director/integrations/stock_h3.py", "h3director/native")   # what the numbers measure


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _fingerprint(frames) -> str:
    """SHA-256 over all uint8 frames `[F, H, W, 3]` (C order)."""
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(frames).tobytes()).hexdigest()[:16]


def _worker(mode: str, frames: int, width: int, height: int, threads: int, workdir: str) -> dict:
    import torch

    from h3director.commands.demo_stock import stock_uint8_frames, stock_video_decode
    from h3director.commands.demo_vaes import tiny_h3_vae
    from h3director.core.devices import peak_rss_bytes, process_rss_bytes, reset_peak_rss
    from h3director.core.host_heap import pin_decode_threshold, release_free_heap
    from h3director.geometry import latent_frames_for
    from h3director.integrations.load_vae import video_adapter_for
    from h3director.video.scheduler import stream_decode
    from h3director.video.sinks import Uint8FrameSink, VideoFileSink

    torch.set_num_threads(threads)
    latent_frames = latent_frames_for(frames)
    latents = torch.randn((1, 24, latent_frames, height // 16, width // 16), generator=torch.Generator().manual_seed(0))
    vae = tiny_h3_vae(seed=0)
    adapter = video_adapter_for(vae)
    # Warm-up of both paths on a tiny latent: thread pools, lazy imports (PyAV, the config, the
    # post-processing) and first-call initialisation are not part of the decode being measured.
    tiny = latents[:, :, :3, :4, :4]
    stock_uint8_frames(stock_video_decode(vae, tiny))
    pin_decode_threshold()  # as the CLI does (stream_decode pinned it here itself before it left that to the CLI)
    stream_decode(adapter, tiny, Uint8FrameSink(), tiles_per_call=1)
    import av  # noqa: F401
    from diffusers.utils.export_utils import encode_video
    video_path = os.path.join(workdir, f"{mode}.mp4")

    release_free_heap()
    exact = reset_peak_rss()
    base = process_rss_bytes()
    cpu0, wall0 = _cpu_seconds(), time.perf_counter()
    fingerprint = None  # the MP4 modes encode frames the uint8 modes fingerprint: same conversion
    if mode in ("stock", "stock-mp4"):
        uint8 = stock_uint8_frames(stock_video_decode(vae, latents))[0]
        if mode == "stock-mp4":
            encode_video(torch.from_numpy(uint8), fps=24, output_path=video_path)
    elif mode == "director-uint8":
        uint8 = stream_decode(adapter, latents, Uint8FrameSink(), tiles_per_call=1).result
    elif mode == "director-mp4":
        stream_decode(adapter, latents, VideoFileSink(video_path, crf=CRF, preset=PRESET), tiles_per_call=1)
        uint8 = None
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    wall, cpu = time.perf_counter() - wall0, _cpu_seconds() - cpu0
    peak = peak_rss_bytes() - base
    encoded = None
    if mode.endswith("-mp4"):                 # after the measurement: what the file holds, against the frames
        if uint8 is None:                     # the director encoded as it decoded: its frames, decoded again
            uint8 = stream_decode(adapter, latents, Uint8FrameSink(), tiles_per_call=1).result
        encoded = _decoded_back(video_path, uint8)
    fingerprint = _fingerprint(uint8)
    return {"mode": mode, "frames": int(uint8.shape[0]), "peak_bytes": int(peak), "wall_s": wall, "cpu_s": cpu,
            "fingerprint": fingerprint, "exact_peak": exact, "encoded": encoded}


def _decoded_back(path: str, uint8) -> dict:
    """The MP4 at `path` decoded with PyAV and compared with the uint8 frames `[F, H, W, 3]` it was encoded from:
    frame count, PSNR over all frames (dB) and the largest absolute difference (H.264 at CRF 23 is lossy)."""
    import av
    import numpy as np

    with av.open(path) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])
    if frames.shape != uint8.shape:
        return {"frames": int(frames.shape[0]), "shape_matches": False}
    difference = frames.astype(np.float64) - uint8.astype(np.float64)
    mse = float(np.mean(difference ** 2))
    return {"frames": int(frames.shape[0]), "shape_matches": True,
            "psnr_db": float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse),
            "max_abs": int(np.abs(difference).max())}


def _run_one(mode: str, frames: int, width: int, height: int, threads: int, malloc_threshold: int | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="h3-decode-bench-") as workdir:
        command = [sys.executable, __file__, "--worker", mode, str(frames), f"{width}x{height}", str(threads), workdir]
        env = dict(os.environ)
        if malloc_threshold is not None:
            env["MALLOC_MMAP_THRESHOLD_"] = str(malloc_threshold)
        proc = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=3600, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"worker {mode} {frames} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _table(results: list[dict]) -> str:
    """One row per length: peaks (MiB), the stock / director-mp4 peak ratio, wall and CPU seconds per mode."""
    by = {(r["frames"], r["mode"]): r for r in results}
    lengths = sorted({r["frames"] for r in results})

    def cell(frames: int, mode: str, key: str, scale: float = 1.0, fmt: str = "{:.1f}") -> str:
        result = by.get((frames, mode))
        return "-" if result is None else fmt.format(result[key] / scale)

    modes = " / ".join(MODES)
    lines = [f"| frames | peak MiB: {modes} | stock / director-mp4 peak | wall s: {modes} | cpu s: {modes} |",
             "|---|---|---|---|---|"]
    for frames in lengths:
        peaks = " / ".join(cell(frames, mode, "peak_bytes", 1024 ** 2, "{:.0f}") for mode in MODES)
        stock, director = by.get((frames, "stock")), by.get((frames, "director-mp4"))
        ratio = f"{stock['peak_bytes'] / max(director['peak_bytes'], 1):.1f}x" if stock and director else "-"
        walls = " / ".join(cell(frames, mode, "wall_s") for mode in MODES)
        cpus = " / ".join(cell(frames, mode, "cpu_s") for mode in MODES)
        lines.append(f"| {frames} | {peaks} | {ratio} | {walls} | {cpus} |")
    return "\n".join(lines)


def _tables(best: dict, modes: list[str], title: str) -> tuple[dict, dict]:
    """The results file's tables and figures from the fastest run of each (frames, mode)."""
    from _results import table

    mib = 1024 ** 2
    lengths = sorted({frames for frames, _ in best})
    joined = " / ".join(modes)

    def cells(frames: int, key: str, scale: float, fmt: str) -> str:
        return " / ".join("-" if (frames, m) not in best else fmt.format(best[(frames, m)][key] / scale) for m in modes)

    rows = []
    for frames in lengths:
        stock, director = best.get((frames, "stock")), best.get((frames, "director-mp4"))
        ratio = f"{stock['peak_bytes'] / max(director['peak_bytes'], 1):.1f}x" if stock and director else "-"
        rows.append([frames, cells(frames, "peak_bytes", mib, "{:.0f}"), ratio, cells(frames, "wall_s", 1, "{:.1f}"),
                     cells(frames, "cpu_s", 1, "{:.1f}")])
    tables = {"decode": table(["frames", f"peak MiB: {joined}", "stock / director-mp4 peak", f"wall s: {joined}",
                               f"cpu s: {joined}"], rows,
                              note=f"{title}. Peak = the exact high-water mark of the resident set minus the resident "
                                   "set just before the decode, one fresh process per point, modes interleaved; "
                                   "compare times within a row (same run).")}
    figures = {}
    encoded = [[frames, mode, best[(frames, mode)]["encoded"]["frames"], f"{best[(frames, mode)]['encoded']['psnr_db']:.1f}",
                best[(frames, mode)]["encoded"]["max_abs"]]
               for frames, mode in sorted(best) if best[(frames, mode)].get("encoded")]
    if encoded:
        tables["mp4_decoded_back"] = table(
            ["frames", "mode", "frames in the MP4", "PSNR dB vs the uint8 frames", "largest difference"], encoded,
            note=f"Each MP4 decoded back with PyAV and compared with the uint8 frames it was encoded from (libx264, "
                 f"CRF {CRF}, lossy); the run fails if the director's is more than {MP4_PSNR_SLACK_DB} dB below "
                 "stock's. The uint8 frames of every mode are fingerprinted (SHA-256) and agree.")
    ends = [f for f in (lengths[0], lengths[-1]) if (f, "director-mp4") in best]
    if len(lengths) > 1 and len(ends) == 2 and all((f, "stock") in best for f in lengths):
        first, last = (best[(f, "director-mp4")]["peak_bytes"] / mib for f in ends)
        peaks = [best[(f, "director-mp4")]["peak_bytes"] / mib for f in lengths]
        stock_last = best[(lengths[-1], "stock")]["peak_bytes"] / mib
        figures["director_mp4_flat"] = (f"{min(peaks):.0f}-{max(peaks):.0f} MiB from {lengths[0]} to {lengths[-1]} "
                                        f"frames, while the stock path grew to {stock_last:.0f} MiB")
        tables["targets"] = table(["target", "measured", ""], [
            [f"director-mp4 peak flat in length: {lengths[-1]}-frame / {lengths[0]}-frame <= 1.15",
             f"{last:.1f} / {first:.1f} MiB = **{last / first:.2f}**", "met" if last / first <= 1.15 else "NOT met"],
            [f"at {lengths[-1]} frames director-mp4 peak <= 1/5 of stock",
             f"{last:.1f} / {stock_last:.1f} MiB = **1/{stock_last / last:.1f}**",
             "met" if last <= stock_last / 5 else "NOT met"],
            ["director wall time <= 1.10x stock",
             "director-uint8 / stock: " + ", ".join(f"{best[(f, 'director-uint8')]['wall_s'] / best[(f, 'stock')]['wall_s']:.2f}"
                                                    for f in lengths if (f, "director-uint8") in best)
             + "; director-mp4 / stock-mp4: " + ", ".join(
                 f"{best[(f, 'director-mp4')]['wall_s'] / best[(f, 'stock-mp4')]['wall_s']:.2f}"
                 for f in lengths if (f, "stock-mp4") in best) + f" ({', '.join(map(str, lengths))} frames)",
             "met" if all(best[(f, d)]["wall_s"] <= 1.10 * best[(f, s)]["wall_s"] for f in lengths
                          for d, s in (("director-uint8", "stock"), ("director-mp4", "stock-mp4"))
                          if (f, d) in best and (f, s) in best) else "NOT met"]],
            note="Ratios from the same run (the table above).")
    return tables, figures


def _plot(results: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = {"stock": "stock: vae.decode + post-processing (uint8 in RAM)",
              "stock-mp4": "stock + diffusers encode_video (MP4)",
              "director-uint8": "director: stream_decode -> uint8 in RAM",
              "director-mp4": "director: stream_decode -> MP4 as it decodes"}
    styles = {"stock": ("tab:red", "o-"), "stock-mp4": ("tab:orange", "s--"),
              "director-uint8": ("tab:blue", "o-"), "director-mp4": ("tab:green", "s-")}
    fig, ax = plt.subplots(figsize=(8, 4.8), dpi=120)
    for mode in MODES:
        points = sorted((r["frames"], r["peak_bytes"] / 1024 ** 2) for r in results if r["mode"] == mode)
        if points:
            color, style = styles[mode]
            ax.plot([p[0] for p in points], [p[1] for p in points], style, color=color, label=labels[mode])
    ax.set_xlabel("video frames (17n+5)")
    ax.set_ylabel("peak host memory above loaded weights (MiB)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        mode, frames, size, threads, workdir = argv[1:6]
        width, height = map(int, size.split("x"))
        print(json.dumps(_worker(mode, int(frames), width, height, int(threads), workdir)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[22, 73, 141, 209, 277])
    parser.add_argument("--size", default="640x384", help="WIDTHxHEIGHT, multiples of 16")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--repeats", type=int, default=1, help="runs per point; the table keeps the fastest")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in each worker")
    parser.add_argument("--malloc-threshold", type=int, default=-1,
                        help="glibc MALLOC_MMAP_THRESHOLD_ for the workers (bytes; -1: glibc's dynamic default)")
    parser.add_argument("--plot", default=None, help="write the PNG plot here")
    parser.add_argument("--json", default=None, help="write all raw results here")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "decode_memory.json"),
                        help="the results file (default: %(default)s)")
    args = parser.parse_args(argv)
    width, height = map(int, args.size.split("x"))
    if args.malloc_threshold < 0:
        args.malloc_threshold = None

    results, best = [], {}
    for frames in args.frames:
        for _ in range(args.repeats):
            for mode in args.modes:  # interleaved, so load changes on the machine hit every mode alike
                result = _run_one(mode, frames, width, height, args.threads, args.malloc_threshold)
                results.append(result)
                key = (result["frames"], mode)
                if key not in best or result["wall_s"] < best[key]["wall_s"]:
                    best[key] = result
                print(f"{mode:15s} {result['frames']:4d} frames: peak {result['peak_bytes'] / 1024 ** 2:8.1f} MiB, "
                      f"wall {result['wall_s']:6.1f} s, cpu {result['cpu_s']:6.1f} s, frames {result['fingerprint']}",
                      file=sys.stderr, flush=True)
    for frames in sorted({k[0] for k in best}):
        fingerprints = {best[(frames, mode)]["fingerprint"] for mode in args.modes
                        if (frames, mode) in best and best[(frames, mode)]["fingerprint"] is not None}
        if len(fingerprints) > 1:
            raise SystemExit(f"uint8 frames differ between modes at {frames} frames: {fingerprints}")
        encoded = {mode: best[(frames, mode)]["encoded"] for mode in args.modes
                   if (frames, mode) in best and best[(frames, mode)].get("encoded")}
        for mode, e in encoded.items():
            if not e["shape_matches"]:
                raise SystemExit(f"{mode} at {frames} frames: the MP4 decoded back has {e['frames']} frames")
        if len(encoded) == 2 and encoded["director-mp4"]["psnr_db"] < encoded["stock-mp4"]["psnr_db"] - MP4_PSNR_SLACK_DB:
            raise SystemExit(f"director-mp4 at {frames} frames is more than {MP4_PSNR_SLACK_DB} dB below stock-mp4 "
                             f"against the same frames: {encoded}")

    table = _table(list(best.values()))
    malloc = "glibc default" if args.malloc_threshold is None else f"MALLOC_MMAP_THRESHOLD_={args.malloc_threshold}"
    title = (f"H3 decode, {width}x{height}, tiny_h3_vae (real AutoencoderKLMiniMaxH3, small decoder), CPU, "
             f"{args.threads} torch threads, {malloc}")
    print(f"{title}, {platform.machine()} {os.cpu_count()} cores, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; uint8 frames identical in every mode: yes "
          "(the MP4 modes' frames fingerprinted before encoding)")
    for (frames, mode), result in sorted(best.items()):
        if result.get("encoded"):
            e = result["encoded"]
            print(f"{mode} at {frames} frames: the MP4 decoded back has {e['frames']} frames, PSNR "
                  f"{e['psnr_db']:.1f} dB against the frames it was encoded from, largest difference {e['max_abs']}")
    print(table)
    if args.plot:
        _plot(list(best.values()), Path(args.plot), f"H3 decode memory by length, {width}x{height}, tiny real H3 VAE, CPU")
        print(f"plot: {args.plot}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    sys.path.insert(0, str(REPO / "bench"))
    from _results import write_results

    tables, figures = _tables(best, list(args.modes), title)
    write_results(args.out, "decode_memory", {k: v for k, v in vars(args).items() if k not in ("json", "out")},
                  {"tables": tables, "figures": figures, "results": results}, sources=SOURCES)
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
