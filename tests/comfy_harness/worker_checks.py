"""Both sides of a check worker: a script run in a fresh Python with a real ComfyUI (the pack's other tests put
stand-in `comfy` modules on sys.path, so the real one cannot share their process) and the test that runs it.

Worker side: `Checks` records each named check as ``{"ok": bool, "detail": str}`` (an exception fails the check
with the end of its traceback) and `Checks.emit` prints them on one line after a marker.
Test side: `run_worker` runs the script with this repository on PYTHONPATH and returns the parsed results,
failing with the worker's output when it exits non-zero or prints no results line.
Only the standard library is imported here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class Checks:
    """Named pass/fail checks of one worker run, in the order they ran."""

    def __init__(self) -> None:
        self.results: dict[str, dict] = {}

    def check(self, name: str, fn: Callable[[], tuple[object, object]]) -> None:
        """Run `fn` (returning ``(ok, detail)``) and record it under `name`; an exception records a failure."""
        try:
            ok, detail = fn()
        except Exception:
            ok, detail = False, traceback.format_exc()[-3000:]
        self.results[name] = {"ok": bool(ok), "detail": str(detail)}


def emit(marker: str, results: dict) -> None:
    """Print `results` as the line the test side reads: ``MARKER {json}``."""
    print(f"{marker} " + json.dumps(results, default=str))


def run_worker(worker: Path, args: list, marker: str, *, python: str | None = None, timeout: int = 600,
               env: dict[str, str] | None = None) -> dict:
    """Run ``python worker *args`` (default: this Python) from the repository root with the repository on
    PYTHONPATH and OMP_NUM_THREADS 2 unless set; `env` adds variables. Returns the JSON after the last
    line starting with `marker`; asserts, with the worker's output, when it failed or printed none."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2"),
                **(env or {})}
    run = subprocess.run([python or sys.executable, str(worker), *map(str, args)], capture_output=True, text=True,
                         env=full_env, timeout=timeout, cwd=REPO)
    prefix = marker + " "
    lines = [line for line in run.stdout.splitlines() if line.startswith(prefix)]
    assert run.returncode == 0 and lines, f"worker failed ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    return json.loads(lines[-1][len(prefix):])
