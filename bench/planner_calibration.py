"""Calibration table of the planner's byte model (docs/PLANNER.md): small configs of the real diffusers H3
classes, peak live tensor bytes measured on the CPU vs predicted from the configs. Not held out: two of
the cases were run while the byte model was written (see docs/PLANNER.md).

Run: .venv/bin/python bench/planner_calibration.py [--out bench/results/planner_calibration.json]
Prints the table and writes it to the results file docs/PLANNER.md and docs/BENCHMARKS.md render it from.
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import sys
import time
from datetime import datetime, timezone

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fixtures"))

from _results import table, write_results  # noqa: E402
from plan_calibration_cases import CASES  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "planner_calibration.json"
SOURCES = ("fixtures/plan_calibration_cases.py", "h3director/plan/activations.py", "h3director/plan/decode.py",
           "h3director/plan/audio.py", "h3director/plan/live_bytes.py", "h3director/integrations/diffusers_h3.py",
           "h3director/video/decoder.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS, help="results file (default: %(default)s)")
    args = parser.parse_args()
    print(f"# planner calibration, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
          f"{platform.processor() or 'cpu'}")
    print("| case | measured peak (B) | predicted (B) | error | seconds |")
    print("|---|---:|---:|---:|---:|")
    rows, errors = [], []
    for case in CASES:
        start = time.perf_counter()
        measured, predicted = case.run()
        seconds = time.perf_counter() - start
        errors.append(predicted / measured - 1)
        rows.append([case.name, f"{measured:,}", f"{predicted:,}", f"{errors[-1]:+.2%}", f"{seconds:.1f}"])
        print("| " + " | ".join(rows[-1]) + " |", flush=True)
    worst = max(errors, key=abs)
    write_results(args.out, "planner_calibration", {}, {
        "tables": {"calibration": table(
            ["case", "measured peak (B)", "predicted (B)", "error", "seconds"], rows,
            note="error = predicted / measured - 1; measured = peak live tensor bytes counted by LiveBytesTracker "
                 "over the real diffusers classes (small configs, CPU); predicted = the planner's byte ledger; "
                 "seconds include building the model.")},
        "figures": {"worst_error": f"{worst:+.2%}", "cases": str(len(CASES))}}, sources=SOURCES)
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
