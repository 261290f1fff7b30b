"""The farm's driver: connect to Ray (or start a local one), start the workers, validate and price
every job, and run them as Ray tasks placed by resources; record everything in the ledger.

Placement is Ray's: each job task asks for ``{ACCEL_RESOURCE: predicted MiB, HOST_RESOURCE: host MiB}``
and Ray starts it on a node (device) with that much unclaimed; there is no placement loop here.
Locally (no address) every simulated or real device is its own Ray node (`ray.cluster_utils.Cluster`:
one raylet per device with that device's capacity as its custom resources), so a device's jobs are
accounted against its own capacity; on a cluster each node declares its device with
``ray start --resources '{"h3_accel_mb": MiB, "h3_host_mb": MiB}'``.

Recovery: a job whose worker died (Ray raised for its task) is queued again at the same setting, up to
`MAX_ATTEMPTS` tries in this run (tries of earlier runs, kept in the ledger, do not count); an out-of-memory failure is retried once on the next cheaper rung of
`needs.ladder`, and after that reported with `h3director oom`'s diagnosis. Outputs come back through
Ray's object store and are written under ``OUT/<job id>/`` with write-then-rename.
"""

from __future__ import annotations

import importlib.util
import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

from h3director.errors import BudgetError, H3DirectorError, InvalidInputError, missing_package
from h3director.farm import needs
from h3director.farm.diffusers_job import request as diffusers_request
from h3director.farm.jobs import Job, read_jobs, unknown_classes
from h3director.farm.ledger import Ledger
from h3director.farm.worker import NAMESPACE, ServerConfig, job_task, worker_actor
from h3director.units import MiB, format_size

MAX_ATTEMPTS = 4
PLACEMENT_CHECK_S = 10.0       # how often the pending jobs are checked against the live device nodes
CONNECT_TIMEOUT_S = 10.0
_log = logging.getLogger("h3director.farm")
RAY_CLIENT_TRIES = 3           # Ray Client's server sometimes fails to start its per-client server under load
LEDGER_NAME = "farm.sqlite"
OBJECT_STORE_BYTES = 128 * MiB


class ClusterUnreachableError(H3DirectorError):
    """The Ray address given does not answer."""


class WorkerStartError(H3DirectorError):
    """A worker's ComfyUI server did not start (its log's end is in the message)."""


@dataclass
class Session:
    """A connected Ray and the workers of this run: name -> (spec, actor, info)."""

    cluster: object | None = None
    workers: dict[str, tuple] = field(default_factory=dict)

    def close(self) -> None:
        import ray

        ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()


def _check_reachable(host: str, port: int, address: str, timeout_s: float) -> None:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return
    except OSError as error:
        raise ClusterUnreachableError(
            f"Ray cluster at {address} does not answer ({error.strerror or error}) within {timeout_s:.0f} s: "
            "check the address, that the head runs (`ray start --head`), and the port "
            "(10001 for ray://, 6379 for the GCS)") from None


