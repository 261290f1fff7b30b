"""Calibration table of the planner's byte model (docs/PLANNER.md): small configs of the real diffusers H3
classes, peak live tensor bytes measured on the CPU vs predicted from the configs. Not held out: two of
the cases were run while the byte model was written (see docs/PLANNER.md).

Run: .venv/bin/python bench/planner_calibration.py
"""

from __future__ import annotations

import pathlib
import platform
import sys
import time
from datetime import datetime, timezone

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fixtures"))

from plan_calibration_cases import CASES  # noqa: E402


def main() -> None:
    print(f"# planner calibration, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.machine()}, "
          f"{platform.processor() or 'cpu'}")
    print("| case | measured peak (B) | predicted (B) | error | seconds |")
    print("|---|---:|---:|---:|---:|")
    for case in CASES:
        start = time.perf_counter()
        measured, predicted = case.run()
        seconds = time.perf_counter() - start
        print(f"| {case.name} | {measured:,} | {predicted:,} | {predicted / measured - 1:+.2%} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
