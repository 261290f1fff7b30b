"""How long `h3director plan` takes, and how many estimates it prices, as the length and canvas grow.

Run: .venv/bin/python bench/planner_speed.py

Each case runs in a fresh interpreter (the planner's caches start empty) and times what `plan` does after
its imports: one `estimate` of the request as asked plus `recommend`. Columns: the case, the outcome
(settings, the long-form chain's segment count and longest segment, or the refusal), the `estimate` calls, and the wall time of the one run
(one sample on a shared machine: compare the rows with each other, not with another machine).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

from _results import table, write_results

GiB = 1024**3
CASES = (
    (1344, 768, 124, 24, 64, None),
    (1344, 768, 362, 24, 64, None),
    (1344, 768, 2011, 24, 64, None),
    (1344, 768, 20_405, 24, 64, None),
    (1344, 768, 86_399, 24, 64, None),          # the longest length the planner accepts
    (1344, 768, 86_399, 10, 48, "q4_k_m"),
    (1344, 768, 86_399, 141, 2000, None),
    (4096, 2048, 86_399, 80, 512, None),
    (4096, 4096, 86_399, 24, 64, None),         # the largest canvas: refused ("nothing fits")
)

_CHILD = r"""
import importlib, json, sys, time
from h3director.errors import BudgetError
from h3director.plan.estimate import PlanRequest
est = importlib.import_module("h3director.plan.estimate")
rec = importlib.import_module("h3director.plan.recommend")
calls = [0]
real = est.estimate
def counting(request):
    calls[0] += 1
    return real(request)
rec.estimate = counting
width, height, frames, vram, ram, fmt = json.loads(sys.argv[1])
request = PlanRequest(width, height, frames)
start = time.perf_counter()
try:
    counting(request)
    advice = rec.recommend(request, rec.Budget(vram * 2**30, ram * 2**30), formats=[fmt] if fmt else None)
    r, lf = advice.request, advice.long_form
    outcome = f"{r.weights}, {r.offload_blocks} offloaded, {r.head_chunks}/{r.ffn_chunks} chunks" + (
        f", {lf.chunks} segments of up to {lf.chunk_frames} frames" if lf else "")
except BudgetError as exc:
    outcome = "refused: " + str(exc).split(":")[0]
print(json.dumps({"seconds": time.perf_counter() - start, "estimates": calls[0], "outcome": outcome}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "planner_speed.json")
    args = parser.parse_args()
    print(f"# planner speed, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
          f"Python {platform.python_version()}")
    print("| canvas | frames | budget (VRAM / RAM GiB) | formats | outcome | estimates | seconds |")
    print("|---|---:|---|---|---|---:|---:|")
    rows, figures = [], {}
    for case in CASES:
        width, height, frames, vram, ram, fmt = case
        out = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(case)], capture_output=True, text=True,
                             check=True)
        result = json.loads(out.stdout)
        rows.append([f"{width}x{height}", f"{frames:,}", f"{vram} / {ram}", fmt or "all", result["outcome"],
                     f"{result['estimates']:,}", f"{result['seconds']:.3f}"])
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
        if (width, height, frames, vram, ram, fmt) == (1344, 768, 20_405, 24, 64, None):
            figures["seconds_20405"] = f"{result['seconds']:.2f} s for 20,405 frames"
        figures["slowest"] = max(figures.get("slowest", 0.0), result["seconds"])
    figures["slowest"] = f"{figures['slowest']:.2f} s"
    write_results(args.out, "planner_speed", {"cases": [list(c) for c in CASES]}, {
        "tables": {"speed": table(["canvas", "frames", "budget (VRAM / RAM GiB)", "formats", "outcome", "estimates",
                                   "seconds"], rows,
                                  note="seconds: wall time of one estimate plus recommend in a fresh interpreter "
                                       "(one sample on a shared machine: compare the rows with each other).")},
        "figures": figures}, sources=("h3director/plan", "h3director/geometry.py"))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
