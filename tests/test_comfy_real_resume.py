"""H3Director Resumable Sampler in a REAL ComfyUI server, SIGKILLed mid-sampling and restarted.

For each resumable sampler (euler, euler_ancestral, dpmpp_2m) a server started with the test gate
(`fixtures/comfy_harness/resume_real_node`) runs UNETLoader -> gate -> SamplerCustom(H3Director Resumable
Sampler, 8 steps, a checkpoint every 2) on ComfyUI's own tiny random-init H3 DiT (as
tests/test_comfy_real_dit.py) and blocks in the model call of step 4; the test waits for that state and
SIGKILLs the server by its pid. A second server (no gate) then gets the same prompt: it continues at step
4 and its final latent (video and audio streams) is `torch.equal` to stock SamplerCustom with
KSamplerSelect run uninterrupted. Before resuming, prompts that differ in seed, prompt or latent size
are refused naming what differs, and resume='restart' discards another run's checkpoints and samples from
step 0; a corrupted newest checkpoint is skipped with a warning and the one before it used; a checkpoint
folder that cannot be written warns once and the sampling still ends equal to stock.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch
from comfy_harness.server import (
    HARNESS,
    comfyui_server,
    post_json,
    prepare_base,
    submit,
    write_tiny_dit_checkpoint,
)
from comfy_harness.vendored import real_comfyui_marks

pytestmark = real_comfyui_marks()

SAMPLERS = ("euler", "euler_ancestral", "dpmpp_2m")
STEPS, EVERY, GATE_STEP = 8, 2, 4
ARGS = ["--use-pytorch-cross-attention"]


def _workflow(sampler_name: str, *, resumable: bool, save_as: str, seed: int = 3, text_seed: int = 0,
              width: int = 64, run_name: str | None = None, resume: str = "auto") -> dict:
    sampler = ({"class_type": "H3DirectorResumableSampler", "inputs": {
        "sampler_name": sampler_name, "run_name": run_name or f"run_{sampler_name}", "checkpoint_every": EVERY,
        "resume": resume}} if resumable else
        {"class_type": "KSamplerSelect", "inputs": {"sampler_name": sampler_name}})
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "h3_tiny_dit.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "H3TestResumeGate", "inputs": {"model": ["1", 0]}},
        "3": {"class_type": "H3TestDiTConditioning", "inputs": {"length": 7, "dim": 48, "seed": text_seed}},
        "4": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": width, "height": 96, "length": 22}},
        "5": sampler,
        "6": {"class_type": "BasicScheduler", "inputs": {"model": ["2", 0], "scheduler": "simple", "steps": STEPS,
                                                         "denoise": 1.0}},
        "7": {"class_type": "SamplerCustom", "inputs": {
            "model": ["2", 0], "add_noise": True, "noise_seed": seed, "cfg": 1.0, "positive": ["3", 0],
            "negative": ["3", 0], "sampler": ["5", 0], "sigmas": ["6", 0], "latent_image": ["4", 0]}},
        "8": {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["7", 0], "name": save_as}},
    }


def _folder(base: Path, sampler_name: str) -> Path:
    return base / "output" / "h3director_resume" / f"run_{sampler_name}"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-resume-base"), ["models/diffusion_models"],
                        {"h3director_dit_test_nodes": HARNESS / "dit_real_node",
                         "h3director_resume_test_nodes": HARNESS / "resume_real_node"})
    write_tiny_dit_checkpoint(base)
    return base


@pytest.fixture(scope="module")
def killed(base, tmp_path_factory):
    """Per sampler: the checkpoint files present when the gated server, blocked in step 4, was SIGKILLed."""
    listings = {}
    for name in SAMPLERS:
        gate = tmp_path_factory.mktemp(f"gate-{name}")
        env = {"H3_TEST_GATE_DIR": str(gate), "H3_TEST_GATE_STEP": str(GATE_STEP)}
        with comfyui_server(base, extra_args=ARGS, env=env) as comfy:
            post_json(f"{comfy['url']}/prompt", {"prompt": _workflow(name, resumable=True, save_as=f"never_{name}"),
                                                "client_id": "h3-resume-test"})
            deadline = time.monotonic() + 300
            # blocked in step 4, and the checkpoint of step 4 (written by a background thread) is on disk
            while not ((gate / "reached").exists() and (_folder(base, name) / "step_000004.safetensors").exists()):
                assert comfy["server"].poll() is None, comfy["log"].read_text()[-4000:]
                assert time.monotonic() < deadline, comfy["log"].read_text()[-4000:]
                time.sleep(0.1)
            listings[name] = sorted(os.listdir(_folder(base, name)))
            comfy["server"].kill()  # SIGKILL, the process this fixture started
            comfy["server"].wait(timeout=30)
        assert not (base / "output" / "tensors" / f"never_{name}.safetensors").exists()
    return listings


@pytest.fixture(scope="module")
def comfy(base, killed):
    with comfyui_server(base, extra_args=ARGS) as server:
        yield server


def _load(base: Path, name: str) -> dict[str, torch.Tensor]:
    import safetensors.torch

    return safetensors.torch.load_file(str(base / "output" / "tensors" / f"{name}.safetensors"))


def test_the_killed_server_left_the_last_two_checkpoints(killed):
    for name in SAMPLERS:
        assert killed[name] == ["step_000002.safetensors", "step_000004.safetensors"], (name, killed[name])


def test_another_seed_prompt_or_latent_size_is_refused_naming_what_differs(comfy):
    cases = [({"seed": 4}, ["seed: checkpoint 3, this run 4", "initial latent:"]),
             ({"text_seed": 1}, ["conditioning: checkpoint crc"]),
             ({"width": 96}, ["latent shape: checkpoint [1, 24, 7, 6, 4]"])]
    for change, expected in cases:
        entry = submit(comfy, _workflow("euler", resumable=True, save_as="refused", **change))
        assert entry["status"]["status_str"] == "error", change
        message = json.dumps(entry["status"]["messages"])
        assert "was made by another run, refusing to resume" in message, message[:3000]
        for text in expected:
            assert text in message, (change, text, message[:3000])
    assert sorted(os.listdir(_folder(comfy["base"], "euler"))) == ["step_000002.safetensors",
                                                                   "step_000004.safetensors"]


def test_restart_discards_another_runs_checkpoints_and_samples_from_step_0(comfy):
    import shutil

    base = comfy["base"]
    leftover = base / "output" / "h3director_resume" / "run_restart"
    shutil.copytree(_folder(base, "euler"), leftover)        # seed 3's checkpoints under another run name
    refused = submit(comfy, _workflow("euler", resumable=True, save_as="refused", seed=4, run_name="run_restart"))
    assert refused["status"]["status_str"] == "error"
    entry = submit(comfy, _workflow("euler", resumable=True, save_as="restarted", seed=4, run_name="run_restart",
                                    resume="restart"))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    assert not any(p.name.startswith("step_") for p in leftover.iterdir())
    entry = submit(comfy, _workflow("euler", resumable=False, save_as="stock_seed4", seed=4))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    stock, restarted = _load(base, "stock_seed4"), _load(base, "restarted")
    assert all(torch.equal(stock[key], restarted[key]) for key in stock)


@pytest.mark.parametrize("name", SAMPLERS)
def test_the_same_prompt_resumes_and_equals_an_uninterrupted_stock_run(comfy, name):
    folder = _folder(comfy["base"], name)
    resume_from = GATE_STEP
    if name == "dpmpp_2m":  # corrupt the newest checkpoint: it is skipped with a warning, step 2 is used
        newest = folder / "step_000004.safetensors"
        newest.write_bytes(newest.read_bytes()[:-64])
        resume_from = 2
    entry = submit(comfy, _workflow(name, resumable=True, save_as=f"resumed_{name}"))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    log = comfy["log"].read_text()
    assert f"continuing at step {resume_from} of {STEPS} from {folder / f'step_{resume_from:06d}.safetensors'}" in log
    if name == "dpmpp_2m":
        assert "ignoring the unreadable checkpoint" in log and "step_000004.safetensors" in log
    assert not any(p.name.startswith("step_") for p in folder.iterdir())  # a finished run removes them

    entry = submit(comfy, _workflow(name, resumable=False, save_as=f"stock_{name}"))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    stock, resumed = _load(comfy["base"], f"stock_{name}"), _load(comfy["base"], f"resumed_{name}")
    assert sorted(stock) == sorted(resumed) == ["stream0", "stream1"]   # video and audio latents
    for key in stock:
        assert torch.isfinite(stock[key]).all()
        assert torch.equal(stock[key], resumed[key]), (name, key, (stock[key] - resumed[key]).abs().max())


def test_a_checkpoint_folder_that_cannot_be_written_warns_and_sampling_goes_on(comfy):
    base = comfy["base"]
    blocked = base / "output" / "h3director_resume" / "run_blocked"
    blocked.parent.mkdir(parents=True, exist_ok=True)
    blocked.write_text("a file where the checkpoint folder should be: every write fails")
    entry = submit(comfy, _workflow("euler", resumable=True, save_as="blocked", run_name="run_blocked"))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    log = comfy["log"].read_text()
    assert f"writing the checkpoint of step {EVERY} to {blocked / 'step_000002.safetensors'} failed" in log
    assert log.count("checkpoints stopped for this run, sampling goes on") == 1
    entry = submit(comfy, _workflow("euler", resumable=False, save_as="stock_for_blocked"))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    stock, ours = _load(base, "stock_for_blocked"), _load(base, "blocked")
    assert all(torch.equal(stock[key], ours[key]) for key in stock)
