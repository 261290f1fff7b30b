"""Workflows the plan writes (`plan --workflow`, `--staged`) in a REAL ComfyUI server.

Runs when `COMFYUI_DIR` names a ComfyUI checkout with H3 support (tests/conftest.py defaults it to the vendored
`.comfy/ComfyUI`); skips otherwise.

- Validation: for a grid of plans (canvases, lengths, cards, weights formats, t2v / i2v, audio on / off, staged)
  the CLI writes the workflow and ComfyUI's own `execution.validate_prompt` accepts it (test route
  ``/h3test/validate`` in fixtures/comfy_harness/workflow_real_node; nothing is queued: the grid names models at H3's
  real size). The model names exist in the server's folders (the text encoder and GGUF as empty files: only their
  names are validated).
- Renders, at a small size with the tiny DiT of tests/test_comfy_real_dit.py and ComfyUI's H3 VAEs at small widths
  (fixtures/comfy_harness/real_comfy.py): a t2v workflow written by the CLI, and both stages of a staged workflow
  (stage two with DiT Memory chunking), each ending in an MP4 with the request's frame count. H3's Qwen3-VL text
  encoder is too large for a test: the render swaps CLIPLoader + MiniMaxH3ImageToVideo for `H3TestImageToVideo`
  (random text states, ComfyUI's own empty AV latent); every other node runs as written.
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
from comfy_harness.server import (
    HARNESS,
    comfyui_server,
    post_json,
    prepare_base,
    submit,
    write_tiny_dit_checkpoint,
    write_tiny_vae_weights,
)
from comfy_harness.server import http_get as _get
from comfy_harness.vendored import real_comfyui_marks

from h3director.cli import main
from h3director.plan.estimate import PlanRequest
from h3director.plan.staged import draft_frames_for
from h3director.plan.workflow_comfy import ModelFiles, RunSpec, draft_latent_name, staged_workflows

pytestmark = real_comfyui_marks()

DIT, GGUF, TE = "h3_tiny_dit.safetensors", "h3_grid_q4_k_m.gguf", "h3_grid_te.safetensors"
VAE, AUDIO_VAE = "h3_tiny_video.safetensors", "h3_tiny_audio.safetensors"
NAMES = ["--dit", DIT, "--text-encoder", TE, "--vae", VAE, "--audio-vae", AUDIO_VAE]


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    import safetensors.torch
    import torch
    from PIL import Image

    base = prepare_base(tmp_path_factory.mktemp("comfy-workflow-base"),
                        ["models/diffusion_models", "models/text_encoders", "models/vae"],
                        {"h3director_test_nodes": HARNESS / "real_node",
                         "h3director_workflow_test_nodes": HARNESS / "workflow_real_node"})
    test_nodes = base / "custom_nodes" / "h3director_test_nodes"
    shutil.copy(HARNESS / "real_comfy.py", test_nodes / "real_comfy.py")
    write_tiny_vae_weights(base, test_nodes)
    write_tiny_dit_checkpoint(base)
    (base / "models" / "diffusion_models" / GGUF).write_bytes(b"")      # names only: validated, never loaded
    (base / "models" / "text_encoders" / TE).write_bytes(b"")
    Image.new("RGB", (64, 64), (200, 80, 20)).save(base / "input" / "first_frame.png")
    safetensors.torch.save_file({"latent_tensor": torch.zeros(1, 24, 2, 4, 4),
                                 "latent_format_version_0": torch.tensor([])},
                                str(base / "input" / draft_latent_name()))
    with comfyui_server(base, extra_args=["--use-pytorch-cross-attention"]) as server:
        server["nodes"] = set(json.loads(_get(f"{server['url']}/object_info")[1]))
        yield server


def _validate(comfy, graph: dict) -> dict:
    return post_json(f"{comfy['url']}/h3test/validate", {"prompt": graph})


def _write(tmp_path, *argv) -> list[Path]:
    out = tmp_path / "wf.json"
    code = main(["plan", "--ram", "64GB", "--workflow", str(out), *argv])
    assert code == 0
    return sorted(tmp_path.glob("wf*.json"))


GRID = {
    "t2v-1344x768-124-24GB": ["--width", "1344", "--height", "768", "--frames", "124", "--vram", "24GB", *NAMES],
    "t2v-1344x768-124-80GB": ["--width", "1344", "--height", "768", "--frames", "124", "--vram", "80GB", *NAMES],
    "t2v-1344x768-362-80GB": ["--width", "1344", "--height", "768", "--frames", "362", "--vram", "80GB", *NAMES],
    "t2v-768x1344-209-48GB": ["--width", "768", "--height", "1344", "--frames", "209", "--vram", "48GB", *NAMES],
    "i2v-1344x768-124-80GB": ["--width", "1344", "--height", "768", "--frames", "124", "--vram", "80GB",
                              "--image", "first_frame.png", *NAMES],
    "t2v-no-audio-736x416-124-32GB": ["--width", "736", "--height", "416", "--frames", "124", "--vram", "32GB",
                                      "--no-audio", *NAMES[:6]],
    "t2v-gguf-1344x768-124-16GB": ["--width", "1344", "--height", "768", "--frames", "124", "--vram", "16GB",
                                   "--weights", "q4_k_m", "--dit", GGUF, *NAMES[2:]],
    "t2v-gguf-1344x768-362-32GB": ["--width", "1344", "--height", "768", "--frames", "362", "--vram", "32GB",
                                   "--weights", "q4_k_m", "--dit", GGUF, *NAMES[2:]],
    "t2v-fp8-1344x768-124-40GB": ["--width", "1344", "--height", "768", "--frames", "124", "--vram", "40GB",
                                  "--weights", "fp8", *NAMES],
    "staged-1344x768-124-80GB": ["--width", "1344", "--height", "768", "--frames", "124", "--vram", "80GB",
                                 "--staged", "--draft", "512x512", *NAMES],
    "staged-i2v-768x768-209-80GB": ["--width", "768", "--height", "768", "--frames", "209", "--vram", "80GB",
                                    "--staged", "--draft-fps", "8", "--image", "first_frame.png", *NAMES],
    "staged-i2v-1344x768-124-24GB": ["--width", "1344", "--height", "768", "--frames", "124", "--vram", "24GB",
                                     "--staged", "--image", "first_frame.png", *NAMES],
}


@pytest.mark.parametrize("case", list(GRID))
def test_written_workflows_pass_comfyui_validation(comfy, tmp_path, case):
    paths = _write(tmp_path, *GRID[case])
    assert len(paths) == (2 if "staged" in case else 1)
    for path in paths:
        graph = json.loads(path.read_text())
        result = _validate(comfy, graph)
        assert result["valid"], json.dumps(result)[:3000]
        assert result["node_errors"] == {}


def test_validation_can_fail(comfy, tmp_path):
    """The route reports what ComfyUI refuses: a model name not in its folder, an input out of range."""
    graph = json.loads(_write(tmp_path, *GRID["t2v-1344x768-124-80GB"])[0].read_text())
    broken = copy.deepcopy(graph)
    next(n for n in broken.values() if n["class_type"] == "UNETLoader")["inputs"]["unet_name"] = "absent.safetensors"
    assert not _validate(comfy, broken)["valid"]
    broken = copy.deepcopy(graph)
    next(n for n in broken.values() if n["class_type"] == "KSampler")["inputs"]["denoise"] = 2.0
    assert not _validate(comfy, broken)["valid"]


def _without_text_encoder(graph: dict) -> dict:
    """`graph` with CLIPLoader + MiniMaxH3ImageToVideo replaced by H3TestImageToVideo (same outputs)."""
    out = copy.deepcopy(graph)
    clip = [k for k, n in out.items() if n["class_type"] == "CLIPLoader"]
    for node in out.values():
        if node["class_type"] == "MiniMaxH3ImageToVideo":
            assert "first_frame" not in node["inputs"]
            node["class_type"] = "H3TestImageToVideo"
            node["inputs"] = {k: node["inputs"][k] for k in ("prompt", "width", "height", "length")}
    for key in clip:
        del out[key]
    assert not [v for n in out.values() for v in n["inputs"].values() if isinstance(v, list) and v[0] in clip]
    return out


def _run(comfy, graph: dict) -> dict:
    entry = submit(comfy, graph)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    return entry["outputs"]


def _mp4(comfy, outputs: dict, graph: dict) -> tuple[int, int]:
    """(video frames, audio streams) of the MP4 the graph's streaming decode wrote."""
    import av

    decode = next(k for k, n in graph.items() if n["class_type"] == "H3DirectorDecodeAVStreaming")
    video = outputs[decode]["images"][0]
    with av.open(str(comfy["base"] / "output" / video["subfolder"] / video["filename"])) as container:
        return container.streams.video[0].frames, len(container.streams.audio)


