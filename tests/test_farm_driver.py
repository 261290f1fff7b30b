"""The farm driver's handling of one job's result (`Farm.handle`) against a real in-process Ray (one CPU,
no device nodes: the resubmitted job tasks stay pending, which is all these checks need), with the real
ledger and display. The results come from real Ray tasks: one that raises (a lost worker, as the driver
sees it) and one that returns a worker's "done" result."""

from __future__ import annotations

import io
import json

import pytest

ray = pytest.importorskip("ray")
rich_console = pytest.importorskip("rich.console")

from h3director.farm import needs  # noqa: E402
from h3director.farm.driver import MAX_ATTEMPTS, Farm, Session, _Running  # noqa: E402
from h3director.farm.jobs import parse_jobs  # noqa: E402
from h3director.farm.ledger import Ledger  # noqa: E402
from h3director.farm.progress import Display  # noqa: E402

WORKFLOW = {
    "1": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": 128, "height": 128, "length": 22}},
    "2": {"class_type": "VAELoader", "inputs": {"vae_name": "v.safetensors"}},
    "4": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
        "samples": ["1", 0], "vae": ["2", 0], "filename_prefix": "video/x", "budget_gb": 0.0}},
}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@ray.remote(num_cpus=0, max_retries=0)
def _lost() -> dict:
    raise RuntimeError("the worker's process died")


@ray.remote(num_cpus=0, max_retries=0)
def _done() -> dict:
    return {"status": "done", "files": {"h3farm/x/x_00001_.mp4": b"video"}, "peak_bytes": 1, "worker": "w0",
            "device": "cpu", "node_id": "n", "held_from": 1.0, "held_to": 2.0, "seconds": 1.0, "error": None}


def _farm(tmp_path, ledger: Ledger) -> Farm:
    console = rich_console.Console(file=io.StringIO(), force_terminal=False)
    return Farm(Session(), ledger, tmp_path / "out", Display(console, ledger))


def _item(tmp_path, job_id: str, ledger: Ledger) -> _Running:
    (tmp_path / "wf.json").write_text(json.dumps(WORKFLOW))
    jobs, errors = parse_jobs(json.dumps({"id": job_id, "workflow": "wf.json"}), tmp_path)
    assert not errors
    ledger.sync(job_id, 1, jobs[0].spec_hash)
    return _Running(jobs[0], needs.ladder(jobs[0]), 0, 0)


def _lose(farm: Farm, item: _Running) -> None:
    """The job's pending task is replaced by one whose worker is lost; the driver handles it."""
    for ref in list(farm.pending):
        ray.cancel(ref, force=True)
    farm.pending.clear()
    ref = _lost.remote()
    farm.pending[ref] = item
    farm.handle(ref)


def test_a_job_rerun_after_an_earlier_failure_still_gets_its_worker_loss_retries(tmp_path, local_ray):
    """A job that failed in an earlier run (its attempts used up there) is queued again by this run; a
    worker lost under it now is its first loss in this run: it is queued again, not failed at once, and
    fails after MAX_ATTEMPTS tries in this run."""
    with Ledger(tmp_path / "farm.sqlite") as ledger:
        item = _item(tmp_path, "a", ledger)
        for _ in range(MAX_ATTEMPTS):                        # an earlier run: every attempt lost, then failed
            ledger.start_attempt("a", 0, {}, 1, 1)
        ledger.fail("a", f"worker lost: RayTaskError, {MAX_ATTEMPTS} attempts")
        ledger.sync("a", 1, item.job.spec_hash)              # this run queues it again
        farm = _farm(tmp_path, ledger)
        farm.submit(item)                                    # pending forever: no node declares the device
        states = []
        for _ in range(MAX_ATTEMPTS):
            _lose(farm, item)
            states.append(ledger.get("a").state)
        assert states == ["running"] * (MAX_ATTEMPTS - 1) + ["failed"], states
        assert f"{MAX_ATTEMPTS} attempts" in ledger.get("a").error
        assert not farm.pending


def test_outputs_that_cannot_be_written_fail_that_job_and_the_run_goes_on(tmp_path, local_ray):
    """A job whose output folder cannot be made (here its id names the ledger file) fails with the
    reason; the driver does not raise (its other jobs would be left running)."""
    with Ledger(tmp_path / "out" / "farm.sqlite") as ledger:
        item = _item(tmp_path, "farm.sqlite", ledger)
        farm = _farm(tmp_path, ledger)
        item.attempt = ledger.start_attempt("farm.sqlite", 0, {}, 1, 1)
        ref = _done.remote()
        farm.pending[ref] = item
        farm.handle(ref)
        row = ledger.get("farm.sqlite")
        assert row.state == "failed" and "cannot write the outputs" in row.error
        assert (tmp_path / "out" / "farm.sqlite").is_file()


