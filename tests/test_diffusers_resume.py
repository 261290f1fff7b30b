"""Resumable diffusers H3 sampling (`integrations/diffusers_resume.py`) on the real modular H3 pipeline.

Every run is a subprocess (`tests/resume_worker.py`, one thread, the tiny random-init pipeline of
fixtures/comfy_harness/farm_diffusers.py, 7 steps): stock `MiniMaxH3CoreDenoiseStep` once; the resumable loop
SIGKILLed inside the transformer call of step 4 (checkpoints every 2 steps); the same request with another
seed (refused, naming the seed); the same request again (continues at step 4, final latents `torch.equal`
to stock); and a run whose checkpoint writes the kernel refuses (file-size limit), which warns that
checkpoints stopped and still ends equal to stock.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from comfy_harness.farm_diffusers import write_embeds, write_tiny_pipeline

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "resume_worker.py"


def _worker(folder: Path, out: str, *extra: str, **popen) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(WORKER), str(folder / "pipe"), str(folder / "embeds.safetensors"),
                             str(folder / out), *extra], env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen)


def _finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    stdout, stderr = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _latents(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("diffusers_resume")
    write_tiny_pipeline(folder / "pipe")
    write_embeds(folder / "embeds.safetensors")
    stock = _finish(_worker(folder, "stock.safetensors"))
    assert stock.returncode == 0, stock.stderr[-3000:]
    return folder


def _assert_equal_to_stock(folder: Path, name: str) -> None:
    stock, ours = _latents(folder / "stock.safetensors"), _latents(folder / name)
    assert sorted(stock) == sorted(ours) == ["audio_latents", "latents"]
    for key in stock:
        assert torch.isfinite(stock[key]).all()
        assert torch.equal(stock[key], ours[key]), (key, (stock[key] - ours[key]).abs().max())


def test_killed_loop_resumes_bit_identical_and_refuses_another_seed(folder):
    checkpoints, gate = folder / "ck", folder / "gate"
    gate.mkdir()
    process = _worker(folder, "never.safetensors", "--folder", str(checkpoints), "--gate-step", "4",
                      "--gate-dir", str(gate))
    deadline = time.monotonic() + 300
    while not ((gate / "reached").exists() and (checkpoints / "step_000004.safetensors").exists()):
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.1)
    process.kill()  # SIGKILL, the process this test started
    process.communicate(timeout=60)
    assert sorted(os.listdir(checkpoints)) == ["step_000002.safetensors", "step_000004.safetensors"]

    refused = _finish(_worker(folder, "refused.safetensors", "--folder", str(checkpoints), "--seed", "1"))
    assert refused.returncode != 0
    assert "was made by another run, refusing to resume" in refused.stderr
    assert "seed: checkpoint 0, this run 1" in refused.stderr and "initial latent:" in refused.stderr
    assert not (folder / "refused.safetensors").exists()

    resumed = _finish(_worker(folder, "resumed.safetensors", "--folder", str(checkpoints)))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed_from=4" in resumed.stdout
    assert not any(p.name.startswith("step_") for p in checkpoints.iterdir())   # a finished run removes them
    _assert_equal_to_stock(folder, "resumed.safetensors")


def test_refused_checkpoint_writes_warn_and_sampling_goes_on(folder):
    checkpoints = folder / "ck_full"
    full = _finish(_worker(folder, "full.safetensors", "--folder", str(checkpoints), "--fsize-limit", "4096"))
    assert full.returncode == 0, full.stderr[-3000:]
    assert "checkpoints stopped for this run, sampling goes on" in full.stderr
    assert "File too large" in full.stderr
    assert full.stderr.count("checkpoints stopped") == 1          # warned once, not at every later step
    assert not any(p.name.startswith(("step_", ".step_")) for p in checkpoints.iterdir())
    _assert_equal_to_stock(folder, "full.safetensors")
