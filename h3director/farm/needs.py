"""A job's memory needs, from the planner: a ladder of settings (rungs), each with its predicted peak.

The phases a workflow runs are read from its node classes: text encoding (``CLIPTextEncode``,
``MiniMaxH3ImageToVideo``, ...), sampling (``KSampler*``, ``SamplerCustom*``) and decode (any class
with ``Decode`` in its name). Each rung prices those phases with `h3director.plan.estimate` at the
job's frames, width and height (H3's released model) and takes the largest:

- with sampling: the planner's DiT chunkings (`plan.recommend.CHUNKINGS`, head chunks dividing the
  DiT's heads), least chunked first; a rung's chunking goes to the workflow's ``H3DirectorDiTMemory``
  nodes (mode fixed). Without such a node the ladder is the stock rung alone;
- decode only: the planner's decode paths (`plan.recommend.DECODE_TILES`: reference, then 4, 2, 1 tiles
  per call), keeping only rungs that need less than the one before; a rung's decode-phase device need
  (VAE weights + working set, GiB) goes to the ``budget_gb`` input of every decode node that has one.
  ``H3DirectorDecodeAVStreaming`` takes it even where the export left the optional input out. Without
  such a node (a stock ``VAEDecode``) the ladder is the reference rung alone.

A diffusers job (`jobs.Job.diffusers`) runs sampling and decode: its rungs are the DiT chunkings whose
head chunks divide its transformer's heads (applied by the worker with `apply_memory_plan`).

`Rung.device_bytes` is the accelerator need (weights + working set of the largest phase);
`Rung.host_bytes` the host RAM need. A job starts on the first rung that fits some worker (Ray then
places it where that need is free); an out-of-memory error moves it one rung down (`next_rung`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from h3director.errors import BudgetError, InvalidInputError
from h3director.plan.activations import DiTShape
from h3director.plan.estimate import PlanEstimate, PlanRequest, estimate
from h3director.plan.recommend import CHUNKINGS, DECODE_TILES
from h3director.units import GiB, MiB, format_size, parse_size

TEXT_CLASSES = {"CLIPTextEncode", "MiniMaxH3ImageToVideo", "H3DirectorCachedTextEncode", "TextEncodeQwenImageEdit"}
SAMPLING_CLASSES = {"KSampler", "KSamplerAdvanced", "SamplerCustom", "SamplerCustomAdvanced"}
DIT_MEMORY_CLASS = "H3DirectorDiTMemory"
DECODE_BUDGET_INPUT = "budget_gb"
BUDGET_DECODE_CLASSES = {"H3DirectorDecodeAVStreaming"}   # take `budget_gb` even where the export left it out
ACCEL_RESOURCE = "h3_accel_mb"     # Ray custom resource: a device's accelerator memory, MiB
HOST_RESOURCE = "h3_host_mb"       # Ray custom resource: the host RAM that device's jobs may use, MiB


def to_mb(nbytes: int) -> int:
    """Bytes -> whole MiB, rounded up (Ray's resource unit here)."""
    return max(1, math.ceil(nbytes / MiB))


@dataclass(frozen=True)
class Rung:
    """One setting of a job: `settings` (what it changes, for reports), the predicted accelerator and
    host peaks (bytes), and the estimate they come from."""

    index: int
    settings: dict
    device_bytes: int
    host_bytes: int
    plan: PlanEstimate = field(repr=False, compare=False)

    @property
    def device_mb(self) -> int:
        return to_mb(self.device_bytes)

    @property
    def host_mb(self) -> int:
        return to_mb(self.host_bytes)

    def describe(self) -> str:
        text = ", ".join(f"{k} {v}" for k, v in self.settings.items())
        return f"rung {self.index} ({text}): device {format_size(self.device_bytes)}, host {format_size(self.host_bytes)}"


@dataclass(frozen=True)
class WorkerSpec:
    """A simulated or declared device: its name, accelerator memory and host RAM (bytes)."""

    name: str
    accel_bytes: int
    host_bytes: int

    @property
    def accel_mb(self) -> int:
        return self.accel_bytes // MiB

    @property
    def host_mb(self) -> int:
        return self.host_bytes // MiB

    def fits(self, rung: Rung) -> bool:
        return rung.device_mb <= self.accel_mb and rung.host_mb <= self.host_mb


def parse_workers(spec: str, default_host_bytes: int) -> list[WorkerSpec]:
    """``"gpu0=24GB,gpu1=12GB:32GB"`` -> workers (``name=ACCEL[:HOST]``; GB means GiB, as cards are
    quoted). The workers without a HOST share `default_host_bytes` (this machine's RAM) equally."""
    workers: list[WorkerSpec] = []
    items = [part.strip() for part in spec.split(",")]
    shares = max(1, sum(1 for item in items if not item.partition("=")[2].partition(":")[2].strip()))
    for item in items:
        name, sep, sizes = item.partition("=")
        if not sep or not name.strip() or not sizes.strip():
            raise InvalidInputError(f"--workers: expected NAME=ACCEL[:HOST] items such as gpu0=24GB, got {item!r}")
        name = name.strip()
        if not name.replace("-", "").replace("_", "").isalnum():
            raise InvalidInputError(f"--workers: a name is letters, digits, '-' and '_', got {name!r}")
        if any(w.name == name for w in workers):
            raise InvalidInputError(f"--workers: duplicate worker name {name!r}")
        accel, _, host = sizes.partition(":")
        accel_bytes = parse_size(accel.strip(), binary_gb=True)
        host_bytes = parse_size(host.strip(), binary_gb=True) if host.strip() else default_host_bytes // shares
        if accel_bytes < MiB or host_bytes < MiB:
            raise InvalidInputError(f"--workers: {name} needs at least 1 MiB of each memory, got {item!r}")
        workers.append(WorkerSpec(name, accel_bytes, host_bytes))
    return workers


def phases_of(classes: set[str]) -> list[str]:
    """The planner phases a workflow with these node classes runs, in run order."""
    phases = []
    if classes & TEXT_CLASSES:
        phases.append("text_encoding")
    if classes & SAMPLING_CLASSES:
        phases.append("sampling")
    if any("Decode" in c for c in classes):
        phases.append("decode")
    return phases


def _has_audio(workflow: dict) -> bool:
    return any("Audio" in n["class_type"] or "audio_vae" in n.get("inputs", {}) for n in workflow.values())


def _takes_budget(node: dict) -> bool:
    """Whether a rung's decode budget goes to this node: a decode node with a literal `budget_gb` input,
    or one of `BUDGET_DECODE_CLASSES` without it (optional there)."""
    if "Decode" not in node["class_type"]:
        return False
    inputs = node.get("inputs", {})
    if DECODE_BUDGET_INPUT in inputs:
        return not isinstance(inputs[DECODE_BUDGET_INPUT], list)
    return node["class_type"] in BUDGET_DECODE_CLASSES


def _takes_decode_budget(workflow: dict) -> bool:
    """Whether some node of `workflow` takes a rung's decode budget (`_takes_budget`)."""
    return any(_takes_budget(node) for node in workflow.values())


def _rung(index: int, request: PlanRequest, phases: list[str], settings: dict) -> Rung:
    plan = estimate(request)
    priced = [p for p in plan.phases if p.name in phases]
    return Rung(index, settings, max(p.device_bytes for p in priced), max(p.host_bytes for p in priced), plan)


def ladder(job) -> list[Rung]:
    """The rungs for a `jobs.Job`, most generous first. Raises `InvalidInputError` when the workflow
    runs nothing the planner prices or its geometry is unknown or off H3's grid."""
    spec = getattr(job, "diffusers", None)
    phases = ["sampling", "decode"] if spec is not None else phases_of(job.classes)
    if not phases:
        raise InvalidInputError("the workflow runs no phase the planner prices (text encoding, sampling or decode)")
    missing = [name for name in ("frames", "width", "height") if getattr(job, name) is None]
    if missing:
        raise InvalidInputError(f"cannot price the job: no {', '.join(missing)} in the job line or the workflow")
    base = PlanRequest(width=job.width, height=job.height, frames=job.frames, audio=_has_audio(job.workflow))
    base.validate()
    rungs: list[Rung] = []
    if "sampling" in phases:
        heads = spec.heads if spec is not None else DiTShape.from_config(None).heads
        chunkings = [(h, f) for h, f in CHUNKINGS if heads % h == 0]
        if spec is None and DIT_MEMORY_CLASS not in job.classes:
            chunkings = chunkings[:1]
        for h, f in chunkings:
            request = PlanRequest(**{**base.__dict__, "head_chunks": h, "ffn_chunks": f})
            rung = _rung(len(rungs), request, phases, {"head_chunks": h, "ffn_chunks": f})
            if not rungs or rung.device_bytes < rungs[-1].device_bytes:
                rungs.append(rung)
        return rungs
    tiles_paths = DECODE_TILES
    if not _takes_decode_budget(job.workflow):        # nothing applies a cheaper rung: price the stock decode only
        tiles_paths = DECODE_TILES[:1]
    for tiles in tiles_paths:
        request = PlanRequest(**{**base.__dict__, "decode_tiles_per_call": tiles})
        decode = next(p for p in estimate(request).phases if p.name == "decode")
        budget_gb = math.ceil(decode.device_bytes / GiB * 10_000) / 10_000
        rung = _rung(len(rungs), request, phases,
                     {"decode": "reference" if tiles is None else f"{tiles} tiles/call", "budget_gb": budget_gb})
        if not rungs or rung.device_bytes < rungs[-1].device_bytes:
            rungs.append(rung)
    return rungs


def node_inputs(rung: Rung, workflow: dict) -> dict[str, dict]:
    """{node_id: inputs to set} that put `rung`'s settings into `workflow`."""
    changes: dict[str, dict] = {}
    for node_id, node in workflow.items():
        if "head_chunks" in rung.settings and node["class_type"] == DIT_MEMORY_CLASS:
            changes[node_id] = {"mode": "fixed", "head_chunks": rung.settings["head_chunks"],
                                "ffn_chunks": rung.settings["ffn_chunks"]}
        elif "budget_gb" in rung.settings and _takes_budget(node):
            changes[node_id] = {DECODE_BUDGET_INPUT: rung.settings["budget_gb"]}
    return changes


def apply_rung(rung: Rung, workflow: dict) -> dict:
    """A copy of `workflow` with `rung`'s settings applied."""
    import copy

    result = copy.deepcopy(workflow)
    for node_id, inputs in node_inputs(rung, workflow).items():
        result[node_id].setdefault("inputs", {}).update(inputs)
    return result


def first_rung(rungs: list[Rung], workers: list[WorkerSpec]) -> int:
    """The index of the first rung some worker fits. Raises `BudgetError` with the plan that shows why
    when none does: every rung's need beside every worker's capacity."""
    for rung in rungs:
        if any(w.fits(rung) for w in workers):
            return rung.index
    lines = ["no worker fits this job on any setting:"]
    lines += [f"  {rung.describe()}" for rung in rungs]
    lines += [f"  worker {w.name}: device {format_size(w.accel_bytes)}, host {format_size(w.host_bytes)}"
              for w in workers]
    lines.append("  the cheapest setting's plan:")
    lines += ["    " + row for row in rungs[-1].plan.summary_table().splitlines()]
    raise BudgetError("\n".join(lines))


def next_rung(rungs: list[Rung], index: int) -> int | None:
    """The next cheaper rung after `index`, or None when there is none."""
    return index + 1 if index + 1 < len(rungs) else None
