"""The plan writes the workflow (plan/workflow_comfy.py, `plan --workflow`), and staged generation (plan/staged.py,
`plan --staged`): graph structure and settings, refusals before anything is written, stage pricing, the latent
resize of stage two. The workflows' validity in a real ComfyUI is tests/test_plan_workflow_comfy_real.py."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from h3director import geometry
from h3director.cli import main
from h3director.errors import InvalidInputError
from h3director.plan.capabilities import applied_settings
from h3director.plan.estimate import PlanRequest, estimate, packed_geometry
from h3director.plan.recommend import Budget, recommend
from h3director.plan.staged import default_draft_size, draft_frames_for, parse_size, plan_staged
from h3director.plan.workflow_comfy import ModelFiles, RunSpec, comfy_workflow, staged_workflows
from h3director.video.latent_resize import resize_video_latent

GiB = 2**30
FILES = ModelFiles(dit="h3_dit.safetensors", text_encoder="h3_te.safetensors", vae="h3_video_vae.safetensors",
                   audio_vae="h3_audio_vae.safetensors")
NAMES = ["--dit", FILES.dit, "--text-encoder", FILES.text_encoder, "--vae", FILES.vae, "--audio-vae", FILES.audio_vae]


def _nodes(graph: dict, class_type: str) -> list[dict]:
    return [node for node in graph.values() if node["class_type"] == class_type]


def _one(graph: dict, class_type: str) -> dict:
    found = _nodes(graph, class_type)
    assert len(found) == 1, (class_type, [n["class_type"] for n in graph.values()])
    return found[0]


def _links_resolve(graph: dict) -> None:
    for node in graph.values():
        for value in node["inputs"].values():
            if isinstance(value, list):
                assert value[0] in graph, value


def _model_chain(graph: dict) -> list[str]:
    """Class types from the KSampler's model input back to the loader."""
    chain, link = [], _one(graph, "KSampler")["inputs"]["model"]
    while link:
        node = graph[link[0]]
        chain.append(node["class_type"])
        link = node["inputs"].get("model")
    return chain[::-1]


@pytest.mark.parametrize("vram,frames", [(24, 124), (80, 124), (80, 362), (32, 209)])
def test_workflow_applies_every_recommended_setting(vram, frames):
    request = PlanRequest(width=1344, height=768, frames=frames)
    advice = recommend(request, Budget(vram * GiB, 64 * GiB), formats=("bf16", "fp8"))
    workflow = comfy_workflow(advice.request, FILES)
    graph, chosen = workflow.graph, advice.request
    _links_resolve(graph)
    unet = _one(graph, "UNETLoader")["inputs"]
    assert unet["unet_name"] == FILES.dit
    assert unet["weight_dtype"] == {"bf16": "default", "fp8": "fp8_e4m3fn"}[chosen.weights]
    clip = _one(graph, "CLIPLoader")["inputs"]
    assert clip == {"clip_name": FILES.text_encoder, "type": "minimax",
                    "device": "cpu" if chosen.text_encoder_device == "cpu" else "default"}
    assert sorted(n["inputs"]["vae_name"] for n in _nodes(graph, "VAELoader")) == sorted([FILES.vae, FILES.audio_vae])
    chain = _model_chain(graph)
    assert chain[0] == "UNETLoader" and chain[-1] == "MiniMaxH3SigmaShift"
    assert ("H3DirectorBlockSwap" in chain) == (chosen.offload_blocks > 0)
    assert ("H3DirectorDiTMemory" in chain) == ((chosen.head_chunks, chosen.ffn_chunks) != (1, 1))
    if chosen.offload_blocks:
        assert _one(graph, "H3DirectorBlockSwap")["inputs"]["blocks_offloaded"] == chosen.offload_blocks
    if "H3DirectorDiTMemory" in chain:
        memory = _one(graph, "H3DirectorDiTMemory")["inputs"]
        assert (memory["mode"], memory["head_chunks"], memory["ffn_chunks"]) == \
            ("fixed", chosen.head_chunks, chosen.ffn_chunks)
    cond = _one(graph, "MiniMaxH3ImageToVideo")["inputs"]
    assert (cond["width"], cond["height"], cond["length"]) == (1344, 768, frames)
    assert "first_frame" not in cond
    decode = _one(graph, "H3DirectorDecodeAVStreaming")["inputs"]
    assert decode["output"] == "video_file" and decode["fps"] == 24.0 and "audio_vae" in decode
    assert graph[decode["samples"][0]]["class_type"] == "KSampler"
    # every applied setting that names a node landed on a node of that class
    for setting in applied_settings(chosen, "comfyui"):
        if setting.node:
            assert _nodes(graph, setting.node), setting


