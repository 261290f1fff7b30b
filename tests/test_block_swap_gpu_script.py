"""The prepared GPU script `bench/gpu/block_swap_overlap.py`: its --dry-run runs both paths (ComfyUI node call,
diffusers call) on the CPU at toy sizes, offloaded outputs equal to resident and the swap's counts recorded;
without a GPU the measurement refuses with exit 2 instead of measuring nothing; a bad count is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from comfy_harness.vendored import h3_comfyui_root, why_no_h3_comfyui

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "block_swap_overlap.py"
ROOT = h3_comfyui_root()


def _run(*argv):
    env = dict(os.environ, **({"COMFYUI_DIR": str(ROOT)} if ROOT else {}))
    return subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=600, env=env)


@pytest.mark.skipif(ROOT is None, reason=why_no_h3_comfyui() if ROOT is None else "")
def test_dry_run_runs_both_paths_exactly(tmp_path):
    out = tmp_path / "dry.json"
    run = _run("--dry-run", "--repeats", "1", "--out", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dry_run"] and result["device"] == "cpu" and result["offload"] == 2
    for path in ("comfy", "diffusers"):
        for setting in ("stream", "sync"):
            assert result[path][setting]["equal_to_resident"], (path, setting)
        assert set(result[path]) >= {"resident", "transfer_s", "hidden_s", "overlap", "copy_one_block"}
    assert result["comfy"]["stream"]["report"]["onloads"] == 2 * 2  # warm-up + one timed forward, 2 blocks each
    assert result["diffusers"]["stream"]["peak_offloaded_on_device"] == 2
    assert result["diffusers"]["sync"]["prefetched"] == 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_without_a_gpu_the_measurement_refuses(tmp_path):
    run = _run("--out", str(tmp_path / "r.json"))
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr


def test_a_count_above_the_blocks_is_refused(tmp_path):
    run = _run("--dry-run", "--offload", "9", "--out", str(tmp_path / "r.json"))
    assert run.returncode == 2 and "--offload must be 0..4" in run.stderr
