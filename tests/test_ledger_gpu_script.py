"""The prepared GPU check `bench/gpu/ledger_cuda.py`: its --smoke run (the same scenarios on the CPU) finds
the leak and not the cache, and without CUDA the device run refuses with exit 2 instead of measuring nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu" / "ledger_cuda.py"


def _run(*argv):
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def test_smoke_run_reports_the_leak_and_not_the_cache(tmp_path):
    out = tmp_path / "ledger.json"
    run = _run("--smoke", "--jobs", "4", "--leak-mib", "32", "--out", str(out))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    results = json.loads(out.read_text())
    assert results["problems"] == [] and results["leak"]["found_at_job"] == 2
    assert results["leak"]["leaks"][0]["series"] == "host" and results["cache"]["leaks"] == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_the_device_run_refuses():
    run = _run()
    assert run.returncode == 2 and "no CUDA device" in run.stderr


def test_bad_arguments_are_refused():
    run = _run("--smoke", "--leak-mib", "8")
    assert run.returncode == 2 and "--leak-mib >= 17" in run.stderr
