"""bench/gpu/run_all.sh: every prepared GPU script is one of its checks, and a check runs through it (CPU plumbing)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "bench" / "gpu" / "run_all.sh"


def _run(*args, out=None):
    env = dict(os.environ, PYTHON=sys.executable)
    return subprocess.run(["bash", str(SCRIPT), *args, *([str(out)] if out else [])], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=600)


def test_every_gpu_script_is_a_check():
    listed = set(_run("--list").stdout.split())
    scripts = {p.stem for p in (REPO / "bench" / "gpu").glob("*.py") if not p.stem.startswith("_")}
    assert scripts - {"multi_gpu_placement"} <= listed, scripts - listed   # multi-GPU needs two cards: not here
    assert "verify_kernels" in listed


def test_a_check_runs_and_is_recorded(tmp_path):
    done = _run("--smoke", "--only", "gguf_dequant_cuda", out=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads((tmp_path / "run_all.json").read_text())
    assert summary["smoke"] is True and summary["failed"] == 0
    assert [c["name"] for c in summary["checks"]] == ["gguf_dequant_cuda"]
    assert json.loads((tmp_path / "gguf_dequant_cuda.json").read_text())     # the check's own results file


def test_a_failing_check_fails_the_run_and_the_rest_still_run(tmp_path):
    env_python = tmp_path / "python"
    env_python.write_text("#!/bin/sh\nexit 3\n")
    env_python.chmod(0o755)
    done = subprocess.run(["bash", str(SCRIPT), "--smoke", "--only", "decode_pool,gguf_dequant_cuda", str(tmp_path)],
                          capture_output=True, text=True, env=dict(os.environ, PYTHON=str(env_python)), cwd=REPO,
                          timeout=120)
    assert done.returncode != 0
    summary = json.loads((tmp_path / "run_all.json").read_text())
    assert [(c["name"], c["exit"]) for c in summary["checks"]] == [("decode_pool", 3), ("gguf_dequant_cuda", 3)]
    assert summary["failed"] == 2
