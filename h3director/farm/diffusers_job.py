"""Farm jobs that run diffusers' MiniMax H3 pipeline instead of a ComfyUI workflow.

A job line names the pipeline with ``"diffusers": {...}`` and the usual ``seed``, ``frames``, ``width``,
``height`` (required here: there is no workflow to read them from):

    {"id": "fox", "diffusers": {"pipeline": "h3-weights", "prompt_embeds": "fox.safetensors",
     "dtype": "bfloat16", "steps": 30}, "seed": 42, "frames": 124, "width": 1344, "height": 768}

- ``pipeline`` (required): a local folder in diffusers' layout (paths relative to the job file), with
  ``transformer/`` (`MiniMaxH3Transformer3DModel`) and ``vae/`` (`AutoencoderKLMiniMaxH3`), each with its
  ``config.json``, and optionally ``scheduler/`` (`MiniMaxH3Scheduler`; default shift 12). Loaded with
  ``from_pretrained(..., local_files_only=True)``;
- ``prompt_embeds`` (required): a ``.safetensors`` file holding ``prompt_embeds`` ``[1, L, text_dim]`` (the
  text encoder's output; `text_dim` is the transformer config's) and optionally ``text_token_tags`` ``[L]``
  (default all ones). The farm does not run H3's text encoder: a ``prompt`` string is refused for these jobs;
- ``task``: ``"t2v"`` (the only one): the pipeline's text-to-video denoising (``MiniMaxH3CoreDenoiseStep``),
  then the video latents decoded into ``<job id>.mp4`` (24 fps, H.264 through `VideoFileSink`) by the decode
  the worker's memory level asks for, as the CLI and the node do (`video.levels.decode_for_level` over
  `integrations.diffusers_h3.H3VideoAdapter`: level 0 the VAE's own whole-video decode, above it the streaming
  decode with the level's pool and collections).
  The audio latents the step also draws are not decoded;
- ``dtype``: ``float32`` (default), ``bfloat16`` or ``float16``: the transformer's and the VAE's;
- ``steps``: denoising steps, 2-1000 (default 30; H3's scheduler needs at least 2); ``crf``: the H.264
  quality, 0-51 (default 18).

Everything above is checked when the job file is read (folders, ``_class_name`` of each config, the
embeddings' safetensors header and width) without importing diffusers. The farm prices a diffusers job
as sampling + decode at its geometry (`needs.ladder`); a rung's DiT chunking is applied with
`integrations.diffusers_dit.apply_memory_plan` (mode fixed), and the rungs are limited to head chunks
that divide the folder's transformer heads.

`PipelineHost` is what a worker keeps: the components of the last pipeline folder (and dtype) it
loaded, on its device; a job with another folder or dtype replaces them.
"""

from __future__ import annotations

import gc
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from h3director.errors import InvalidInputError

SPEC_KEYS = {"pipeline", "prompt_embeds", "task", "dtype", "steps", "crf"}
TASKS = ("t2v",)
DTYPES = ("float32", "bfloat16", "float16")
COMPONENTS = {"transformer": "MiniMaxH3Transformer3DModel", "vae": "AutoencoderKLMiniMaxH3"}
SCHEDULER_CLASS = "MiniMaxH3Scheduler"
DEFAULT_STEPS = 30
DEFAULT_CRF = 18
FPS = 24.0
MIN_FRAMES, MAX_FRAMES = 124, 345     # the pipeline's 5-15 s at 24 fps on the 17n+5 grid
DEFAULT_SHIFT = 12.0
AUDIO_SHIFT = 3.0


@dataclass(frozen=True)
class DiffusersSpec:
    """A checked ``diffusers`` spec: absolute paths; `heads` and `text_dim` from the transformer's config."""

    pipeline: str
    prompt_embeds: str
    task: str
    dtype: str
    steps: int
    crf: int
    heads: int
    text_dim: int


def _read_config(folder: Path, name: str, expected: str) -> dict:
    path = folder / name / "config.json"
    try:
        config = json.loads(path.read_text())
    except OSError:
        raise InvalidInputError(f"diffusers pipeline {str(folder)!r} has no {name}/config.json "
                                f"(expected a {expected} saved with save_pretrained)") from None
    except json.JSONDecodeError as error:
        raise InvalidInputError(f"{str(path)!r} is not JSON: {error.msg}") from None
    if not isinstance(config, dict) or config.get("_class_name") != expected:
        found = config.get("_class_name") if isinstance(config, dict) else None
        raise InvalidInputError(f"{str(path)!r} is a {found!r}, expected {expected}")
    return config


def _embeds_width(path: Path) -> int:
    from h3director.core.safetensors_header import read_header

    header = read_header(path)      # InvalidInputError naming the file for anything unreadable
    tensors = header.tensors
    if "prompt_embeds" not in tensors:
        raise InvalidInputError(f"prompt_embeds {str(path)!r} has no tensor 'prompt_embeds' "
                                f"(it has {sorted(tensors)})")
    shape = tuple(tensors["prompt_embeds"].shape)
    if len(shape) != 3 or shape[0] != 1 or shape[1] < 1:
        raise InvalidInputError(f"prompt_embeds in {str(path)!r} must be [1, tokens, text_dim], got {list(shape)}")
    tags = tensors.get("text_token_tags")
    if tags is not None and tuple(tags.shape) != (shape[1],):
        raise InvalidInputError(f"text_token_tags in {str(path)!r} must be [{shape[1]}], got {list(tags.shape)}")
    return shape[2]