def test_a_written_t2v_workflow_renders_the_requested_frames(comfy, tmp_path):
    (path,) = _write(tmp_path, "--width", "128", "--height", "128", "--frames", "39", "--vram", "80GB",
                     "--steps", "2", "--prompt", "a fox", *NAMES)
    graph = json.loads(path.read_text())
    assert {"UNETLoader", "CLIPLoader", "MiniMaxH3SigmaShift", "KSampler", "H3DirectorDecodeAVStreaming"} <= \
        {n["class_type"] for n in graph.values()}
    outputs = _run(comfy, _without_text_encoder(graph))
    assert _mp4(comfy, outputs, graph) == (39, 1)


def test_a_written_no_audio_workflow_renders_video_only(comfy, tmp_path):
    (path,) = _write(tmp_path, "--width", "64", "--height", "64", "--frames", "22", "--vram", "80GB", "--no-audio",
                     "--steps", "1", *NAMES[:6])
    graph = json.loads(path.read_text())
    outputs = _run(comfy, _without_text_encoder(graph))
    assert _mp4(comfy, outputs, graph) == (22, 0)


def test_staged_workflows_render_draft_then_full_video(comfy):
    """Stage one samples a video-only draft and saves its latent; stage two loads it (copied into the input
    folder, as a user would), refines it at full size with audio (DiT Memory chunking on) and writes the MP4."""
    import safetensors.torch

    final = PlanRequest(width=128, height=128, frames=39, head_chunks=2, ffn_chunks=8)
    draft_frames = draft_frames_for(39, 12)
    draft = PlanRequest(width=64, height=64, frames=draft_frames, audio=False, audio_rows=False)
    files = ModelFiles(dit=DIT, text_encoder=TE, vae=VAE, audio_vae=AUDIO_VAE)
    one, two = staged_workflows(draft, final, files, RunSpec(steps=2, filename_prefix="video/staged"),
                                denoise=0.6, draft_fps=12.0)
    for workflow in (one, two):
        assert _validate(comfy, workflow.graph)["valid"]

    outputs = _run(comfy, _without_text_encoder(one.graph))
    assert _mp4(comfy, outputs, one.graph) == (draft_frames, 0)
    saved = next(k for k, n in one.graph.items() if n["class_type"] == "SaveLatent")
    latent = outputs[saved]["latents"][0]
    source = comfy["base"] / "output" / latent["subfolder"] / latent["filename"]
    tensors = safetensors.torch.load_file(str(source))
    assert tuple(tensors["latent_tensor"].shape) == (1, 24, 7, 4, 4)      # 22 frames -> 7 latent frames, 64 px / 16
    shutil.copy(source, comfy["base"] / "input" / draft_latent_name())

    outputs = _run(comfy, _without_text_encoder(two.graph))
    assert _mp4(comfy, outputs, two.graph) == (39, 1)
    assert "2 head groups, 8 FFN row chunks" in comfy["log"].read_text()


