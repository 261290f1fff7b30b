"""Peak host RSS of decoding an H3 latent to an MP4 inside ComfyUI: core nodes vs the streaming node.

    COMFYUI_DIR=/path/to/ComfyUI /path/to/comfy-venv/bin/python bench/comfy_decode_memory.py \
        [--frames 22 124 243 362] [--size 512x512]

Each measurement runs in its own subprocess (so one run's peak cannot hide another's) with ComfyUI's
own modules on the CPU (`--cpu`):

- core: `VAEDecode` (nodes.py) -> `CreateVideo` -> the `save_to` call `SaveVideo` makes (H.264 MP4);
- streaming: `H3DirectorDecodeAVStreaming` in `video_file` mode (same VAE object, same latent).

The VAE is ComfyUI's `MiniMaxH3VideoVAE` at small widths with random weights
(`fixtures/comfy_harness/real_comfy.py`): decode compute is small, so the numbers isolate what grows
with video length, the host-side buffers. "decode+save" is the process's peak RSS during the decode and save
minus its RSS just before: the high-water mark (VmHWM) is reset to the current RSS before decoding
(`h3director.core.devices.reset_peak_rss`, as bench/decode_memory.py does), so what set up the model cannot
hide in the peak; "peak RSS" is the whole process's high-water mark.
Prints a Markdown table and writes bench/results/comfy_decode_memory.json (`--out`), from which
docs/BENCHMARKS.md and the README render their figures.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LATENT_FRAMES = {22: 7, 124: 37, 243: 72, 362: 107}


def _child(mode: str, latent_frames: int, height: int, width: int, workdir: str) -> dict:
    comfy_dir = os.environ["COMFYUI_DIR"]
    sys.argv = ["main.py", "--cpu", "--output-directory", workdir]
    sys.path.insert(0, comfy_dir)
    import comfy.options

    comfy.options.enable_args_parsing()
    spec = importlib.util.spec_from_file_location("h3_real_comfy", REPO / "fixtures/comfy_harness/real_comfy.py")
    real_comfy = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(real_comfy)
    real_comfy.apply_tiny_shapes()
    vae_path = Path(workdir) / "vae.safetensors"
    real_comfy.write_tiny_weights(str(vae_path), str(Path(workdir) / "audio.safetensors"))

    import av
    import comfy.sd
    import comfy.utils
    import folder_paths
    import torch

    folder_paths.set_output_directory(workdir)
    vae = comfy.sd.VAE(sd=comfy.utils.load_torch_file(str(vae_path)))
    latent = {"samples": torch.randn(1, 24, latent_frames, height // 16, width // 16,
                                     generator=torch.Generator().manual_seed(0))}
    sys.path.insert(0, str(REPO))
    from h3director.core.devices import peak_rss_bytes, process_rss_bytes, reset_peak_rss
    from h3director.core.host_heap import release_free_heap

    whole_peak = peak_rss_bytes()
    release_free_heap()
    if not reset_peak_rss():
        raise SystemExit("this bench needs a resettable peak RSS (Linux /proc/self/clear_refs)")
    before = process_rss_bytes()
    with torch.inference_mode():  # as ComfyUI's executor runs every node (execution.py)
        out = _run(mode, vae, latent, workdir)
    peak = peak_rss_bytes()
    whole_peak = max(whole_peak, peak)
    with av.open(str(out)) as container:
        frames = container.streams.video[0].frames
    return {"mode": mode, "frames": frames, "before": before, "peak": peak, "whole_peak": whole_peak,
            "file_bytes": out.stat().st_size}


def _run(mode: str, vae, latent: dict, workdir: str) -> Path:
    """Decode `latent` to an MP4 in `workdir` with the core nodes or the streaming node; return its path."""
    if mode == "core":
        from fractions import Fraction

        import nodes
        from comfy_api.latest import InputImpl, Types

        images = nodes.VAEDecode().decode(vae, latent)[0]
        video = InputImpl.VideoFromComponents(Types.VideoComponents(images=images, audio=None,
                                                                    frame_rate=Fraction(24)))
        out = Path(workdir) / "core.mp4"
        video.save_to(str(out), format=Types.VideoContainer("mp4"), codec=Types.VideoCodec("h264"))
        return out
    sys.path.insert(0, str(REPO))
    from h3director.comfy.nodes_decode import DecodeAVStreaming

    result = DecodeAVStreaming.execute(latent, vae, "video_file", "bench/h3", 24.0, 18)
    saved = result.ui.values[0]
    return Path(workdir) / saved["subfolder"] / saved["filename"]


def _measure(python: str, mode: str, latent_frames: int, height: int, width: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="h3bench-") as workdir:
        code = (f"import sys, json; sys.path.insert(0, {str(REPO / 'bench')!r}); import comfy_decode_memory as b;"
                f"print('RESULT', json.dumps(b._child({mode!r}, {latent_frames}, {height}, {width}, {workdir!r})))")
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, cwd=os.environ["COMFYUI_DIR"])
        if out.returncode != 0:
            raise SystemExit(f"{mode} {latent_frames}: failed\n{out.stderr[-3000:]}")
        line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")][-1]
        return json.loads(line[len("RESULT "):])


def markdown(rows: list[dict]) -> str:
    """The table docs/BENCHMARKS.md shows (rendered from the results file by scripts/render_docs.py)."""
    mib = 1024 ** 2
    lines = ["| frames | float32 video | core VAEDecode + SaveVideo: decode+save / peak RSS | "
             "streaming node: decode+save / peak RSS | ratio (decode+save) |", "|---:|---:|---:|---:|---:|"]
    for row in rows:
        core, stream = row["core"], row["stream"]
        core_delta, stream_delta = (core["peak"] - core["before"]) / mib, (stream["peak"] - stream["before"]) / mib
        lines.append(f"| {row['frames']} | {row['video_bytes'] / mib:.0f} MiB | {core_delta:.0f} / "
                     f"{core['whole_peak'] / mib:.0f} MiB | {stream_delta:.0f} / {stream['whole_peak'] / mib:.0f} MiB | "
                     f"{ratio(row):.1f}x |")
    return "\n".join(lines)


def ratio(row: dict) -> float:
    """Core's decode+save over the streaming node's, for one length."""
    core, stream = row["core"], row["stream"]
    return (core["peak"] - core["before"]) / max(stream["peak"] - stream["before"], 1024 ** 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, nargs="+", default=[22, 124, 243, 362], choices=sorted(LATENT_FRAMES))
    parser.add_argument("--size", default="512x512", help="WIDTHxHEIGHT in pixels, multiples of 16")
    parser.add_argument("--python", default=sys.executable, help="Python with ComfyUI's requirements")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "comfy_decode_memory.json")
    args = parser.parse_args()
    if not os.environ.get("COMFYUI_DIR"):
        raise SystemExit("set COMFYUI_DIR to a ComfyUI checkout with MiniMax H3 support")
    sys.path[:0] = [str(REPO), str(REPO / "bench")]     # h3director and the results writer, from this checkout
    from _results import write_results

    width, height = (int(v) for v in args.size.lower().split("x"))
    print(f"ComfyUI {os.environ['COMFYUI_DIR']}, {width}x{height}, CPU ({platform.processor() or platform.machine()}), "
          f"python {platform.python_version()}")
    rows = []
    for frames in args.frames:
        core = _measure(args.python, "core", LATENT_FRAMES[frames], height, width)
        stream = _measure(args.python, "stream", LATENT_FRAMES[frames], height, width)
        assert core["frames"] == stream["frames"] == frames, (core, stream)
        rows.append({"frames": frames, "video_bytes": frames * height * width * 3 * 4, "core": core, "stream": stream})
    print(markdown(rows))
    write_results(args.out, "comfy_decode_memory", {"frames": args.frames, "size": args.size},
                  {"size": [width, height], "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
