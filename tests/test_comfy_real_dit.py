"""H3Director DiT Memory in a REAL ComfyUI server: UNETLoader -> DiT Memory -> KSampler over HTTP.

Runs when `COMFYUI_DIR` names a ComfyUI checkout with H3 support (tests/conftest.py defaults it to the
vendored `.comfy/ComfyUI`, with `COMFYUI_PYTHON`); skips otherwise. Uses the request helpers of
tests/test_comfy_real.py and its own temporary `--base-directory`.

The diffusion model is ComfyUI's own `MiniMaxH3Model` at a small size: a random state dict in ComfyUI's
key layout (`tests/comfy_harness/dit_worker.py`, 2 blocks, 4 heads of 16), which `UNETLoader` detects as
MiniMax H3 (`comfy/model_detection.py`). H3's text encoder (Qwen3-VL) is too large for a test, so
`H3TestDiTConditioning` (tests/comfy_harness/dit_real_node) makes random text-encoder states of the
model's text width. Checks: two-step KSampler output with the node is bit-identical to the stock
model's, the node shows its report and the server log names the tier that ran; a head count that does
not divide is a node error naming the valid counts.
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
import torch
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
    base = tmp_path_factory.mktemp("comfy-dit-base")
    for folder in ("custom_nodes", "models/diffusion_models", "input", "output", "temp", "user", "web"):
        (base / folder).mkdir(parents=True)
    (base / "custom_nodes" / "H3-Director").symlink_to(REPO, target_is_directory=True)
    shutil.copytree(REPO / "tests/comfy_harness/dit_real_node", base / "custom_nodes" / "h3director_dit_test_nodes")
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
    server = subprocess.Popen(
        [python, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port), "--base-directory", str(base),
         "--disable-auto-launch", "--front-end-root", str(base / "web"), "--use-pytorch-cross-attention"],
        cwd=COMFYUI_DIR, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
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
    yield {"url": url, "base": base, "log": log_path}
    server.terminate()
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
    log.close()


def _submit(comfy, workflow: dict) -> dict:
    """The prompt's history entry once it finished (success or error)."""
    prompt_id = _post_json(f"{comfy['url']}/prompt", {"prompt": workflow, "client_id": "h3-dit-test"})["prompt_id"]
    deadline = time.monotonic() + PROMPT_TIMEOUT_S
    while time.monotonic() < deadline:
        status, body = _get(f"{comfy['url']}/history/{prompt_id}")
        history = json.loads(body) if status == 200 else {}
        if prompt_id in history:
            return history[prompt_id]
        time.sleep(0.5)
    raise AssertionError("prompt did not finish:\n" + comfy["log"].read_text()[-4000:])


def _workflow(head_chunks: int, ffn_chunks: int) -> dict:
    sampler = {"seed": 3, "steps": 2, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0,
               "positive": ["3", 0], "negative": ["3", 0], "latent_image": ["4", 0]}
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "h3_tiny_dit.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "H3DirectorDiTMemory", "inputs": {
            "model": ["1", 0], "mode": "fixed", "head_chunks": head_chunks, "ffn_chunks": ffn_chunks, "budget_gb": 0.0}},
        "3": {"class_type": "H3TestDiTConditioning", "inputs": {"length": 7, "dim": 48, "seed": 0}},
        "4": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": 64, "height": 96, "length": 22}},
        "5": {"class_type": "KSampler", "inputs": {"model": ["1", 0], **sampler}},
        "6": {"class_type": "KSampler", "inputs": {"model": ["2", 0], **sampler}},
        "7": {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["5", 0], "name": "stock"}},
        "8": {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["6", 0], "name": "dit_memory"}},
    }


def test_node_is_listed(comfy):
    info = json.loads(_get(f"{comfy['url']}/object_info/H3DirectorDiTMemory")[1])["H3DirectorDiTMemory"]
    assert info["display_name"] == "H3Director DiT Memory" and info["category"] == "H3 Director/memory"
    assert info["input"]["required"]["mode"][1]["options"] == ["auto", "exact only", "fixed"] or \
        info["input"]["required"]["mode"][0] == ["auto", "exact only", "fixed"]


def test_sampling_through_the_node_equals_stock_bit_for_bit(comfy):
    import safetensors.torch

    entry = _submit(comfy, _workflow(head_chunks=2, ffn_chunks=3))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    folder = comfy["base"] / "output" / "tensors"
    stock = safetensors.torch.load_file(str(folder / "stock.safetensors"))
    ours = safetensors.torch.load_file(str(folder / "dit_memory.safetensors"))
    assert sorted(stock) == sorted(ours) == ["stream0", "stream1"]  # video and audio latents
    for key in stock:
        assert torch.isfinite(stock[key]).all()
        assert torch.equal(stock[key], ours[key]), key
    report = entry["outputs"]["2"]["text"][0]
    assert "2 head groups, 3 FFN row chunks" in report and "mode fixed" in report
    log = comfy["log"].read_text()
    assert "H3 Director DiT memory: 2 head groups, 3 FFN row chunks (exact where verified" in log


def test_head_chunks_that_do_not_divide_are_a_node_error(comfy):
    entry = _submit(comfy, _workflow(head_chunks=3, ffn_chunks=1))
    assert entry["status"]["status_str"] == "error"
    messages = json.dumps(entry["status"]["messages"])
    assert "head_chunks=3 does not divide the model's 4 heads" in messages and "[1, 2, 4]" in messages
