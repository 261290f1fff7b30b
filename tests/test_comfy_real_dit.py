"""H3Director DiT Memory in a REAL ComfyUI server: UNETLoader -> DiT Memory -> KSampler over HTTP.

Runs when `COMFYUI_DIR` names a ComfyUI checkout with H3 support (tests/conftest.py defaults it to the
vendored `.comfy/ComfyUI`, with `COMFYUI_PYTHON`); skips otherwise. Uses the request helpers of
tests/test_comfy_real.py and its own temporary `--base-directory`.

The diffusion model is ComfyUI's own `MiniMaxH3Model` at a small size: a random state dict in ComfyUI's
key layout (`fixtures/comfy_harness/dit_worker.py`, 2 blocks, 4 heads of 16), which `UNETLoader` detects as
MiniMax H3 (`comfy/model_detection.py`). H3's text encoder (Qwen3-VL) is too large for a test, so
`H3TestDiTConditioning` (fixtures/comfy_harness/dit_real_node) makes random text-encoder states of the
model's text width. Checks: two-step KSampler output with the node is bit-identical to the stock
model's, the node shows its report and the server log names the tier that ran; a head count that does
not divide is a node error naming the valid counts.

At real packed-row counts (2,789 rows: 256x256 x 124 frames; over 9,000 rows: 512x256 x 243 frames; the tiny
model's widths, float32 and bfloat16, the server's 2 CPU threads), after `verify-kernels` ran in the
server at that row count (`H3TestVerifyKernels`, its own kernel cache): every tier (lifetime, head groups,
FFN row chunks, both, "exact only") and the Memory Guard's `reduce_batch` escalation (`H3TestGuardReduce`)
is `torch.equal` to the stock sampler where its log line reports it exact, and reported approximate with
a difference where it is not (never claimed exact). Plain row chunks differ here (the FFN width 96 puts the
CPU thread cuts mid-row), which is what the adapters' SwiGLU recompute fixes.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from comfy_harness.server import (
    HARNESS,
    assert_latents_equal_stock,
    comfyui_server,
    prepare_base,
    submit,
    write_tiny_dit_checkpoint,
)
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
    env = {"H3_KERNEL_CACHE": str(base / "kernels.json")}
    with comfyui_server(base, extra_args=["--use-pytorch-cross-attention"], env=env) as server:
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
    entry = _submit(comfy, _workflow(head_chunks=2, ffn_chunks=3))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    assert_latents_equal_stock(comfy["base"], ("dit_memory",))
    report = entry["outputs"]["2"]["text"][0]
    assert "2 head groups, 3 FFN row chunks" in report and "mode fixed" in report
    log = comfy["log"].read_text()
    assert "H3 Director DiT memory: 2 head groups, 3 FFN row chunks (exact where verified" in log


def test_head_chunks_that_do_not_divide_are_a_node_error(comfy):
    entry = _submit(comfy, _workflow(head_chunks=3, ffn_chunks=1))
    assert entry["status"]["status_str"] == "error"
    messages = json.dumps(entry["status"]["messages"])
    assert "head_chunks=3 does not divide the model's 4 heads" in messages and "[1, 2, 4]" in messages


# (at least these packed rows, EmptyMiniMaxH3LatentAV width, height, length); the rows a forward has are
# counted in the server (ComfyUI's PackedLayout) and read back
REAL_ROWS = [(2_500, 256, 256, 124), (9_000, 512, 256, 243)]
TIERS = {"lifetime": dict(mode="fixed", head_chunks=1, ffn_chunks=1),
         "heads": dict(mode="fixed", head_chunks=2, ffn_chunks=1),
         "ffn": dict(mode="fixed", head_chunks=1, ffn_chunks=3),
         "both": dict(mode="fixed", head_chunks=2, ffn_chunks=7),
         "exact_only": dict(mode="exact only", head_chunks=4, ffn_chunks=5)}
TIER_NAMES = {"lifetime": "lifetime frees only", "heads": "2 head groups", "ffn": "3 FFN row chunks",
              "both": "2 head groups, 7 FFN row chunks", "exact_only": "4 head groups, 5 FFN row chunks",
              "guard": "2 FFN row chunks"}


def _rows_workflow(dtype: str, size: tuple, prefix: str) -> dict:
    _, width, height, length = size
    sampler = {"seed": 3, "steps": 1, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0,
               "positive": ["c", 0], "negative": ["c", 0], "latent_image": ["l", 0]}
    workflow = {
        "m": {"class_type": "H3TestDiTLoader", "inputs": {"unet_name": "h3_tiny_dit.safetensors", "dtype": dtype}},
        "c": {"class_type": "H3TestDiTConditioning", "inputs": {"length": 7, "dim": 48, "seed": 0}},
        "l": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": width, "height": height, "length": length}},
        "s": {"class_type": "KSampler", "inputs": {"model": ["m", 0], **sampler}},
        "S": {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["s", 0], "name": f"{prefix}stock"}},
    }
    for name, settings in TIERS.items():
        workflow[f"d_{name}"] = {"class_type": "H3DirectorDiTMemory",
                                 "inputs": {"model": ["m", 0], "budget_gb": 0.0, **settings}}
        workflow[f"k_{name}"] = {"class_type": "KSampler", "inputs": {**sampler, "model": [f"d_{name}", 0]}}
        workflow[f"o_{name}"] = {"class_type": "H3TestDiTSaveLatent",
                                 "inputs": {"samples": [f"k_{name}", 0], "name": f"{prefix}{name}"}}
    # the guard's reduce_batch escalation from the lifetime-only floor to the next ladder tier; two steps
    # (an escalation holds for the later forwards too), against a two-step stock sampler. Its own DiT Memory
    # node (another budget than the lifetime tier's, so ComfyUI does not hand both the same cached MODEL)
    workflow["s2"] = {"class_type": "KSampler", "inputs": {"model": ["m", 0], **sampler, "steps": 2}}
    workflow["S2"] = {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["s2", 0], "name": f"{prefix}stock2"}}
    workflow["d_guard"] = {"class_type": "H3DirectorDiTMemory",
                           "inputs": {"model": ["m", 0], "mode": "fixed", "head_chunks": 1, "ffn_chunks": 1,
                                      "budget_gb": 1000.0}}
    workflow["g_guard"] = {"class_type": "H3TestGuardReduce",
                           "inputs": {"model": ["d_guard", 0], "latent": ["l", 0], "conditioning": ["c", 0]}}
    workflow["k_guard"] = {"class_type": "KSampler", "inputs": {**sampler, "steps": 2, "model": ["g_guard", 0]}}
    workflow["o_guard"] = {"class_type": "H3TestDiTSaveLatent",
                           "inputs": {"samples": ["k_guard", 0], "name": f"{prefix}guard"}}
    return workflow


def _tier_lines(log: str, rows: int) -> dict[str, str]:
    """The last 'H3 Director DiT memory: <tier> (...) for <rows> rows' line per tier name."""
    found = {}
    for match in re.finditer(r"H3 Director DiT memory: (.+?) \((exact where verified|exact by construction); "
                             rf"(.+?)\) for {rows} rows", log):
        found[match.group(1)] = match.group(3)
    return found


@pytest.mark.parametrize("size", REAL_ROWS, ids=[f"over{s[0]}rows" for s in REAL_ROWS])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_every_tier_at_real_row_counts_is_exact_where_reported_exact(comfy, dtype, size):
    import safetensors.torch

    workflow = _rows_workflow(dtype, size, f"{dtype}-{size[0]}-")
    verify = {key: workflow[key] for key in ("m", "c", "l")}
    verify["v"] = {"class_type": "H3TestVerifyKernels",
                   "inputs": {"model": ["m", 0], "latent": ["l", 0], "conditioning": ["c", 0]}}
    entry = _submit(comfy, verify)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    verified, rows = entry["outputs"]["v"]["text"][0], int(entry["outputs"]["v"]["text"][1])
    assert rows >= size[0]
    prefix = f"{dtype}-{size[0]}-"
    entry = _submit(comfy, workflow)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    folder = comfy["base"] / "output" / "tensors"
    stocks = {steps: safetensors.torch.load_file(str(folder / f"{prefix}{name}.safetensors"))
              for steps, name in ((1, "stock"), (2, "stock2"))}
    log = comfy["log"].read_text()
    lines = _tier_lines(log, rows)
    said = [line[line.index("H3 Director DiT memory"):] for line in log.splitlines() if "H3 Director DiT memory" in line]
    claims = {}
    for name in [*TIERS, "guard"]:
        ours = safetensors.torch.load_file(str(folder / f"{prefix}{name}.safetensors"))
        stock = stocks[2 if name == "guard" else 1]
        equal = all(torch.equal(stock[key], ours[key]) for key in stock)
        detail = lines.get(TIER_NAMES[name])
        assert detail is not None, (name, sorted(lines), verified, said[-8:])
        claims[name] = (detail.split(" (")[0].split(":")[0], equal)
        if detail.startswith("exact"):
            assert equal, (name, detail)       # reported exact: the same bits as the stock sampler
        else:                                   # never claimed exact; a measured difference is named
            assert detail.startswith(("approximate: max difference", "unverified")), (name, detail)
    # what this CPU verifies at these shapes: every FFN-chunked and head-grouped tier is exact
    assert all(claim == ("exact", True) for claim in claims.values()), (claims, verified)
    assert "ffn_row_chunks" in verified.split("failed")[0]
    assert "(row class " in lines[TIER_NAMES["ffn"]] and "2 threads" in lines[TIER_NAMES["ffn"]]
