"""The farm's pieces without Ray or ComfyUI: job lines, the planner's rungs, worker specs, the ledger,
and the CLI's refusals (an unreachable cluster, a missing ledger)."""

from __future__ import annotations

import importlib.util
import json
import re
import socket
import sqlite3
import subprocess
import sys

import pytest

from h3director.errors import BudgetError, InvalidInputError
from h3director.farm import needs
from h3director.farm.jobs import parse_jobs, unknown_classes, with_output_prefix
from h3director.farm.ledger import Ledger
from h3director.units import GiB, MiB

WORKFLOW = {
    "1": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": 128, "height": 128, "length": 22}},
    "2": {"class_type": "VAELoader", "inputs": {"vae_name": "v.safetensors"}},
    "4": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
        "samples": ["1", 0], "vae": ["2", 0], "filename_prefix": "video/x", "budget_gb": 0.0}},
}


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "wf.json").write_text(json.dumps(WORKFLOW))
    return tmp_path


def _lines(*objects) -> str:
    return "\n".join(o if isinstance(o, str) else json.dumps(o) for o in objects)


def test_overrides_reach_the_nodes_and_the_geometry(folder):
    jobs, errors = parse_jobs(_lines({"id": "a", "workflow": "wf.json", "width": 256, "frames": 39,
                                      "set": {"4": {"crf": 20}}}), folder)
    assert errors == []
    job = jobs[0]
    assert job.workflow["1"]["inputs"] == {"width": 256, "height": 128, "length": 39}
    assert job.workflow["4"]["inputs"]["samples"] == ["1", 0]      # links are never overridden
    assert job.workflow["4"]["inputs"]["crf"] == 20
    assert (job.width, job.height, job.frames) == (256, 128, 39)
    assert with_output_prefix(job.workflow, "a")["4"]["inputs"]["filename_prefix"] == "h3farm/a/x"


def test_each_bad_line_gets_its_own_error_and_the_others_go_on(folder):
    (folder / "ui.json").write_text(json.dumps({"nodes": [], "links": []}))
    text = _lines({"id": "ok", "workflow": "wf.json"}, "{not json", {"id": "ok", "workflow": "wf.json"},
                  {"id": "p", "workflow": "wf.json", "prompt": "a cat"}, {"id": "d", "diffusers": {"model": "x"}},
                  {"id": "u", "workflow": "ui.json"}, {"id": "m", "workflow": "missing.json"},
                  {"id": "bad id!", "workflow": "wf.json"}, {"id": "k", "workflow": "wf.json", "colour": 1},
                  {"id": "s", "workflow": "wf.json", "seed": "7"}, "", "# a comment")
    jobs, errors = parse_jobs(text, folder)
    assert [j.id for j in jobs] == ["ok"]
    messages = {e.line: e.message for e in errors}
    assert "malformed JSON" in messages[2]
    assert "duplicate job id 'ok'" in messages[3]
    assert "override 'prompt' matches no node input" in messages[4]
    assert "a diffusers job needs frames, width, height" in messages[5]
    assert "UI format" in messages[6]
    assert "cannot read workflow" in messages[7]
    assert "'id' must be" in messages[8]
    assert "unknown keys ['colour']" in messages[9]
    assert "seed must be an integer" in messages[10]
    assert len(errors) == 9


def test_unknown_node_classes_are_named(folder):
    jobs, _ = parse_jobs(_lines({"id": "a", "workflow": "wf.json"}), folder)
    assert unknown_classes(jobs[0], {"EmptyMiniMaxH3LatentAV", "VAELoader"}) == ["H3DirectorDecodeAVStreaming"]


def test_decode_rungs_get_cheaper_and_reach_the_decode_node(folder):
    jobs, _ = parse_jobs(_lines({"id": "a", "workflow": "wf.json", "width": 512, "height": 512}), folder)
    rungs = needs.ladder(jobs[0])
    assert len(rungs) >= 2
    assert all(a.device_bytes > b.device_bytes for a, b in zip(rungs, rungs[1:], strict=False))
    applied = needs.apply_rung(rungs[1], jobs[0].workflow)
    assert applied["4"]["inputs"]["budget_gb"] == rungs[1].settings["budget_gb"]
    assert applied["4"]["inputs"]["budget_gb"] * GiB >= rungs[1].device_bytes
    assert jobs[0].workflow["4"]["inputs"]["budget_gb"] == 0.0        # the job's own workflow is untouched


