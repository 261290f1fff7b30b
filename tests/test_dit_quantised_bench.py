"""bench/dit_quantised_vs_kjnodes.py and bench/gpu/dit_quantised_kjnodes.py, in their --smoke mode (toy widths,
CPU): the quantised blocks build as ComfyUI builds them (int8_tensorwise on its own kernel, fp8 on ComfyUI's CPU
fallback), every setup runs and is compared with the stock block, and the results files hold what the docs render.
With `KJNODES_DIR` naming a ComfyUI-KJNodes checkout, KJNodes' H3 nodes run as the third setup."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from comfy_harness.vendored import h3_comfyui_root, why_no_h3_comfyui

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "bench" / "dit_quantised_vs_kjnodes.py"
GPU = REPO / "bench" / "gpu" / "dit_quantised_kjnodes.py"
ROOT = h3_comfyui_root()
KJNODES = os.environ.get("KJNODES_DIR")
HAVE_KJNODES = bool(KJNODES) and Path(KJNODES, "nodes", "minimax_nodes.py").is_file()
pytestmark = [pytest.mark.comfyui, pytest.mark.skipif(ROOT is None, reason=why_no_h3_comfyui() if ROOT is None else "")]


def _run(script: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COMFYUI_DIR": str(ROOT), "OMP_NUM_THREADS": "2"}
    python = os.environ.get("COMFYUI_PYTHON") or sys.executable
    return subprocess.run([python, str(script), *args], capture_output=True, text=True, env=env, cwd=REPO, timeout=600)


def test_bench_smoke_runs_every_setup_and_writes_its_tables(tmp_path):
    out = tmp_path / "r.json"
    run = _run(BENCH, "--smoke", "--out", str(out), *(["--kjnodes", KJNODES] if HAVE_KJNODES else []))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["rows_measured"]
    setups = ["stock", "director 4x8"] + (["kjnodes 4x8"] if HAVE_KJNODES else [])
    assert [(r["layout"], r["setup"]) for r in rows] == [(layout, setup) for layout in
                                                         ("int8_tensorwise", "fp8_e4m3fn", "bf16") for setup in setups]
    paths = {r["layout"]: r["path"] for r in rows}
    assert paths == {"int8_tensorwise": "native", "fp8_e4m3fn": "emulated", "bf16": "bf16"}
    assert all(r["peak_bytes"] > 0 for r in rows)
    assert all(r["equal"] for r in rows if r["setup"] == "stock")
    assert data["kjnodes"]["given"] is HAVE_KJNODES
    table = data["tables"]["peaks"]
    assert len(table["rows"]) == len(rows) and all(len(row) == len(table["columns"]) for row in table["rows"])
    assert set(data["figures"]) == {f"{layout}_4x8" for layout in paths}
    assert data["code"]["commit"] and data["sources"][0] == "bench/dit_quantised_vs_kjnodes.py"


def test_bench_refuses_bad_chunks_before_building_anything(tmp_path):
    run = _run(BENCH, "--smoke", "--out", str(tmp_path / "r.json"), "--chunks", "3x8")
    assert run.returncode == 2 and "head groups must divide the 4 heads, got 3" in run.stderr
    run = _run(BENCH, "--smoke", "--out", str(tmp_path / "r.json"), "--chunks", "4by8")
    assert run.returncode == 2 and "chunks look like 4x8" in run.stderr
    assert not (tmp_path / "r.json").exists()


def test_gpu_script_smoke_records_each_layout_or_its_error(tmp_path):
    out = tmp_path / "g.json"
    run = _run(GPU, "--smoke", "--out", str(out), "--layouts", "bf16", "int8_tensorwise", "nvfp4")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["smoke"] is True and data["device"] == "cpu"
    done = {r["layout"] for r in data["results"]}
    assert {"bf16", "int8_tensorwise"} <= done
    assert "nvfp4" in done or "nvfp4" in data["errors"]       # recorded either way, never dropped
