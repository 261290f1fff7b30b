"""The prepared GPU scripts of issue 24 keep working where they can run here: `bench/gpu/upscale_recipe.py --smoke`
runs the three variants on the CPU (in the ComfyUI environment: spandrel) and `bench/gpu/doctor_driver.py` writes the
doctor's report; without a GPU or driver each real run refuses with exit 2 instead of measuring nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from comfy_harness.server import comfyui_python

from h3director.core import devices

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "bench" / "gpu" / "upscale_recipe.py"
DOCTOR = REPO / "bench" / "gpu" / "doctor_driver.py"


def _run(python: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([python, *args], cwd=REPO, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="2"))


@pytest.mark.skipif(not os.environ.get("COMFYUI_PYTHON") or not Path(comfyui_python()).is_file(),
                    reason="needs the ComfyUI environment with spandrel (COMFYUI_PYTHON; bash scripts/setup.sh)")
def test_recipe_smoke_runs_the_three_variants(tmp_path):
    out = tmp_path / "recipe.json"
    run = _run(comfyui_python(), str(RECIPE), "--smoke", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    results = json.loads(out.read_text())
    assert [r["variant"] for r in results["rows"]] == ["full", "recipe", "recipe fp16 x4"]
    assert all(r["seconds"] > 0 and r["peak_host_bytes"] > 0 for r in results["rows"])
    assert results["rows"][2]["dtype_error"]["max_abs"] > 0
    assert results["fp16_x4_vs_fp32_recipe_output"]["max_uint8_levels"] <= 3


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_recipe_without_a_gpu_refuses():
    run = _run(sys.executable, str(RECIPE))
    assert run.returncode == 2 and "needs a CUDA device" in run.stderr


@pytest.mark.skipif(devices.nvml_available(), reason="checks the no-driver answer")
def test_doctor_driver_without_a_driver_writes_the_report_and_exits_2(tmp_path):
    out = tmp_path / "doctor.json"
    run = _run(sys.executable, str(DOCTOR), "--out", str(out))
    assert run.returncode == 2 and "no driver version read" in run.stderr
    report = json.loads(out.read_text())
    assert report["driver"]["driver_version"] is None and report["driver"]["warnings"] == []
