"""The director's switches in a REAL ComfyUI server (CPU, `--cache-none`, memory level 3 by environment).

Runs when `COMFYUI_DIR` names a ComfyUI checkout with H3 support (tests/conftest.py defaults it to the
vendored `.comfy/ComfyUI`, with `COMFYUI_PYTHON`); skips otherwise. Uses the request helpers of
tests/test_comfy_real.py and its own temporary `--base-directory`. `--cache-none` makes ComfyUI run
every node of every prompt, so only the pack's own cache can save the text encoder's work.

- Cached Text Encode: the CLIP is `H3TestCountedCLIP` (fixtures/comfy_harness/switch_real_node: a small
  real torch encoder whose forwards are counted in a file; a new CLIP object each prompt, as a loader
  makes under `--cache-none`). A second prompt that changes only the length runs 0 encoder forwards,
  gives the same conditioning, and `/h3director/stats` shows the hit.
- Memory Guard: ComfyUI's own `MiniMaxH3Model` at a small size (fixtures/comfy_harness/dit_worker.py)
  sampled by KSampler through the guard with a 1 MiB budget fails with the "[Director Safety] ...
  memory limit exceeded" message naming the guarded device; the next prompt (no guard) completes.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from comfy_harness.server import HARNESS, comfyui_server, prepare_base, submit, write_tiny_dit_checkpoint
from comfy_harness.server import http_get as _get
from comfy_harness.vendored import real_comfyui_marks

REPO = Path(__file__).resolve().parents[1]
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = real_comfyui_marks()


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-switch-base"), ["models/diffusion_models"],
                        {"h3director_dit_test_nodes": HARNESS / "dit_real_node",
                         "h3director_switch_nodes": HARNESS / "switch_real_node"})
    write_tiny_dit_checkpoint(base)
    with comfyui_server(base, extra_args=["--use-pytorch-cross-attention", "--cache-none"],
                        env={"H3_MEMORY_OPTIMIZATION_LEVEL": "3"}) as server:
        yield server


def _submit(comfy, workflow: dict) -> dict:
    """The prompt's history entry once it finished (success or error)."""
    return submit(comfy, workflow, client_id="h3-switch-test")


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
    # 1 MiB leaves no room for any tier: the message says what would (blocks to offload measured on the real
    # model's blocks) or that nothing in place would
    assert re.search(r"would have fit: (node H3DirectorBlockSwap: blocks_offloaded=\d+|no chunking)", messages), messages
    assert comfy["server"].poll() is None                                 # the worker lives
    after = _submit(comfy, _dit_workflow(guard_budget_gb=None))
    assert after["status"]["status_str"] == "success", json.dumps(after["status"])[:4000]
    assert (comfy["base"] / "output" / "tensors" / "after_guard.safetensors").is_file()
