"""H3Director DiT Memory next to another pack's H3 block patches in a REAL ComfyUI server, both orders, over HTTP.

The other pack is fixtures/comfy_harness/foreign_pack, installed as the custom node folder `H3TestForeignPack` (its node
`H3TestForeignPatch` object-patches every block's `mlp.forward`, as KJNodes' FFN node does). One prompt samples the
tiny H3 DiT (fixtures/comfy_harness, as tests/test_comfy_real_dit.py) three ways: stock; the other pack's node, then DiT
Memory; DiT Memory, then the other pack's node. Both orders equal the stock latents bit for bit (the stand-in pack
runs the stock arithmetic), DiT Memory's node text names the pack found at install, and the server log says, for each
order, which pack's code ran the FFN and the attention of which blocks.
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
PACK = "H3TestForeignPack"


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-dit-foreign"), ["models/diffusion_models"],
                        {"h3director_dit_test_nodes": HARNESS / "dit_real_node", PACK: HARNESS / "foreign_pack"})
    write_tiny_dit_checkpoint(base)
    env = {"H3_KERNEL_CACHE": str(base / "kernels.json")}
    with comfyui_server(base, extra_args=["--use-pytorch-cross-attention"], env=env) as server:
        yield server


def _workflow() -> dict:
    sampler = {"seed": 3, "steps": 2, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0,
               "positive": ["c", 0], "negative": ["c", 0], "latent_image": ["l", 0]}
    memory = {"mode": "fixed", "head_chunks": 2, "ffn_chunks": 3, "budget_gb": 0.0}
    return {
        "m": {"class_type": "UNETLoader", "inputs": {"unet_name": "h3_tiny_dit.safetensors", "weight_dtype": "default"}},
        "c": {"class_type": "H3TestDiTConditioning", "inputs": {"length": 7, "dim": 48, "seed": 0}},
        "l": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": 64, "height": 96, "length": 22}},
        "s": {"class_type": "KSampler", "inputs": {"model": ["m", 0], **sampler}},
        "S": {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["s", 0], "name": "stock"}},
        # the other pack first, DiT Memory on its MODEL
        "f1": {"class_type": "H3TestForeignPatch", "inputs": {"model": ["m", 0], "part": "ffn"}},
        "d1": {"class_type": "H3DirectorDiTMemory", "inputs": {"model": ["f1", 0], **memory}},
        "k1": {"class_type": "KSampler", "inputs": {"model": ["d1", 0], **sampler}},
        "o1": {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["k1", 0], "name": "foreign_first"}},
        # DiT Memory first, the other pack on its MODEL
        "d2": {"class_type": "H3DirectorDiTMemory", "inputs": {"model": ["m", 0], **memory}},
        "f2": {"class_type": "H3TestForeignPatch", "inputs": {"model": ["d2", 0], "part": "ffn"}},
        "k2": {"class_type": "KSampler", "inputs": {"model": ["f2", 0], **sampler}},
        "o2": {"class_type": "H3TestDiTSaveLatent", "inputs": {"samples": ["k2", 0], "name": "director_first"}},
    }


def test_both_orders_equal_stock_and_say_whose_code_ran(comfy):
    entry = submit(comfy, _workflow(), client_id="h3-dit-foreign-test")
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    assert_latents_equal_stock(comfy["base"], ("foreign_first", "director_first"))
    found_at_install = entry["outputs"]["d1"]["text"][0]
    assert "other packs' patches" in found_at_install and PACK in found_at_install and "mlp.forward" in found_at_install
    assert PACK not in entry["outputs"]["d2"]["text"][0]              # installed first: nothing to find yet
    log = comfy["log"].read_text()
    assert "H3Director DiT Memory installed after other packs' patches on the H3 DiT: " + PACK in log
    ran = [line for line in log.splitlines() if "H3 Director DiT memory: other packs' patches on the H3 DiT" in line]
    assert len(ran) == 2, ran                                          # once per installation (both orders)
    for line in ran:
        assert (f"{PACK}: {PACK}.ffn_forward patches blocks.N.mlp.forward on blocks 0-1: the director's FFN tier" in line
                and f"attention: H3 Director on blocks 0-1; ffn: {PACK}: {PACK}.ffn_forward on blocks 0-1" in line), line
