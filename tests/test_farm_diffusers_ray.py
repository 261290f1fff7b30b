"""Diffusers jobs on the farm through a real local Ray (one simulated device) and the CLI: one JSONL file
mixing ComfyUI decode jobs (the vendored ComfyUI, tiny H3 VAEs) and diffusers jobs (a tiny random-init H3
pipeline saved with save_pretrained to a folder): every job is done, the diffusers outputs are MP4s of
the job's frame count with a measured peak in the ledger, a bad spec is refused on its line; a second run
over the same --out redoes nothing. A file of diffusers jobs only runs without --comfyui (no server), and a worker process killed (SIGKILL) while it
runs a diffusers job loses no job and finishes none twice."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pytest
from comfy_harness.farm_base import farm_servers
from comfy_harness.vendored import why_unavailable

pytest.importorskip("ray")
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = pytest.mark.slow
WORKERS = "w0=128GB:8GB"     # a 32x32x124 diffusers job is priced 61.89 GiB (H3's released DiT): two at once
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _cli(folder, jobs, out):
    return [sys.executable, "-m", "h3director", "farm", "run", str(jobs), "--out", str(out), "--workers", WORKERS,
            "--comfyui", COMFYUI_DIR, "--comfy-python", os.environ.get("COMFYUI_PYTHON", sys.executable),
            "--comfy-base", str(folder / "base"), "--cpu"]


@pytest.mark.comfyui
@pytest.mark.skipif(not COMFYUI_DIR, reason=why_unavailable())
def test_diffusers_and_comfyui_jobs_in_one_file_and_a_rerun_redoes_nothing(tmp_path):
    import av
    from comfy_harness.farm_base import prepare_farm_base, write_decode_workflow
    from comfy_harness.farm_diffusers import write_embeds, write_tiny_pipeline

    from h3director.farm.ledger import Ledger

    prepare_farm_base(tmp_path / "base")
    write_decode_workflow(tmp_path / "decode.json")
    write_tiny_pipeline(tmp_path / "pipe")
    write_embeds(tmp_path / "embeds.safetensors")
    spec = {"pipeline": "pipe", "prompt_embeds": "embeds.safetensors", "steps": 2}
    diffusers = [f"gen{seed}" for seed in range(3)]
    lines = [{"id": job_id, "diffusers": spec, "seed": seed, "frames": 124, "width": 32, "height": 32}
             for seed, job_id in enumerate(diffusers)]
    lines += [{"id": f"dec{i}", "workflow": "decode.json"} for i in range(2)]
    lines += [{"id": "bad-spec", "diffusers": {**spec, "dtype": "float8"}, "frames": 124, "width": 32, "height": 32}]
    jobs = tmp_path / "mixed.jsonl"
    jobs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"

    first = subprocess.run(_cli(tmp_path, jobs, out), capture_output=True, text=True, timeout=300, cwd=tmp_path,
                           env=ENV)
    print(first.stdout)
    assert first.returncode == 1, first.stdout[-4000:] + first.stderr[-4000:]     # 1: the bad spec was refused
    assert "diffusers 'dtype' must be one of" in first.stdout
    with Ledger(out / "farm.sqlite") as ledger:
        rows = {row.id: row for row in ledger.rows()}
        attempts = ledger.attempts()
    assert all(rows[j].state == "done" for j in diffusers + ["dec0", "dec1"]), {j: r.state for j, r in rows.items()}
    assert rows["bad-spec"].state == "refused"
    videos = {}
    for job_id in diffusers:
        assert [p.name for p in (out / job_id).iterdir()] == [f"{job_id}.mp4"]
        assert rows[job_id].measured_peak_bytes > 0 and rows[job_id].worker == "w0"
        with av.open(str(out / job_id / f"{job_id}.mp4")) as container:
            stream = container.streams.video[0]
            assert (sum(1 for _ in container.decode(stream)), stream.width, stream.height) == (124, 32, 32)
        videos[job_id] = (out / job_id / f"{job_id}.mp4").read_bytes()
    assert len(set(videos.values())) == 3                      # the seed reached the sampler
    for job_id in ("dec0", "dec1"):
        assert [p.name for p in (out / job_id).iterdir()] == ["decode_00001_.mp4"]
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("*/*.mp4")}

    again = subprocess.run(_cli(tmp_path, jobs, out), capture_output=True, text=True, timeout=300, cwd=tmp_path,
                           env=ENV)
    assert again.returncode == 1, again.stdout[-4000:] + again.stderr[-4000:]
    with Ledger(out / "farm.sqlite") as ledger:
        assert ledger.attempts() == attempts                    # no job started again
        assert {row.id: row.state for row in ledger.rows()} == {j: r.state for j, r in rows.items()}
    assert {p: p.stat().st_mtime_ns for p in out.glob("*/*.mp4")} == stamps


def _lost_attempts(ledger) -> int:
    try:
        with sqlite3.connect(ledger, timeout=30) as db:
            return db.execute("SELECT COUNT(*) FROM attempts WHERE result='worker lost'").fetchone()[0]
    except sqlite3.OperationalError:        # the driver has not created the tables yet
        return 0


def _done_jobs(ledger) -> int:
    try:
        with sqlite3.connect(ledger, timeout=30) as db:
            return db.execute("SELECT COUNT(*) FROM jobs WHERE state='done'").fetchone()[0]
    except sqlite3.OperationalError:
        return 0


def _kill_the_worker_in_a_diffusers_job(cli_pid: int, ledger, done: int, killed: list[int]) -> None:
    """SIGKILL the farm worker while it runs a diffusers job, once `done` jobs are done.

    Only processes this test started are candidates: descendants of the CLI process it launched (the local Ray
    cluster and its actors are that process's children). Ray titles an actor's process with the method it runs;
    a title can lag the task's end under load, so a kill that lands between jobs is noticed (the ledger records
    no 'worker lost' attempt) and the next running job's worker is killed instead, up to three times."""
    import psutil

    deadline = time.monotonic() + 240
    cli = psutil.Process(cli_pid)
    while time.monotonic() < deadline and _done_jobs(ledger) < done:
        time.sleep(0.2)
    while time.monotonic() < deadline and len(killed) < 3:
        try:
            workers = [p for p in cli.children(recursive=True)
                       if "ray::FarmWorker.run_diffusers" in " ".join(p.cmdline())]
        except psutil.Error:                 # the CLI ended, or a child exited while being read
            return
        if not workers:
            time.sleep(0.05)
            continue
        killed.append(workers[0].pid)
        workers[0].send_signal(signal.SIGKILL)
        settle = time.monotonic() + 30
        while time.monotonic() < settle and _lost_attempts(ledger) == 0:
            time.sleep(0.2)
        if _lost_attempts(ledger):
            return