def test_the_grid_covers_offload_chunking_and_both_text_encoder_places():
    seen = set()
    for vram, frames in [(24, 124), (80, 124), (80, 362), (32, 209)]:
        chosen = recommend(PlanRequest(width=1344, height=768, frames=frames), Budget(vram * GiB, 64 * GiB),
                           formats=("bf16", "fp8")).request
        seen |= {("offload", chosen.offload_blocks > 0), ("chunks", chosen.head_chunks > 1),
                 ("te", chosen.text_encoder_device)}
    assert {("offload", True), ("offload", False), ("chunks", True), ("te", "cpu"), ("te", "gpu")} <= seen


def test_image_to_video_and_no_audio():
    request = PlanRequest(width=768, height=768, frames=124, keyframes=1, audio=False, head_chunks=2, ffn_chunks=8)
    graph = comfy_workflow(request, dataclasses.replace(FILES, audio_vae=None),
                           RunSpec(image="fox.png", prompt="a fox", seed=7, steps=12)).graph
    _links_resolve(graph)
    cond = _one(graph, "MiniMaxH3ImageToVideo")["inputs"]
    assert graph[cond["first_frame"][0]] == {"class_type": "LoadImage", "inputs": {"image": "fox.png"},
                                            "_meta": {"title": "first frame"}}
    assert cond["prompt"] == "a fox"
    sampler = _one(graph, "KSampler")["inputs"]
    assert (sampler["seed"], sampler["steps"], sampler["denoise"]) == (7, 12, 1.0)
    assert len(_nodes(graph, "VAELoader")) == 1
    decode = _one(graph, "H3DirectorDecodeAVStreaming")["inputs"]
    assert "audio_vae" not in decode and graph[decode["samples"][0]]["class_type"] == "H3DirectorVideoStream"
    with pytest.raises(InvalidInputError, match="keyframe"):
        comfy_workflow(dataclasses.replace(request, keyframes=0), FILES, RunSpec(image="fox.png"))


def test_gguf_plan_uses_the_gguf_loader_and_file_kinds_must_match():
    request = PlanRequest(width=1344, height=768, frames=124, weights="q4_k_m")
    graph = comfy_workflow(request, dataclasses.replace(FILES, dit="h3_q4_k_m.gguf")).graph
    assert _one(graph, "H3DirectorGGUFDiTLoader")["inputs"]["gguf_name"] == "h3_q4_k_m.gguf"
    assert not _nodes(graph, "UNETLoader")
    with pytest.raises(InvalidInputError, match="does not match the plan's DiT weights q4_k_m"):
        comfy_workflow(request, FILES)
    with pytest.raises(InvalidInputError, match="unknown weights format '.ckpt'"):
        comfy_workflow(PlanRequest(width=1344, height=768, frames=124), dataclasses.replace(FILES, dit="h3.ckpt"))
    with pytest.raises(InvalidInputError, match="--audio-vae"):
        comfy_workflow(PlanRequest(width=1344, height=768, frames=124), dataclasses.replace(FILES, audio_vae=None))


