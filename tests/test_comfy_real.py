"""The pack in a REAL ComfyUI: server on loopback (--cpu), pack installed, example workflow queued over HTTP.

ComfyUI: `COMFYUI_DIR` names a checkout (with H3 support) and `COMFYUI_PYTHON` the Python that has its
requirements (default: this one). Unset, they default to the vendored snapshot that `scripts/setup.sh`
prepares in `.comfy/` (`fixtures/comfy_harness/vendored.py`); without either, the tests skip and say why.
The checkout is only read: models, custom nodes, input and output live in a temporary
`--base-directory`; the web frontend is an empty `--front-end-root` (no frontend package needed). The H3 VAEs are ComfyUI's own
classes at small widths with random weights (`fixtures/comfy_harness/real_comfy.py`), since the
released weights are gigabytes.

Checks: the pack loads through ComfyUI's loader and lists its nodes; the example decode workflow
(`examples/h3_decode_latent_streaming_api.json`) runs; the streaming decode's IMAGE output equals
core `VAEDecode`'s bit for bit (one clip, two clips with two 256 px spatial tiles, one latent frame); the AV latent's MP4 has every frame and an audio stream, and the
node's audio equals core `VAEDecodeAudio`'s; the routes answer and validate their inputs.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from comfy_harness.server import HARNESS, comfyui_server, prepare_base, submit, write_tiny_vae_weights
from comfy_harness.server import http_get as _get
from comfy_harness.vendored import real_comfyui_marks

REPO = Path(__file__).resolve().parents[1]
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")  # tests/conftest.py defaults it to the prepared .comfy/ComfyUI
pytestmark = real_comfyui_marks()
# Latents for the bit-identity test, [B, 24, T, H, W]: (T, H, W) -> (frames, height px, width px).
# ComfyUI's H3 VAE decodes 5-token chunks with 2 tokens of overlap and 256 px tiles overlapping by at
# least 64 px, so T=7 is one clip, T=12 two, and W=24 (384 px) two spatial tiles.
BIT_IDENTITY_LATENTS = {"one_clip": ((7, 8, 8), (22, 128, 128), 1),
                        "two_clips_two_tiles": ((12, 8, 24), (39, 128, 384), 2),
                        "one_latent_frame": ((1, 8, 8), (1, 128, 128), 1)}
@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-base"), ["models/vae"],
                        {"h3director_test_nodes": HARNESS / "real_node"})
    test_nodes = base / "custom_nodes" / "h3director_test_nodes"
    shutil.copy(HARNESS / "real_comfy.py", test_nodes / "real_comfy.py")
    write_tiny_vae_weights(base, test_nodes)
    import safetensors.torch

    for name, (t, h, w) in [("h3_video", (7, 8, 8))] + [(k, v[0]) for k, v in BIT_IDENTITY_LATENTS.items()]:
        latent = torch.randn(1, 24, t, h, w, generator=torch.Generator().manual_seed(11))
        safetensors.torch.save_file({"latent_tensor": latent, "latent_format_version_0": torch.tensor([])},
                                    str(base / "input" / f"{name}.latent"))
    with comfyui_server(base) as server:
        yield server


def _run(comfy, workflow: dict) -> dict:
    entry = submit(comfy, workflow)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    return entry["outputs"]


def _tensors(comfy, name: str) -> dict:
    import safetensors.torch

    return safetensors.torch.load_file(str(comfy["base"] / "output" / "tensors" / f"{name}.safetensors"))


def test_pack_nodes_are_listed(comfy):
    info = json.loads(_get(f"{comfy['url']}/object_info")[1])
    ours = sorted(k for k in info if k.startswith("H3Director"))
    assert ours == sorted(["H3DirectorDecodeAVStreaming", "H3DirectorMonitorStart", "H3DirectorMonitorStop",
                           "H3DirectorMemoryGuard", "H3DirectorSharedWrite", "H3DirectorSharedRead",
                           "H3DirectorFrameOffset", "H3DirectorPlan", "H3DirectorDiTMemory",
                           "H3DirectorAVSyncMeasure", "H3DirectorUpscaleStreaming",
                           "H3DirectorGGUFDiTLoader", "H3DirectorStitch", "H3DirectorCachedTextEncode",
                           "H3DirectorKeyframeSelect", "H3DirectorKeyframeMerge", "H3DirectorDevicePlacement",
                           "H3DirectorBlockSwap", "H3DirectorVideoOnlyLatent", "H3DirectorVideoStream",
                           "H3DirectorDraftToAV", "H3DirectorResumableSampler"])
    assert all(info[k]["category"].startswith("H3 Director/") for k in ours)
    extensions = json.loads(_get(f"{comfy['url']}/extensions")[1])
    assert any(e.endswith("h3director.js") for e in extensions)


def test_example_decode_workflow_runs_and_saves_mp4(comfy):
    import av

    workflow = json.loads((REPO / "examples/h3_decode_latent_streaming_api.json").read_text())
    workflow["2"]["inputs"]["vae_name"] = "h3_tiny_video.safetensors"
    outputs = _run(comfy, workflow)
    video = outputs["4"]["images"][0]
    status, body = _get(f"{comfy['url']}/view?filename={video['filename']}&subfolder={video['subfolder']}&type=output")
    assert status == 200 and len(body) > 0
    path = comfy["base"] / "output" / video["subfolder"] / video["filename"]
    with av.open(str(path)) as container:
        assert container.streams.video[0].frames == 22  # 7 latent frames -> 22 frames
    assert outputs["6"]["images"], "the monitor's timeline image was not saved"
    status, body = _get(f"{comfy['url']}/h3director/report.png?width=640&height=360")
    assert status == 200 and body[:8] == b"\x89PNG\r\n\x1a\n"
    assert _get(f"{comfy['url']}/h3director/report.png?width=99999")[0] == 400
    stats = json.loads(_get(f"{comfy['url']}/h3director/stats?samples=3")[1])
    assert stats["timeline"] is not None and len(stats["timeline"]["samples"]) <= 3
    assert _get(f"{comfy['url']}/h3director/stats?samples=-1")[0] == 400


@pytest.mark.parametrize("case", list(BIT_IDENTITY_LATENTS))
def test_streaming_images_equal_core_vae_decode_bit_for_bit(comfy, case):
    frames, height, width = BIT_IDENTITY_LATENTS[case][1]
    clips = BIT_IDENTITY_LATENTS[case][2]
    workflow = {
        "1": {"class_type": "LoadLatent", "inputs": {"latent": f"{case}.latent"}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_video.safetensors"}},
        "3": {"class_type": "VAEDecode", "inputs": {"samples": ["1", 0], "vae": ["2", 0]}},
        "4": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
            "samples": ["1", 0], "vae": ["2", 0], "output": "images", "filename_prefix": "x", "fps": 24.0, "crf": 18}},
        "5": {"class_type": "H3TestSaveTensor", "inputs": {"name": f"core_{case}", "image": ["3", 0]}},
        "6": {"class_type": "H3TestSaveTensor", "inputs": {
            "name": f"streaming_{case}", "image": ["4", 0], "text": ["4", 2]}},
    }
    _run(comfy, workflow)
    core, streaming = _tensors(comfy, f"core_{case}")["image"], _tensors(comfy, f"streaming_{case}")["image"]
    assert core.shape == (frames, height, width, 3) and core.dtype == torch.float32
    assert torch.equal(core, streaming)
    report = (comfy["base"] / "output" / "tensors" / f"streaming_{case}.txt").read_text()
    assert f"frames: {frames} in {clips} clips" in report


@pytest.mark.parametrize("failures", [1, 2])
def test_an_allocator_failure_in_the_decoder_is_retried_once_and_a_second_one_is_named(comfy, failures):
    """A real allocation failure (the CPU allocator refusing 2**50 bytes) in the first clip's decoder call: the
    node frees other models and decodes that clip again, and the frames equal core VAEDecode's bit for bit; a
    second failure of the same clip stops the prompt with the retry named."""
    workflow = {
        "1": {"class_type": "LoadLatent", "inputs": {"latent": "two_clips_two_tiles.latent"}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_video.safetensors"}},
        "3": {"class_type": "VAEDecode", "inputs": {"samples": ["1", 0], "vae": ["2", 0]}},
        "7": {"class_type": "H3TestFailAllocations", "inputs": {"vae": ["2", 0], "failures": failures}},
        "4": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
            "samples": ["1", 0], "vae": ["7", 0], "output": "images", "filename_prefix": "x", "fps": 24.0, "crf": 18}},
        "5": {"class_type": "H3TestSaveTensor", "inputs": {"name": "core_oom", "image": ["3", 0]}},
        "6": {"class_type": "H3TestSaveTensor", "inputs": {"name": f"oom_{failures}", "image": ["4", 0],
                                                            "text": ["4", 2]}},
    }
    entry = submit(comfy, workflow)
    if failures == 2:
        assert entry["status"]["status_str"] == "error"
        message = json.dumps(entry["status"]["messages"])
        assert "out of memory" in message.lower() and "can't allocate memory" in message
        return
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    assert torch.equal(_tensors(comfy, "core_oom")["image"], _tensors(comfy, "oom_1")["image"])
    report = (comfy["base"] / "output" / "tensors" / "oom_1.txt").read_text()
    assert "out-of-memory retry on clip 0" in report and "can't allocate memory" in report


def test_av_latent_to_mp4_with_audio_equal_to_core_audio_decode(comfy):
    import av

    workflow = {
        "1": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": 128, "height": 128, "length": 22}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_video.safetensors"}},
        "3": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_audio.safetensors"}},
        "4": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
            "samples": ["1", 0], "vae": ["2", 0], "audio_vae": ["3", 0], "output": "video_file",
            "filename_prefix": "av/h3", "fps": 24.0, "crf": 18}},
        "5": {"class_type": "VAEDecodeAudio", "inputs": {"samples": ["1", 0], "vae": ["3", 0]}},
        "6": {"class_type": "H3TestSaveTensor", "inputs": {"name": "core_audio", "audio": ["5", 0]}},
        "7": {"class_type": "H3TestSaveTensor", "inputs": {"name": "streaming_audio", "audio": ["4", 1]}},
    }
    outputs = _run(comfy, workflow)
    video = outputs["4"]["images"][0]
    with av.open(str(comfy["base"] / "output" / video["subfolder"] / video["filename"])) as container:
        assert container.streams.video[0].frames == 22
        assert len(container.streams.audio) == 1
    assert torch.equal(_tensors(comfy, "core_audio")["waveform"], _tensors(comfy, "streaming_audio")["waveform"])


def test_wrong_latent_is_a_node_error(comfy):
    workflow = {
        "1": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_video.safetensors"}},
        "4": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
            "samples": ["1", 0], "vae": ["2", 0], "output": "video_file", "filename_prefix": "bad/h3",
            "fps": 24.0, "crf": 18}},
    }
    with pytest.raises(AssertionError, match="expected an H3 video latent"):
        _run(comfy, workflow)
    assert not (comfy["base"] / "output" / "bad").exists() or not any((comfy["base"] / "output" / "bad").iterdir())


@pytest.mark.parametrize("name", ["h3_t2v_streaming_api.json", "h3_t2v_video_only_api.json",
                                  "h3_i2v_streaming_api.json",
                                  "h3_decode_latent_streaming_api.json", "h3_long_chain_api.json",
                                  "h3_keyframe_detail_api.json", "h3_t2v_planned_40gb_api.json",
                                  "h3_staged_api.stage1.json", "h3_staged_api.stage2.json",
                                  "h3_t2v_resumable_api.json"])
def test_example_workflows_match_the_real_node_definitions(comfy, name):
    info = json.loads(_get(f"{comfy['url']}/object_info")[1])
    workflow = json.loads((REPO / "examples" / name).read_text())
    for node_id, node in workflow.items():
        spec = info[node["class_type"]]  # KeyError names an unknown node type
        known = {**spec["input"].get("required", {}), **spec["input"].get("optional", {})}
        for required in spec["input"].get("required", {}):
            assert required in node["inputs"], f"{name} node {node_id} lacks required input {required}"
        for key, value in node["inputs"].items():
            assert key in known, f"{name} node {node_id} ({node['class_type']}) has unknown input {key}"
            if isinstance(value, list):
                source = workflow[value[0]]
                outputs = info[source["class_type"]]["output"]
                assert value[1] < len(outputs), f"{name} node {node_id}.{key} links to a missing output"
                wanted, given = known[key][0], outputs[value[1]]
                assert wanted == given or "*" in (wanted, given) or isinstance(wanted, list), \
                    f"{name} node {node_id}.{key}: {given} into {wanted}"


def test_the_decode_node_leaves_the_servers_mmap_threshold_as_it_was(comfy):
    """glibc's mmap threshold is process-wide and cannot be restored once set (core/host_heap.py), so the node
    must not set it: after a streaming decode (level 2: pool and collections) the server's malloc still follows
    the dynamic threshold, read in the server process by `real_comfy.mmap_threshold_is_pinned`."""
    workflow = {
        "1": {"class_type": "LoadLatent", "inputs": {"latent": "two_clips_two_tiles.latent"}},
        "2": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_video.safetensors"}},
        "4": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
            "samples": ["1", 0], "vae": ["2", 0], "output": "images", "filename_prefix": "x", "fps": 24.0, "crf": 18}},
        "5": {"class_type": "H3TestMmapProbe", "inputs": {"name": "mmap_after_decode", "image": ["4", 0]}},
    }
    _run(comfy, workflow)
    probed = (comfy["base"] / "output" / "tensors" / "mmap_after_decode.txt").read_text()
    if probed == "None":
        pytest.skip("the server's C library is not glibc")
    assert probed == "False", "the decode node left glibc's mmap threshold pinned in the ComfyUI server"