_OTHER_DRIVER = """
import json, sys
import ray
from h3director.farm.worker import ServerConfig, worker_actor
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
actor = worker_actor(sys.argv[2], "w0", ServerConfig(python=sys.executable, comfyui_dir="", base_dir=""))
print(json.dumps(ray.get(actor.ready.remote())))
"""


def test_two_drivers_on_one_cluster_get_their_own_workers(tmp_path, local_ray):
    """Another farm run on the same cluster (another user, another --out) starts its own worker on the
    node instead of getting this run's (with this run's settings, and owned by this driver: killed when
    this run ends, under the other run's jobs)."""
    import subprocess
    import sys

    from h3director.farm.worker import ServerConfig, worker_actor

    node_id = ray.get_runtime_context().get_node_id()
    actor = worker_actor(node_id, "w0", ServerConfig(python=sys.executable, comfyui_dir="", base_dir=""))
    ours = ray.get(actor.ready.remote())
    address = ray.get_runtime_context().gcs_address
    done = subprocess.run([sys.executable, "-c", _OTHER_DRIVER, address, node_id], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs["node_id"] == ours["node_id"] and theirs["pid"] != ours["pid"]
    assert ray.get(actor.ready.remote())["pid"] == ours["pid"]          # ours lives on


def test_a_job_id_that_names_the_ledger_is_refused_before_it_runs(tmp_path, local_ray):
    """OUT/<job id>/ would be the ledger file (or its WAL, lock): refused up front, not after the render."""
    (tmp_path / "wf.json").write_text(json.dumps(WORKFLOW))
    text = "\n".join(json.dumps({"id": job_id, "workflow": "wf.json"})
                     for job_id in ("farm.sqlite", "farm.sqlite-wal", "farm.sqlite.lock", "farm.sqlite2", "fine"))
    jobs, errors = parse_jobs(text, tmp_path)
    assert not errors
    with Ledger(tmp_path / "out" / "farm.sqlite") as ledger:
        farm = _farm(tmp_path, ledger)
        farm.session.workers["w0"] = (needs.WorkerSpec("w0", 64 * 2**30, 64 * 2**30), None, None)
        runnable = farm.prepare(jobs, {node["class_type"] for node in WORKFLOW.values()})
        assert [item.job.id for item in runnable] == ["farm.sqlite2", "fine"]
        for job_id in ("farm.sqlite", "farm.sqlite-wal", "farm.sqlite.lock"):
            row = ledger.get(job_id)
            assert row.state == "refused" and "the ledger's name" in row.error


def test_a_job_a_dead_driver_moved_down_a_rung_resumes_on_that_rung(tmp_path, local_ray):
    """The dead driver's run had an OOM on rung 0 and was running the job on rung 1: the next run resumes
    on rung 1 (its one OOM retry spent), instead of running rung 0 into the same OOM again."""
    (tmp_path / "wf.json").write_text(json.dumps(WORKFLOW))
    jobs, _ = parse_jobs(json.dumps({"id": "a", "workflow": "wf.json", "width": 512, "height": 512}), tmp_path)
    rungs = needs.ladder(jobs[0])
    assert len(rungs) >= 2
    with Ledger(tmp_path / "farm.sqlite") as ledger:
        ledger.sync("a", 1, jobs[0].spec_hash)
        first = ledger.start_attempt("a", 0, rungs[0].settings, rungs[0].device_bytes, rungs[0].device_mb)
        ledger.end_attempt("a", first, "oom", error="CUDA out of memory")
        ledger.start_attempt("a", 1, rungs[1].settings, rungs[1].device_bytes, rungs[1].device_mb)
    with Ledger(tmp_path / "farm.sqlite") as ledger:                 # the next run
        assert ledger.recover() == ["a"]
        farm = _farm(tmp_path, ledger)
        farm.session.workers["w0"] = (needs.WorkerSpec("w0", 64 * 2**30, 64 * 2**30), None, None)
        [item] = farm.prepare(jobs, {node["class_type"] for node in WORKFLOW.values()})
        assert (item.rung, item.oom_retried) == (1, True)


def test_a_job_no_live_worker_fits_any_more_fails_instead_of_waiting_forever(tmp_path, local_ray):
    """Ray keeps a task no node can take pending for ever: when the node(s) a job fits are gone (a cluster
    node lost; here none declares a device), the job fails with the reason and the run ends."""
    import threading

    def run() -> None:                                # the ledger's connection belongs to this thread
        with Ledger(tmp_path / "farm.sqlite") as ledger:
            farm = _farm(tmp_path, ledger)
            farm.run([_item(tmp_path, "a", ledger)])

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(timeout=60)                           # a guard against the hang this checks, not a timing
    assert not runner.is_alive(), "the run waits for ever on a job no live node can take"
    with Ledger(tmp_path / "farm.sqlite") as ledger:
        row = ledger.get("a")
        assert row.state == "failed" and "no live worker fits" in row.error
        assert [a["result"] for a in ledger.attempts("a")] == ["no worker"]
