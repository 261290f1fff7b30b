"""The library's keyframe merge on tensors a real ComfyUI saved, run in ComfyUI's Python (same numpy and OpenCV
as the server) so the node's output can be compared bit for bit.

    python keyframe_reference.py FOLDER FLOW_WARP(0|1)

reads FOLDER/originals.safetensors, FOLDER/detailed.safetensors and FOLDER/indices.txt (H3TestKeyframeSave's
files) and writes FOLDER/reference.safetensors.
"""

import sys
from pathlib import Path

import numpy as np
import safetensors.torch
import torch

from h3director.video import detail_carry, keyframes


def main(folder: str, flow_warp: str) -> None:
    folder = Path(folder)
    originals = safetensors.torch.load_file(str(folder / "originals.safetensors"))["images"]
    detailed = safetensors.torch.load_file(str(folder / "detailed.safetensors"))["images"]
    indices = keyframes.parse_indices((folder / "indices.txt").read_text())
    frames = [f.copy() for f in detail_carry.carry_detail(originals, detailed, indices, flow_warp=flow_warp == "1")]
    safetensors.torch.save_file({"images": torch.from_numpy(np.stack(frames))}, str(folder / "reference.safetensors"))


if __name__ == "__main__":
    main(*sys.argv[1:])
