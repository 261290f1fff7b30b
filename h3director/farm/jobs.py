"""Farm jobs: one JSON object per line of a JSONL file, validated before anything runs.

A line is ``{"id": "shot-01", "workflow": "flows/decode_api.json", "prompt": "...", "seed": 7,
"frames": 124, "width": 768, "height": 512, "set": {"5": {"crf": 20}}}``:

- ``id`` (required): unique in the file, 1-128 characters of letters, digits, ``-``, ``_``, ``.``;
- ``workflow`` (required): a ComfyUI workflow in API format (``{node_id: {"class_type", "inputs"}}``),
  relative paths against the job file's folder;
- overrides, each applied to every node input of that name whose value is a literal (not a link):
  ``prompt`` -> inputs ``prompt``/``text`` (strings), ``seed`` -> ``seed``/``noise_seed``,
  ``frames`` -> ``length``/``frames``, ``width``, ``height``; a prompt or seed no node takes is an error
  (geometry no node takes still prices the job: a decode of a saved latent gives its size this way);
- ``set``: explicit ``{node_id: {input: value}}`` values for anything else.

``frames``/``width``/``height`` (given, or read from the workflow's nodes) are what the planner prices.
A line with ``"diffusers": {...}`` instead of ``workflow`` runs diffusers' H3 pipeline on the worker
(`farm.diffusers_job`: the spec, checked here); it takes ``seed``, ``frames``, ``width``, ``height``
(the geometry required, within the pipeline's 124-345 frames) and neither ``prompt`` nor ``set``.
Every problem is a `JobError` for its line; the other lines go on.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

MAX_LINE_CHARS = 1_000_000
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
KNOWN_KEYS = {"id", "workflow", "diffusers", "prompt", "seed", "frames", "width", "height", "set"}
# override -> the node input names it sets, and the Python type its value must have
OVERRIDES: dict[str, tuple[tuple[str, ...], type]] = {
    "prompt": (("prompt", "text"), str),
    "seed": (("seed", "noise_seed"), int),
    "frames": (("length", "frames"), int),
    "width": (("width",), int),
    "height": (("height",), int),
}


@dataclass(frozen=True)
class Job:
    """One valid job: `workflow` is the API workflow with the overrides applied; `frames`, `width`,
    `height` (pixels, frames at 24 fps) are the geometry the planner prices (None when unknown)."""

    id: str
    line: int
    workflow_path: str
    workflow: dict
    frames: int | None
    width: int | None
    height: int | None
    spec_hash: str
    overrides: dict = field(default_factory=dict)
    diffusers: object = None       # a `diffusers_job.DiffusersSpec` for a diffusers job (then `workflow` is {})

    @property
    def classes(self) -> set[str]:
        return {node["class_type"] for node in self.workflow.values()}


@dataclass(frozen=True)
class JobError:
    """Why the job on `line` (1-based; `job_id` when it could be read) will not run."""

    line: int
    job_id: str | None
    message: str

    def __str__(self) -> str:
        return f"line {self.line}" + (f" (job {self.job_id})" if self.job_id else "") + f": {self.message}"


class _Refused(Exception):
    pass


def _is_link(value: object) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)


def check_workflow(workflow: object, source: str) -> dict:
    """Refuse anything that is not an API-format workflow (the UI format has "nodes" and "links")."""
    if not isinstance(workflow, dict) or not workflow:
        raise _Refused(f"{source} is not a ComfyUI API workflow (expected an object of nodes)")
    if "nodes" in workflow and "links" in workflow:
        raise _Refused(f"{source} is in ComfyUI's UI format; export it with 'Save (API)'")
    for node_id, node in workflow.items():
        if not isinstance(node, dict) or not isinstance(node.get("class_type"), str) \
                or not isinstance(node.get("inputs", {}), dict):
            raise _Refused(f"{source}: node {node_id!r} has no class_type or its inputs are not an object")
    return workflow


def _load_workflow(path: Path, cache: dict[Path, dict]) -> dict:
    if path not in cache:
        try:
            text = path.read_text()
        except OSError as error:
            raise _Refused(f"cannot read workflow {str(path)!r}: {error.strerror or error}") from None
        try:
            cache[path] = check_workflow(json.loads(text), f"workflow {str(path)!r}")
        except json.JSONDecodeError as error:
            raise _Refused(f"workflow {str(path)!r} is not JSON: {error.msg} at line {error.lineno}") from None
    return copy.deepcopy(cache[path])


def apply_overrides(workflow: dict, overrides: dict) -> dict:
    """Set each override on every node input of its names that holds a literal; returns `workflow`."""
    for key, value in overrides.items():
        names, kind = OVERRIDES[key]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _Refused(f"{key} must be {'an integer' if kind is int else 'a string'}, got {value!r}")
        if kind is int and value < 0:
            raise _Refused(f"{key} must be >= 0, got {value}")
        hits = 0
        for node in workflow.values():
            inputs = node.setdefault("inputs", {})
            for name in names:
                if name in inputs and not _is_link(inputs[name]):
                    inputs[name] = value
                    hits += 1
        if not hits and key in ("prompt", "seed"):      # geometry may only price a job (e.g. a LoadLatent one)
            raise _Refused(f"override {key!r} matches no node input ({' or '.join(names)}) in the workflow")
    return workflow


def _apply_set(workflow: dict, values: object) -> None:
    if not isinstance(values, dict):
        raise _Refused(f"'set' must be an object {{node_id: {{input: value}}}}, got {values!r}")
    for node_id, inputs in values.items():
        if node_id not in workflow:
            raise _Refused(f"'set' names node {node_id!r}, which the workflow does not have")
        if not isinstance(inputs, dict):
            raise _Refused(f"'set' for node {node_id!r} must be an object of inputs")
        workflow[node_id].setdefault("inputs", {}).update(inputs)


def _geometry(workflow: dict, name: str, given: int | None) -> int | None:
    if given is not None:
        return given
    names = OVERRIDES[name][0]
    for node in workflow.values():
        for key in names:
            value = node.get("inputs", {}).get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
    return None


def _parse_line(number: int, text: str, folder: Path, seen: set[str], cache: dict[Path, dict]) -> Job:
    if len(text) > MAX_LINE_CHARS:
        raise _Refused(f"line is {len(text):,} characters; at most {MAX_LINE_CHARS:,}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise _Refused(f"malformed JSON: {error.msg} at column {error.colno}") from None
    if not isinstance(data, dict):
        raise _Refused(f"a job must be a JSON object, got {type(data).__name__}")
    job_id = data.get("id")
    if not isinstance(job_id, str) or not ID_PATTERN.fullmatch(job_id):
        raise _Refused(f"'id' must be 1-128 characters of letters, digits, '-', '_' or '.', got {job_id!r}")
    if job_id in seen:
        raise _Refused(f"duplicate job id {job_id!r} (ids must be unique in the file)")
    seen.add(job_id)
    unknown = sorted(set(data) - KNOWN_KEYS)
    if unknown:
        raise _Refused(f"unknown keys {unknown}; a job has {sorted(KNOWN_KEYS)}")
    if "diffusers" in data:
        return _diffusers_job(number, job_id, data, folder)
    if not isinstance(data.get("workflow"), str) or not data["workflow"]:
        raise _Refused("'workflow' (the path of a ComfyUI API workflow JSON) is required")
    path = Path(data["workflow"]).expanduser()
    path = (path if path.is_absolute() else folder / path).resolve()
    workflow = _load_workflow(path, cache)
    overrides = {key: data[key] for key in OVERRIDES if key in data}
    apply_overrides(workflow, overrides)
    if "set" in data:
        _apply_set(workflow, data["set"])
    digest = hashlib.sha256(json.dumps(workflow, sort_keys=True).encode()).hexdigest()[:16]
    return Job(id=job_id, line=number, workflow_path=str(path), workflow=workflow,
               frames=_geometry(workflow, "frames", overrides.get("frames")),
               width=_geometry(workflow, "width", overrides.get("width")),
               height=_geometry(workflow, "height", overrides.get("height")),
               spec_hash=digest, overrides=overrides)


def _diffusers_job(number: int, job_id: str, data: dict, folder: Path) -> Job:
    from h3director.errors import InvalidInputError
    from h3director.farm.diffusers_job import MAX_FRAMES, MIN_FRAMES, parse_spec

    if "workflow" in data:
        raise _Refused("a job has either 'workflow' (ComfyUI) or 'diffusers' (a pipeline spec), not both")
    for key in ("prompt", "set"):
        if key in data:
            raise _Refused(f"'{key}' is for ComfyUI workflows; a diffusers job takes its text as the spec's "
                           "'prompt_embeds' file" if key == "prompt" else
                           f"'{key}' is for ComfyUI workflows; a diffusers job has no nodes")
    overrides = {key: data[key] for key in OVERRIDES if key in data}
    for key, value in overrides.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise _Refused(f"{key} must be an integer >= 0, got {value!r}")
    missing = [key for key in ("frames", "width", "height") if key not in overrides]
    if missing:
        raise _Refused(f"a diffusers job needs {', '.join(missing)} (there is no workflow to read them from)")
    if not MIN_FRAMES <= overrides["frames"] <= MAX_FRAMES:
        raise _Refused(f"frames must be from {MIN_FRAMES} to {MAX_FRAMES} for H3's pipeline (5-15 s at 24 fps), "
                       f"got {overrides['frames']}")
    try:
        spec = parse_spec(data["diffusers"], folder)
    except InvalidInputError as error:
        raise _Refused(str(error)) from None
    key = json.dumps({"diffusers": spec.__dict__, **overrides}, sort_keys=True)
    return Job(id=job_id, line=number, workflow_path=spec.pipeline, workflow={}, frames=overrides["frames"],
               width=overrides["width"], height=overrides["height"],
               spec_hash=hashlib.sha256(key.encode()).hexdigest()[:16], overrides=overrides, diffusers=spec)


def parse_jobs(text: str, folder: str | Path = ".") -> tuple[list[Job], list[JobError]]:
    """Every line of a JSONL job file -> (valid jobs in file order, errors). Blank lines and lines
    starting with ``#`` are skipped. `folder` resolves relative workflow paths."""
    jobs: list[Job] = []
    errors: list[JobError] = []
    seen: set[str] = set()
    cache: dict[Path, dict] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        try:
            jobs.append(_parse_line(number, stripped, Path(folder), seen, cache))
        except _Refused as error:
            job_id = None
            try:
                candidate = json.loads(stripped)
                job_id = candidate.get("id") if isinstance(candidate, dict) and isinstance(candidate.get("id"), str) \
                    else None
            except json.JSONDecodeError:
                pass
            errors.append(JobError(number, job_id, str(error)))
    return jobs, errors


def read_jobs(path: str | Path) -> tuple[list[Job], list[JobError]]:
    """`parse_jobs` of a file (relative workflow paths against its folder)."""
    path = Path(path)
    return parse_jobs(path.read_text(), path.resolve().parent)


def unknown_classes(job: Job, known: set[str]) -> list[str]:
    """The job's node classes the server does not have (from its ``/object_info``), sorted."""
    return sorted(job.classes - known)


def with_output_prefix(workflow: dict, job_id: str) -> dict:
    """A copy whose literal ``filename_prefix`` inputs save under ``h3farm/<job_id>/`` (unique per job,
    and a changed input makes ComfyUI run the saving node again instead of answering from its cache)."""
    result = copy.deepcopy(workflow)
    for node in result.values():
        prefix = node.get("inputs", {}).get("filename_prefix")
        if isinstance(prefix, str):
            node["inputs"]["filename_prefix"] = f"h3farm/{job_id}/{Path(prefix).name or 'out'}"
    return result


__all__ = ["Job", "JobError", "parse_jobs", "read_jobs", "unknown_classes", "with_output_prefix"]