def connect(address: str | None, workers: list[needs.WorkerSpec], *, timeout_s: float = CONNECT_TIMEOUT_S) -> Session:
    """Connect to Ray. `address` None or "local": start one on this machine with one node per worker
    in `workers`; "auto": the cluster this machine belongs to; "ray://host:port" (Ray Client, needs
    ``ray[client]``) or "host:port" (GCS): that cluster, checked to answer within `timeout_s` first."""
    import ray

    options = {"namespace": NAMESPACE, "logging_level": "ERROR", "log_to_driver": False}
    if address in (None, "", "local"):
        from ray.cluster_utils import Cluster

        if not workers:
            raise InvalidInputError("a local farm needs at least one worker (--workers NAME=SIZE)")
        cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "object_store_memory": OBJECT_STORE_BYTES, "include_dashboard": False})
        try:
            for spec in workers:
                cluster.add_node(num_cpus=1, object_store_memory=OBJECT_STORE_BYTES, resources={
                    needs.ACCEL_RESOURCE: spec.accel_mb, needs.HOST_RESOURCE: spec.host_mb, f"h3w_{spec.name}": 1})
            ray.init(address=cluster.address, **options)
        except BaseException:
            cluster.shutdown()
            raise
        return Session(cluster=cluster)
    if workers:
        raise InvalidInputError("--workers describes the devices of a local farm; on a cluster each node declares "
                                f"its own ({needs.ACCEL_RESOURCE}, {needs.HOST_RESOURCE} in `ray start --resources`)")
    if address != "auto":
        parsed = urlparse(address if "://" in address else f"ray-gcs://{address}")
        if not parsed.hostname or not parsed.port:
            raise InvalidInputError(f"--address must be local, auto, ray://HOST:PORT or HOST:PORT, got {address!r}")
        _check_reachable(parsed.hostname, parsed.port, address, timeout_s)
        if parsed.scheme == "ray" and importlib.util.find_spec("grpc") is None:
            raise InvalidInputError(missing_package(f"--address {address} goes through Ray Client, which",
                                                    "'ray[client]' here", "farm")
                                    + "; inside the cluster give the GCS address HOST:6379 instead")
    tries = RAY_CLIENT_TRIES if address.startswith("ray://") else 1
    attempt = 1
    while True:
        try:
            ray.init(address=address, **options)
            return Session()
        except ConnectionError as error:
            ray.shutdown()
            if attempt == tries:
                raise ClusterUnreachableError(f"Ray cluster at {address}: {error}"
                                              + (f" (after {tries} connections)" if tries > 1 else "")) from None
            # the port answered (checked above): Ray Client failing now is its server not starting this
            # client's own server process, which a new connection (a new process) may not repeat
            attempt += 1
            _log.warning("Ray Client at %s: %s; connecting again (%d of %d)", address, error, attempt, tries)


def cluster_workers() -> list[tuple[needs.WorkerSpec, str]]:
    """(spec, node id) of every live node that declares the accelerator resource."""
    import ray

    found = []
    for node in ray.nodes():
        resources = node.get("Resources", {})
        if not node.get("Alive") or needs.ACCEL_RESOURCE not in resources:
            continue
        names = [k[4:] for k in resources if k.startswith("h3w_")]
        name = names[0] if names else f"{node['NodeManagerAddress']}-{node['NodeID'][:6]}"
        if needs.HOST_RESOURCE not in resources:
            raise InvalidInputError(f"node {name} declares {needs.ACCEL_RESOURCE} but not {needs.HOST_RESOURCE}")
        found.append((needs.WorkerSpec(name, int(resources[needs.ACCEL_RESOURCE]) * MiB,
                                       int(resources[needs.HOST_RESOURCE]) * MiB), node["NodeID"]))
    return sorted(found, key=lambda item: item[0].name)


def start_workers(session: Session, config: ServerConfig) -> set[str]:
    """One worker actor per device node; waits until all are up and returns the node classes their
    servers know (the intersection)."""
    import ray

    found = cluster_workers()
    if not found:
        raise InvalidInputError(f"no Ray node declares {needs.ACCEL_RESOURCE}: start nodes with `ray start "
                                f"--resources '{{\"{needs.ACCEL_RESOURCE}\": MiB, \"{needs.HOST_RESOURCE}\": MiB}}'`")
    actors = {spec.name: (spec, worker_actor(node_id, spec.name, config)) for spec, node_id in found}
    try:
        infos = ray.get([actor.ready.remote() for _, actor in actors.values()])
        classes = ray.get([actor.node_classes.remote() for _, actor in actors.values()])
    except ray.exceptions.RayError as error:
        cause = getattr(error, "cause", None) or getattr(error, "error_msg", None) or error
        raise WorkerStartError(f"a farm worker did not start: {cause}") from None
    for (name, (spec, actor)), info in zip(actors.items(), infos, strict=True):
        session.workers[name] = (spec, actor, info)
    known = set(classes[0])
    for more in classes[1:]:
        known &= set(more)
    return known


@dataclass
class _Running:
    job: Job
    rungs: list
    rung: int
    attempt: int               # the ledger's attempt number (counts every run's tries)
    oom_retried: bool = False
    tries: int = 0             # tries in this run: MAX_ATTEMPTS bounds these


def _diagnosis(error: str) -> str:
    from h3director.core.oom import explain_log, format_explanations

    return format_explanations(explain_log(error))


