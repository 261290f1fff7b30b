"""The director's switches in a REAL ComfyUI server (CPU, `--cache-none`, memory level 3 by environment).

Runs when `COMFYUI_DIR` names a ComfyUI checkout with H3 support (tests/conftest.py defaults it to the
vendored `.comfy/ComfyUI`, with `COMFYUI_PYTHON`); skips otherwise. Uses the request helpers of
tests/test_comfy_real.py and its own temporary `--base-directory`. `--cache-none` makes ComfyUI run
every node of every prompt, so only the pack's own cache can save the text encoder's work.

- Cached Text Encode: the CLIP is `H3TestCountedCLIP` (tests/comfy_harness/switch_real_node: a small
  real torch encoder whose forwards are counted in a file; a new CLIP object each prompt, as a loader
  makes under `--cache-none`). A second prompt that changes only the length runs 0 encoder forwards,
  gives the same conditioning, and `/h3director/stats` shows the hit.
- Memory Guard: ComfyUI's own `MiniMaxH3Model` at a small size (tests/comfy_harness/dit_worker.py)
  sampled by KSampler through the guard with a 1 MiB budget fails with the "[Director Safety] ...
  memory limit exceeded" message naming the guarded device; the next prompt (no guard) completes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_comfy_real import PROMPT_TIMEOUT_S, START_TIMEOUT_S, _free_port, _get, _post_json

REPO = Path(__file__).resolve().parents[1]
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = [
    pytest.mark.comfyui,
    pytest.mark.slow,
    pytest.mark.skipif(not COMFYUI_DIR, reason="set COMFYUI_DIR to a ComfyUI checkout (and COMFYUI_PYTHON) to run"),
]


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    python = os.environ.get("COMFYUI_PYTHON", sys.executable)
    base = tmp_path_factory.mktemp("comfy-switch-base")
    for folder in ("custom_nodes", "models/diffusion_models", "input", "output", "temp", "user", "web"):
        (base / folder).mkdir(parents=True)
    (base / "custom_nodes" / "H3-Director").symlink_to(REPO, target_is_directory=True)
    shutil.copytree(REPO / "tests/comfy_harness/dit_real_node", base / "custom_nodes" / "h3director_dit_test_nodes")
    shutil.copytree(REPO / "tests/comfy_harness/switch_real_node", base / "custom_nodes" / "h3director_switch_nodes")
    weights = base / "models" / "diffusion_models" / "h3_tiny_dit.safetensors"
    make_weights = (
        f"import sys; sys.path.insert(0, {str(REPO / 'tests' / 'comfy_harness')!r}); import dit_worker;"
        f"h3 = dit_worker.import_comfy({COMFYUI_DIR!r}); import safetensors.torch;"
        "sd = {k: v.contiguous() for k, v in dit_worker.tiny_state_dict(h3).items()};"
        f"safetensors.torch.save_file(sd, {str(weights)!r})"
    )
    subprocess.run([python, "-c", make_weights], check=True, cwd=REPO, timeout=300,
                   env=dict(os.environ, PYTHONPATH=str(REPO)))
    port = _free_port()
    log_path = base / "comfyui.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed after the server stops
    env = dict(os.environ, PYTHONUNBUFFERED="1", H3_MEMORY_OPTIMIZATION_LEVEL="3")
    server = subprocess.Popen(
        [python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port), "--base-directory", str(base),
         "--disable-auto-launch", "--front-end-root", str(base / "web"), "--use-pytorch-cross-attention",
         "--cache-none"],
        cwd=COMFYUI_DIR, stdout=log, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and server.poll() is None:
        try:
            if _get(f"{url}/system_stats")[0] == 200:
                break
        except OSError:
            time.sleep(1)
    if server.poll() is not None or time.monotonic() >= deadline:
        server.kill()
        log.close()
        pytest.fail("ComfyUI did not start:\n" + log_path.read_text()[-4000:])
    yield {"url": url, "base": base, "log": log_path, "server": server}
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def _submit(comfy, workflow: dict) -> dict:
    """The prompt's history entry once it finished (success or error)."""
    prompt_id = _post_json(f"{comfy['url']}/prompt", {"prompt": workflow, "client_id": "h3-switch-test"})["prompt_id"]
    deadline = time.monotonic() + PROMPT_TIMEOUT_S
    while time.monotonic() < deadline:
        status, body = _get(f"{comfy['url']}/history/{prompt_id}")
        history = json.loads(body) if status == 200 else {}
        if prompt_id in history:
            return history[prompt_id]
        time.sleep(0.5)
    raise AssertionError("prompt did not finish:\n" + comfy["log"].read_text()[-4000:])


