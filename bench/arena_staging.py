"""Would the native `Arena` pay for itself behind the video-file sink's per-clip uint8 staging? Measured here.

    .venv/bin/python bench/arena_staging.py [--clips 8] [--frames 17] [--size 1344x768] [--repeats 3]

The staging is the one host buffer per clip a streaming decode to MP4 fills (`VideoFileSink.write` ->
`video.sinks.pixels.uint8_pixels` -> `native.pack_frames`): ``frames x H x W x 3`` bytes, written once and handed to
the encoder. Without a CPU slot pool (the usual case: the pool lives on the decoder's GPU) it is a fresh
allocation per clip. This bench packs the same float32 clip (random values in the decoder's range) `--clips`
times per mode, each mode in its own process with glibc's default (dynamic) mmap threshold, as inside ComfyUI:

- fresh: `uint8_pixels(frames, spec)` allocates its output every clip (what the sink does without a pool);
- arena: the output is a lease of one `native.Arena` (page-aligned), released after the clip, so every clip
  reuses the same already-touched pages.

Recorded per mode: the median seconds per clip of the packing (allocation included) and the process's resident
set after the last clip minus before the first. Writes bench/results/arena_staging.json (`--out`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402

CHILD = """
import json, sys, time
import torch
from h3director import native
from h3director.core.devices import process_rss_bytes
from h3director.video.sinks.pixels import uint8_pixels
from h3director.video.sinks.contract import StreamSpec

mode, clips, frames, width, height = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
torch.set_num_threads(1)
clip = torch.empty((3, frames, height, width)).uniform_(-2.5, 2.5, generator=torch.Generator().manual_seed(0))
spec = StreamSpec(batch=1, channels=3, frames=frames, height=height, width=width, fps=24.0,
                  pixel_mean=(0.485, 0.456, 0.406), pixel_std=(0.229, 0.224, 0.225))
nbytes = frames * height * width * 3
arena = native.Arena(nbytes, alignment=4096) if mode == "arena" else None
uint8_pixels(clip[:, :1], spec)                      # first-call initialisation outside the timing
before = process_rss_bytes()
seconds = []
checksum = 0
for _ in range(clips):
    started = time.perf_counter()
    if arena is None:
        pixels = uint8_pixels(clip, spec)
    else:
        lease = arena.lease(nbytes)
        pixels = uint8_pixels(clip, spec, out=lease.numpy(shape=(frames, height, width, 3)))
    seconds.append(time.perf_counter() - started)
    checksum = (checksum + int(pixels[::7, ::97, ::89].sum())) % (1 << 31)
    del pixels
    if arena is not None:
        lease.release()
print(json.dumps({"seconds": seconds, "rss_growth_bytes": process_rss_bytes() - before, "checksum": checksum,
                  "backend": native.backend()}))
"""


def markdown(rows: list[dict], arguments: dict) -> str:
    """One line per mode: median milliseconds per clip and resident growth (MiB)."""
    lines = [f"  Clip of {arguments['frames']} frames at {arguments['size']}, {arguments['clips']} clips per process, "
             f"{arguments['repeats']} processes per mode:", ""]
    for row in rows:
        lines.append(f"  - {row['mode']}: median {row['median_s_per_clip'] * 1000:.0f} ms per clip; resident set "
                     f"after the last clip {row['rss_growth_bytes'] / 2**20:+.1f} MiB")
    return "\n".join(lines)


def run(mode: str, args: argparse.Namespace, width: int, height: int) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(args.clips), str(args.frames), str(width),
                          str(height)], capture_output=True, text=True, cwd=str(REPO))
    if out.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=8)
    parser.add_argument("--frames", type=int, default=17, help="frames per clip (H3's clip length)")
    parser.add_argument("--size", default="1344x768")
    parser.add_argument("--repeats", type=int, default=3, help="processes per mode, alternating")
    parser.add_argument("--out", default=str(REPO / "bench/results/arena_staging.json"))
    args = parser.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    runs: dict[str, list[dict]] = {"fresh": [], "arena": []}
    for _ in range(args.repeats):
        for mode in runs:
            runs[mode].append(run(mode, args, width, height))
    rows = []
    for mode, results in runs.items():
        per_clip = [s for result in results for s in result["seconds"]]
        rows.append({"mode": mode, "median_s_per_clip": statistics.median(per_clip),
                     "rss_growth_bytes": max(r["rss_growth_bytes"] for r in results),
                     "checksums": sorted({r["checksum"] for r in results}), "backend": results[0]["backend"]})
        print(f"{mode}: median {rows[-1]['median_s_per_clip'] * 1000:.1f} ms per clip, RSS growth "
              f"{rows[-1]['rss_growth_bytes'] / 2**20:.1f} MiB, backend {rows[-1]['backend']}")
    assert rows[0]["checksums"] == rows[1]["checksums"], "the two modes packed different bytes"
    path = write_results(args.out, "arena_staging", {"clips": args.clips, "frames": args.frames, "size": args.size,
                                                     "repeats": args.repeats}, {"rows": rows})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
