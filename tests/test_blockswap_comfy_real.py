"""H3Director Block Swap in a REAL ComfyUI server: UNETLoader -> Block Swap (-> DiT Memory) -> KSampler over HTTP.

Runs when `COMFYUI_DIR` names a ComfyUI checkout with H3 support (tests/conftest.py defaults it to the vendored
`.comfy/ComfyUI`); skips otherwise. The model is the tiny random `MiniMaxH3Model` checkpoint of
tests/test_comfy_real_dit.py (2 blocks), the text states come from `H3TestDiTConditioning`. Checks: two-step
KSampler output with every block offloaded, and with one block offloaded under DiT Memory, is bit-identical to
the stock MODEL's (sampled first, in the same prompt, so ComfyUI hands the model between clones); the node shows
its report and the server log the swap that ran; a count above the model's blocks is a node error naming them.
"""

from __future__ import annotations

import json

import pytest
from comfy_harness.server import (
    HARNESS,
    assert_latents_equal_stock,
    comfyui_server,
    prepare_base,
    submit,
    write_tiny_dit_checkpoint,
)
from comfy_harness.vendored import real_comfyui_marks

pytestmark = real_comfyui_marks()


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-swap-base"), ["models/diffusion_models"],
                        {"h3director_dit_test_nodes": HARNESS / "dit_real_node"})
    write_tiny_dit_checkpoint(base)
    with comfyui_server(base, extra_args=["--use-pytorch-cross-attention"]) as server:
        yield server


def _workflow(all_blocks: int, one_block: int = 1) -> dict:
    sampler = {"seed": 3, "steps": 2, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0,
               "positive": ["3", 0], "negative": ["3", 0], "latent_image": ["4", 0]}
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "h3_tiny_dit.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "H3DirectorBlockSwap", "inputs": {"model": ["1", 0], "blocks_offloaded": all_blocks}},
        "3": {"class_type": "H3TestDiTConditioning", "inputs": {"length": 7, "dim": 48, "seed": 0}},
        "4": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": 64, "height": 96, "length": 22}},
        "5": {"class_type": "KSampler", "inputs": {"model": ["1", 0], **sampler}},
        "6": {"class_type": "KSampler", "inputs": {"model": ["2", 0], **sampler}},
        "7": {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["5", 0], "name": "stock"}},
        "8": {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["6", 0], "name": "swap_all"}},
        "9": {"class_type": "H3DirectorBlockSwap", "inputs": {"model": ["1", 0], "blocks_offloaded": one_block}},
        "10": {"class_type": "H3DirectorDiTMemory", "inputs": {
            "model": ["9", 0], "mode": "fixed", "head_chunks": 2, "ffn_chunks": 3, "budget_gb": 0.0}},
        "11": {"class_type": "KSampler", "inputs": {"model": ["10", 0], **sampler}},
        "12": {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["11", 0], "name": "swap_one_dit"}},
    }


def test_sampling_with_blocks_offloaded_equals_stock_bit_for_bit(comfy):
    entry = submit(comfy, _workflow(all_blocks=2), client_id="h3-swap-test")
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    assert_latents_equal_stock(comfy["base"], ("swap_all", "swap_one_dit"))
    report = entry["outputs"]["2"]["text"][0]
    assert "2 of 2 DiT blocks offloaded" in report and "exact by construction" in report
    log = comfy["log"].read_text()
    assert "H3 Director block swap: 2 of 2 DiT blocks offloaded (blocks [0, 1])" in log
    assert "H3 Director block swap: 1 of 2 DiT blocks offloaded (blocks [1])" in log
    assert "H3 Director DiT memory: 2 head groups, 3 FFN row chunks" in log


def test_a_count_above_the_models_blocks_is_a_node_error(comfy):
    entry = submit(comfy, _workflow(all_blocks=3), client_id="h3-swap-test")
    assert entry["status"]["status_str"] == "error"
    messages = json.dumps(entry["status"]["messages"])
    assert "blocks_offloaded=3 is out of range" in messages and "has 2 DiT blocks" in messages