def test_diffusers_jobs_alone_need_no_comfyui_and_survive_a_killed_worker(tmp_path):
    from comfy_harness.farm_diffusers import write_embeds, write_tiny_pipeline

    from h3director.farm.ledger import Ledger

    write_tiny_pipeline(tmp_path / "pipe")
    write_embeds(tmp_path / "embeds.safetensors")
    spec = {"pipeline": "pipe", "prompt_embeds": "embeds.safetensors", "steps": 20}
    lines = [{"id": f"g{i}", "diffusers": spec, "seed": i, "frames": 345, "width": 128, "height": 128}
             for i in range(6)]
    lines.append({"id": "bf16", "diffusers": {**spec, "steps": 2, "dtype": "bfloat16"}, "frames": 124, "width": 32,
                  "height": 32})
    jobs = tmp_path / "gen.jsonl"
    jobs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "out"
    killed: list[int] = []
    env = {k: v for k, v in ENV.items() if k != "H3_FARM_COMFYUI"}
    cli = subprocess.Popen([sys.executable, "-m", "h3director", "farm", "run", str(jobs), "--out", str(out),
                            "--workers", WORKERS, "--cpu"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           cwd=tmp_path, env=env)
    killer = threading.Thread(target=_kill_the_worker_in_a_diffusers_job,
                              args=(cli.pid, out / "farm.sqlite", 2, killed), daemon=True)
    killer.start()
    try:
        stdout, stderr = cli.communicate(timeout=300)
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.communicate()
    killer.join(timeout=5)
    assert cli.returncode == 0, stdout[-4000:] + stderr[-4000:]
    assert killed, "no diffusers job was seen running"
    with Ledger(out / "farm.sqlite") as ledger:
        rows = ledger.rows()
        attempts = ledger.attempts()
    assert {(r.id, r.state, r.device) for r in rows} == {(line["id"], "done", "cpu") for line in lines}
    for row in rows:                                          # finished once, one file each
        results = [a["result"] for a in attempts if a["job_id"] == row.id]
        assert results.count("done") == 1 and set(results) <= {"done", "worker lost"}, (row.id, results)
        assert [p.name for p in (out / row.id).iterdir()] == [f"{row.id}.mp4"]
    assert any(a["result"] == "worker lost" for a in attempts), "the killed worker had no job in flight"
    assert not farm_servers(COMFYUI_DIR)        # no ComfyUI started (H3_FARM_COMFYUI was taken out of its env)