def test_a_job_no_worker_fits_is_refused_with_the_plan(folder):
    jobs, _ = parse_jobs(_lines({"id": "a", "workflow": "wf.json"}), folder)
    rungs = needs.ladder(jobs[0])
    small = needs.WorkerSpec("small", rungs[-1].device_bytes - GiB, 64 * GiB)
    with pytest.raises(BudgetError, match="no worker fits this job") as info:
        needs.first_rung(rungs, [small])
    assert "worker small: device" in str(info.value) and "decode" in str(info.value)
    big = needs.WorkerSpec("big", 2 * rungs[0].device_bytes + GiB, 64 * GiB)   # room for the planner's margin
    assert needs.first_rung(rungs, [small, big]) == 0


def test_geometry_off_the_grid_or_missing_is_refused(folder):
    jobs, _ = parse_jobs(_lines({"id": "a", "workflow": "wf.json", "frames": 23}), folder)
    with pytest.raises(InvalidInputError, match="17n\\+5 grid"):
        needs.ladder(jobs[0])
    (folder / "nogeo.json").write_text(json.dumps({"2": WORKFLOW["2"], "4": WORKFLOW["4"]}))
    jobs, _ = parse_jobs(_lines({"id": "b", "workflow": "nogeo.json"}), folder)
    with pytest.raises(InvalidInputError, match="no frames, width, height"):
        needs.ladder(jobs[0])


def test_worker_specs():
    workers = needs.parse_workers("gpu0=24GB, gpu1=12GB:32GB", 8 * GiB)
    assert [(w.name, w.accel_mb, w.host_mb) for w in workers] == [("gpu0", 24 * 1024, 8 * 1024),
                                                                   ("gpu1", 12 * 1024, 32 * 1024)]
    for bad, match in (("gpu0", "NAME=ACCEL"), ("a=1GB,a=2GB", "duplicate"), ("a b=1GB", "letters"),
                       ("a=lots", "cannot read size")):
        with pytest.raises(InvalidInputError, match=match):
            needs.parse_workers(bad, GiB)


