"""The farm on a real local Ray cluster (one Ray node per simulated device, its capacity a custom
resource) with real ComfyUI workers (the vendored snapshot, tiny H3 VAEs, --cpu) and real decode jobs.

- 40 decode jobs (plus an out-of-memory job that succeeds on the cheaper rung, one that fails with
  the diagnosis, an unknown node class, a job no worker fits, a malformed line) over 2 workers: every good job is done
  once; the predicted MiB of the attempts that overlapped on a worker never exceed its capacity (from
  the ledger's intervals); a worker process killed mid-run loses no job;
- the driver (the CLI) killed mid-run and run again: no job lost, no finished job redone;
- `--address HOST:PORT` of a running cluster: workers only on the nodes that declare a device.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from comfy_harness.farm_base import farm_servers
from comfy_harness.server import free_port
from comfy_harness.vendored import real_comfyui_marks

pytest.importorskip("ray")
COMFYUI_DIR = os.environ.get("COMFYUI_DIR")
pytestmark = real_comfyui_marks()
REPO = Path(__file__).resolve().parents[1]
WORKERS = "w0=12GB:8GB,w1=6GB:8GB"     # a 128x128x22 decode job is priced 5.70 GiB: 2 + 1 at once
CAPACITY_MB = {"w0": 12 * 1024, "w1": 6 * 1024}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    from comfy_harness.farm_base import prepare_farm_base, write_decode_workflow

    folder = tmp_path_factory.mktemp("farm")
    prepare_farm_base(folder / "base")
    write_decode_workflow(folder / "decode.json")
    return folder


# Ray gives its workers OMP_NUM_THREADS=1 unless the driver's environment sets it (tests/conftest.py sets 2):
# two servers with two threads each on a shared 2-core machine run several times slower.
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def _cli(folder: Path, jobs: Path, out: Path, workers: str) -> list[str]:
    return [sys.executable, "-m", "h3director", "farm", "run", str(jobs), "--out", str(out), "--workers", workers,
            "--comfyui", COMFYUI_DIR, "--comfy-python", os.environ.get("COMFYUI_PYTHON", sys.executable),
            "--comfy-base", str(folder / "base"), "--cpu"]


def _oom_limits(folder: Path) -> tuple[float, float]:
    """(between rung 0 and rung 1, below both) for a job priced at 512x512 (two decode rungs)."""
    from h3director.farm import needs
    from h3director.farm.jobs import read_jobs

    probe = folder / "probe.jsonl"
    probe.write_text(json.dumps({"id": "p", "workflow": "decode.json", "width": 512, "height": 512}))
    rungs = needs.ladder(read_jobs(probe)[0][0])
    first, second = rungs[0].settings["budget_gb"], rungs[1].settings["budget_gb"]
    return (first + second) / 2, second / 2


def _oom_job(job_id: str, limit_gb: float) -> dict:
    # priced at 512x512 (two rungs); the latent stays 128x128 so the CPU run is short
    return {"id": job_id, "workflow": "decode.json", "width": 512, "height": 512,
            "set": {"1": {"width": 128, "height": 128}, "5": {"limit_gb": limit_gb}}}


def _wait_for_done(ledger: Path, count: int, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with sqlite3.connect(ledger, timeout=30) as db:
                if db.execute("SELECT COUNT(*) FROM jobs WHERE state='done'").fetchone()[0] >= count:
                    return
        except sqlite3.OperationalError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"fewer than {count} jobs done within {timeout_s} s")


def _server_processes() -> list[psutil.Process]:
    return farm_servers(COMFYUI_DIR)


def _kill_one_worker_when(ledger: Path, done: int, killed: list[int]) -> None:
    _wait_for_done(ledger, done)
    # w0 fits two jobs at once: while it works, a second job waits on it, so one is always in flight
    server = next(p for p in _server_processes() if any("h3farm-w0-" in part for part in p.info["cmdline"]))
    worker = psutil.Process(server.ppid())   # the Ray actor process that started this server
    killed.append(worker.pid)
    worker.send_signal(signal.SIGKILL)


def _overlap_peaks(attempts: list[dict]) -> dict[str, int]:
    """Per worker, the largest sum of predicted MiB over attempts running at one instant."""
    peaks: dict[str, int] = {}
    for worker in {a["worker"] for a in attempts}:
        events = []
        for a in attempts:
            if a["worker"] == worker:
                events += [(a["started_at"], 1, a["predicted_mb"]), (a["ended_at"], 0, -a["predicted_mb"])]
        level = peak = 0
        for _, _, delta in sorted(events):   # ends sort before starts at the same instant
            level += delta
            peak = max(peak, level)
        peaks[worker] = peak
    return peaks


def test_forty_jobs_over_two_workers_with_a_worker_killed_and_oom_retries(base, tmp_path):
    from comfy_harness.farm_base import DECODE_WORKFLOW

    from h3director.farm.ledger import Ledger

    between, below = _oom_limits(base)
    lines = [json.dumps({"id": f"job{i:02d}", "workflow": "decode.json"}) for i in range(40)]
    lines += [json.dumps(_oom_job("oom-retried", between)), json.dumps(_oom_job("oom-fails", below)),
              "{this is not json", json.dumps({"id": "unknown-node", "workflow": "unknown.json"}),
              json.dumps({"id": "too-big", "workflow": "sample.json"})]
    # sampling H3 (priced with the DiT: tens of GiB) fits neither device: refused before anything runs
    (base / "sample.json").write_text(json.dumps({**DECODE_WORKFLOW, "9": {"class_type": "KSampler", "inputs": {
        "latent_image": ["1", 0], "seed": 1, "steps": 1}}}))
    (base / "unknown.json").write_text(json.dumps({"1": {"class_type": "NoSuchNode", "inputs": {"width": 128}}}))
    jobs = base / "forty.jsonl"
    jobs.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out"
    killed: list[int] = []
    killer = threading.Thread(target=_kill_one_worker_when, args=(out / "farm.sqlite", 8, killed), daemon=True)
    killer.start()
    done = subprocess.run(_cli(base, jobs, out, WORKERS), capture_output=True, text=True, timeout=600, cwd=base, env=ENV)
    killer.join(timeout=5)
    print(done.stdout)
    assert killed, "the worker was not killed"
    assert done.returncode == 1, done.stdout[-4000:] + done.stderr[-4000:]      # 1: some jobs failed/refused
    with Ledger(out / "farm.sqlite") as ledger:
        rows = {row.id: row for row in ledger.rows()}
        attempts = ledger.attempts()
    good = [f"job{i:02d}" for i in range(40)]
    assert all(rows[j].state == "done" for j in good), {j: rows[j].state for j in good if rows[j].state != "done"}
    for job_id in good:                                        # finished once, output written once
        results = [a["result"] for a in attempts if a["job_id"] == job_id]
        assert results.count("done") == 1 and set(results) <= {"done", "worker lost"}, (job_id, results)
        assert [p.name for p in (out / job_id).iterdir()] == ["decode_00001_.mp4"]
    assert any(a["result"] == "worker lost" for a in attempts), "no job was in flight on the killed worker"
    assert len({a["worker"] for a in attempts if a["result"] == "done"}) == 2
    finished = [a for a in attempts if a["started_at"] is not None and a["ended_at"] is not None]
    peaks = _overlap_peaks(finished)
    for worker, peak in peaks.items():
        assert peak <= CAPACITY_MB[worker], (worker, peak)
    assert peaks["w0"] > CAPACITY_MB["w1"], "w0 never held two jobs at once: the capacity check saw no overlap"
    retried = [a for a in attempts if a["job_id"] == "oom-retried"]
    assert [(a["rung"], a["result"]) for a in retried] == [(0, "oom"), (1, "done")]
    assert rows["oom-retried"].state == "done" and rows["oom-retried"].rung == 1
    fails = rows["oom-fails"]
    assert fails.state == "failed" and "out of memory again on the cheaper setting" in fails.error
    assert "Tried to allocate" in fails.error and "GPU 0" in fails.error       # the `h3director oom` diagnosis
    assert rows["unknown-node"].state == "refused" and "NoSuchNode" in rows["unknown-node"].error
    too_big = rows["too-big"]
    assert too_big.state == "refused" and too_big.attempts == 0
    assert "no worker fits this job" in too_big.error and "worker w0: device 12.00 GiB" in too_big.error
    assert "malformed JSON" in done.stdout
    time.sleep(3)
    assert not _server_processes(), "a ComfyUI server outlived the farm"


def test_the_driver_killed_mid_run_resumes_without_redoing_finished_jobs(base, tmp_path):
    from h3director.farm.ledger import Ledger

    jobs = base / "twelve.jsonl"
    jobs.write_text("".join(json.dumps({"id": f"d{i:02d}", "workflow": "decode.json"}) + "\n" for i in range(10)))
    out = tmp_path / "out"
    driver = subprocess.Popen(_cli(base, jobs, out, "w0=12GB:8GB,w1=6GB:8GB"), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, cwd=base, env=ENV)
    try:
        _wait_for_done(out / "farm.sqlite", 3)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    with Ledger(out / "farm.sqlite") as ledger:
        before = {row.id: row for row in ledger.rows() if row.state == "done"}
    stamps = {job_id: (out / job_id / "decode_00001_.mp4").stat().st_mtime_ns for job_id in before}
    deadline = time.monotonic() + 60
    while _server_processes() and time.monotonic() < deadline:   # the killed driver's Ray and servers go
        time.sleep(0.5)
    assert not _server_processes()
    again = subprocess.run(_cli(base, jobs, out, "w0=12GB:8GB,w1=6GB:8GB"), capture_output=True, text=True,
                           timeout=600, cwd=base, env=ENV)
    assert again.returncode == 0, again.stdout[-4000:] + again.stderr[-4000:]
    with Ledger(out / "farm.sqlite") as ledger:
        rows = {row.id: row for row in ledger.rows()}
        attempts = ledger.attempts()
    assert all(row.state == "done" for row in rows.values()) and len(rows) == 10
    for job_id, row in before.items():                         # finished before the kill: not run again
        assert rows[job_id].finished_at == row.finished_at and rows[job_id].attempts == row.attempts
        assert (out / job_id / "decode_00001_.mp4").stat().st_mtime_ns == stamps[job_id]
        assert [a["result"] for a in attempts if a["job_id"] == job_id] == ["done"]
    for job_id in rows:
        assert [a["result"] for a in attempts if a["job_id"] == job_id].count("done") == 1
    assert "resuming" in again.stdout or len(before) == 10


@pytest.mark.parametrize("through", [
    "gcs",
    # Known flake, not ours to hide: on the 2-core build machine Ray's Client server sometimes fails to start its
    # per-client server (2 of 4 full runs on 2026-12-01: a gRPC channel timeout, then that process a zombie at
    # start). The farm now connects again (driver.RAY_CLIENT_TRIES; tests/test_farm_units.py checks the retry);
    # whether that is enough under load is not yet shown by enough loaded runs, so this stays reported, not strict.
    pytest.param("ray client", marks=pytest.mark.xfail(
        reason="Ray Client's per-client server sometimes fails to start on this machine", strict=False)),
])
def test_a_cluster_address_finds_the_declared_devices(base, tmp_path, through):
    """`--address HOST:PORT` (the GCS of a running cluster) or `ray://HOST:PORT` (its Ray Client server): the
    farm starts one worker per node that declares the device resources, names it by node, and runs the jobs
    there."""
    from ray.cluster_utils import Cluster

    from h3director.farm.ledger import Ledger

    head = {"num_cpus": 0, "object_store_memory": 100 * 2**20}
    if through == "ray client":
        head["ray_client_server_port"] = free_port()
    cluster = Cluster(initialize_head=True, head_node_args=head)
    address = f"ray://127.0.0.1:{head['ray_client_server_port']}" if through == "ray client" else cluster.address
    try:
        cluster.add_node(num_cpus=1, object_store_memory=100 * 2**20,
                         resources={"h3_accel_mb": 12288, "h3_host_mb": 8192})
        cluster.add_node(num_cpus=1, object_store_memory=100 * 2**20)        # declares no device: no worker
        jobs = base / "three.jsonl"
        jobs.write_text("".join(json.dumps({"id": f"c{i}", "workflow": "decode.json"}) + "\n" for i in range(3)))
        out = tmp_path / "out"
        command = _cli(base, jobs, out, "unused")
        command[command.index("--workers"):command.index("--workers") + 2] = ["--address", address]
        # The environment as it is now, not ENV's copy from import time: the cluster above follows this
        # process's Ray auth mode, which an earlier in-process ray.init may have set (RAY_AUTH_MODE=token).
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=base,
                              env=dict(os.environ, OMP_NUM_THREADS="1"))
    finally:
        cluster.shutdown()
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    with Ledger(out / "farm.sqlite") as ledger:
        rows = ledger.rows()
    assert [row.state for row in rows] == ["done"] * 3
    assert len({row.worker for row in rows}) == 1
    assert re.fullmatch(r"[0-9.]+-[0-9a-f]{6}", rows[0].worker), rows[0].worker       # "<node ip>-<node id>"