def _int(spec: dict, key: str, default: int, low: int, high: int) -> int:
    value = spec.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise InvalidInputError(f"diffusers '{key}' must be an integer from {low} to {high}, got {value!r}")
    return value


def parse_spec(spec: object, folder: Path) -> DiffusersSpec:
    """Check a job's ``diffusers`` object (see the module docstring); relative paths against `folder`.
    Raises `InvalidInputError` naming the key at fault."""
    if not isinstance(spec, dict):
        raise InvalidInputError(f"'diffusers' must be an object {{\"pipeline\": FOLDER, ...}}, got {spec!r}")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise InvalidInputError(f"unknown diffusers keys {unknown}; a diffusers spec has {sorted(SPEC_KEYS)}")
    paths = {}
    for key in ("pipeline", "prompt_embeds"):
        value = spec.get(key)
        if not isinstance(value, str) or not value:
            raise InvalidInputError(f"diffusers '{key}' (a local path) is required")
        path = Path(value).expanduser()
        paths[key] = (path if path.is_absolute() else folder / path).resolve()
    if not paths["pipeline"].is_dir():
        raise InvalidInputError(f"diffusers pipeline {str(paths['pipeline'])!r} is not a folder (a local "
                                "folder in diffusers' layout; nothing is downloaded)")
    task = spec.get("task", "t2v")
    if task not in TASKS:
        raise InvalidInputError(f"diffusers 'task' must be one of {list(TASKS)}, got {task!r}")
    dtype = spec.get("dtype", "float32")
    if dtype not in DTYPES:
        raise InvalidInputError(f"diffusers 'dtype' must be one of {list(DTYPES)}, got {dtype!r}")
    transformer = _read_config(paths["pipeline"], "transformer", COMPONENTS["transformer"])
    _read_config(paths["pipeline"], "vae", COMPONENTS["vae"])
    if (paths["pipeline"] / "scheduler").is_dir():
        scheduler_path = paths["pipeline"] / "scheduler" / "scheduler_config.json"
        try:
            found = json.loads(scheduler_path.read_text()).get("_class_name")
        except (OSError, json.JSONDecodeError, AttributeError):
            found = None
        if found != SCHEDULER_CLASS:
            raise InvalidInputError(f"{str(scheduler_path)!r} must be a readable {SCHEDULER_CLASS} config "
                                    f"(found {found!r})")
    width = _embeds_width(paths["prompt_embeds"])
    text_dim = int(transformer.get("text_dim", 0))
    if width != text_dim:
        raise InvalidInputError(f"prompt_embeds are {width} wide but the transformer's text_dim is {text_dim}")
    return DiffusersSpec(pipeline=str(paths["pipeline"]), prompt_embeds=str(paths["prompt_embeds"]), task=task,
                         dtype=dtype, steps=_int(spec, "steps", DEFAULT_STEPS, 2, 1000),
                         crf=_int(spec, "crf", DEFAULT_CRF, 0, 51),
                         heads=int(transformer.get("num_attention_heads", 0)), text_dim=text_dim)


def request(job, settings: dict) -> dict:
    """What a worker needs to run `job` (a `jobs.Job` with a spec) on a rung with `settings`."""
    return {"spec": asdict(job.diffusers), "seed": job.overrides.get("seed", 0), "frames": job.frames,
            "width": job.width, "height": job.height, "settings": dict(settings)}


def _device(name: str | None):
    import torch

    if name is not None:
        return torch.device(name)
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