def test_ledger_never_redoes_a_done_job_and_resumes_a_dead_drivers_jobs(tmp_path):
    path = tmp_path / "farm.sqlite"
    with Ledger(path) as ledger:
        for job_id in ("a", "b", "c"):
            ledger.sync(job_id, 1, "h")
        attempt = ledger.start_attempt("a", 0, {"budget_gb": 1.0}, 5 * GiB, 5120)
        ledger.finish("a", attempt, worker="w0", node_id="n", device="cpu", measured_peak_bytes=10, started_at=1.0,
                      finished_at=2.0, output="out/a")
        ledger.start_attempt("b", 0, {}, GiB, 1024)                 # the driver dies here
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with Ledger(path) as ledger:
        assert ledger.recover() == ["b"]
        assert ledger.sync("a", 1, "h").state == "done"            # kept, not queued again
        assert ledger.get("b").state == "queued" and ledger.get("b").attempts == 1
        assert ledger.attempts("b")[0]["result"] == "driver lost"
        changed = ledger.sync("a", 1, "other")
        assert changed.state == "done" and "different workflow" in changed.error
        assert ledger.counts() == {"queued": 2, "running": 0, "done": 1, "failed": 0, "refused": 0}
        assert ledger.get("a").seconds == 1.0
        assert [a["result"] for a in ledger.attempts("a")] == ["done"]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_cluster_that_does_not_answer_is_a_clear_error(tmp_path):
    """A closed port is refused by a TCP check before Ray is asked (the subprocess timeout bounds it)."""
    pytest.importorskip("ray")
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("")
    address = f"ray://127.0.0.1:{_closed_port()}"
    done = subprocess.run([sys.executable, "-m", "h3director", "farm", "run", str(jobs), "--address", address,
                           "--comfyui", str(tmp_path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert f"Ray cluster at {address} does not answer" in done.stderr


def test_status_without_a_ledger_says_how_to_make_one(tmp_path):
    done = subprocess.run([sys.executable, "-m", "h3director", "farm", "status", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "no farm ledger" in done.stderr


def test_no_comfyui_folder_is_refused_before_ray_starts(tmp_path):
    pytest.importorskip("ray")
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("")
    done = subprocess.run([sys.executable, "-m", "h3director", "farm", "run", str(jobs), "--comfyui", str(tmp_path),
                           "--workers", "w0=1GB", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "has no main.py" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_server_that_does_not_start_is_a_clear_error(tmp_path):
    """A real local Ray whose worker's "ComfyUI" exits at once: the farm says so, with the server's log."""
    pytest.importorskip("ray")
    comfy = tmp_path / "comfy"
    comfy.mkdir()
    (comfy / "main.py").write_text("import sys\nprint('no models here')\nsys.exit(3)\n")
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("")
    done = subprocess.run([sys.executable, "-m", "h3director", "farm", "run", str(jobs), "--comfyui", str(comfy),
                           "--workers", "w0=1GB", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "a farm worker did not start" in done.stderr and "exited with code 3" in done.stderr
    assert "no models here" in done.stderr


def test_ray_client_without_its_package_says_what_to_install(tmp_path):
    """Ray Client's package (grpc) hidden from a fresh Python (`sys.modules["grpc"] = None` makes it
    unimportable, as on a machine with plain `ray`)."""
    pytest.importorskip("ray")
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("")
    with socket.socket() as listener:                     # something answers the TCP check
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = f"ray://127.0.0.1:{listener.getsockname()[1]}"
        argv = ["farm", "run", str(jobs), "--address", address, "--comfyui", str(tmp_path), "--out", str(tmp_path / "out")]
        hidden = f"import sys; sys.modules['grpc'] = None; from h3director.cli import main; sys.exit(main({argv!r}))"
        done = subprocess.run([sys.executable, "-c", hidden], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "pip install 'h3director[farm]'" in done.stderr, done.stderr


def test_a_decode_without_a_budget_input_has_only_the_stock_rung(folder):
    """A stock VAEDecode takes no `budget_gb`: a cheaper decode rung would change nothing in the workflow
    and only reserve less device memory than the decode needs (and an OOM retry would run it unchanged)."""
    stock = {"1": WORKFLOW["1"], "2": WORKFLOW["2"],
             "4": {"class_type": "VAEDecode", "inputs": {"samples": ["1", 0], "vae": ["2", 0]}}}
    (folder / "stock.json").write_text(json.dumps(stock))
    jobs, _ = parse_jobs(_lines({"id": "a", "workflow": "stock.json", "width": 512, "height": 512}), folder)
    rungs = needs.ladder(jobs[0])
    assert [r.settings["decode"] for r in rungs] == ["reference"]
    small = needs.WorkerSpec("small", rungs[0].device_bytes - MiB, 64 * GiB)
    with pytest.raises(BudgetError, match="no worker fits this job"):
        needs.first_rung(rungs, [small])


def test_a_second_driver_on_the_same_ledger_is_refused(tmp_path):
    """Two `farm run` on one --out: the second's `recover` would queue the first's running jobs again
    (and run them twice); it is refused while the first holds the ledger."""
    path = tmp_path / "farm.sqlite"
    with Ledger(path) as first, Ledger(path) as second:
        first.claim()
        first.sync("a", 1, "h")
        first.start_attempt("a", 0, {}, GiB, 1024)
        with pytest.raises(InvalidInputError, match="another farm run"):
            second.claim()
        assert first.get("a").state == "running"
    with Ledger(path) as third:                      # the first driver is gone: the ledger is free again
        third.claim()
        assert third.recover() == ["a"]


def test_local_workers_without_a_host_size_share_this_machines_ram():
    """The simulated devices of a local farm are on one machine: their default host RAM is one pool
    split between them (each claiming all of it let their jobs' host needs add up to a multiple of it)."""
    workers = needs.parse_workers("a=1GB,b=1GB:2GB,c=1GB", 8 * GiB)
    assert [(w.name, w.host_bytes) for w in workers] == [("a", 4 * GiB), ("b", 2 * GiB), ("c", 4 * GiB)]


def test_the_streaming_decode_gets_the_rungs_budget_when_its_optional_input_is_left_out(folder):
    """An API export may leave out H3DirectorDecodeAVStreaming's optional `budget_gb` (as
    examples/h3_decode_latent_streaming_api.json does): the node takes it, so the decode rungs apply."""
    inputs = {k: v for k, v in WORKFLOW["4"]["inputs"].items() if k != "budget_gb"}
    (folder / "nobudget.json").write_text(json.dumps({**WORKFLOW, "4": {**WORKFLOW["4"], "inputs": inputs}}))
    jobs, _ = parse_jobs(_lines({"id": "a", "workflow": "nobudget.json", "width": 512, "height": 512}), folder)
    rungs = needs.ladder(jobs[0])
    assert len(rungs) >= 2
    assert needs.apply_rung(rungs[1], jobs[0].workflow)["4"]["inputs"]["budget_gb"] == rungs[1].settings["budget_gb"]


# ------------------------------------------------------------------------- pricing what the workflow loads

def _t2v(**changes) -> dict:
    """The repository's text-to-video example workflow with nodes replaced or added (`changes`)."""
    from pathlib import Path

    workflow = json.loads((Path(__file__).resolve().parents[1] / "examples" / "h3_t2v_streaming_api.json").read_text())
    workflow.update(changes)
    return workflow


GGUF_Q4K = {"1": {"class_type": "H3DirectorGGUFDiTLoader",
                  "inputs": {"gguf_name": "minimax_h3_dit_Q4_K.gguf", "weight_dtype": "default"}},
            "20": {"class_type": "H3DirectorDiTMemory",
                   "inputs": {"model": ["1", 0], "mode": "auto", "head_chunks": 1, "ffn_chunks": 1, "budget_gb": 0.0}},
            "21": {"class_type": "H3DirectorBlockSwap", "inputs": {"model": ["20", 0], "blocks_offloaded": 0}}}


def _job(folder, workflow: dict, **line):
    (folder / "job.json").write_text(json.dumps(workflow))
    jobs, errors = parse_jobs(_lines({"id": "a", "workflow": "job.json", **line}), folder)
    assert not errors, errors
    return jobs[0]


def test_a_q4k_gguf_job_is_placed_on_a_24gb_worker_where_the_planner_says_it_fits(folder):
    from h3director.plan.estimate import PlanRequest
    from h3director.plan.recommend import Budget, recommend

    clip = {"class_type": "CLIPLoader", "inputs": {"clip_name": "minimax_h3_qwen3vl_32b_fp8_scaled.safetensors",
                                                   "type": "minimax", "device": "default"}}
    job = _job(folder, _t2v(**GGUF_Q4K, **{"2": clip}))
    settings = needs.read_settings(job.workflow)
    assert (settings.weights, settings.text_encoder_weights, settings.swap_node) == ("q4_k", "fp8", True)
    rungs = needs.ladder(job)
    worker = needs.WorkerSpec("w24", 24 * GiB, 64 * GiB)
    first = rungs[needs.first_rung(rungs, [worker])]
    # the planner, for this card, the same format and the workflow's files, on the ComfyUI target
    advice = recommend(PlanRequest(1344, 768, 124, text_encoder_weights="fp8"), Budget(24 * GiB, 64 * GiB),
                       formats=["q4_k"])
    chosen = advice.request
    sampling = next(p for p in first.plan.phases if p.name == "sampling")
    assert sampling.detail.startswith("DiT q4_k")
    assert first.device_bytes <= worker.usable_accel_bytes and first.host_bytes <= worker.usable_host_bytes
    assert first.settings["blocks_offloaded"] == chosen.offload_blocks
    if not chosen.offload_blocks:     # resident: the least chunking that fits, as the planner chose it
        assert (first.settings["head_chunks"], first.settings["ffn_chunks"]) == (chosen.head_chunks, chosen.ffn_chunks)
    assert first.settings["text_encoder_device"] == "cpu" and chosen.text_encoder_device == "cpu"
    applied = needs.apply_rung(first, job.workflow)
    assert applied["21"]["inputs"]["blocks_offloaded"] == first.settings["blocks_offloaded"]
    assert applied["2"]["inputs"]["device"] == "cpu"
    assert applied["20"]["inputs"]["mode"] == "fixed"


def test_the_gguf_type_is_read_from_the_file_before_its_name(folder, tmp_path):
    """A GGUF found in the ComfyUI base's models folder is priced by its header (a real file written with gguf's
    own writer), whatever its name says; one not found is priced by its name."""
    import gguf
    import torch
    from gguf_helpers import write_gguf

    models = tmp_path / "base" / "models" / "diffusion_models"
    models.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    sd = {f"blocks.{i}.ffn.fc1.weight": torch.randn(256, 512, generator=generator) for i in range(2)}
    sd["blocks.0.norm.weight"] = torch.randn(512, generator=generator)
    write_gguf(models / "dit_q4_k.gguf", sd, gguf.GGMLQuantizationType.Q8_0)     # named Q4_K, holds Q8_0
    workflow = _t2v(**{**GGUF_Q4K, "1": {"class_type": "H3DirectorGGUFDiTLoader",
                                         "inputs": {"gguf_name": "dit_q4_k.gguf"}}})
    found = needs.read_settings(workflow, needs.comfy_model_dirs(tmp_path / "base"))
    assert found.weights == "q8_0" and found.weights_from.startswith("Q8_0 from the header of")
    assert needs.read_settings(workflow).weights == "q4_k"          # not found: its name


def test_a_comfy_quant_dit_is_priced_by_its_layers_before_its_name(folder, tmp_path):
    """A UNETLoader file found in the models folder is priced by its ComfyUI quantised layers (a real safetensors
    file with comfy_quant entries), whatever its name says; one not found by its name."""
    from comfy_quant_files import LAYERS, write_dit

    models = tmp_path / "base" / "models" / "diffusion_models"
    models.mkdir(parents=True)
    write_dit(models / "h3_int8_convrot.safetensors", {name: {"format": "nvfp4"} for name in LAYERS})
    workflow = _t2v(**{"1": {"class_type": "UNETLoader",
                             "inputs": {"unet_name": "h3_int8_convrot.safetensors", "weight_dtype": "default"}}})
    found = needs.read_settings(workflow, needs.comfy_model_dirs(tmp_path / "base"))
    assert found.weights == "nvfp4" and "nvfp4 layers read from" in found.weights_from
    assert needs.read_settings(workflow).weights == "int8_convrot"        # not found: its name


def test_a_stitch_only_job_is_priced_by_its_own_phase(folder):
    stitch = {"1": {"class_type": "LoadImage", "inputs": {"image": "a.png"}},
              "2": {"class_type": "H3DirectorStitch", "inputs": {
                  "images_a": ["1", 0], "audio_a": ["1", 1], "images_b": ["1", 0], "audio_b": ["1", 1],
                  "overlap": 22, "blend": "crossfade", "fps": 24.0}}}
    job = _job(folder, stitch, frames=226, width=1344, height=768)
    (rung,) = needs.ladder(job)
    assert rung.device_bytes == 0
    assert rung.host_bytes == (2 * 226 + 22) * 1344 * 768 * 3 * 4      # float32 inputs + result
    assert needs.first_rung([rung], [needs.WorkerSpec("w", 8 * GiB, 16 * GiB)]) == 0


def test_a_bf16_workflow_is_still_priced_as_bf16_and_refused_on_24gb(folder):
    job = _job(folder, _t2v())
    rungs = needs.ladder(job)
    assert all("DiT bf16" in next(p for p in r.plan.phases if p.name == "sampling").detail for r in rungs)
    with pytest.raises(BudgetError, match="no worker fits"):
        needs.first_rung(rungs, [needs.WorkerSpec("w24", 24 * GiB, 64 * GiB)])


def test_a_refused_sampling_job_says_what_the_missing_nodes_would_allow(folder):
    job = _job(folder, _t2v())
    worker = needs.WorkerSpec("w24", 24 * GiB, 64 * GiB)
    hint = needs.missing_nodes_hint(job, [worker])
    assert hint.startswith("with H3DirectorDiTMemory and H3DirectorBlockSwap in the workflow")
    offloaded = int(re.search(r"blocks_offloaded (\d+)", hint).group(1))
    # the same workflow with both nodes: its first fitting rung is the one the hint names
    with_nodes = _job(folder, _t2v(**{**GGUF_Q4K, "1": _t2v()["1"]}))          # the bf16 UNETLoader kept
    rungs = needs.ladder(with_nodes)
    assert rungs[needs.first_rung(rungs, [worker])].settings["blocks_offloaded"] == offloaded
    assert needs.missing_nodes_hint(with_nodes, [worker]) == ""


@pytest.mark.parametrize("change, message", [
    ({"21": {"class_type": "H3DirectorBlockSwap", "inputs": {"model": ["20", 0], "blocks_offloaded": 51}}},
     "blocks_offloaded must be 0 to the DiT's 50 blocks, got 51"),
    ({"1": {"class_type": "H3DirectorGGUFDiTLoader", "inputs": {"gguf_name": "dit.gguf"}}},
     "cannot tell the GGUF type of 'dit.gguf'"),
])
def test_what_cannot_be_priced_is_refused(folder, change, message):
    job = _job(folder, _t2v(**{**GGUF_Q4K, **change}))
    with pytest.raises(InvalidInputError, match=message):
        needs.ladder(job)


def test_dry_run_prints_rungs_need_and_placement_and_refuses_bad_lines(folder, capsys):
    """`farm run --dry-run` through the CLI: no Ray is imported, nothing is written under --out."""
    (folder / "gguf.json").write_text(json.dumps(_t2v(**GGUF_Q4K)))
    (folder / "jobs.jsonl").write_text(_lines(
        {"id": "q4k", "workflow": "gguf.json", "frames": 124},
        {"id": "offgrid", "workflow": "gguf.json", "frames": 130},
        '{"id": "broken"',
        {"id": "badswap", "workflow": "gguf.json", "set": {"21": {"blocks_offloaded": 99}}}))
    script = ("import sys; from h3director.cli import main; code = main(sys.argv[1:]); "
              "assert 'ray' not in sys.modules, 'ray was imported'; sys.exit(code)")
    out = folder / "out"
    done = subprocess.run([sys.executable, "-c", script, "farm", "run", str(folder / "jobs.jsonl"), "--dry-run",
                           "--workers", "w24=24GB:64GB", "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 1, done.stderr            # some lines refused
    text = done.stdout
    assert "job q4k (line 1)" in text and "loads: DiT q4_k (Q4_K from the file name)" in text
    assert re.search(r"-> rung \d+ \(.*blocks_offloaded \d+.*\): device [\d.]+ GiB", text)
    assert re.search(r"placement: rung \d+ \(device \d+ MiB, host \d+ MiB\) on w24", text)
    assert "[refused] line 2 (job offgrid): frames 130 is off H3's 17n+5 grid" in text
    assert "[refused] line 3: malformed JSON" in text
    assert "[refused] line 4 (job badswap): H3DirectorBlockSwap: blocks_offloaded must be 0 to" in text
    assert "1 job(s) would be placed, 3 refused; nothing ran" in text
    assert not out.exists()


def _listening_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


@pytest.mark.parametrize("failures, connected", [(2, True), (3, False)])
def test_ray_client_start_failures_are_retried_then_reported(monkeypatch, failures, connected):
    """Ray Client's server sometimes fails to start the per-client server: `connect` connects again, up to
    RAY_CLIENT_TRIES times, and then says how many it made. `ray.init` is replaced by a stand-in with its
    signature that raises what Ray Client raises then (ConnectionError); no cluster runs here."""
    pytest.importorskip("ray")
    import ray

    from h3director.farm import driver

    calls = []

    def init(address=None, **options):
        calls.append(address)
        if len(calls) <= failures:
            raise ConnectionError("ray client connection timeout")

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(driver, "RAY_CLIENT_TRIES", 3)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object())   # grpc present
    with _listening_port() as server:
        address = f"ray://127.0.0.1:{server.getsockname()[1]}"
        if connected:
            assert isinstance(driver.connect(address, []), driver.Session)
        else:
            with pytest.raises(driver.ClusterUnreachableError, match=r"after 3 connections"):
                driver.connect(address, [])
    assert calls == [address] * min(failures + 1, 3)
