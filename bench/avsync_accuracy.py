"""Accuracy of `h3director avsync measure` on generated clips with known A/V offsets, written as real files.

    .venv/bin/python bench/avsync_accuracy.py [--seconds 8] [--seeds 1] [--out bench/results/avsync_accuracy.json]

The set (`fixtures/synthetic_av.py`, 24 fps, 32 kHz, 96x64, picture and sound noise):

* beep-and-flash: every flash shape ("step" drawn on 1, 3 or 6 frames; "fade"; "smooth" raised-cosine rise) against
  every tone shape ("step" tone burst of 100, 200 or 400 ms; "smooth" attack; decaying noise "click");
* speech-like: syllable-shaped voiced bursts with a mouth-like ellipse opening and closing in step ("mouth");

each at offsets from -200 to +200 ms with sub-frame jitter, with AAC in MP4 and 16-bit PCM in Matroska. Truth: each
event's onset as `h3director.av.onsets` defines it (the 20 % point of its rise; a frame stands at its timestamp).
Every file is measured by `measure_file`, as the CLI does; clips with no events ("none") must answer "no usable
events". Targets (issue 21): median |error| <= 5 ms, max <= one frame (41.7 ms), no-event clips unusable.
The results JSON carries every case, the summary, the code version and the machine.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
from pathlib import Path

import numpy as np

from h3director.av.measure import measure_file

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "fixtures")]
from _results import write_results  # noqa: E402
from synthetic_av import (  # noqa: E402
    FLASH_SHAPES,
    TONE_SHAPES,
    beep_flash_tracks,
    synthetic_tracks,
    write_clip,
)

FPS, RATE, SIZE = 24.0, 32000, (96, 64)
LENGTHS = ((1, 100.0), (3, 200.0), (6, 400.0))       # (flash frames, tone burst ms)
CODECS = (("aac", "mp4", ".mp4"), ("pcm_s16le", "matroska", ".mkv"))


def _cases(seeds: int):
    rng = np.random.default_rng(2026)
    for seed in range(seeds):
        for flash, tone, (frames, burst) in itertools.product(FLASH_SHAPES, TONE_SHAPES, LENGTHS):
            yield {"pattern": "beep-flash", "flash": flash, "tone": tone, "flash_frames": frames, "burst_ms": burst,
                   "offset_ms": float(rng.uniform(-200, 200)), "seed": seed}
        for index in range(6):
            yield {"pattern": "speech", "offset_ms": float(rng.uniform(-200, 200)), "seed": seed * 100 + index}


def _tracks(case: dict, seconds: float):
    if case["pattern"] == "speech":
        return synthetic_tracks("mouth", case["offset_ms"], seconds, FPS, RATE, SIZE, case["seed"])
    return beep_flash_tracks(case["offset_ms"], flash=case["flash"], flash_frames=case["flash_frames"],
                             tone=case["tone"], burst_ms=case["burst_ms"], seconds=seconds, fps=FPS,
                             sample_rate=RATE, size=SIZE, seed=case["seed"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "avsync_accuracy.json")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for case in _cases(args.seeds):
            frames, samples = _tracks(case, args.seconds)
            for codec, container, suffix in CODECS:
                path = write_clip(Path(folder) / f"clip{suffix}", frames, samples, FPS, RATE,
                                  container_format=container, audio_codec=codec)
                result = measure_file(path)
                error = None if result.offset_ms is None else result.offset_ms - case["offset_ms"]
                rows.append({**case, "codec": codec, "measured_ms": result.offset_ms, "error_ms": error,
                             "confidence": result.confidence})
        for seed in range(4):
            frames, samples = synthetic_tracks("none", 0.0, args.seconds, FPS, RATE, SIZE, seed)
            path = write_clip(Path(folder) / "none.mp4", frames, samples, FPS, RATE)
            result = measure_file(path)
            rows.append({"pattern": "none", "seed": seed, "codec": "aac", "measured_ms": result.offset_ms,
                         "error_ms": None, "confidence": result.confidence})
    summary = {}
    frame_ms = 1000.0 / FPS
    for name, select in (("beep-flash", lambda r: r["pattern"] == "beep-flash"),
                         ("speech", lambda r: r["pattern"] == "speech"),
                         ("aac", lambda r: r["pattern"] != "none" and r["codec"] == "aac"),
                         ("pcm", lambda r: r["pattern"] != "none" and r["codec"] == "pcm_s16le"),
                         ("all", lambda r: r["pattern"] != "none")):
        chosen = [r for r in rows if select(r)]
        errors = np.array([abs(r["error_ms"]) if r["error_ms"] is not None else np.inf for r in chosen])
        signed = np.array([r["error_ms"] for r in chosen if r["error_ms"] is not None])
        summary[name] = {"cases": len(chosen), "median_abs_ms": float(np.median(errors)),
                         "max_abs_ms": float(errors.max()), "mean_ms": float(signed.mean()),
                         "unanswered": int(np.sum(~np.isfinite(errors))),
                         "median_confidence": float(np.median([r["confidence"] for r in chosen]))}
    none = [r for r in rows if r["pattern"] == "none"]
    summary["no_events"] = {"cases": len(none), "unusable": sum(r["measured_ms"] is None for r in none),
                            "max_confidence": max(r["confidence"] for r in none)}
    everything = summary["all"]
    met = (everything["median_abs_ms"] <= 5.0 and everything["max_abs_ms"] <= frame_ms
           and summary["no_events"]["unusable"] == len(none))
    summary["targets"] = {"median_abs_ms_max": 5.0, "max_abs_ms_max": round(frame_ms, 1), "met": bool(met)}
    write_results(args.out, "avsync_accuracy", vars(args) | {"out": str(args.out)}, {"summary": summary, "cases": rows})
    print("| set | cases | median abs(error) ms | max abs(error) ms | mean error ms | median confidence |")
    print("|---|---|---|---|---|---|")
    for name in ("beep-flash", "speech", "aac", "pcm", "all"):
        row = summary[name]
        print(f"| {name} | {row['cases']} | {row['median_abs_ms']:.2f} | {row['max_abs_ms']:.2f} | "
              f"{row['mean_ms']:+.2f} | {row['median_confidence']:.2f} |")
    print(f"\nno-event clips: {summary['no_events']['unusable']}/{len(none)} answered 'no usable events'")
    print(f"targets (median <= 5 ms, max <= {frame_ms:.1f} ms): {'met' if met else 'NOT met'}; wrote {args.out}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
