"""Keyframe detailing vs detailing every frame: detailer calls, host peak memory, and PSNR of the carried detail.

Content: `MovingScenes` (fixtures/synthetic_motion.py) (a smooth texture translating `--shift` px per frame,
one scene, float32 RGB) and its known detail layer. The "detailer" is an oracle that returns the detailed truth
of each frame it is given (the all-frames-detailed result is therefore the truth itself), so the PSNR measures
only what carrying the detail from keyframes loses. Keyframes: every `--n`-th frame plus the last.

Memory: the originals (an in-memory float32 IMAGE, as ComfyUI holds it) are built first; then each way is
measured in this one process with `tracemalloc` (peak of numpy/Python allocations above the moment the way
starts; OpenCV's internal scratch (flow pyramids) is not counted, it is per frame):
- all frames: the detailer on the whole clip (F frames in, F out), as a detailer node on a video does;
- keyframes -> IMAGE: Keyframe Select's batch (K), the detailer on it (K out), Keyframe Merge into one
  preallocated F-frame float32 output (the node; the K-frame batches stay alive, as ComfyUI keeps node outputs);
- keyframes -> file: the same, but the merged frames streamed to a uint8 `.npy` memmap (file pages, not traced).
PSNR (dB, over the frames between keyframes, values in [0, 1]) of the merge against the all-frames result,
with and without flow warping, and of the undetailed originals.

    .venv/bin/python bench/keyframe_detail.py [--frames 121] [--width 640] [--height 360] [--n 5] [--shift 2 1]
        [--slow-shift 0.2 0.1]

The PSNR is also measured at `--slow-shift` (slow motion; quality only). Writes bench/results/keyframe_detail.json
(`--out`): tables `ways` and `quality`, figures `readme` and `detailed` (README, KEYFRAMES.md, BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
from _results import table, table_markdown, write_results

from h3director.video import detail_carry, keyframes

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from synthetic_motion import MovingScenes  # noqa: E402

SOURCES = ("h3director/video/detail_carry.py", "h3director/video/keyframes.py", "h3director/video/optical_flow.py",
           "fixtures/synthetic_motion.py")


class OracleDetailer:
    """Returns the detailed truth of the frames it is given (by index) and counts the frames it detailed."""

    def __init__(self, clip: MovingScenes) -> None:
        self.clip, self.frames_detailed, self.calls = clip, 0, 0

    def __call__(self, frames: np.ndarray, indices) -> np.ndarray:
        """The detailed truth of `frames` `[K, H, W, 3]`, which are the clip's frames `indices`."""
        if len(frames) != len(indices):
            raise ValueError(f"{len(frames)} frames for {len(indices)} indices")
        self.calls += 1
        self.frames_detailed += len(indices)
        out = np.empty((len(indices), self.clip.height, self.clip.width, 3), np.float32)
        for slot, t in enumerate(indices):
            out[slot] = self.clip.render(t, detail=True)
        return out


