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
from pathlib import Path

import pytest
import torch
from comfy_harness.server import HARNESS, comfyui_server, prepare_base, submit, write_tiny_dit_checkpoint
from comfy_harness.server import http_get as _get
from comfy_harness.vendored import real_comfyui_marks

REPO = Path(__file__).resolve().parents[1]
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = real_comfyui_marks()


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-dit-base"), ["models/diffusion_models"],
                        {"h3director_dit_test_nodes": HARNESS / "dit_real_node"})
    write_tiny_dit_checkpoint(base)
    with comfyui_server(base, extra_args=["--use-pytorch-cross-attention"]) as server:
        yield server


def _submit(comfy, workflow: dict) -> dict:
    """The prompt's history entry once it finished (success or error)."""
    return submit(comfy, workflow, client_id="h3-dit-test")


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
