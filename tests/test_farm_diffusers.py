"""The farm's diffusers jobs without Ray: the ``diffusers`` spec is checked line by line with specific
messages; a diffusers job is priced as sampling + decode with rungs its transformer's heads allow; the
worker's `PipelineHost` runs a tiny random-init H3 pipeline saved with save_pretrained (loaded once, kept)
into an MP4 of the job's frame count."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from comfy_harness.farm_diffusers import write_embeds, write_tiny_pipeline

from h3director.farm import needs
from h3director.farm.jobs import parse_jobs


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("diffusers_jobs")
    write_tiny_pipeline(folder / "pipe")
    write_embeds(folder / "embeds.safetensors")
    write_embeds(folder / "wide.safetensors", width=48)
    (folder / "not_safetensors.safetensors").write_bytes(b"\x01")
    (folder / "wrong").mkdir()
    (folder / "wrong" / "transformer").mkdir()
    (folder / "wrong" / "transformer" / "config.json").write_text(json.dumps({"_class_name": "WanTransformer3DModel"}))
    return folder


GOOD_SPEC = {"pipeline": "pipe", "prompt_embeds": "embeds.safetensors", "steps": 2}
GEOMETRY = {"frames": 124, "width": 32, "height": 32}


def _line(**changes) -> str:
    job = {"id": "j", "diffusers": GOOD_SPEC, "seed": 3, **GEOMETRY}
    for key, value in changes.items():
        if value is None:
            job.pop(key, None)
        else:
            job[key] = value
    return json.dumps(job)


def test_a_good_spec_becomes_a_diffusers_job(folder):
    jobs, errors = parse_jobs(_line(), folder)
    assert errors == []
    (job,) = jobs
    spec = job.diffusers
    assert spec.pipeline == str(folder / "pipe") and spec.prompt_embeds == str(folder / "embeds.safetensors")
    assert (spec.task, spec.dtype, spec.steps, spec.crf, spec.heads, spec.text_dim) == ("t2v", "float32", 2, 18, 2, 32)
    assert (job.frames, job.width, job.height, job.workflow) == (124, 32, 32, {})
    other, _ = parse_jobs(_line(seed=4), folder)
    assert other[0].spec_hash != job.spec_hash            # the seed is part of what a done job was


@pytest.mark.parametrize("changes, message", [
    ({"diffusers": "pipe"}, "'diffusers' must be an object"),
    ({"diffusers": {**GOOD_SPEC, "model": "x"}}, "unknown diffusers keys ['model']"),
    ({"diffusers": {"prompt_embeds": "embeds.safetensors"}}, "diffusers 'pipeline' (a local path) is required"),
    ({"diffusers": {"pipeline": "pipe"}}, "diffusers 'prompt_embeds' (a local path) is required"),
    ({"diffusers": {**GOOD_SPEC, "pipeline": "nowhere"}}, "is not a folder"),
    ({"diffusers": {**GOOD_SPEC, "pipeline": "wrong"}}, "is a 'WanTransformer3DModel', expected MiniMaxH3Transformer3DModel"),
    ({"diffusers": {**GOOD_SPEC, "pipeline": "pipe/vae"}}, "has no transformer/config.json"),
    ({"diffusers": {**GOOD_SPEC, "task": "i2v"}}, "diffusers 'task' must be one of ['t2v']"),
    ({"diffusers": {**GOOD_SPEC, "dtype": "float8"}}, "diffusers 'dtype' must be one of"),
    ({"diffusers": {**GOOD_SPEC, "steps": 1}}, "diffusers 'steps' must be an integer from 2 to 1000, got 1"),
    ({"diffusers": {**GOOD_SPEC, "crf": 60}}, "diffusers 'crf' must be an integer from 0 to 51"),
    ({"diffusers": {**GOOD_SPEC, "prompt_embeds": "missing.safetensors"}}, "is not a file"),
    ({"diffusers": {**GOOD_SPEC, "prompt_embeds": "not_safetensors.safetensors"}}, "is not a safetensors file"),
    ({"diffusers": {**GOOD_SPEC, "prompt_embeds": "wide.safetensors"}}, "prompt_embeds are 48 wide but the "
                                                                         "transformer's text_dim is 32"),
    ({"workflow": "decode.json"}, "either 'workflow' (ComfyUI) or 'diffusers'"),
    ({"prompt": "a fox"}, "a diffusers job takes its text as the spec's 'prompt_embeds' file"),
    ({"set": {"1": {}}}, "a diffusers job has no nodes"),
    ({"frames": None}, "a diffusers job needs frames"),
    ({"frames": 22}, "frames must be from 124 to 345"),
    ({"seed": "7"}, "seed must be an integer >= 0"),
])
def test_bad_specs_are_refused_with_specific_messages(folder, changes, message):
    jobs, errors = parse_jobs(_line(**changes) + "\n" + _line(id="other"), folder)
    assert [job.id for job in jobs] == ["other"]                # the other line goes on
    (error,) = errors
    assert error.line == 1 and error.job_id == "j" and message in error.message, error.message


def test_a_diffusers_job_is_priced_as_sampling_and_decode_with_rungs_its_heads_allow(folder):
    (job,), _ = parse_jobs(_line(), folder)
    rungs = needs.ladder(job)
    assert [r.settings for r in rungs] == [{"head_chunks": 1, "ffn_chunks": 1}, {"head_chunks": 1, "ffn_chunks": 2},
                                           {"head_chunks": 2, "ffn_chunks": 8}][:len(rungs)]
    assert all(r.settings["head_chunks"] in (1, 2) for r in rungs)   # the tiny transformer has 2 heads
    sampling = next(p for p in rungs[0].plan.phases if p.name == "sampling")
    assert rungs[0].device_bytes >= sampling.device_bytes


def test_the_pipeline_host_runs_jobs_into_mp4s_and_keeps_the_pipeline(folder, tmp_path):
    import av

    from h3director.farm.diffusers_job import PipelineHost, request

    (job,), _ = parse_jobs(_line(), folder)
    host = PipelineHost("cpu")
    first = host.run("a", request(job, {"head_chunks": 1, "ffn_chunks": 2}), str(tmp_path))
    assert first["status"] == "done", first["error"]
    transformer = host.transformer
    second = host.run("b", request(job, {"head_chunks": 2, "ffn_chunks": 1}), str(tmp_path))
    assert second["status"] == "done" and host.transformer is transformer        # loaded once, kept
    assert first["files"]["a.mp4"] == second["files"]["b.mp4"]    # the DiT chunking is exact on the CPU
    assert first["peak_series"] == "worker.rss_bytes" and first["peak_bytes"] > 0
    (tmp_path / "a.mp4").write_bytes(first["files"]["a.mp4"])
    with av.open(str(tmp_path / "a.mp4")) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        assert (frames, stream.width, stream.height) == (124, 32, 32)
    assert not list(tmp_path.glob("*.tmp*")) and sorted(p.name for p in tmp_path.iterdir()) == ["a.mp4"]


def test_a_job_error_is_reported_and_the_host_goes_on(folder, tmp_path):
    from h3director.farm.diffusers_job import PipelineHost, request

    (job,), _ = parse_jobs(_line(), folder)
    host = PipelineHost("cpu")
    bad = host.run("x", request(job, {"head_chunks": 4, "ffn_chunks": 1}), str(tmp_path))   # 4 does not divide 2
    assert bad["status"] == "error" and "InvalidInputError" in bad["error"] and bad["files"] == {}
    good = host.run("y", request(job, {"head_chunks": 1, "ffn_chunks": 1}), str(tmp_path))
    assert good["status"] == "done" and not (tmp_path / "x.mp4").exists()


def test_an_out_of_memory_decode_is_an_oom_result_the_driver_retries_cheaper(folder, tmp_path):
    from oom_injection import OomOnClip

    from h3director.farm.diffusers_job import PipelineHost, request

    (job,), _ = parse_jobs(_line(), folder)
    injector = OomOnClip(clips=range(100), times=100)       # every execution of the first clip fails
    result = PipelineHost("cpu", fault_injector=injector).run("o", request(job, {}), str(tmp_path))
    assert injector.hits and result["status"] == "oom" and "DecodeOutOfMemory" in result["error"], result["error"]
    assert result["files"] == {} and not (tmp_path / "o.mp4").exists()


def test_without_comfyui_a_file_with_workflow_jobs_is_refused_naming_the_lines(tmp_path):
    import subprocess
    import sys

    pytest.importorskip("ray")
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text(_line() + "\n" + json.dumps({"id": "w", "workflow": "decode.json"}) + "\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "H3_FARM_COMFYUI"}
    done = subprocess.run([sys.executable, "-m", "h3director", "farm", "run", str(jobs), "--workers", "w0=1GB",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 2, done.stderr
    assert "--comfyui (or H3_FARM_COMFYUI) must name" in done.stderr and "workflow jobs (lines 2)" in done.stderr


def test_the_pipeline_host_decodes_as_its_memory_level_asks(folder, tmp_path, monkeypatch):
    """Level 0 is the VAE's own whole-video decode (no streaming, no pool), as for the CLI and the node; level 2
    streams with collections between clips; the MP4s are the same bytes. Each run samples its own latents: they are
    compared first, so a difference says whether sampling or decoding differed (one full-suite run on 2026-12-02 had
    the MP4s differ; this run's latents were not kept then)."""
    import torch

    from h3director.core.config import validate_config
    from h3director.farm.diffusers_job import PipelineHost, request

    sampled = []
    sample = PipelineHost._latents

    def keep_latents(self, spec, job):
        out = sample(self, spec, job)
        sampled.append(out.detach().clone())
        return out

    monkeypatch.setattr(PipelineHost, "_latents", keep_latents)
    (job,), _ = parse_jobs(_line(), folder)
    files = {}
    for level, path in [(0, "reference"), (2, "streaming")]:
        config = validate_config({"memory_optimization_level": level, "memory_safety": {"enabled": False}}, env={})
        points: list = []                                   # the streaming decode's fault points
        host = PipelineHost("cpu", fault_injector=points.append, config=config)
        result = host.run(f"l{level}", request(job, {}), str(tmp_path))
        assert result["status"] == "done", result["error"]
        assert host.last_decode.path == path and bool(points) == (level > 0)
        files[level] = result["files"][f"l{level}.mp4"]
    assert len(sampled) == 2 and torch.equal(sampled[0], sampled[1]), (
        f"the two runs sampled different latents (max abs diff {(sampled[0] - sampled[1]).abs().max().item()})")
    assert files[0] == files[2]
