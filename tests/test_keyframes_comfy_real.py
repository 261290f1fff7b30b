"""Keyframe Select -> a core detailer -> Keyframe Merge in a REAL ComfyUI server (CPU).

A synthetic moving clip with a scene cut (fixtures/synthetic_motion.py) is written as an MP4 into the input folder;
core `LoadVideo` + `GetVideoComponents` decode it, `H3DirectorKeyframeSelect` picks every 5th frame,
core `ImageScaleBy` (lanczos, 2x: an upscaling "detailer"; core `ImageSharpen` needs kornia, which the
vendored environment lacks) details only those keyframes, `H3DirectorKeyframeMerge` (flow warp on) rebuilds the
clip at 2x.
Checks: the indices travel as STRING from Select to Merge; the scene mode brackets the cut; the merged IMAGE
equals the library's merge of the same decoded frames and sharpened keyframes bit for bit (computed in
ComfyUI's Python, fixtures/comfy_harness/keyframe_reference.py); keyframes are the detailer's frames exactly.
The example workflow `examples/h3_keyframe_detail_api.json` runs as shipped, with its two file names pointed at
the test clip and a tiny random-init 4x upscaler (spandrel's Compact architecture, written by ComfyUI's Python),
and saves an MP4 with every frame.
"""

from __future__ import annotations

import json
import os
import subprocess
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from comfy_harness.server import HARNESS, comfyui_python, comfyui_server, prepare_base, submit
from comfy_harness.vendored import real_comfyui_marks
from synthetic_motion import MovingScenes

REPO = Path(__file__).resolve().parents[1]
pytestmark = real_comfyui_marks()
FRAMES, CUT = 20, 12


def _write_clip(path: Path) -> None:
    import av

    clip = MovingScenes(frames=FRAMES, height=64, width=96, cut_at=CUT)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=Fraction(24))
        stream.width, stream.height, stream.pix_fmt = 96, 64, "yuv420p"
        stream.options = {"crf": "8"}
        for t in range(FRAMES):
            pixels = np.rint(clip.render(t) * 255).astype(np.uint8)
            container.mux(stream.encode(av.VideoFrame.from_ndarray(pixels, format="rgb24")))
        container.mux(stream.encode())


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-keyframe-base"), ["models/upscale_models"],
                        {"h3director_keyframe_nodes": HARNESS / "keyframe_real_node"})
    _write_clip(base / "input" / "moving.mp4")
    model = base / "models" / "upscale_models" / "tiny_compact_x4.safetensors"
    code = ("import torch, safetensors.torch; from spandrel.architectures.Compact import Compact;"
            "torch.manual_seed(0); m = Compact(num_in_ch=3, num_out_ch=3, num_feat=8, num_conv=2, upscale=4);"
            f"safetensors.torch.save_file({{k: v.contiguous() for k, v in m.state_dict().items()}}, {str(model)!r})")
    subprocess.run([comfyui_python(), "-c", code], check=True, timeout=300)
    with comfyui_server(base) as server:
        yield server


def _save(name: str, images=None, text=None) -> dict:
    inputs = {"name": name}
    if images is not None:
        inputs["images"] = images
    if text is not None:
        inputs["text"] = text
    return {"class_type": "H3TestKeyframeSave", "inputs": inputs}


def test_select_sharpen_merge_equals_the_library(comfy):
    workflow = {
        "1": {"class_type": "LoadVideo", "inputs": {"file": "moving.mp4"}},
        "2": {"class_type": "GetVideoComponents", "inputs": {"video": ["1", 0]}},
        "3": {"class_type": "H3DirectorKeyframeSelect", "inputs": {
            "images": ["2", 0], "mode": "every_n", "n": 5, "threshold": 0.4, "min_spacing": 5}},
        "4": {"class_type": "ImageScaleBy", "inputs": {"image": ["3", 0], "upscale_method": "lanczos",
                                                       "scale_by": 2.0}},
        "5": {"class_type": "H3DirectorKeyframeMerge", "inputs": {
            "images": ["2", 0], "detailed_keyframes": ["4", 0], "indices": ["3", 1], "flow_warp": True}},
        "6": {"class_type": "H3DirectorKeyframeSelect", "inputs": {
            "images": ["2", 0], "mode": "scene", "n": 5, "threshold": 0.4, "min_spacing": 5}},
        "7": _save("originals", images=["2", 0]),
        "8": _save("detailed", images=["4", 0]),
        "9": _save("merged", images=["5", 0]),
        "10": _save("indices", text=["3", 1]),
        "11": _save("scene_indices", text=["6", 1]),
    }
    result = submit(comfy, workflow)
    assert result["status"]["status_str"] == "success", json.dumps(result["status"])[:4000]
    folder = comfy["base"] / "output" / "keyframe_tensors"
    assert json.loads((folder / "indices.txt").read_text()) == [0, 5, 10, 15, 19]
    assert json.loads((folder / "scene_indices.txt").read_text()) == [0, CUT - 1, CUT, FRAMES - 1]
    subprocess.run([comfyui_python(), str(HARNESS / "keyframe_reference.py"), str(folder), "1"], check=True,
                   cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300)
    import safetensors.torch
    import torch

    load = lambda name: safetensors.torch.load_file(str(folder / f"{name}.safetensors"))["images"]  # noqa: E731
    originals, detailed, merged = load("originals"), load("detailed"), load("merged")
    assert originals.shape == (FRAMES, 64, 96, 3) and detailed.shape == (5, 128, 192, 3)
    assert merged.shape == (FRAMES, 128, 192, 3)
    assert torch.equal(merged, load("reference"))
    for slot, t in enumerate((0, 5, 10, 15, 19)):
        assert torch.equal(merged[t], detailed[slot])
    # between keyframes: the original enlarged (OpenCV bicubic) plus the carried lanczos-minus-bicubic residual
    enlarged = torch.nn.functional.interpolate(originals[7:8].movedim(-1, 1), scale_factor=2, mode="bicubic")
    difference = (merged[7] - enlarged[0].movedim(0, -1)).abs()
    assert 0 < float(difference.mean()) < 0.05


def test_the_example_workflow_runs(comfy):
    import av

    workflow = json.loads((REPO / "examples" / "h3_keyframe_detail_api.json").read_text())
    loads = [node for node in workflow.values() if node["class_type"] == "LoadVideo"]
    models = [node for node in workflow.values() if node["class_type"] == "UpscaleModelLoader"]
    assert len(loads) == 1 and len(models) == 1
    loads[0]["inputs"]["file"] = "moving.mp4"
    models[0]["inputs"]["model_name"] = "tiny_compact_x4.safetensors"
    result = submit(comfy, workflow)
    assert result["status"]["status_str"] == "success", json.dumps(result["status"])[:4000]
    saved = [item for output in result["outputs"].values() for item in output.get("images", [])]
    assert len(saved) == 1, result["outputs"]
    path = comfy["base"] / "output" / saved[0]["subfolder"] / saved[0]["filename"]
    with av.open(str(path)) as container:
        frames = [frame for frame in container.decode(video=0)]
    assert len(frames) == FRAMES and (frames[0].width, frames[0].height) == (96, 64)
