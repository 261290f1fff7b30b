"""A job's memory needs, from the planner: a ladder of settings (rungs), each with its predicted peak.

What a ComfyUI workflow loads is read from its nodes (`read_settings`), through the capability registry
(`plan.capabilities`), so a job is priced as it will run:

- DiT weights: ``UNETLoader`` (``weight_dtype`` fp8_* -> fp8; default -> the file's format: its comfy_quant layers
  when the file is found in the model folders, else int8 / int8_convrot / nvfp4 / fp8 when its name
  says so, else bf16) or ``H3DirectorGGUFDiTLoader`` (the GGUF type from the file's header when the file is in the
  models folders given, else from its name; a GGUF whose type cannot be told refuses the job);
- text encoder: ``CLIPLoader``'s file (fp8 when the name says so, else bf16) and ``device`` (cpu or default);
- ``H3DirectorDiTMemory`` (head/FFN chunks), ``H3DirectorBlockSwap`` (``blocks_offloaded``, 0 to the DiT's
  blocks, else the job is refused), a decode node without ``audio_vae`` (no audio decode).

The phases a workflow runs come from its node classes: text encoding (``CLIPTextEncode``, ...), sampling
(``KSampler*``, ``SamplerCustom*``), decode (any class with ``Decode`` in its name), stitch (``H3DirectorStitch``)
and upscale (``H3DirectorUpscaleStreaming``). Each rung prices those phases at the job's frames, width and height
and takes the largest:

- with sampling: the planner's own preference order (`plan.recommend.choose_dit`): the DiT chunkings
  (`plan.recommend.chunkings`), least chunked first, with the workflow's offload; then, where the workflow has
  an ``H3DirectorBlockSwap`` node, one more offloaded block per rung with the most chunked setting. Only what a
  node of the workflow applies varies (no DiT Memory node: its chunking alone; no block-swap node: its offload).
  A ``CLIPLoader`` whose ``device`` is a literal runs the text encoder on the accelerator unless that phase would
  be the rung's largest device need; then on the CPU (``device`` cpu). Rungs only get cheaper on the device;
- decode only: the planner's decode paths (`plan.recommend.DECODE_TILES`: reference, then 4, 2, 1 tiles
  per call), keeping only rungs that need less than the one before; a rung's decode-phase device need
  (VAE weights + working set, GiB) goes to the ``budget_gb`` input of every decode node that has one.
  ``H3DirectorDecodeAVStreaming`` takes it even where the export left the optional input out. Without
  such a node (a stock ``VAEDecode``) the ladder is the reference rung alone;
- stitch only: host RAM for both float32 IMAGE inputs and the joined result (`stitch_phase`), nothing on the
  accelerator; upscale: the bound of `upscale_phase`.

A diffusers job (`jobs.Job.diffusers`) runs sampling and decode: its rungs are the DiT chunkings whose
head chunks divide its transformer's heads (applied by the worker with `apply_memory_plan`).

`Rung.device_bytes` is the accelerator need (weights + working set of the largest phase);
`Rung.host_bytes` the host RAM need. A job starts on the first rung that fits some worker (Ray then
places it where that need is free); an out-of-memory error moves it one rung down (`next_rung`).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from h3director.errors import BudgetError, InvalidInputError
from h3director.plan import capabilities as caps
from h3director.plan.activations import DiTShape
from h3director.plan.estimate import Phase, PlanEstimate, PlanRequest, estimate
from h3director.plan.recommend import DECODE_TILES, Budget, chunkings
from h3director.units import MiB, format_size, parse_size

TEXT_CLASSES = {"CLIPTextEncode", "MiniMaxH3ImageToVideo", "H3DirectorCachedTextEncode", "TextEncodeQwenImageEdit"}
SAMPLING_CLASSES = {"KSampler", "KSamplerAdvanced", "SamplerCustom", "SamplerCustomAdvanced"}
STITCH_CLASSES = {"H3DirectorStitch"}
UPSCALE_CLASSES = {"H3DirectorUpscaleStreaming"}
DIT_MEMORY_CLASS = caps.DIT_MEMORY_NODE
BLOCK_SWAP_CLASS = caps.BLOCK_SWAP_NODE
GGUF_LOADER_CLASS = caps.GGUF_LOADER_NODE
UNET_LOADER_CLASS = "UNETLoader"
CLIP_LOADER_CLASS = caps.CLIP_LOADER_NODE
UPSCALE_ASSUMED_SCALE = 4          # ESRGAN-family models: the model's scale is only known once ComfyUI loads it
UPSCALE_FEATURE_CHANNELS = 64      # ESRGAN/RRDB feature width; two such maps alive at the output resolution
DECODE_BUDGET_INPUT = "budget_gb"
BUDGET_DECODE_CLASSES = {"H3DirectorDecodeAVStreaming"}   # take `budget_gb` even where the export left it out
ACCEL_RESOURCE = "h3_accel_mb"     # Ray custom resource: a device's accelerator memory, MiB
HOST_RESOURCE = "h3_host_mb"       # Ray custom resource: the host RAM that device's jobs may use, MiB


def to_mb(nbytes: int) -> int:
    """Bytes -> whole MiB, rounded up (Ray's resource unit here)."""
    return max(1, math.ceil(nbytes / MiB))


@dataclass(frozen=True)
class Rung:
    """One setting of a job: `settings` (what it changes, for reports and `node_inputs`), the predicted
    accelerator and host peaks (bytes), the priced phases, and the planner's estimate they come from (None for
    stitch and upscale jobs, which the planner's H3 estimate does not cover)."""

    index: int
    settings: dict
    device_bytes: int
    host_bytes: int
    plan: PlanEstimate | None = field(repr=False, compare=False)
    phases: tuple[Phase, ...] = field(default=(), repr=False, compare=False)

    def table(self) -> str:
        """The priced phases as text (GiB)."""
        rows = [f"{'phase':<14}{'device':>10}{'host RAM':>10}  detail"]
        rows += [f"{p.name:<14}{p.device_bytes / 2**30:>9.2f}G{p.host_bytes / 2**30:>9.2f}G  {p.detail}"
                 for p in self.phases]
        return "\n".join(rows)

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
    """A simulated or declared device: its name, accelerator memory and host RAM (bytes).

    A rung fits it as the planner fits a plan to a budget (`plan.recommend.Budget` with its default margin and
    reserve): the predicted need within `usable_accel_bytes` and `usable_host_bytes`, so the farm places a job
    where `h3director plan` says it fits, never at the card's last byte."""

    name: str
    accel_bytes: int
    host_bytes: int

    @property
    def accel_mb(self) -> int:
        return self.accel_bytes // MiB

    @property
    def host_mb(self) -> int:
        return self.host_bytes // MiB

    @property
    def usable_accel_bytes(self) -> int:
        return Budget(self.accel_bytes, self.host_bytes).device_usable

    @property
    def usable_host_bytes(self) -> int:
        return Budget(self.accel_bytes, self.host_bytes).host_usable

    def fits(self, rung: Rung) -> bool:
        return rung.device_bytes <= self.usable_accel_bytes and rung.host_bytes <= self.usable_host_bytes


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
    """The phases a workflow with these node classes runs, in run order."""
    phases = []
    if classes & TEXT_CLASSES:
        phases.append("text_encoding")
    if classes & SAMPLING_CLASSES:
        phases.append("sampling")
    if any("Decode" in c for c in classes):
        phases.append("decode")
    if classes & UPSCALE_CLASSES:
        phases.append("upscale")
    if classes & STITCH_CLASSES:
        phases.append("stitch")
    return phases


def _literal(node: dict, name: str):
    value = node.get("inputs", {}).get(name)
    return None if isinstance(value, list) else value


def _nodes(workflow: dict, class_type: str) -> list[tuple[str, dict]]:
    return [(node_id, node) for node_id, node in workflow.items() if node["class_type"] == class_type]


@dataclass(frozen=True)
class WorkflowSettings:
    """What a ComfyUI workflow loads and sets, in the planner's terms (see the module docstring).

    `weights`: the DiT's planner format and `weights_from` how it was read; `text_encoder_*`: the CLIPLoader's
    file format and device ("gpu"/"cpu"), `text_encoder_movable` when its ``device`` is a literal a rung may set;
    `head_chunks`/`ffn_chunks`, `offload_blocks`: the workflow's own values; `chunk_node`/`swap_node`: whether a
    node applies other values; `audio`: whether audio is decoded."""

    weights: str = "bf16"
    weights_from: str = "no DiT loader: the release's bf16"
    text_encoder_weights: str = "bf16"
    text_encoder_device: str = "gpu"
    text_encoder_movable: bool = False
    head_chunks: int = 1
    ffn_chunks: int = 1
    chunk_node: bool = False
    offload_blocks: int = 0
    swap_node: bool = False
    audio: bool = True


def comfy_model_dirs(base_dir: str | os.PathLike | None) -> tuple[Path, ...]:
    """The folders of a ComfyUI base where DiT files live (``models/diffusion_models``, ``models/unet``)."""
    if not base_dir:
        return ()
    return tuple(Path(base_dir) / "models" / name for name in ("diffusion_models", "unet"))


def _gguf_format(name: str, model_dirs: Sequence[Path]) -> tuple[str, str]:
    """(planner format, how it was read) of the GGUF DiT `name`: its header when found in `model_dirs`, else
    the name; `InvalidInputError` when neither tells."""
    for folder in model_dirs:
        path = Path(folder) / name
        if path.is_file():
            fmt = caps.gguf_file_format(path)
            return fmt, f"{caps.GGUF_TYPES[fmt]} from the header of {path}"
    fmt = caps.gguf_format_from_name(name)
    if fmt is None:
        where = f" (not found in {', '.join(map(str, model_dirs))})" if model_dirs else ""
        raise InvalidInputError(f"cannot tell the GGUF type of {name!r}{where}: name the file with its type "
                                f"({', '.join(caps.GGUF_TYPES.values())}) or give the ComfyUI base that holds it")
    return fmt, f"{caps.GGUF_TYPES[fmt]} from the file name"


def read_settings(workflow: dict, model_dirs: Sequence[Path] = ()) -> WorkflowSettings:
    """The `WorkflowSettings` of an API-format `workflow`. Raises `InvalidInputError` for a GGUF whose type cannot
    be told, two different DiT loaders, or a ``blocks_offloaded`` outside 0 to the DiT's blocks."""
    found: dict = {}
    loaders = []
    for _, node in _nodes(workflow, GGUF_LOADER_CLASS):
        name = _literal(node, "gguf_name")
        if not isinstance(name, str):
            raise InvalidInputError(f"{GGUF_LOADER_CLASS}: gguf_name must be a file name, got {name!r}")
        loaders.append(_gguf_format(name, model_dirs))
    for _, node in _nodes(workflow, UNET_LOADER_CLASS):
        dtype = str(_literal(node, "weight_dtype") or "default")
        file_name = str(_literal(node, "unet_name") or "")
        name = file_name.lower()
        if dtype.startswith("fp8"):
            loaders.append(("fp8", f"UNETLoader weight_dtype {dtype}"))
            continue
        found_file = next((Path(d) / file_name for d in model_dirs if file_name and (Path(d) / file_name).is_file()),
                          None)
        layers = caps.comfy_dit_file_format(found_file) if found_file and name.endswith(".safetensors") else None
        if layers is not None:
            loaders.append((layers, f"UNETLoader, {layers} layers read from {found_file}"))
        elif "int8" in name:
            fmt = "int8_convrot" if "convrot" in name else "int8"
            loaders.append((fmt, f"UNETLoader, an {fmt} file (by its name)"))
        elif "nvfp4" in name:
            loaders.append(("nvfp4", "UNETLoader, an nvfp4 file (by its name)"))
        elif "fp8" in name or "e4m3" in name:
            loaders.append(("fp8", "UNETLoader, an fp8 file (by its name)"))
        else:
            loaders.append(("bf16", "UNETLoader weight_dtype default"))
    if len({fmt for fmt, _ in loaders}) > 1:
        raise InvalidInputError(f"the workflow loads DiTs in several formats ({sorted({f for f, _ in loaders})}); "
                                "a job is priced for one")
    if loaders:
        found["weights"], found["weights_from"] = loaders[0]
    for _, node in _nodes(workflow, CLIP_LOADER_CLASS):
        name = str(_literal(node, "clip_name") or "").lower()
        found["text_encoder_weights"] = "fp8" if ("fp8" in name or "e4m3" in name) else "bf16"
        device = node.get("inputs", {}).get("device", "default")
        found["text_encoder_device"] = "cpu" if device == "cpu" else "gpu"
        found["text_encoder_movable"] = not isinstance(device, list)
    blocks = DiTShape.from_config(None).layers
    for _, node in _nodes(workflow, DIT_MEMORY_CLASS):
        found["chunk_node"] = True
        heads, ffn = _literal(node, "head_chunks"), _literal(node, "ffn_chunks")
        if _literal(node, "mode") == "fixed" and isinstance(heads, int) and isinstance(ffn, int):
            found["head_chunks"], found["ffn_chunks"] = heads, ffn
    for _, node in _nodes(workflow, BLOCK_SWAP_CLASS):
        found["swap_node"] = True
        count = _literal(node, "blocks_offloaded")
        if count is not None:
            if not isinstance(count, int) or isinstance(count, bool) or not 0 <= count <= blocks:
                raise InvalidInputError(f"{BLOCK_SWAP_CLASS}: blocks_offloaded must be 0 to the DiT's {blocks} "
                                        f"blocks, got {count!r}")
            found["offload_blocks"] = count
    found["audio"] = _has_audio(workflow)
    return WorkflowSettings(**found)


def _has_audio(workflow: dict) -> bool:
    """Whether the workflow decodes audio: an audio node, or a decode node with ``audio_vae`` connected."""
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


def stitch_phase(frames: int, width: int, height: int, overlap: int) -> Phase:
    """The stitch node's memory for a joined result of `frames` frames: both float32 IMAGE inputs (``frames +
    overlap`` frames together) and the result, in host RAM; nothing on the accelerator."""
    frame = width * height * 3 * 4
    return Phase("stitch", 0, 0, (2 * frames + overlap) * frame,
                 f"float32 IMAGE: inputs {frames + overlap} frames + result {frames} frames")


def upscale_phase(frames: int, width: int, height: int, tile: int, images_linked: bool) -> Phase:
    """A bound for the streaming upscale: on the accelerator one tile in, one out and two feature maps of
    `UPSCALE_FEATURE_CHANNELS` at the output resolution (float32; `UPSCALE_ASSUMED_SCALE`, the model's scale
    being unknown until it loads); in host RAM one input and one output frame, plus the whole float32 video when
    the frames arrive as an IMAGE input (`images_linked`). Not calibrated: the model's own weights (tens of MB for
    ESRGAN-family models) are inside the slack."""
    s = UPSCALE_ASSUMED_SCALE
    side = min(tile, max(width, height))
    device = side * side * 4 * (3 + s * s * (3 + 2 * UPSCALE_FEATURE_CHANNELS))
    frame = width * height * 3 * 4
    host = frame * (1 + s * s) + (frames * frame if images_linked else 0)
    return Phase("upscale", 0, device, host, f"tile {side}px, x{s} assumed, float32")


def _rung(index: int, request: PlanRequest, phases: list[str], settings: dict, extra=()) -> Rung:
    plan = estimate(request)
    priced = [p for p in plan.phases if p.name in phases] + list(extra)
    return Rung(index, settings, max(p.device_bytes for p in priced), max(p.host_bytes for p in priced), plan,
                tuple(priced))


def _with_text_encoder(request: PlanRequest, phases: list[str], wf: WorkflowSettings) -> PlanRequest:
    """`request` with the text encoder on the CPU where the workflow lets a rung move it and on the accelerator
    it would be the largest device phase (the planner's rule: it must not decide the job's need)."""
    if "text_encoding" not in phases or not wf.text_encoder_movable or wf.text_encoder_device == "cpu":
        return request
    plan = estimate(request)
    te = next(p for p in plan.phases if p.name == "text_encoding")
    others = [p.device_bytes for p in plan.phases if p.name in phases and p.name != "text_encoding"]
    if others and te.device_bytes > max(others):
        return dataclasses.replace(request, text_encoder_device="cpu")
    return request


def _sampling_rungs(base: PlanRequest, phases: list[str], wf: WorkflowSettings, heads: int,
                    decode_budget: bool) -> list[Rung]:
    """Sampling rungs in the planner's preference order (see the module docstring), each cheaper on the device."""
    pairs = chunkings(heads, base.weights, base.target) if wf.chunk_node else [(wf.head_chunks, wf.ffn_chunks)]
    blocks = DiTShape.from_config(base.dit_config).layers
    order = [(h, f, wf.offload_blocks) for h, f in pairs]
    if wf.swap_node:
        h, f = pairs[-1]
        order += [(h, f, n) for n in range(wf.offload_blocks + 1, blocks + 1)]
    rungs: list[Rung] = []
    for h, f, offload in order:
        request = _with_text_encoder(dataclasses.replace(base, head_chunks=h, ffn_chunks=f, offload_blocks=offload),
                                     phases, wf)
        settings: dict = {}
        if wf.chunk_node:
            settings.update(head_chunks=h, ffn_chunks=f)
        if wf.swap_node:
            settings["blocks_offloaded"] = offload
        if wf.text_encoder_movable and "text_encoding" in phases:
            settings["text_encoder_device"] = "cpu" if request.text_encoder_device == "cpu" else "default"
        if decode_budget and "decode" in phases:
            decode = next(p for p in estimate(request).phases if p.name == "decode")
            settings["budget_gb"] = caps.decode_budget_gb(decode.device_bytes)
        rung = _rung(len(rungs), request, phases, settings)
        if not rungs or rung.device_bytes < rungs[-1].device_bytes:
            rungs.append(rung)
    return rungs


def missing_nodes_hint(job, workers: Sequence[WorkerSpec], model_dirs: Sequence[Path] = ()) -> str:
    """For a ComfyUI sampling job no worker fits: which of the DiT Memory and block-swap nodes the workflow lacks
    and, priced as if it had them, the first rung a worker would fit ("" when it has both, when even then none
    fits, or for other jobs)."""
    if getattr(job, "diffusers", None) is not None or not job.classes & SAMPLING_CLASSES:
        return ""
    wf = read_settings(job.workflow, model_dirs)
    missing = [name for name, has in ((DIT_MEMORY_CLASS, wf.chunk_node), (BLOCK_SWAP_CLASS, wf.swap_node)) if not has]
    if not missing:
        return ""
    with_nodes = dataclasses.replace(wf, chunk_node=True, swap_node=True)
    base = PlanRequest(width=job.width, height=job.height, frames=job.frames, audio=wf.audio, weights=wf.weights,
                       text_encoder_weights=wf.text_encoder_weights, text_encoder_device=wf.text_encoder_device)
    phases = phases_of(job.classes)
    rungs = _sampling_rungs(base, phases, dataclasses.replace(with_nodes, text_encoder_movable=True),
                            DiTShape.from_config(None).heads, False)
    fit = next((r for r in rungs if any(w.fits(r) for w in workers)), None)
    if fit is None:
        return ""
    settings = ", ".join(f"{k} {v}" for k, v in fit.settings.items())
    return (f"with {' and '.join(missing)} in the workflow (and CLIPLoader's device free to move) it would start "
            f"at {settings}: device {format_size(fit.device_bytes)}, host {format_size(fit.host_bytes)}")


def ladder(job, model_dirs: Sequence[Path] = ()) -> list[Rung]:
    """The rungs for a `jobs.Job`, most generous first. `model_dirs`: where the workflow's DiT files may be read
    (`comfy_model_dirs`), for a GGUF's type. Raises `InvalidInputError` when the workflow runs nothing priced,
    its geometry is unknown or off H3's grid, or what it loads cannot be priced (`read_settings`)."""
    spec = getattr(job, "diffusers", None)
    phases = ["sampling", "decode"] if spec is not None else phases_of(job.classes)
    if not phases:
        raise InvalidInputError("the workflow runs no phase the planner prices (text encoding, sampling, decode, "
                                "upscale or stitch)")
    missing = [name for name in ("frames", "width", "height") if getattr(job, name) is None]
    if missing:
        raise InvalidInputError(f"cannot price the job: no {', '.join(missing)} in the job line or the workflow")
    wf = WorkflowSettings() if spec is not None else read_settings(job.workflow, model_dirs)
    base = PlanRequest(width=job.width, height=job.height, frames=job.frames, audio=wf.audio, weights=wf.weights,
                       text_encoder_weights=wf.text_encoder_weights, text_encoder_device=wf.text_encoder_device,
                       head_chunks=wf.head_chunks, ffn_chunks=wf.ffn_chunks, offload_blocks=wf.offload_blocks,
                       target="diffusers" if spec is not None else "comfyui")
    base.validate()
    if "sampling" in phases:
        if spec is not None:
            wf = dataclasses.replace(wf, chunk_node=True)
        heads = spec.heads if spec is not None else DiTShape.from_config(None).heads
        return _sampling_rungs(base, phases, wf, heads, spec is None and _takes_decode_budget(job.workflow))
    extra = []
    if "stitch" in phases:
        overlaps = [v for _, n in _nodes(job.workflow, "H3DirectorStitch") if isinstance(v := _literal(n, "overlap"), int)]
        extra.append(stitch_phase(job.frames, job.width, job.height, max(overlaps, default=0)))
    if "upscale" in phases:
        for _, node in _nodes(job.workflow, "H3DirectorUpscaleStreaming"):
            tile = _literal(node, "tile")
            extra.append(upscale_phase(job.frames, job.width, job.height, tile if isinstance(tile, int) else 512,
                                       isinstance(node.get("inputs", {}).get("images"), list)))
    if "decode" not in phases and "text_encoding" not in phases:
        return [Rung(0, {}, max(p.device_bytes for p in extra), max(p.host_bytes for p in extra), None, tuple(extra))]
    tiles_paths = DECODE_TILES
    if not _takes_decode_budget(job.workflow):        # nothing applies a cheaper rung: price the stock decode only
        tiles_paths = DECODE_TILES[:1]
    rungs: list[Rung] = []
    for tiles in tiles_paths:
        request = dataclasses.replace(base, decode_tiles_per_call=tiles)
        decode = next(p for p in estimate(request).phases if p.name == "decode")
        rung = _rung(len(rungs), request, phases,
                     {"decode": "reference" if tiles is None else f"{tiles} tiles/call",
                      "budget_gb": caps.decode_budget_gb(decode.device_bytes)}, extra)
        if not rungs or rung.device_bytes < rungs[-1].device_bytes:
            rungs.append(rung)
    return rungs


def node_inputs(rung: Rung, workflow: dict) -> dict[str, dict]:
    """{node_id: inputs to set} that put `rung`'s settings into `workflow` (the registry's nodes and inputs)."""
    changes: dict[str, dict] = {}
    s = rung.settings
    for node_id, node in workflow.items():
        kind = node["class_type"]
        if "head_chunks" in s and kind == DIT_MEMORY_CLASS:
            changes[node_id] = {"mode": "fixed", "head_chunks": s["head_chunks"], "ffn_chunks": s["ffn_chunks"]}
        elif "blocks_offloaded" in s and kind == BLOCK_SWAP_CLASS:
            changes[node_id] = {"blocks_offloaded": s["blocks_offloaded"]}
        elif "text_encoder_device" in s and kind == CLIP_LOADER_CLASS and \
                not isinstance(node.get("inputs", {}).get("device"), list):
            changes[node_id] = {"device": s["text_encoder_device"]}
        elif "budget_gb" in s and _takes_budget(node):
            changes[node_id] = {DECODE_BUDGET_INPUT: s["budget_gb"]}
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
    lines += [f"  worker {w.name}: device {format_size(w.accel_bytes)} (usable {format_size(w.usable_accel_bytes)}), "
              f"host {format_size(w.host_bytes)} (usable {format_size(w.usable_host_bytes)})" for w in workers]
    lines.append("  the cheapest setting's plan:")
    lines += ["    " + row for row in rungs[-1].table().splitlines()]
    raise BudgetError("\n".join(lines))


def next_rung(rungs: list[Rung], index: int) -> int | None:
    """The next cheaper rung after `index`, or None when there is none."""
    return index + 1 if index + 1 < len(rungs) else None


__all__ = ["ACCEL_RESOURCE", "HOST_RESOURCE", "Rung", "WorkerSpec", "WorkflowSettings", "apply_rung",
           "comfy_model_dirs", "first_rung", "ladder", "missing_nodes_hint", "next_rung", "parse_workers",
           "read_settings"]