class PipelineHost:
    """The diffusers components a worker keeps loaded: the last (folder, dtype) it ran, on its device.
    `run(job_id, request, work_dir)` runs one job and returns a `comfy_server.RunResult`-shaped dict.
    `device`: a torch device name; None takes CUDA's current device when there is one, else the CPU.
    `config`: the `H3Config` whose memory level chooses the decode (None: `load_config()` in the worker's
    process, as the CLI reads it). `fault_injector` goes to the streaming decode (tests: `OomOnClip` in
    `fixtures/oom_injection.py`).
    `last_decode` is the `DecodeReport` of the last decode that finished (its ``path`` and ``notes`` say
    which decode ran)."""

    def __init__(self, device: str | None = None, fault_injector=None, config=None) -> None:
        self.key: tuple[str, str] | None = None
        self.transformer = self.vae = self.scheduler = None
        self.device = _device(device)
        self.fault_injector = fault_injector
        self.config = config
        self.last_decode = None

    def _load(self, spec: DiffusersSpec) -> None:
        import torch
        from diffusers import AutoencoderKLMiniMaxH3, MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel

        key = (spec.pipeline, spec.dtype)
        if self.key == key:
            return
        self.key = self.transformer = self.vae = None
        gc.collect()
        dtype = getattr(torch, spec.dtype)
        folder = Path(spec.pipeline)
        self.transformer = MiniMaxH3Transformer3DModel.from_pretrained(
            folder / "transformer", torch_dtype=dtype, local_files_only=True).to(self.device).eval().requires_grad_(False)
        self.vae = AutoencoderKLMiniMaxH3.from_pretrained(
            folder / "vae", torch_dtype=dtype, local_files_only=True).to(self.device).eval().requires_grad_(False)
        self.scheduler = MiniMaxH3Scheduler.from_pretrained(folder / "scheduler", local_files_only=True) \
            if (folder / "scheduler").is_dir() else MiniMaxH3Scheduler(shift=DEFAULT_SHIFT)
        self.key = key

    def _latents(self, spec: DiffusersSpec, job: dict):
        import torch
        from diffusers import MiniMaxH3Scheduler
        from diffusers.modular_pipelines import SequentialPipelineBlocks
        from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3CoreDenoiseStep
        from safetensors.torch import load_file

        from h3director.integrations.diffusers_dit import apply_memory_plan

        tensors = load_file(spec.prompt_embeds)
        embeds = tensors["prompt_embeds"].to(self.device, getattr(torch, spec.dtype))
        tags = tensors.get("text_token_tags", torch.ones(embeds.shape[1], dtype=torch.long)).to(self.device)
        pipe = SequentialPipelineBlocks.from_blocks_dict({"denoise": MiniMaxH3CoreDenoiseStep()}).init_pipeline()
        pipe.load_components()
        pipe.update_components(transformer=self.transformer, scheduler=self.scheduler,
                               audio_scheduler=MiniMaxH3Scheduler(shift=AUDIO_SHIFT))
        settings = job["settings"]
        handle = apply_memory_plan(self.transformer, head_chunks=settings.get("head_chunks", 1),
                                   ffn_chunks=settings.get("ffn_chunks", 1), mode="fixed")
        try:
            with torch.no_grad():
                out = pipe(prompt_embeds=embeds, text_token_tags=tags, height=job["height"], width=job["width"],
                           num_frames=job["frames"], num_inference_steps=spec.steps,
                           generator=torch.Generator(self.device).manual_seed(job["seed"]), output="latents")
        finally:
            handle.remove()
        return out

    def _decode(self, spec: DiffusersSpec, latents, path: Path) -> None:
        from h3director.integrations.diffusers_h3 import H3VideoAdapter
        from h3director.video.levels import decode_for_level
        from h3director.video.sinks import file_sink_for

        self.last_decode = decode_for_level(H3VideoAdapter(self.vae), latents,
                                            file_sink_for(path, fps=FPS, crf=spec.crf), config=self.config,
                                            fault_injector=self.fault_injector)

    def run(self, job_id: str, job: dict, work_dir: str) -> dict:
        """Load (or reuse) the pipeline, run the job, return ``status`` ("done", "oom": an allocator failure
        or a streaming decode that ran out of memory on every execution it has, "error"), ``files``
        ({name: bytes}), ``peak_bytes`` / ``peak_series`` (CUDA: ``torch.cuda.max_memory_allocated``;
        CPU: this process's resident bytes sampled every 50 ms), ``error``, ``seconds``."""
        import torch

        from h3director.core.monitor import Monitor
        from h3director.core.oom import is_out_of_memory
        from h3director.video.scheduler import DecodeOutOfMemory

        spec = DiffusersSpec(**job["spec"])
        cuda = self.device.type == "cuda"
        path = Path(work_dir) / f"{job_id}.mp4"
        monitor = None
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            import psutil

            process = psutil.Process()
            monitor = Monitor(interval_ms=50, devices=())
            monitor.add_series("worker.rss_bytes", lambda: float(process.memory_info().rss))
            monitor.__enter__()
        started = time.perf_counter()
        status, error = "done", None
        try:
            self._load(spec)
            with torch.no_grad():
                self._decode(spec, self._latents(spec, job), path)
        except Exception as failure:  # the job's result carries the error; the worker goes on
            status = "oom" if is_out_of_memory(failure) or isinstance(failure, DecodeOutOfMemory) else "error"
            error = f"{type(failure).__name__}: {failure}"[:4000]
        finally:
            if monitor is not None:
                monitor.__exit__(None, None, None)
        seconds = time.perf_counter() - started
        if cuda:
            peak, series = int(torch.cuda.max_memory_allocated(self.device)), "cuda.max_memory_allocated"
        else:
            value = monitor.report().peaks.get("worker.rss_bytes")
            peak, series = (int(value) if value else None), "worker.rss_bytes"
        files = {}
        if status == "done":
            files = {path.name: path.read_bytes()}
        path.unlink(missing_ok=True)
        if status != "done":
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
        return {"status": status, "files": files, "peak_bytes": peak, "peak_series": series, "error": error,
                "seconds": seconds}


__all__ = ["MAX_FRAMES", "MIN_FRAMES", "DiffusersSpec", "PipelineHost", "parse_spec", "request"]