def _write_outputs(out_dir: Path, job_id: str, files: dict[str, bytes]) -> str:
    from h3director.core.atomic_file import atomic_path

    folder = out_dir / job_id
    for relative, data in files.items():
        name = Path(relative).name  # ComfyUI's subfolder is h3farm/<job id>/: the job folder replaces it
        with atomic_path(folder / name) as temporary:
            temporary.write_bytes(data)
    return str(folder)


class Farm:
    """One run of a job file against a connected `Session` (see `run_farm`)."""

    def __init__(self, session: Session, ledger: Ledger, out_dir: Path, display, model_dirs: tuple[Path, ...] = ()):
        self.session, self.ledger, self.out_dir, self.display = session, ledger, out_dir, display
        self.model_dirs = model_dirs
        self.task = job_task()
        self.pending: dict[object, _Running] = {}

    def refuse(self, job_id: str, line: int, reason: str) -> None:
        self.ledger.refuse(job_id, line, reason)
        self.display.event(f"[refused] {job_id}: {reason}")

    def prepare(self, jobs: list[Job], known: set[str]) -> list[_Running]:
        """Check node classes, price every job, register it; the jobs to run (done ones skipped)."""
        specs = [spec for spec, _, _ in self.session.workers.values()]
        runnable = []
        for job in jobs:
            reserved = reserved_id(job)
            if reserved:
                self.refuse(job.id, job.line, reserved)
                continue
            missing = unknown_classes(job, known)
            if missing:
                self.refuse(job.id, job.line, f"unknown node classes {missing}: the workers' ComfyUI does not "
                            "have them (missing custom nodes?)")
                continue
            try:
                rungs = needs.ladder(job, self.model_dirs)
                first = needs.first_rung(rungs, specs)
            except (InvalidInputError, BudgetError) as error:
                hint = needs.missing_nodes_hint(job, specs, self.model_dirs) if isinstance(error, BudgetError) else ""
                self.refuse(job.id, job.line, str(error) + (f"\n  {hint}" if hint else ""))
                continue
            row = self.ledger.sync(job.id, job.line, job.spec_hash)
            if row.state == "done":
                if row.error:
                    self.display.event(f"[kept] {job.id}: {row.error}")
                continue
            runnable.append(self._resumed(_Running(job, rungs, first, 0), row))
        return runnable

    def _resumed(self, item: _Running, row) -> _Running:
        """A job a dead driver had moved down a rung after an OOM goes on from that rung, its one OOM
        retry spent (`sync` puts a failed or changed job back on rung 0, so those start afresh)."""
        ooms = [a["rung"] for a in self.ledger.attempts(item.job.id) if a["result"] == "oom"]
        if item.rung < row.rung < len(item.rungs) and any(rung < row.rung for rung in ooms):
            item.rung, item.oom_retried = row.rung, True
        return item

    def submit(self, item: _Running) -> None:
        rung = item.rungs[item.rung]
        item.tries += 1
        item.attempt = self.ledger.start_attempt(item.job.id, rung.index, rung.settings, rung.device_bytes,
                                                 rung.device_mb)
        workflow = needs.apply_rung(rung, item.job.workflow)
        pipeline = diffusers_request(item.job, rung.settings) if item.job.diffusers is not None else None
        ref = self.task.options(resources={needs.ACCEL_RESOURCE: rung.device_mb, needs.HOST_RESOURCE: rung.host_mb},
                                name=f"h3farm-job-{item.job.id}").remote(item.job.id, workflow, pipeline)
        self.pending[ref] = item

    def handle(self, ref) -> None:
        import ray

        item = self.pending.pop(ref)
        job_id = item.job.id
        try:
            result = ray.get(ref)
        except ray.exceptions.RayError as error:
            reason = f"worker lost: {type(error).__name__}"
            self.ledger.end_attempt(job_id, item.attempt, "worker lost", error=str(error)[:2000])
            if item.tries >= MAX_ATTEMPTS:
                self.ledger.fail(job_id, f"{reason}, {item.tries} attempts")
                self.display.event(f"[failed] {job_id}: {reason} ({item.tries} attempts)")
                return
            self.ledger.requeue(job_id, reason)
            self.display.event(f"[requeued] {job_id}: {reason}")
            self.submit(item)
            return
        where = {"worker": result["worker"], "node_id": result["node_id"], "started_at": result["held_from"],
                 "ended_at": result["held_to"]}
        if result["status"] == "done":
            try:
                output = _write_outputs(self.out_dir, job_id, result["files"])
            except OSError as error:      # this job fails; the driver (and every other job) goes on
                message = f"cannot write the outputs to {str(self.out_dir / job_id)!r}: {error.strerror or error}"
                self.ledger.end_attempt(job_id, item.attempt, "error", error=message, **where)
                self.ledger.fail(job_id, message, worker=result["worker"], device=result["device"],
                                 started_at=result["held_from"], finished_at=result["held_to"])
                self.display.event(f"[failed] {job_id}: {message}")
                return
            self.ledger.finish(job_id, item.attempt, worker=result["worker"], node_id=result["node_id"],
                               device=result["device"], measured_peak_bytes=result["peak_bytes"],
                               started_at=result["held_from"], finished_at=result["held_to"], output=output)
            self.display.event(f"[done] {job_id} on {result['worker']} ({result['seconds']:.1f} s)")
            return
        self.ledger.end_attempt(job_id, item.attempt, result["status"], error=result["error"], **where)
        if result["status"] == "oom":
            cheaper = needs.next_rung(item.rungs, item.rung)
            if cheaper is not None and not item.oom_retried:
                item.rung, item.oom_retried = cheaper, True
                self.ledger.requeue(job_id, f"out of memory; retrying with {item.rungs[cheaper].describe()}")
                self.display.event(f"[oom] {job_id}: retrying with {item.rungs[cheaper].describe()}")
                self.submit(item)
                return
            why = "out of memory again on the cheaper setting" if item.oom_retried else "no cheaper setting left"
            message = f"out of memory ({why}): {result['error']}\n{_diagnosis(result['error'])}"
        else:
            message = result["error"] or "failed"
        self.ledger.fail(job_id, message, worker=result["worker"], device=result["device"],
                         started_at=result["held_from"], finished_at=result["held_to"])
        self.display.event(f"[failed] {job_id}: {message.splitlines()[0][:200]}")

    def fail_unplaceable(self) -> None:
        """Fail the pending jobs no live device node fits any more (a cluster node lost): Ray would keep
        their tasks waiting for ever."""
        import ray

        live = [spec for spec, _ in cluster_workers()]
        for ref, item in list(self.pending.items()):
            rung = item.rungs[item.rung]
            if any(worker.fits(rung) for worker in live) or ray.wait([ref], timeout=0)[0]:
                continue            # placeable, or already finished (`handle` takes its result)
            ray.cancel(ref, force=True)
            del self.pending[ref]
            message = (f"no live worker fits {rung.describe()} any more (live: "
                       + (", ".join(f"{w.name} {w.accel_mb} MiB" for w in live) or "none") + ")")
            self.ledger.end_attempt(item.job.id, item.attempt, "no worker", error=message)
            self.ledger.fail(item.job.id, message)
            self.display.event(f"[failed] {item.job.id}: {message}")

    def run(self, items: list[_Running]) -> None:
        import ray

        for item in items:
            self.submit(item)
        next_check = 0.0
        while self.pending:
            if time.monotonic() >= next_check:
                self.fail_unplaceable()
                next_check = time.monotonic() + PLACEMENT_CHECK_S
                if not self.pending:
                    break
            done, _ = ray.wait(list(self.pending), num_returns=1, timeout=0.5)
            for ref in done:
                self.handle(ref)
            self.display.refresh()