def _cli(capsys, tmp_path, *argv):
    code = main(["plan", "--width", "1344", "--height", "768", "--ram", "64GB", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err, sorted(p.name for p in tmp_path.iterdir())


def test_cli_writes_the_workflow(capsys, tmp_path):
    target = tmp_path / "wf.json"
    code, out, err, files = _cli(capsys, tmp_path, "--frames", "124", "--vram", "24GB", "--workflow", str(target),
                                 *NAMES, "--prompt", "a fox", "--image", "fox.png")
    assert code == 0, err
    assert files == ["wf.json"] and f"Wrote {target}" in out
    graph = json.loads(target.read_text())
    assert _one(graph, "MiniMaxH3ImageToVideo")["inputs"]["prompt"] == "a fox"
    assert _one(graph, "LoadImage")["inputs"]["image"] == "fox.png"


@pytest.mark.parametrize("argv,message", [
    (["--frames", "124", "--dit", "h3.safetensors"], "--dit go into a written workflow"),
    (["--frames", "124", "--workflow", "{out}", "--dit", "h3.safetensors"], "--text-encoder, --vae, --audio-vae"),
    (["--frames", "124", "--workflow", "{out}", *NAMES[:1], "h3.bin", *NAMES[2:]], "unknown weights format '.bin'"),
    (["--frames", "124", "--workflow", "{out}", "--dit", "h3.gguf", *NAMES[2:]], "say which quantisation"),
    (["--frames", "124", "--workflow", "{out}", "--weights", "nf4", *NAMES], "nf4 have no ComfyUI loader"),
    (["--frames", "125", "--workflow", "{out}", *NAMES], "off H3's 17n+5 grid"),
    (["--frames", "124", "--workflow", "{out}", *NAMES[:6], "--audio-vae", "a.ckpt"], "unknown weights format"),
    (["--frames", "124", "--staged", "--draft", "1536x768", "--workflow", "{out}", *NAMES],
     "draft 1536x768 is larger than the final video 1344x768"),
    (["--frames", "124", "--draft", "512x512"], "describe the draft of --staged"),
    (["--frames", "124", "--no-audio", "--workflow", "{out}", *NAMES], "--audio-vae with --no-audio"),
    (["--frames", "124", "--staged", "--draft-fps", "30"], "--draft-fps must be in"),
    (["--frames", "124", "--workflow", "{dir}/missing/wf.json", *NAMES], "does not exist"),
])
def test_cli_refuses_bad_input_in_one_line_and_writes_nothing(capsys, tmp_path, argv, message):
    argv = [a.format(out=str(tmp_path / "wf.json"), dir=str(tmp_path)) for a in argv]
    code, out, err, files = _cli(capsys, tmp_path, "--vram", "24GB", *argv)
    assert code == 2 and message in err, err
    assert len(err.strip().splitlines()) == 1 and out == ""
    assert files == []


def test_video_only_rows_and_draft_geometry():
    full = estimate(PlanRequest(width=512, height=512, frames=56, audio=False))
    draft = estimate(PlanRequest(width=512, height=512, frames=56, audio=False, audio_rows=False))
    assert full.geometry.audio_rows == 2 * geometry.audio_latent_frames_for(56) > 0
    assert draft.geometry.audio_rows == 0
    assert full.geometry.packed_tokens - draft.geometry.packed_tokens == full.geometry.audio_rows
    assert draft.geometry == packed_geometry(512, 512, 56, audio=False)
    with pytest.raises(InvalidInputError, match="audio=False"):
        PlanRequest(width=512, height=512, frames=56, audio_rows=False).validate()
    assert draft_frames_for(124, 12) == 56 and draft_frames_for(124, 24) == 124 and draft_frames_for(22, 1) == 5
    assert default_draft_size(1344, 768) == (672, 384) and default_draft_size(256, 128) == (256, 128)
    assert parse_size("512x512") == (512, 512)
    with pytest.raises(InvalidInputError):
        parse_size("512")


def test_staged_plan_prices_both_stages():
    request = PlanRequest(width=1344, height=768, frames=124)
    staged = plan_staged(request, Budget(80 * GiB, 64 * GiB), draft_size=(512, 512), formats=["bf16"])
    d, f = staged.draft, staged.final
    assert (d.request.width, d.request.height, d.request.frames) == (512, 512, 56)
    assert not d.request.audio_rows and not d.request.audio and d.estimate.geometry.audio_rows == 0
    assert f.request.audio_rows and f.estimate == recommend(request, Budget(80 * GiB, 64 * GiB),
                                                             formats=["bf16"]).estimate
    assert d.request.weights == f.request.weights
    work, floor = staged.sampling_working_bytes(), staged.smallest_device_bytes()
    assert work[0] < work[1] and floor[0] < floor[1]
    assert abs(staged.draft_fps_actual - 56 / (124 / 24)) < 1e-9
    data = staged.to_dict()
    assert data["draft"]["packed_tokens"] == d.estimate.geometry.packed_tokens
    text = staged.summary()
    assert "Stage one" in text and "Stage two" in text and "does not lower the final video's peak" in text
    assert "stretches the draft" in text                          # 512x512 onto 1344x768
    same_aspect = plan_staged(request, Budget(80 * GiB, 64 * GiB), formats=["bf16"])
    assert (same_aspect.draft.request.width, same_aspect.draft.request.height) == (672, 384)
    assert "stretches" not in same_aspect.summary()
    with pytest.raises(InvalidInputError, match="draft 1344x800 is larger than the final video 1344x768"):
        plan_staged(request, Budget(80 * GiB, 64 * GiB), draft_size=(1344, 800))


def test_staged_json(capsys, tmp_path):
    code, out, err, files = _cli(capsys, tmp_path, "--frames", "124", "--vram", "24GB", "--staged", "--json")
    assert code == 0 and files == [], err
    data = json.loads(out)
    assert data["draft"]["request"]["audio_rows"] is False and data["final"]["request"]["audio_rows"] is True
    assert data["draft"]["packed_tokens"] < data["final"]["packed_tokens"]
    assert data["draft"]["smallest_device_bytes"] < data["final"]["smallest_device_bytes"]
    assert data["budget"]["device_bytes"] == 24 * GiB and data["written"] == []


def test_staged_workflows_save_and_load_the_draft(capsys, tmp_path):
    target = tmp_path / "staged.json"
    code, out, err, files = _cli(capsys, tmp_path, "--frames", "124", "--vram", "80GB", "--staged",
                                 "--draft", "512x512", "--refine-denoise", "0.5", "--workflow", str(target), *NAMES)
    assert code == 0, err
    assert files == ["staged.stage1.json", "staged.stage2.json"]
    one = json.loads((tmp_path / "staged.stage1.json").read_text())
    two = json.loads((tmp_path / "staged.stage2.json").read_text())
    _links_resolve(one)
    _links_resolve(two)
    cond = _one(one, "MiniMaxH3ImageToVideo")["inputs"]
    assert (cond["width"], cond["height"], cond["length"]) == (512, 512, 56)
    only = _one(one, "H3DirectorVideoOnlyLatent")["inputs"]
    assert only["samples"][1] == 1 and one[only["samples"][0]]["class_type"] == "MiniMaxH3ImageToVideo"
    save = _one(one, "SaveLatent")["inputs"]
    assert one[save["samples"][0]]["class_type"] == "H3DirectorVideoStream"
    assert not [n for n in _nodes(one, "VAELoader") if n["inputs"]["vae_name"] == FILES.audio_vae]
    assert "audio_vae" not in _one(one, "H3DirectorDecodeAVStreaming")["inputs"]
    assert _one(two, "LoadLatent")["inputs"]["latent"] == "h3_draft_00001_.latent"
    cond = _one(two, "MiniMaxH3ImageToVideo")["inputs"]
    assert (cond["width"], cond["height"], cond["length"]) == (1344, 768, 124)
    sampler = _one(two, "KSampler")["inputs"]
    assert sampler["denoise"] == 0.5 and two[sampler["latent_image"][0]]["class_type"] == "H3DirectorDraftToAV"
    assert "audio_vae" in _one(two, "H3DirectorDecodeAVStreaming")["inputs"]
    with pytest.raises(InvalidInputError, match="one DiT file"):
        staged_workflows(PlanRequest(512, 512, 56, audio=False, audio_rows=False, weights="fp8"),
                         PlanRequest(1344, 768, 124), FILES, denoise=0.5, draft_fps=12)


def test_resize_video_latent():
    video = torch.randn(1, 24, 7, 4, 6, generator=torch.Generator().manual_seed(0))
    assert torch.equal(resize_video_latent(video, 7, 4, 6), video)
    longer = resize_video_latent(video, 12, 4, 6)
    assert longer.shape == (1, 24, 12, 4, 6)
    assert torch.allclose(longer[:, :, 0], video[:, :, 0]) and torch.allclose(longer[:, :, -1], video[:, :, -1])
    bigger = resize_video_latent(video, 12, 8, 12)
    assert bigger.shape == (1, 24, 12, 8, 12) and bigger.dtype == torch.float32
    constant = torch.full((1, 24, 2, 2, 2), 0.25)
    assert torch.allclose(resize_video_latent(constant, 7, 4, 4), torch.full((1, 24, 7, 4, 4), 0.25))
    with pytest.raises(InvalidInputError):
        resize_video_latent(torch.zeros(1, 16, 2, 2, 2), 3, 4, 4)
    with pytest.raises(InvalidInputError):
        resize_video_latent(video, 0, 4, 4)