def test_plan_node_outputs_wire_into_the_nodes_that_apply_them(comfy):
    """H3Director Plan's INT and FLOAT outputs drive DiT Memory and the streaming decode in a real prompt."""
    graph = {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": DIT, "weight_dtype": "default"}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": VAE}},
        "8": {"class_type": "VAELoader", "inputs": {"vae_name": AUDIO_VAE}},
        "3": {"class_type": "H3TestImageToVideo", "inputs": {"prompt": "", "width": 64, "height": 64, "length": 22}},
        "4": {"class_type": "H3DirectorPlan", "inputs": {"samples": ["3", 1], "budget_gb": 48.0}},
        "5": {"class_type": "H3DirectorDiTMemory", "inputs": {"model": ["1", 0], "mode": "fixed",
                                                              "head_chunks": ["4", 1], "ffn_chunks": ["4", 2],
                                                              "budget_gb": 0.0}},
        "6": {"class_type": "KSampler", "inputs": {"model": ["5", 0], "seed": 1, "steps": 1, "cfg": 1.0,
                                                   "sampler_name": "euler", "scheduler": "simple",
                                                   "positive": ["3", 0], "negative": ["3", 0],
                                                   "latent_image": ["3", 1], "denoise": 1.0}},
        "7": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
            "samples": ["6", 0], "vae": ["2", 0], "audio_vae": ["8", 0], "output": "video_file",
            "filename_prefix": "video/plan_wired",
            "fps": 24.0, "crf": 18, "budget_gb": ["4", 4]}},
    }
    assert _validate(comfy, graph)["valid"]
    outputs = _run(comfy, graph)
    text = outputs["4"]["text"][0]
    assert "outputs: head_chunks 1, ffn_chunks 1, blocks_offloaded 0, budget_gb" in text
    assert _mp4(comfy, outputs, graph) == (22, 1)


