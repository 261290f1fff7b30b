"""H3Director Upscale (Streaming) in a real ComfyUI server: Load Upscale Model (a random-init spandrel RealESRGAN
Compact in models/upscale_models) -> the node, from an IMAGE batch into a .npy, and from a video file with sound into
an MP4; the frames equal the untiled upscale (within uint8 rounding; the MP4 through the same yuv420p conversion) and
the sound's packets are copied unchanged."""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest
from comfy_harness.server import HARNESS, REPO, comfyui_python, comfyui_server, prepare_base, submit
from comfy_harness.upscale_media import audio_payloads, decode_rgb, video_with_audio, yuv420_roundtrip
from comfy_harness.vendored import real_comfyui_marks

COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = real_comfyui_marks()
MODEL = "compact_x2.safetensors"
H, W, FRAMES = 48, 80, 3


def _helper(*args: str) -> None:
    subprocess.run([comfyui_python(), str(HARNESS / "upscale_models.py"), *args], check=True, cwd=REPO, timeout=600,
                   env=dict(os.environ, PYTHONPATH=str(REPO)))


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-upscale-base"), ["models/upscale_models"])
    _helper("write", str(base / "models" / "upscale_models"))
    rng = np.random.default_rng(7)
    noise = rng.integers(0, 256, (H, W, 3), dtype=np.uint8)
    from PIL import Image

    Image.fromarray(noise).save(base / "input" / "noise.png")
    video_with_audio(base / "input" / "clip.mp4", rng.integers(0, 256, (FRAMES, H, W, 3), dtype=np.uint8), crf=0)
    with comfyui_server(base, extra_args=["--cache-none"]) as server:
        server["noise"] = noise
        yield server


def _workflow() -> dict:
    common = {"upscale_model": ["1", 0], "tile": 32, "overlap": "auto", "fps": 12.0, "crf": 0}
    return {
        "1": {"class_type": "UpscaleModelLoader", "inputs": {"model_name": MODEL}},
        "2": {"class_type": "LoadImage", "inputs": {"image": "noise.png"}},
        "3": {"class_type": "RepeatImageBatch", "inputs": {"image": ["2", 0], "amount": FRAMES}},
        "4": {"class_type": "H3DirectorUpscaleStreaming",
              "inputs": {**common, "images": ["3", 0], "format": "npy", "filename_prefix": "up/frames"}},
        "5": {"class_type": "H3DirectorUpscaleStreaming",
              "inputs": {**common, "source_path": "clip.mp4", "format": "mp4", "filename_prefix": "up/clip"}},
    }


def _reference(comfy, frames: np.ndarray, name: str) -> np.ndarray:
    folder = comfy["base"] / "temp"
    np.save(folder / f"{name}.in.npy", frames)
    _helper("reference", str(comfy["base"] / "models" / "upscale_models" / MODEL), str(folder / f"{name}.in.npy"),
            str(folder / f"{name}.ref.npy"))
    return np.round(np.load(folder / f"{name}.ref.npy") * 255).astype(np.uint8)


def test_node_streams_exact_upscales_to_npy_and_mp4(comfy):
    result = submit(comfy, _workflow())
    assert result["status"]["status_str"] == "success", json.dumps(result["status"])[:4000]
    output = comfy["base"] / "output" / "up"
    npy = sorted(output.glob("frames_*.npy"))
    mp4 = sorted(output.glob("clip_*.mp4"))
    assert len(npy) == 1 and len(mp4) == 1, sorted(p.name for p in output.iterdir())

    frames = np.load(npy[0])
    expected = _reference(comfy, np.repeat(comfy["noise"][None], FRAMES, 0), "image")
    assert frames.shape == (FRAMES, 2 * H, 2 * W, 3)
    assert np.abs(frames.astype(int) - expected.astype(int)).max() <= 1

    source = comfy["base"] / "input" / "clip.mp4"
    expected = yuv420_roundtrip(_reference(comfy, decode_rgb(source), "clip"))
    video = decode_rgb(mp4[0])
    assert video.shape == (FRAMES, 2 * H, 2 * W, 3)
    # lossless H.264 of uint8 frames that differ from the reference by at most 1: at most a step or two after yuv420p
    assert np.abs(video.astype(int) - expected.astype(int)).max() <= 3
    assert audio_payloads(mp4[0]) == audio_payloads(source)


def test_bad_input_is_a_node_error_before_output(comfy):
    workflow = _workflow()
    del workflow["4"]
    workflow["5"]["inputs"]["tile"] = 16        # the model's receptive field needs more than 2 x overlap
    before = sorted((comfy["base"] / "output").rglob("*"))
    result = submit(comfy, workflow)
    assert result["status"]["status_str"] == "error"
    assert "larger than 2 x overlap" in json.dumps(result["status"])
    assert sorted((comfy["base"] / "output").rglob("*")) == before


def test_node_recipe_pre_resize_fp16_tile_batch_post_resize(comfy):
    """pre_resize to half, Compact x2 in fp16 with a tile batch of 4, post_resize to 60x40: the report gives each
    stage and the fp16 difference, the frames equal the same steps by hand (fp32 model) within the fp16 error."""
    import torch

    from h3director.video.resize import resize_frame

    inputs = {"upscale_model": ["1", 0], "images": ["3", 0], "tile": 24, "overlap": "auto", "fps": 12.0, "crf": 0,
              "format": "npy", "filename_prefix": "recipe/frames", "pre_resize": f"{W // 2}x{H // 2}",
              "pre_resample": "area", "post_resize": "60x40", "resample": "lanczos", "dtype": "fp16",
              "tile_batch": 4}
    workflow = {k: v for k, v in _workflow().items() if k in ("1", "2", "3")}
    workflow["6"] = {"class_type": "H3DirectorUpscaleStreaming", "inputs": inputs}
    workflow["7"] = {"class_type": "PreviewAny", "inputs": {"source": ["6", 2]}}  # the report text
    result = submit(comfy, workflow)
    assert result["status"]["status_str"] == "success", json.dumps(result["status"])[:4000]
    [report] = result["outputs"]["7"]["text"]
    for line in ("pre-resize: 40x24 area", "post-resize: 60x40 lanczos", "tile batch: 4", "fp16: approximate",
                 "stage pre-resize:", "stage model:", "stage post-resize:"):
        assert line in report, report
    [npy] = sorted((comfy["base"] / "output" / "recipe").glob("frames_*.npy"))
    frames = np.load(npy)
    assert frames.shape == (FRAMES, 40, 60, 3)
    small = resize_frame(torch.from_numpy(comfy["noise"]).permute(2, 0, 1).float() / 255, (H // 2, W // 2), "area")
    restored = _reference(comfy, small.permute(1, 2, 0)[None].numpy().astype(np.float32), "recipe") / 255.0
    expected = resize_frame(torch.from_numpy(restored[0]).permute(2, 0, 1).float(), (40, 60), "lanczos")
    expected = np.round(expected.permute(1, 2, 0).numpy() * 255)
    # the reference model runs in fp32 and its output was rounded to uint8 before the resize: a few steps
    assert np.abs(frames[0].astype(int) - expected.astype(int)).max() <= 4
