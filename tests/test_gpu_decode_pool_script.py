"""The prepared GPU script `bench/gpu/decode_pool.py` keeps working where it can be run here: its CPU smoke
mode decodes the same latents at every memory level and agrees with itself; without a GPU the real run
refuses with exit 2 instead of measuring nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "decode_pool.py"


def test_smoke_run_decodes_identically_at_every_level_and_counts_leases(tmp_path):
    out = tmp_path / "pool.json"
    run = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--out", str(out)], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    summary = json.loads(out.read_text())
    assert summary["identical_frames"] is True
    by_setting = {r["setting"]: r for r in summary["results"]}
    assert by_setting["level 0 (reference)"]["path"] == "reference"
    assert by_setting["level 2, no pool"]["pool_leases"] == 0
    assert by_setting["level 1, 1 GiB pool"]["pool_leases"] > 0
    assert by_setting["level 1, 1 GiB pool"]["collections"] == 0
    assert by_setting["level 2, 1 GiB pool"]["collections"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_a_gpu_the_real_run_refuses():
    run = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "needs a CUDA device" in run.stderr
