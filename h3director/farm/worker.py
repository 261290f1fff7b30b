"""The farm's worker: a Ray actor bound to one node (one device) that hosts a ComfyUI server and,
for diffusers jobs, the diffusers H3 pipeline (`diffusers_job.PipelineHost`, in the actor's process).

One worker per Ray node that declares the `needs.ACCEL_RESOURCE` custom resource (the device's memory
in MiB). The actor is pinned to its node (hard node affinity), named ``h3farm-<Ray job id>-<node id>``
(one set of workers per driver) in the ``h3farm`` namespace, and restarted by Ray when it dies (its
ComfyUI server dies with it and a new one starts). Jobs are Ray tasks (`run_job`) that ask for the job's predicted MiB of that resource: Ray
starts one only on a node with that much unclaimed, and holds it until the task ends, so the
predictions of the jobs on a device never add up to more than its capacity. The task calls its node's
worker, which runs one prompt at a time on its server, and one diffusers job at a time in its own
process (the last pipeline folder it loaded stays loaded for the next job). A server that died (the job
it ran fails its task, and is queued again) is started again at the worker's next ComfyUI job.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from dataclasses import asdict, dataclass

NAMESPACE = "h3farm"
READY_TIMEOUT_S = 600


@dataclass(frozen=True)
class ServerConfig:
    """Where ComfyUI is on every node: its Python, its source tree, and the base folder (models and
    custom_nodes with this pack); an empty `comfyui_dir` starts no server (a farm of diffusers jobs only);
    `cpu` starts it with ``--cpu`` and puts diffusers jobs on the CPU; `work_root` holds each worker's
    output/temp/user folders (default: the system's temporary folder)."""

    python: str
    comfyui_dir: str
    base_dir: str
    cpu: bool = False
    work_root: str | None = None


def actor_name(node_id: str) -> str:
    """The worker actor of `node_id` for the calling Ray job (one driver's run): another farm run on the
    same cluster has its own workers (with its own settings, and not killed when this run ends)."""
    import ray

    return f"h3farm-{ray.get_runtime_context().get_job_id()}-{node_id}"


class FarmWorker:
    """Hosts one ComfyUI server (unless the config names none) and the diffusers pipelines for the device
    of its node (plain class; `worker_actor` wraps it)."""

    def __init__(self, name: str, config: dict):
        import ray

        from h3director.farm.comfy_server import ComfyServer

        self.name = name
        self.node_id = ray.get_runtime_context().get_node_id()
        self.config = ServerConfig(**config)
        work = self.work = tempfile.mkdtemp(prefix=f"h3farm-{name}-", dir=self.config.work_root)
        self.server = None
        if self.config.comfyui_dir:
            self.server = ComfyServer(self.config.python, self.config.comfyui_dir, self.config.base_dir, work,
                                      cpu=self.config.cpu)
        atexit.register(self._shutdown, work)
        if self.server is not None:
            self.server.start()
        self.device = "cpu" if self.config.cpu else os.environ.get("CUDA_VISIBLE_DEVICES", "default device")
        self._classes: list[str] | None = None
        self._one_at_a_time = threading.Lock()   # ComfyUI runs one prompt at a time; so do the monitor windows
        self._one_pipeline_job = threading.Lock()   # the kept pipeline runs one job at a time
        self._pipelines = None

    def ready(self) -> dict:
        """Who this worker is: name, node, device, PIDs (its own and its server's; None without a server)."""
        server = self.server
        return {"name": self.name, "node_id": self.node_id, "device": self.device, "pid": os.getpid(),
                "server_pid": server.process.pid if server else None, "url": server.url if server else None}

    def node_classes(self) -> list[str]:
        if self._classes is None:
            self._classes = sorted(self.server.node_classes()) if self.server is not None else []
        return self._classes

    def run(self, job_id: str, workflow: dict) -> dict:
        from h3director.farm.jobs import with_output_prefix

        with self._one_at_a_time:
            if not self.server.alive():     # died between jobs (e.g. the kernel's OOM killer): a new one
                self.server.start()
            result = self.server.run(with_output_prefix(workflow, job_id))
        return {**asdict(result), "worker": self.name, "device": self.device, "node_id": self.node_id}

    def run_diffusers(self, job_id: str, request: dict) -> dict:
        """Run a diffusers job (`diffusers_job.request`) in this process on the kept pipeline."""
        from h3director.farm.diffusers_job import PipelineHost

        with self._one_pipeline_job:
            if self._pipelines is None:
                self._pipelines = PipelineHost("cpu" if self.config.cpu else None)
            result = self._pipelines.run(job_id, request, self.work)
        return {**result, "worker": self.name, "device": str(self._pipelines.device), "node_id": self.node_id}

    def _shutdown(self, work: str) -> None:
        """On a normal exit of the actor's process: stop the server and delete its folders (their files
        went back to the driver with each job). A killed process leaves the folders; its server exits
        by itself (`h3director.farm.serve`)."""
        if self.server is not None:
            self.server.stop()
        shutil.rmtree(work, ignore_errors=True)


def worker_actor(node_id: str, name: str, config: ServerConfig):
    """Create (or get) the worker actor of `node_id`."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cls = ray.remote(FarmWorker).options(
        name=actor_name(node_id), namespace=NAMESPACE, get_if_exists=True, num_cpus=0, max_restarts=-1,
        max_task_retries=0, max_concurrency=2,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))
    return cls.remote(name, asdict(config))


def _run_job(job_id: str, workflow: dict, diffusers: dict | None = None) -> dict:
    """Body of the job task: find this node's worker, wait until it is up, run the job there (the
    ComfyUI `workflow`, or the diffusers job `diffusers` when given).
    Returns the worker's result with ``held_from``/``held_to`` (epoch seconds): the interval this
    task held the job's resources."""
    import ray

    held_from = time.time()
    node_id = ray.get_runtime_context().get_node_id()
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        try:
            actor = ray.get_actor(actor_name(node_id), namespace=NAMESPACE)
            ray.get(actor.ready.remote(), timeout=READY_TIMEOUT_S)
            break
        except (ValueError, ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)
    call = actor.run_diffusers.remote(job_id, diffusers) if diffusers is not None else actor.run.remote(job_id, workflow)
    result = ray.get(call)
    return {**result, "held_from": held_from, "held_to": time.time()}


def job_task():
    """`_run_job` as a Ray remote function (no CPU claimed; the job's resources come with `.options`)."""
    import ray

    return ray.remote(num_cpus=0, max_retries=0)(_run_job)


__all__ = ["NAMESPACE", "FarmWorker", "ServerConfig", "job_task", "worker_actor"]