def _text_workflow(length: int) -> dict:
    return {
        "1": {"class_type": "H3TestCountedCLIP", "inputs": {"seed": 3}},
        "2": {"class_type": "H3DirectorCachedTextEncode", "inputs": {"clip": ["1", 0], "text": "a red fox in snow"}},
        "3": {"class_type": "H3TestUseConditioning", "inputs": {"conditioning": ["2", 0], "length": length}},
    }


def test_changing_only_the_length_runs_no_text_encoder_forward(comfy):
    output = comfy["base"] / "output"
    first = _submit(comfy, _text_workflow(22))
    assert first["status"]["status_str"] == "success", json.dumps(first["status"])[:4000]
    assert (output / "encoder_forwards.txt").read_text() == "1"
    second = _submit(comfy, _text_workflow(23))
    assert second["status"]["status_str"] == "success", json.dumps(second["status"])[:4000]
    assert (output / "encoder_forwards.txt").read_text() == "1"       # 0 forwards for the second prompt
    assert (output / "conditioning_22.txt").read_text() == (output / "conditioning_23.txt").read_text()
    stats = json.loads(_get(f"{comfy['url']}/h3director/stats")[1])
    assert stats["text_cache"]["misses"] == 1 and stats["text_cache"]["hits"] == 1
    assert stats["text_cache"]["bytes_saved"] == (16 * 32 + 32) * 4
    assert stats["shared_store"]["memory_budget_bytes"] == 1024 * 1024 * 1024


def _dit_workflow(guard_budget_gb: float | None) -> dict:
    model = ["1", 0]
    workflow = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "h3_tiny_dit.safetensors", "weight_dtype": "default"}},
        "3": {"class_type": "H3TestDiTConditioning", "inputs": {"length": 7, "dim": 48, "seed": 0}},
        "4": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": 64, "height": 96, "length": 22}},
        "5": {"class_type": "KSampler", "inputs": {"seed": 3, "steps": 1, "cfg": 1.0, "sampler_name": "euler",
                                                   "scheduler": "simple", "denoise": 1.0, "positive": ["3", 0],
                                                   "negative": ["3", 0], "latent_image": ["4", 0]}},
        "6": {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["5", 0], "name": "after_guard"}},
    }
    if guard_budget_gb is not None:
        workflow["2"] = {"class_type": "H3DirectorMemoryGuard",
                         "inputs": {"model": model, "action": "stop_and_clear", "budget_gb": guard_budget_gb}}
        model = ["2", 0]
    workflow["5"]["inputs"]["model"] = model
    return workflow


def test_guard_stops_the_prompt_with_the_safety_message_and_the_next_prompt_runs(comfy):
    stopped = _submit(comfy, _dit_workflow(guard_budget_gb=1 / 1024))    # 1 MiB
    assert stopped["status"]["status_str"] == "error"
    messages = json.dumps(stopped["status"]["messages"])
    assert "[Director Safety] CPU memory limit exceeded" in messages and "on cpu" in messages
    assert "models unloaded and caches emptied" in messages
    assert comfy["server"].poll() is None                                 # the worker lives
    after = _submit(comfy, _dit_workflow(guard_budget_gb=None))
    assert after["status"]["status_str"] == "success", json.dumps(after["status"])[:4000]
    assert (comfy["base"] / "output" / "tensors" / "after_guard.safetensors").is_file()