def reserved_id(job: Job) -> str | None:
    """Why `job`'s id cannot be used (OUT/<job id>/ would be the ledger's own file), or None."""
    reserved = {LEDGER_NAME + suffix for suffix in ("", "-wal", "-shm", "-journal", ".lock")}
    if job.id in reserved:
        return (f"job id {job.id!r} is the ledger's name in --out ({', '.join(sorted(reserved))} are taken); "
                "rename the job")
    return None


def dry_run(jobs_path: str | Path, workers: list[needs.WorkerSpec], *, model_dirs: tuple[Path, ...] = (),
            write=print) -> int:
    """Price every job of `jobs_path` as `run_farm` would and `write` each job's rungs, the rung it would start
    on and the workers that fit it; bad lines get the same refusals. Starts nothing (no Ray, no ComfyUI, no
    ledger), so node classes are not checked against a server. 0 when every job would be placed, else 1."""
    jobs, errors = read_jobs(jobs_path)
    write("workers: " + ", ".join(f"{w.name} (device {format_size(w.accel_bytes)}, host {format_size(w.host_bytes)})"
                                  for w in workers))
    refused = 0
    for error in errors:
        write(f"[refused] {error}")
        refused += 1
    for job in jobs:
        try:
            reason = reserved_id(job)
            if reason:
                raise InvalidInputError(reason)
            rungs = needs.ladder(job, model_dirs)
            first = needs.first_rung(rungs, workers)
        except (InvalidInputError, BudgetError) as error:
            hint = needs.missing_nodes_hint(job, workers, model_dirs) if isinstance(error, BudgetError) else ""
            write(f"[refused] line {job.line} (job {job.id}): {error}" + (f"\n  {hint}" if hint else ""))
            refused += 1
            continue
        what = "diffusers pipeline" if job.diffusers is not None else f"workflow {job.workflow_path}"
        write(f"job {job.id} (line {job.line}): {what}, {job.width}x{job.height}, {job.frames} frames")
        if job.diffusers is None:
            wf = needs.read_settings(job.workflow, model_dirs)
            write(f"  loads: DiT {wf.weights} ({wf.weights_from}); text encoder {wf.text_encoder_weights} on "
                  f"{wf.text_encoder_device}; audio {'on' if wf.audio else 'off'}")
        for rung in rungs:
            write(f"  {'->' if rung.index == first else '  '} {rung.describe()}")
        rung = rungs[first]
        fit = [w.name for w in workers if w.fits(rung)]
        write(f"  placement: rung {first} (device {rung.device_mb} MiB, host {rung.host_mb} MiB) on "
              f"{' or '.join(fit)}")
    write(f"dry run: {len(jobs) + len(errors) - refused} job(s) would be placed, {refused} refused; nothing ran")
    return 0 if not refused else 1


