"""A ComfyUI base folder for the farm tests and bench: the pack, the tiny H3 VAEs, the farm's test node,
and a small decode workflow (standard library only; uses `server.py`'s helpers).

`prepare_farm_base(base)` -> base; `write_decode_workflow(path)` writes the API workflow the farm jobs
name: an empty 128x128x22 H3 AV latent, H3TestFarmDecodeCapped (node "5"), and the streaming decode to
an MP4 (node "4"). `farm_servers(comfyui_dir)`: the farm's ComfyUI server processes that run `comfyui_dir`
(only this checkout's: other farms on the machine, e.g. another clone's tests, are not counted).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import psutil

from comfy_harness.server import HARNESS, prepare_base, write_tiny_vae_weights

DECODE_WORKFLOW = {
    "1": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": 128, "height": 128, "length": 22}},
    "2": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_video.safetensors"}},
    "3": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_audio.safetensors"}},
    "5": {"class_type": "H3TestFarmDecodeCapped", "inputs": {"samples": ["1", 0], "budget_gb": 0.0, "limit_gb": 1024.0}},
    "4": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
        "samples": ["5", 0], "vae": ["2", 0], "audio_vae": ["3", 0], "output": "video_file",
        "filename_prefix": "video/decode", "fps": 24.0, "crf": 18, "budget_gb": 0.0}},
}


def prepare_farm_base(base: Path) -> Path:
    prepare_base(base, ["models/vae"], {"h3director_test_nodes": HARNESS / "real_node"})
    test_nodes = base / "custom_nodes" / "h3director_test_nodes"
    shutil.copy(HARNESS / "real_comfy.py", test_nodes / "real_comfy.py")
    shutil.copy(HARNESS / "farm_nodes.py", base / "custom_nodes" / "h3director_farm_test_nodes.py")
    write_tiny_vae_weights(base, test_nodes)
    return base


def write_decode_workflow(path: Path) -> Path:
    path.write_text(json.dumps(DECODE_WORKFLOW, indent=1))
    return path


def farm_servers(comfyui_dir: str | None) -> list[psutil.Process]:
    """Live `h3director.farm.serve` processes whose ComfyUI folder (their fifth argument) is `comfyui_dir`."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "h3director.farm.serve" in cmdline and comfyui_dir in cmdline:
            found.append(process)
    return found