def test_h3_dit_takes_a_latent_without_audio_rows():
    """ComfyUI's H3 DiT with 0 audio latent frames: a finite video velocity of the latent's shape and an empty
    audio one; the video velocity differs from the joint forward's (video rows attend to audio rows)."""
    import os
    import subprocess

    from comfy_harness.server import comfyui_python

    done = subprocess.run([comfyui_python(), str(HARNESS / "video_only_rows.py"), os.environ["COMFYUI_DIR"]],
                          cwd=HARNESS, capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, PYTHONPATH=str(HARNESS.parents[1])))
    line = next((x for x in done.stdout.splitlines() if x.startswith("VIDEO-ONLY ")), None)
    assert line, done.stdout[-2000:] + done.stderr[-4000:]
    result = json.loads(line.split(" ", 1)[1])
    assert result["0"] == {"video": [1, 24, 7, 6, 4], "audio": [1, 32, 2, 0], "finite": True}
    assert result["9"] == {"video": [1, 24, 7, 6, 4], "audio": [1, 32, 2, 9], "finite": True}
    assert result["video_max_difference"] > 0


def test_draft_larger_than_the_final_is_a_node_error(comfy):
    graph = {
        "1": {"class_type": "H3TestImageToVideo", "inputs": {"prompt": "", "width": 128, "height": 64, "length": 22}},
        "2": {"class_type": "H3TestImageToVideo", "inputs": {"prompt": "", "width": 64, "height": 64, "length": 22}},
        "3": {"class_type": "H3DirectorDraftToAV", "inputs": {"draft": ["1", 1], "samples": ["2", 1]}},
        "4": {"class_type": "H3DirectorVideoStream", "inputs": {"samples": ["3", 0]}},
        "5": {"class_type": "SaveLatent", "inputs": {"samples": ["4", 0], "filename_prefix": "latents/never"}},
    }
    entry = submit(comfy, graph)
    assert entry["status"]["status_str"] == "error"
    assert "is larger than the final video's" in json.dumps(entry["status"]["messages"])
