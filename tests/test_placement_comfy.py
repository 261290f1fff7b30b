"""H3Director Device Placement in a REAL ComfyUI server (`--cpu`): the placed objects carry the requested
devices, a decode through the placed VAE equals core VAEDecode bit for bit, and a device this machine does not
have (cuda:1 here) or a malformed placement is a node error naming what is available, before anything runs."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from comfy_harness.server import (
    HARNESS,
    comfyui_server,
    prepare_base,
    submit,
    write_tiny_dit_checkpoint,
    write_tiny_vae_weights,
)
from comfy_harness.vendored import real_comfyui_marks

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = real_comfyui_marks()


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-placement"), ["models/vae", "models/diffusion_models"],
                        {"h3director_test_nodes": HARNESS / "real_node"})
    test_nodes = base / "custom_nodes" / "h3director_test_nodes"
    shutil.copy(HARNESS / "real_comfy.py", test_nodes / "real_comfy.py")
    write_tiny_vae_weights(base, test_nodes)
    write_tiny_dit_checkpoint(base)
    import safetensors.torch

    latent = torch.randn(1, 24, 7, 8, 8, generator=torch.Generator().manual_seed(5))
    safetensors.torch.save_file({"latent_tensor": latent, "latent_format_version_0": torch.tensor([])},
                                str(base / "input" / "placement.latent"))
    with comfyui_server(base) as server:
        yield server


def _workflow(placement: str) -> dict:
    return {
        "1": {"class_type": "LoadLatent", "inputs": {"latent": "placement.latent"}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_video.safetensors"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_audio.safetensors"}},
        "4": {"class_type": "UNETLoader", "inputs": {"unet_name": "h3_tiny_dit.safetensors", "weight_dtype": "default"}},
        "5": {"class_type": "H3DirectorDevicePlacement", "inputs": {
            "placement": placement, "model": ["4", 0], "vae": ["2", 0], "audio_vae": ["3", 0]}},
        "6": {"class_type": "VAEDecode", "inputs": {"samples": ["1", 0], "vae": ["5", 2]}},
        "7": {"class_type": "VAEDecode", "inputs": {"samples": ["1", 0], "vae": ["2", 0]}},
        "8": {"class_type": "H3TestSaveTensor", "inputs": {"name": "placed", "image": ["6", 0], "text": ["5", 4]}},
        "9": {"class_type": "H3TestSaveTensor", "inputs": {"name": "core", "image": ["7", 0]}},
    }


def _error(entry) -> str:
    assert entry["status"]["status_str"] == "error", json.dumps(entry["status"])[:2000]
    return json.dumps(entry["status"]["messages"])


def test_cpu_placement_sets_the_devices_and_decodes_like_core(comfy):
    entry = submit(comfy, _workflow("dit=cpu,text_encoder=cpu,video_vae=cpu,audio_vae=cpu"))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    out = comfy["base"] / "output" / "tensors"
    report = (out / "placed.txt").read_text()
    assert "dit: load_device cpu, offload_device cpu" in report
    assert "video_vae: device cpu, load_device cpu, offload_device cpu" in report
    assert "audio_vae: device cpu, load_device cpu, offload_device cpu" in report
    assert "text_encoder: not connected (placement asked cpu)" in report
    import safetensors.torch

    placed = safetensors.torch.load_file(str(out / "placed.safetensors"))["image"]
    core = safetensors.torch.load_file(str(out / "core.safetensors"))["image"]
    assert placed.shape == (22, 128, 128, 3) and torch.equal(placed, core)


def test_a_missing_device_is_a_node_error_naming_the_available_ones(comfy):
    messages = _error(submit(comfy, _workflow("dit=cpu,vae=cuda:1")))
    assert "device cuda:1 does not exist on this machine: available cpu" in messages


def test_a_malformed_placement_is_a_node_error(comfy):
    messages = _error(submit(comfy, _workflow("vae=gpu:1")))
    assert "is not cpu, cuda, cuda:N or mps" in messages


_CLONE_CHECK = r"""
import sys, json
sys.path.insert(0, sys.argv[1])
sys.argv = ['main.py', '--cpu']
import comfy.options; comfy.options.enable_args_parsing()
import torch, comfy.model_patcher, comfy.sd
from h3director.errors import InvalidInputError
from h3director.integrations.comfy_placement import place_objects
# a patcher that says it loads on cuda:0 (no allocation happens until it is loaded)
original = comfy.model_patcher.ModelPatcher(torch.nn.Linear(4, 4), load_device=torch.device('cuda:0'),
                                            offload_device=torch.device('cpu'))
placed = place_objects('model=cpu', model=original)
out = {'placed': str(placed.model.load_device), 'placed_offload': str(placed.model.offload_device),
       'original': str(original.load_device), 'same': placed.model is original, 'report': placed.report}
try:
    place_objects('model=cuda:0', model=original)
except InvalidInputError as error:
    out['error'] = str(error)
print(json.dumps(out))
"""


def test_placement_clones_and_leaves_the_input_as_it_was():
    """In ComfyUI's own Python: a MODEL whose patcher loads on cuda:0 placed on the CPU comes out as a clone
    loading on the CPU while the input still says cuda:0; asking for cuda:0 on this CPU machine is refused."""
    import subprocess

    from comfy_harness.server import REPO, comfyui_python

    result = subprocess.run([comfyui_python(), "-c", _CLONE_CHECK, COMFYUI_DIR], cwd=COMFYUI_DIR, timeout=300,
                            capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert (out["placed"], out["placed_offload"], out["original"], out["same"]) == ("cpu", "cpu", "cuda:0", False)
    assert out["report"].startswith("dit: load_device cpu, offload_device cpu")
    assert out["error"] == "device cuda:0 does not exist on this machine: available cpu"
