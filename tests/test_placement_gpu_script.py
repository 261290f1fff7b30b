"""The prepared GPU script `bench/gpu/multi_gpu_placement.py`: its planning half runs anywhere (--plan-only);
without two GPUs the measurement refuses with exit 2 instead of measuring nothing; bad capacities are refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "multi_gpu_placement.py"


def _run(*argv, out=None):
    return subprocess.run([sys.executable, str(SCRIPT), *argv, *(["--out", str(out)] if out else [])],
                          capture_output=True, text=True, timeout=300)


def test_plan_only_places_the_render_on_the_given_capacities(tmp_path):
    out = tmp_path / "placement.json"
    run = _run("--plan-only", "--capacities", "cuda:0=12GB,cuda:1=8GB", "--dit-layers", "8", out=out)
    assert run.returncode == 0, run.stderr[-2000:]
    placement = json.loads(out.read_text())["placement"]
    assert placement["policy"] == "resident"
    assert [d["name"] for d in placement["devices"]] == ["cuda:0", "cuda:1"]
    assert all(d["peak_bytes"] <= d["usable_bytes"] for d in placement["devices"])
    assert placement["settings"]["weights"] == "bf16"
    assert "Placement across 2 devices" in run.stdout


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="checks the refusal on a machine without two GPUs")
def test_without_two_gpus_the_measurement_refuses():
    run = _run()
    assert run.returncode == 2
    assert f"needs at least 2 CUDA devices, found {torch.cuda.device_count()}" in run.stderr


def test_bad_capacities_are_refused_before_any_gpu_work():
    run = _run("--capacities", "cuda:0=24XB")
    assert run.returncode == 2 and "unknown size unit" in run.stderr


def _script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("multi_gpu_placement", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_one_device_run_is_skipped_when_its_plan_offloads_blocks():
    """16 GB + 8 GB, 8 blocks: the placement keeps the DiT whole on cuda:0, but cuda:0 alone needs 6 blocks
    offloaded, which the script does not run: the one-device run is not measured (it would run unplanned)."""
    script = _script()
    from h3director.plan.placement import parse_devices

    args = script.parse_args(["--capacities", "cuda:0=16GB,cuda:1=8GB", "--dit-layers", "8"])
    devices = parse_devices(args.capacities)
    placement = script.plan(args, list(devices))
    assert placement.request.offload_blocks == 0
    single, why = script.one_device_plan(args, placement, devices[0])
    assert single is None and "offloads 6 DiT blocks" in why
    args = script.parse_args(["--capacities", "cuda:0=24GB,cuda:1=24GB", "--dit-layers", "4"])
    devices = parse_devices(args.capacities)
    single, why = script.one_device_plan(args, script.plan(args, list(devices)), devices[0])
    assert why is None and single.request.offload_blocks == 0