def traced(run) -> tuple[object, int]:
    """(result of run(), peak traced bytes above the start)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    start = tracemalloc.get_traced_memory()[0]
    result = run()
    peak = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    return result, peak


def psnr_between(out_frames, truth: MovingScenes, skip: set[int]) -> float:
    """PSNR (dB) of the frames not in `skip` against the detailed truth, accumulated frame by frame."""
    squared, count = 0.0, 0
    for t, frame in enumerate(out_frames):
        if t in skip:
            continue
        squared += float(np.sum((frame.astype(np.float64) - truth.render(t, detail=True)) ** 2))
        count += frame.size
    return float(10 * np.log10(1.0 / (squared / count)))


def quality(clip: MovingScenes, n: int) -> dict[str, float]:
    """PSNR (dB) of the frames between keyframes (every `n`-th plus the last) against the detailed truth: carried
    with and without flow warping, and the undetailed originals."""
    originals = np.stack([clip.render(t) for t in range(clip.frames)])
    indices = keyframes.every_n_indices(clip.frames, n)
    detailed = np.stack([clip.render(t, detail=True) for t in indices])
    skip = set(indices)
    return {
        "flow warp": psnr_between(detail_carry.carry_detail(originals, detailed, indices, flow_warp=True), clip, skip),
        "no warp": psnr_between(detail_carry.carry_detail(originals, detailed, indices, flow_warp=False), clip, skip),
        "no detail (originals)": psnr_between(iter(originals), clip, skip),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=121)
    parser.add_argument("--width", type=int, default=640)
    parser.add_argument("--height", type=int, default=360)
    parser.add_argument("--n", type=int, default=5)
    parser.add_argument("--shift", type=float, nargs=2, default=(2.0, 1.0))
    parser.add_argument("--slow-shift", type=float, nargs=2, default=(0.2, 0.1))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "keyframe_detail.json")
    args = parser.parse_args()
    clip = MovingScenes(frames=args.frames, height=args.height, width=args.width, shift=tuple(args.shift))
    originals = np.stack([clip.render(t) for t in range(args.frames)])
    frame_mib = originals[0].nbytes / 2**20
    print(f"clip: {args.frames} frames {args.width}x{args.height} float32 RGB ({originals.nbytes / 2**20:.0f} MiB, "
          f"{frame_mib:.2f} MiB a frame), shift {tuple(args.shift)} px/frame, keyframes every {args.n}", flush=True)
    rows = []

    detailer = OracleDetailer(clip)
    started = time.perf_counter()
    everything, peak = traced(lambda: detailer(originals, range(args.frames)))
    rows.append(("all frames (detailer on the clip)", detailer.frames_detailed, peak, time.perf_counter() - started))
    del everything

    def keyframes_into_image():
        selection = keyframes.select_keyframes(originals, "every_n", n=args.n)
        batch = keyframes.gather_keyframes(originals, selection.indices)
        detailed = detailer(batch, selection.indices)
        out = np.empty(detail_carry.output_shape(originals, detailed, selection.indices), np.float32)
        return detail_carry.merge_into(out, originals, detailed, selection.indices, flow_warp=True)

    def keyframes_to_file(path):
        selection = keyframes.select_keyframes(originals, "every_n", n=args.n)
        batch = keyframes.gather_keyframes(originals, selection.indices)
        detailed = detailer(batch, selection.indices)
        sink = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=originals.shape)
        for t, frame in enumerate(detail_carry.carry_detail(originals, detailed, selection.indices, flow_warp=True)):
            sink[t] = np.rint(frame * 255.0)
        sink.flush()
        return selection.indices

    for label, run in (("keyframes -> one IMAGE (Keyframe Merge node)", keyframes_into_image),
                       ("keyframes -> uint8 .npy, streamed", None)):
        detailer.frames_detailed = 0
        started = time.perf_counter()
        if run is None:
            with tempfile.TemporaryDirectory() as folder:
                indices, peak = traced(lambda folder=folder: keyframes_to_file(Path(folder) / "out.npy"))
        else:
            merged, peak = traced(run)
            del merged
        rows.append((label, detailer.frames_detailed, peak, time.perf_counter() - started))

    indices = keyframes.every_n_indices(args.frames, args.n)
    speeds = {tuple(args.shift): quality(clip, args.n)}
    slow = MovingScenes(frames=args.frames, height=args.height, width=args.width, shift=tuple(args.slow_shift))
    speeds[tuple(args.slow_shift)] = quality(slow, args.n)
    full = rows[0]
    ways = table(["way", "frames detailed", "host peak above the input (tracemalloc)", "peak / all frames", "wall"],
                 [[label, count, f"{peak / 2**20:.1f} MiB ({peak / originals[0].nbytes:.1f} frames)",
                   f"{peak / full[2]:.3f}", f"{seconds:.1f} s"] for label, count, peak, seconds in rows],
                 f"{args.frames} frames {args.width}x{args.height} float32 RGB ({frame_mib:.2f} MiB a frame), moving "
                 f"{tuple(args.shift)} px per frame, keyframes every {args.n} (plus the last), an oracle detailer; "
                 "peaks above the moment each way starts, all ways in one process; wall times from a shared machine.")
    def motion(shift):
        return f"{shift[0]:g}, {shift[1]:g} px per frame"
    qualities = table([f"carried detail, {args.frames - len(indices)} frames between {len(indices)} keyframes",
                       *(f"PSNR vs all frames detailed, {motion(shift)}" for shift in speeds)],
                      [[label, *(f"{speeds[shift][label]:.2f} dB" for shift in speeds)]
                       for label in speeds[tuple(args.shift)]],
                      "PSNR over the frames between keyframes against detailing every frame (the truth), values in "
                      "[0, 1].")
    fast = speeds[tuple(args.shift)]
    speed = float(np.hypot(*args.shift))
    by_name = {label: (count, peak) for label, count, peak, _ in rows}
    streamed = by_name["keyframes -> uint8 .npy, streamed"][1] / full[2]
    image = by_name["keyframes -> one IMAGE (Keyframe Merge node)"][1] / full[2]
    readme = (f"On a {args.frames}-frame {args.width}x{args.height} clip moving {speed:.1f} px per frame "
              f"(`bench/keyframe_detail.py`): {len(indices)} frames detailed instead of {args.frames}; the carried "
              f"detail scores {fast['flow warp']:.1f} dB PSNR against detailing every frame with flow warping, "
              f"{fast['no warp']:.1f} dB without ({fast['no detail (originals)']:.1f} dB with no detail at all); "
              f"host memory is {streamed:.2f}x of detailing every frame when the frames stream to a file, but "
              f"{image:.2f}x when the result is one ComfyUI IMAGE.")
    detailed_figure = (f"{len(indices)} frames instead of {args.frames} (one frame in {args.n} plus the last: "
                       f"{len(indices) / args.frames:.3f} of the frames)")
    print(table_markdown(ways))
    print()
    print(table_markdown(qualities))
    print()
    print(readme)
    write_results(args.out, "keyframe_detail", {k: v for k, v in vars(args).items() if k != "out"},
                  {"rows": [{"way": label, "frames_detailed": count, "peak_bytes": peak, "seconds": seconds}
                            for label, count, peak, seconds in rows],
                   "psnr": {f"{a:g},{b:g}": values for (a, b), values in speeds.items()},
                   "tables": {"ways": ways, "quality": qualities},
                   "figures": {"readme": readme, "detailed": detailed_figure}}, sources=SOURCES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
