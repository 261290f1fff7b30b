"""Stitch memory: k chained 10 s segments at 1344x768 with audio -> one file; host peak vs k, and exactness.

Writes six 240-frame (10 s at 24 fps) segments that share 22 frames, each with 32 kHz stereo int16 sound, using a
cheap lossless setting to save CPU time (libx264 qp 0, preset ultrafast, yuv420p; PCM audio; .mkv). Then, each in
a fresh process so its peak resident set (VmHWM) is its own, stitches the first 2 and all 6 segments with
`h3director.av.stitch.stitch_files(..., video_codec="h264-lossless", preset="ultrafast")` (PCM audio) for each
blend, and checks the outputs with `compare_stitch`: every frame outside the overlaps byte-equal to the inputs'
decoded frames and every sample outside the audio cross-fades equal.

    .venv/bin/python bench/stitch_memory.py [--folder DIR] [--segments 6] [--frames 240] [--width 1344 --height 768]

Writes bench/results/stitch_memory.json (`--out`): table `peaks` and figures `summary` (AV.md, BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _results import table, table_markdown, write_results

SOURCES = ("h3director/av/stitch.py", "h3director/av/timeline.py", "h3director/av/segment_audio.py",
           "h3director/av/audio_end.py", "h3director/av/open_file.py", "h3director/av/stitch_check.py",
           "h3director/av/chain_clips.py")

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
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "stitch_memory.json")
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
    mib = 2 ** 20
    body = []
    for row in rows:
        base = next(r for r in rows if r["blend"] == row["blend"] and r["segments"] == 2)
        body.append([row["blend"], row["segments"], f"{row['output_frames']:,}", f"{row['peak_rss'] / mib:.0f} MiB",
                     f"{row['peak_rss'] / base['peak_rss']:.3f}", f"{row['frames_equal']:,} / {row['frames_checked']:,}",
                     f"{row['samples_equal']:,} / {row['samples_checked']:,}", f"{row['seconds']:.0f} s"])
    after_imports = max(r["rss_after_imports"] for r in rows) / mib
    note = (f"{args.segments} segments of {args.frames} frames at {args.width}x{args.height}, 24 fps, 22-frame overlaps, "
            "32 kHz stereo int16 sound; each stitch in a fresh process, `h264-lossless` (ultrafast) + PCM. Host peak = "
            f"the process's VmHWM (about {after_imports:.0f} MiB of it after the imports); the ratio compares it with "
            "the same blend at 2 segments. Frames and samples are compared with the inputs' decoded ones, "
            "outside the overlaps (frames) and the audio cross-fades (samples). Stitch time is from a shared machine.")
    peaks = table(["blend", "segments", "output frames", "host peak (VmHWM)", "peak / peak at 2 segments",
                   "frames equal outside the overlaps", "samples equal outside the cross-fades", "stitch time"],
                  body, note)
    at = {(r["blend"], r["segments"]): r for r in rows}
    ratio = {b: at[(b, args.segments)]["peak_rss"] / at[(b, 2)]["peak_rss"] for b in ("cut", "crossfade")}
    exact = all(r["frames_equal"] == r["frames_checked"] and r["samples_equal"] == r["samples_checked"] for r in rows)
    summary = (f"host peak {at[('cut', args.segments)]['peak_rss'] / mib:.0f} MiB with `cut`, "
               f"{at[('crossfade', args.segments)]['peak_rss'] / mib:.0f} MiB with `crossfade` at {args.segments} "
               f"segments of {args.frames} frames {args.width}x{args.height}; {args.segments}-segment / 2-segment peak "
               f"{ratio['cut']:.3f} and {ratio['crossfade']:.3f}; "
               + ("every frame and sample outside the overlaps equal" if exact
                  else "NOT every frame and sample outside the overlaps equal"))
    print(table_markdown(peaks))
    print(summary)
    write_results(args.out, "stitch_memory", {k: v for k, v in vars(args).items() if k not in ("folder", "out")},
                  {"rows": rows, "tables": {"peaks": peaks}, "figures": {"summary": summary}}, sources=SOURCES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
