"""Stitch memory: k chained 10 s segments at 1344x768 with audio -> one file; host peak vs k, and exactness.

Writes six 240-frame (10 s at 24 fps) segments that share 22 frames, each with 32 kHz stereo int16 sound, using a
cheap lossless setting to save CPU time (libx264 qp 0, preset ultrafast, yuv420p; PCM audio; .mkv). Then, each in
a fresh process so its peak resident set (VmHWM) is its own, stitches the first 2 and all 6 segments with
`h3director.av.stitch.stitch_files(..., video_codec="h264-lossless", preset="ultrafast")` (PCM audio) for each
blend, and checks the outputs with `compare_stitch`: every frame outside the overlaps byte-equal to the inputs'
decoded frames and every sample outside the audio cross-fades equal.

    .venv/bin/python bench/stitch_memory.py [--folder DIR] [--segments 6] [--frames 240]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# The peak is the process's VmHWM (/proc/self/status): ru_maxrss would not do, Linux carries it over execve
# from the forking parent, which here holds the comparison's buffers.
STITCH = """
import json, sys, time
from h3director.av.stitch import stitch_files
def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key))
paths, out, blend = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
base = status("VmRSS:")
t = time.perf_counter()
report = stitch_files(paths, out, 22, blend=blend, video_codec="h264-lossless", preset="ultrafast")
print(json.dumps({"frames": report.frames, "samples": report.samples, "seconds": time.perf_counter() - t,
                  "peak_rss": status("VmHWM:"), "rss_after_imports": base}))
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", default=None)
    parser.add_argument("--segments", type=int, default=6)
    parser.add_argument("--frames", type=int, default=240)
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--height", type=int, default=768)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
    from chain_clips import write_segment

    from h3director.av.stitch_check import compare_stitch

    folder = Path(args.folder or tempfile.mkdtemp(prefix="h3_stitch_"))
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    started = time.perf_counter()
    for s in range(args.segments):
        path = folder / f"seg{s}.mkv"
        if not path.exists():
            write_segment(path, segment=s, frames=args.frames, overlap=22, width=args.width, height=args.height,
                          video_codec="libx264", video_options={"qp": "0", "preset": "ultrafast"})
        paths.append(str(path))
    print(f"segments: {args.segments} x {args.frames} frames {args.width}x{args.height} in {folder} "
          f"({time.perf_counter() - started:.0f} s to write)", flush=True)
    rows = []
    for blend in ("cut", "crossfade"):
        for k in (2, args.segments):
            out = folder / f"out_{blend}_{k}.mkv"
            run = subprocess.run([sys.executable, "-c", STITCH, json.dumps(paths[:k]), str(out), blend],
                                 check=True, capture_output=True, text=True)
            result = json.loads(run.stdout.strip().splitlines()[-1])
            check = compare_stitch(paths[:k], out, 22, blend)
            rows.append({"blend": blend, "segments": k, **result, "frames_checked": check.frames_checked,
                         "frames_equal": check.frames_equal, "samples_checked": check.samples_checked,
                         "samples_equal": check.samples_equal, "output_frames": check.output_frames})
            print(json.dumps(rows[-1]), flush=True)
            out.unlink()
    print()
    print("| blend | segments | output frames | host peak (VmHWM) | peak k / peak 2 | frames equal outside overlaps "
          "| samples equal outside cross-fades | stitch time |")
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        base = next(r for r in rows if r["blend"] == row["blend"] and r["segments"] == 2)
        print(f"| {row['blend']} | {row['segments']} | {row['output_frames']} | {row['peak_rss'] / 2**20:.0f} MiB "
              f"| {row['peak_rss'] / base['peak_rss']:.3f} | {row['frames_equal']}/{row['frames_checked']} "
              f"| {row['samples_equal']}/{row['samples_checked']} | {row['seconds']:.0f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
