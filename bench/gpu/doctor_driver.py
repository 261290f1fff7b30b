"""The driver gate on a machine with NVML: `h3director doctor --json`, with the NVIDIA driver, the CUDA version it
supports, torch's CUDA runtime and the GPU names, written to a file.

    python bench/gpu/doctor_driver.py [--out doctor_driver.json]

Runs `python -m h3director doctor --json` in a fresh process, checks that the driver section was read (exit 2 with
the doctor's status when NVML or the driver is missing), prints the versions and any driver warnings, and writes the
whole report to --out, else $OUT/doctor_driver.json, else ./doctor_driver.json. Not run in this project's CI (no
GPU); see docs/BENCHMARKS.md for whether a run has been recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    result = subprocess.run([sys.executable, "-m", "h3director", "doctor", "--json"], cwd=REPO, capture_output=True,
                            text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    if result.returncode != 0:
        print(result.stderr, file=sys.stderr)
        return result.returncode
    report = json.loads(result.stdout)
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "doctor_driver.json")
    out.write_text(json.dumps(report, indent=2))
    driver = report.get("driver") or {}
    for key in ("status", "driver_version", "cuda_driver_version", "cuda_runtime_version", "cudart_version", "gpus"):
        print(f"{key}: {driver.get(key)}")
    for warning in driver.get("warnings", []):
        print(f"warning: {warning}")
    print(f"written: {out}")
    if driver.get("driver_version") is None:
        print(f"no driver version read: {driver.get('status')}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
