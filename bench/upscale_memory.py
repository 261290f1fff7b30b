"""Upscale memory: host peak of a 2x upscale to MP4 in a real ComfyUI, the streaming node vs core nodes, 24 and 240 frames.

Writes an H.264 clip (moving gradient with texture, mono AAC tone) of each length into a ComfyUI base folder, and a
small random-init RealESRGAN Compact x2 (fixtures/comfy_harness/upscale_models.py, `compact_x2`) into
models/upscale_models. Each pipeline then runs in a fresh ComfyUI server (`--cpu`), one prompt:

- node (file in): Load Upscale Model -> H3Director Upscale (Streaming) with source_path = the clip, format mp4;
- node (IMAGE in): Load Video -> Get Video Components -> H3Director Upscale (Streaming) (the input IMAGE is whole in RAM,
  the upscaled frames are not);
- core: Load Video -> Get Video Components -> Upscale Image (using Model) -> Create Video (with the audio) -> Save Video.

The peak is the server process's VmHWM (/proc/PID/status) read after the prompt; "idle" is its VmRSS after start-up,
before the prompt; "prompt" = peak - idle. Needs the prepared ComfyUI (scripts/setup.sh, `.comfy/ready`):

    .venv/bin/python bench/upscale_memory.py [--frames 24 240] [--width 256 --height 192]
        [--large-frames 48 --large-width 960 --large-height 540] [--json]

`--large-frames N` adds a run of the three pipelines on an N-frame clip at the large size, where what the upscale
holds outweighs the idle server. Writes bench/results/upscale_memory.json (`--out`): tables `small` and `large`,
figures `flat` and `large_ratio` (UPSCALE.md,
BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "fixtures"))
sys.path.insert(0, str(REPO / "fixtures" / "comfy_harness"))

sys.path.insert(0, str(REPO / "bench"))
from _results import table, table_markdown, write_results  # noqa: E402

SOURCES = ("h3director/comfy/nodes_upscale.py", "h3director/video/upscale.py", "h3director/video/upscale_stages.py",
           "h3director/video/upscale_tiles.py", "h3director/video/upscale_sources.py",
           "h3director/video/upscale_audio.py", "h3director/video/sinks_video.py",
           "h3director/integrations/spandrel_models.py")
MODEL = "compact_x2.safetensors"
PIPELINES = ("node (file in)", "node (IMAGE in)", "core")


def _clip(path: Path, frames: int, width: int, height: int, fps: int) -> None:
    from upscale_media import video_with_audio

    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    texture = np.random.default_rng(0).integers(0, 24, (height, width, 3)).astype(np.float32)
    pictures = np.empty((frames, height, width, 3), np.uint8)
    for index in range(frames):
        shift = 3 * index
        base = np.stack([(x + shift) % width / width, (y + shift) % height / height,
                         ((x + y + 2 * shift) % (width + height)) / (width + height)], -1) * 220
        pictures[index] = np.clip(base + texture, 0, 255).astype(np.uint8)
    video_with_audio(path, pictures, fps=fps)


def _workflow(pipeline: str, clip: str, fps: float) -> dict:
    loader = {"1": {"class_type": "UpscaleModelLoader", "inputs": {"model_name": MODEL}}}
    components = {"2": {"class_type": "LoadVideo", "inputs": {"file": clip}},
                  "3": {"class_type": "GetVideoComponents", "inputs": {"video": ["2", 0]}}}
    node = {"upscale_model": ["1", 0], "tile": 512, "overlap": "auto", "format": "mp4", "fps": fps, "crf": 18,
            "filename_prefix": "bench/node"}
    if pipeline == "node (file in)":
        return {**loader, "4": {"class_type": "H3DirectorUpscaleStreaming", "inputs": {**node, "source_path": clip}}}
    if pipeline == "node (IMAGE in)":
        return {**loader, **components, "4": {"class_type": "H3DirectorUpscaleStreaming",
                                              "inputs": {**node, "images": ["3", 0], "audio": ["3", 1]}}}
    return {**loader, **components,
            "4": {"class_type": "ImageUpscaleWithModel", "inputs": {"upscale_model": ["1", 0], "image": ["3", 0]}},
            "5": {"class_type": "CreateVideo", "inputs": {"images": ["4", 0], "fps": ["3", 2], "audio": ["3", 1]}},
            "6": {"class_type": "SaveVideo", "inputs": {"video": ["5", 0], "filename_prefix": "bench/core",
                                                        "format": "mp4", "format.codec": "auto"}}}


def _status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith(key))


def _run(base: Path, pipeline: str, clip: str, fps: float) -> dict:
    from server import comfyui_server, submit

    with comfyui_server(base, extra_args=["--cache-none"]) as comfy:
        pid = comfy["server"].pid
        time.sleep(2)
        idle = _status(pid, "VmRSS:")
        started = time.perf_counter()
        result = submit(comfy, _workflow(pipeline, clip, fps))
        seconds = time.perf_counter() - started
        peak = _status(pid, "VmHWM:")
        if result["status"]["status_str"] != "success":
            raise SystemExit(f"{pipeline} on {clip} failed: {json.dumps(result['status'])[:3000]}\n"
                             + comfy["log"].read_text()[-3000:])
    return {"pipeline": pipeline, "clip": clip, "idle": idle, "peak": peak, "prompt": peak - idle,
            "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[24, 240])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--height", type=int, default=192)
    parser.add_argument("--fps", type=int, default=24)
    parser.add_argument("--folder", default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--large-frames", type=int, default=0, help="frames of the large-size run (0: none)")
    parser.add_argument("--large-width", type=int, default=960)
    parser.add_argument("--large-height", type=int, default=540)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "upscale_memory.json")
    args = parser.parse_args()

    from vendored import use_prepared_comfyui, why_unavailable

    use_prepared_comfyui()
    from server import comfyui_python, prepare_base

    if not Path(comfyui_python()).is_file() or "COMFYUI_DIR" not in __import__("os").environ:
        raise SystemExit(f"no ComfyUI: {why_unavailable()}")
    folder = Path(args.folder or tempfile.mkdtemp(prefix="h3-upscale-memory-"))
    base = prepare_base(folder / "base", ["models/upscale_models"])
    subprocess.run([comfyui_python(), str(REPO / "fixtures/comfy_harness/upscale_models.py"), "write",
                    str(base / "models/upscale_models")], check=True, cwd=REPO)
    clips = [(f"clip_{frames}.mp4", frames, args.width, args.height) for frames in args.frames]
    if args.large_frames:
        clips.append((f"large_{args.large_frames}.mp4", args.large_frames, args.large_width, args.large_height))
    for name, frames, width, height in clips:
        _clip(base / "input" / name, frames, width, height, args.fps)
    rows = [{**_run(base, pipeline, name, float(args.fps)), "frames": frames, "size": [width, height]}
            for name, frames, width, height in clips for pipeline in PIPELINES]
    small = [r for r in rows if r["clip"].startswith("clip_")]
    large = [r for r in rows if r["clip"].startswith("large_")]
    mib = 2 ** 20
    first = {r["pipeline"]: r["peak"] for r in small if r["frames"] == args.frames[0]}
    last = {r["pipeline"]: r for r in small if r["frames"] == args.frames[-1]}
    model = "Compact x2 (random init), each pipeline in a fresh ComfyUI server (`--cpu --cache-none`), one prompt"
    tables = {"small": table(
        ["pipeline", "frames", "server idle", "server peak (VmHWM)", "prompt (peak - idle)",
         f"peak / peak at {args.frames[0]}", "seconds"],
        [[r["pipeline"], r["frames"], f"{r['idle'] / mib:,.0f} MiB", f"{r['peak'] / mib:,.0f} MiB",
          f"{r['prompt'] / mib:,.0f} MiB", f"{r['peak'] / first[r['pipeline']]:.3f}", f"{r['seconds']:.1f}"]
         for r in small],
        f"{args.width}x{args.height} -> {2 * args.width}x{2 * args.height}, {model}. At {args.frames[-1]} frames, "
        + "; ".join(f"{p} / core: peak {last[p]['peak'] / last['core']['peak']:.3f}, prompt "
                    f"{last[p]['prompt'] / last['core']['prompt']:.3f}" for p in PIPELINES[:2])
        + ". Seconds include loading the model, on a shared machine: not a speed claim.")}
    figures = {"flat": f"{last['node (file in)']['peak'] / first['node (file in)']:.3f}x from {args.frames[0]} to "
                       f"{args.frames[-1]} frames ({args.width}x{args.height} -> {2 * args.width}x{2 * args.height})"}
    if large:
        core = next(r for r in large if r["pipeline"] == "core")
        tables["large"] = table(
            ["pipeline", "frames", "server idle", "server peak (VmHWM)", "prompt (peak - idle)", "peak / core's",
             "seconds"],
            [[r["pipeline"], r["frames"], f"{r['idle'] / mib:,.0f} MiB", f"{r['peak'] / mib:,.0f} MiB",
              f"{r['prompt'] / mib:,.0f} MiB", f"{r['peak'] / core['peak']:.3f}", f"{r['seconds']:.1f}"] for r in large],
            f"{args.large_width}x{args.large_height} -> {2 * args.large_width}x{2 * args.large_height}, {model}.")
        node = next(r for r in large if r["pipeline"] == "node (file in)")
        figures["large_ratio"] = (f"at {args.large_frames} frames of {args.large_width}x{args.large_height} -> "
                            f"{2 * args.large_width}x{2 * args.large_height}, {node['peak'] / core['peak']:.3f}x of the "
                            f"core chain's ({node['peak'] / mib:,.0f} vs {core['peak'] / mib:,.0f} MiB for the whole "
                            f"server process; prompt {node['prompt'] / core['prompt']:.3f}x)")
    write_results(args.out, "upscale_memory", {k: v for k, v in vars(args).items() if k not in ("out", "folder", "json")},
                  {"rows": rows, "tables": tables, "figures": figures}, sources=SOURCES)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for found in tables.values():
        print(table_markdown(found))
        print()
    print("\n".join(figures.values()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