def run_farm(jobs_path: str | Path, out_dir: str | Path, *, address: str | None, workers: list[needs.WorkerSpec],
             config: ServerConfig, console) -> int:
    """Run every job of `jobs_path`; 0 when all are done, 1 when some failed or were refused."""
    from h3director.farm.progress import Display, counts_line, final_table

    out_dir = Path(out_dir)
    jobs, errors = read_jobs(jobs_path)
    ledger = Ledger(out_dir / LEDGER_NAME)
    try:
        ledger.claim()
        recovered = ledger.recover()
        with Display(console, ledger) as display:
            if recovered:
                display.event(f"resuming: {len(recovered)} job(s) a previous driver left running are queued again")
            for error in errors:
                display.event(f"[refused] {error}")
                if error.job_id and not any(j.id == error.job_id for j in jobs):
                    ledger.refuse(error.job_id, error.line, error.message)
            session = connect(address, workers)
            try:
                known = start_workers(session, config)
                display.event("workers: " + ", ".join(
                    f"{name} ({spec.accel_mb} MiB)" for name, (spec, _, _) in session.workers.items()))
                farm = Farm(session, ledger, out_dir, display, needs.comfy_model_dirs(config.base_dir))
                farm.run(farm.prepare(jobs, known))
            finally:
                session.close()
        ids = [job.id for job in jobs]
        rows = [row for row in ledger.rows() if row.id in ids]
        console.print(final_table(rows))
        console.print(counts_line(ledger.counts()))
        return 0 if not errors and all(row.state == "done" for row in rows) else 1
    finally:
        ledger.close()


__all__ = ["LEDGER_NAME", "MAX_ATTEMPTS", "ClusterUnreachableError", "Farm", "Session", "WorkerStartError",
           "connect", "dry_run", "run_farm", "start_workers"]
