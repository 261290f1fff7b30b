"""The plan writes the workflow: a ComfyUI API-format workflow that applies every recommended setting.

`comfy_workflow(request, files, spec)` turns a `PlanRequest` (normally `Recommendation.request`) and the user's
model file names into the node graph of the examples (`examples/h3_t2v_streaming_api.json`,
`h3_i2v_streaming_api.json`):

    DiT loader -> [H3DirectorBlockSwap] -> [H3DirectorDiTMemory] -> MiniMaxH3SigmaShift -> KSampler
    CLIPLoader + video VAELoader (+ LoadImage) -> MiniMaxH3ImageToVideo -> positive / latent; ConditioningZeroOut
    KSampler -> H3DirectorDecodeAVStreaming (video VAE, audio VAE) -> MP4; without audio, KSampler ->
    H3DirectorVideoStream -> the decode with the video VAE only

The settings come from `capabilities.applied_settings(request, "comfyui")` only: each `AppliedSetting`'s inputs
are set on the node it names (the DiT loader, CLIPLoader, the decode node), and a model patch node it names is
inserted into the MODEL chain. A setting whose node has no place in this graph is an error (`InvalidInputError`),
never silently dropped; one applied by ``h3_config.yaml`` (no node) is returned in `Workflow.config`.

`staged_workflows(...)` writes the two prompts of staged generation (see `plan.staged`).

Only strings and numbers are written here: nothing imports ComfyUI.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from h3director import geometry
from h3director.errors import InvalidInputError
from h3director.plan.capabilities import (
    BLOCK_SWAP_NODE,
    DIT_MEMORY_NODE,
    GGUF_LOADER_NODE,
    GGUF_TYPES,
    REGISTRY,
    applied_settings,
    check_target,
    weights_capability,
)

# The user's file name goes into these inputs, whatever a setting's placeholder says.
FILE_INPUTS = ("unet_name", "gguf_name", "clip_name", "vae_name")
# Model patch nodes, in the order they wrap the loaded DiT (block placement first, then the block forward).
MODEL_PATCH_ORDER = (BLOCK_SWAP_NODE, DIT_MEMORY_NODE)
# Inputs a patch node needs besides those a setting gives (the node's own defaults).
PATCH_DEFAULTS = {DIT_MEMORY_NODE: {"mode": "fixed", "budget_gb": 0.0}}
DIT_LOADERS = ("UNETLoader", GGUF_LOADER_NODE)
DIT_EXTENSIONS = {".safetensors": "safetensors", ".sft": "safetensors", ".gguf": "gguf"}
TEXT_ENCODER_EXTENSIONS = (".safetensors", ".sft")
VAE_EXTENSIONS = (".safetensors", ".sft")
TEXT_ENCODER_FORMATS = ("bf16", "fp8")   # what CLIPLoader reads for H3's Qwen3-VL (no GGUF text encoder loader)
DEFAULT_PROMPT = "A red fox trots through fresh snow at dawn, its breath steaming; soft crunch of footsteps."
SHIFT_VIDEO, SHIFT_AUDIO = 12.0, 3.0      # MiniMaxH3SigmaShift defaults (the reference's flow shifts)


def loadable_formats(formats: Iterable[str], target: str = "comfyui") -> tuple[str, ...]:
    """The DiT weight formats of `formats` (in order) that a loader of `target` reads (the registry's
    executors): what a plan that writes a workflow or script may choose."""
    check_target(target)
    return tuple(f for f in formats if weights_capability(f) in REGISTRY
                 and REGISTRY[weights_capability(f)].executor(target) is not None)


@dataclass(frozen=True)
class ModelFiles:
    """The user's model file names as ComfyUI lists them (relative to models/diffusion_models, text_encoders,
    vae). `audio_vae` may be None only for a plan without audio."""

    dit: str | None = None
    text_encoder: str | None = None
    vae: str | None = None
    audio_vae: str | None = None

    def check(self, request) -> None:
        """`InvalidInputError` naming every missing file the workflow of `request` needs, or a DiT file whose
        format is not the plan's (a GGUF plan needs a .gguf, a bf16/fp8 plan a .safetensors)."""
        needed = [("--dit", self.dit), ("--text-encoder", self.text_encoder), ("--vae", self.vae)]
        if request.audio:
            needed.append(("--audio-vae", self.audio_vae))
        missing = [flag for flag, value in needed if not value]
        if missing:
            raise InvalidInputError(f"the workflow needs the model file names {', '.join(missing)} "
                                    "(as ComfyUI lists them, e.g. --dit minimax_h3_dit_bf16.safetensors)")
        kind = dit_file_kind(self.dit)
        plan_gguf = request.weights in GGUF_TYPES
        if plan_gguf != (kind == "gguf"):
            want = f"a .gguf holding {GGUF_TYPES[request.weights]}" if plan_gguf else "a .safetensors file"
            raise InvalidInputError(f"--dit {self.dit} does not match the plan's DiT weights {request.weights}: "
                                    f"it loads {want}")
        for flag, name, allowed in (("--text-encoder", self.text_encoder, TEXT_ENCODER_EXTENSIONS),
                                    ("--vae", self.vae, VAE_EXTENSIONS), ("--audio-vae", self.audio_vae, VAE_EXTENSIONS)):
            if name and os.path.splitext(name)[1].lower() not in allowed:
                raise InvalidInputError(f"{flag} {name}: unknown weights format {os.path.splitext(name)[1]!r}; "
                                        f"ComfyUI's loader reads {', '.join(allowed)}")


def dit_file_kind(name: str) -> str:
    """"safetensors" or "gguf" from a DiT file name's extension; `InvalidInputError` for any other."""
    ext = os.path.splitext(name)[1].lower()
    if ext not in DIT_EXTENSIONS:
        raise InvalidInputError(f"--dit {name}: unknown weights format {ext or '(no extension)'!r}; expected "
                                f"{', '.join(DIT_EXTENSIONS)}")
    return DIT_EXTENSIONS[ext]


@dataclass(frozen=True)
class RunSpec:
    """What the workflow shows besides the plan's settings: the prompt, sampler and output name. `image`: a
    first frame (image-to-video), a file name in ComfyUI's input folder; None for text-to-video."""

    prompt: str = DEFAULT_PROMPT
    seed: int = 42
    steps: int = 30
    cfg: float = 4.0
    image: str | None = None
    filename_prefix: str = "video/H3Director"
    fps: float = float(geometry.VIDEO_FPS)
    crf: int = 18


@dataclass
class Workflow:
    """An API-format workflow (`graph`: node id -> {"class_type", "inputs", "_meta"}), the settings it applies,
    and the ``h3_config.yaml`` keys a setting needs that no node applies (`config`)."""

    graph: dict[str, dict]
    settings: tuple = ()
    config: dict[str, Any] = field(default_factory=dict)

    def file_notes(self, request, files: ModelFiles) -> list[str]:
        """What the named files must hold for the plan to be true (a loader reads a file as it is)."""
        notes = []
        if request.weights in GGUF_TYPES:
            notes.append(f"--dit {files.dit} must hold {GGUF_TYPES[request.weights]} (h3director weights convert "
                         f"--type {GGUF_TYPES[request.weights]})")
        if request.text_encoder_weights != "bf16":
            notes.append(f"the plan prices the text encoder in {request.text_encoder_weights}: --text-encoder "
                         f"{files.text_encoder} must be an {request.text_encoder_weights} file (CLIPLoader reads it "
                         "as stored)")
        return notes


class _Graph:
    """Node ids "1", "2", ... in the order nodes are added."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict] = {}

    def add(self, class_type: str, inputs: Mapping[str, Any], title: str | None = None) -> str:
        node_id = str(len(self.nodes) + 1)
        self.nodes[node_id] = {"class_type": class_type, "inputs": dict(inputs)}
        if title:
            self.nodes[node_id]["_meta"] = {"title": title}
        return node_id

    def find(self, class_type: str) -> str | None:
        return next((k for k, v in self.nodes.items() if v["class_type"] == class_type), None)


def _merge(node: dict, inputs: Mapping[str, Any]) -> None:
    node["inputs"].update({k: v for k, v in inputs.items() if k not in FILE_INPUTS})


def _model_chain(settings: Iterable, dit_loader: str, g: _Graph) -> str:
    """Insert the model patch nodes the settings name after the DiT loader; returns the last MODEL node id."""
    patches = {s.node: s for s in settings if s.node in MODEL_PATCH_ORDER}
    model = dit_loader
    for class_type in MODEL_PATCH_ORDER:
        if class_type in patches:
            inputs = {"model": [model, 0], **PATCH_DEFAULTS.get(class_type, {}), **patches[class_type].inputs}
            model = g.add(class_type, inputs)
    return model


def _loaders(request, files: ModelFiles, settings, g: _Graph) -> dict[str, str]:
    """The loader nodes (DiT, text encoder, VAEs) with the user's file names; returns their ids by role."""
    weights = next((s for s in settings if s.node in DIT_LOADERS), None)
    if weights is None:
        raise InvalidInputError(f"no DiT loader applies weights {request.weights!r} in ComfyUI")
    if weights.node == "H3DirectorGGUFDiTLoader":
        dit = g.add(weights.node, {"gguf_name": files.dit, "weight_dtype": "default"}, "H3 DiT (GGUF)")
    else:
        dit = g.add(weights.node, {"unet_name": files.dit, "weight_dtype": "default"}, "H3 DiT")
    _merge(g.nodes[dit], weights.inputs)
    clip = g.add("CLIPLoader", {"clip_name": files.text_encoder, "type": "minimax", "device": "default"},
                 "H3 text encoder")
    vae = g.add("VAELoader", {"vae_name": files.vae}, "H3 video VAE")
    ids = {"dit": dit, "clip": clip, "vae": vae}
    if request.audio:
        ids["audio_vae"] = g.add("VAELoader", {"vae_name": files.audio_vae}, "H3 audio VAE")
    return ids


def _apply_node_settings(settings, g: _Graph) -> dict[str, Any]:
    """Set each setting's inputs on the node it names; returns the config keys of settings without a node.
    Raises `InvalidInputError` for a setting whose node is not in the graph."""
    config: dict[str, Any] = {}
    for setting in settings:
        if setting.node is None:
            config.update(getattr(setting, "config", None) or {})
            continue
        if setting.node in MODEL_PATCH_ORDER or setting.node in DIT_LOADERS:
            continue                                   # placed by _loaders / _model_chain
        node_id = g.find(setting.node)
        if node_id is None:
            raise InvalidInputError(f"setting {setting.capability} is applied by node {setting.node}, which the "
                                    "workflow writer has no place for")
        _merge(g.nodes[node_id], setting.inputs)
    return config


def _conditioning(request, ids: dict, spec: RunSpec, g: _Graph, *, width: int, height: int, frames: int) -> str:
    inputs = {"clip": [ids["clip"], 0], "vae": [ids["vae"], 0], "prompt": spec.prompt,
              "width": width, "height": height, "length": frames}
    if spec.image:
        inputs["first_frame"] = [g.add("LoadImage", {"image": spec.image}, "first frame"), 0]
    return g.add("MiniMaxH3ImageToVideo", inputs)


def _sampler(model: str, cond: str, latent: list, spec: RunSpec, g: _Graph, denoise: float = 1.0) -> str:
    negative = g.add("ConditioningZeroOut", {"conditioning": [cond, 0]})
    return g.add("KSampler", {"model": [model, 0], "seed": spec.seed, "steps": spec.steps, "cfg": spec.cfg,
                              "sampler_name": "euler", "scheduler": "simple", "positive": [cond, 0],
                              "negative": [negative, 0], "latent_image": latent, "denoise": denoise})


def _decode(samples: list, ids: dict, spec: RunSpec, g: _Graph, *, audio: bool, fps: float, prefix: str) -> str:
    inputs = {"samples": samples, "vae": [ids["vae"], 0], "output": "video_file", "filename_prefix": prefix,
              "fps": fps, "crf": spec.crf, "budget_gb": 0.0}
    if audio:
        inputs["audio_vae"] = [ids["audio_vae"], 0]
    return g.add("H3DirectorDecodeAVStreaming", inputs)


def _check_request(request) -> None:
    request.validate()
    if request.refs:
        raise InvalidInputError("the workflow writer covers text-to-video and image-to-video (--image); reference "
                                "images (--refs) need MiniMaxH3ReferenceToVideo, which it does not write")


def comfy_workflow(request, files: ModelFiles, spec: RunSpec = RunSpec()) -> Workflow:
    """The ComfyUI API-format workflow that runs `request` with its settings (see the module docstring).

    `request.keyframes` must be 1 with `spec.image` (the first frame is one keyframe) and 0 without; refs are
    refused. Raises `InvalidInputError` for a missing or mismatched file name and for any setting this graph
    cannot apply, before anything is written."""
    _check_request(request)
    if request.keyframes != (1 if spec.image else 0):
        raise InvalidInputError(f"the plan counts {request.keyframes} keyframe(s) but the workflow has "
                                f"{'a first frame' if spec.image else 'none'}: plan image-to-video with --image")
    files.check(request)
    g, settings, ids, model, cond = _front(request, files, spec)
    sampled = _sampler(model, cond, [cond, 1], spec, g)
    if not request.audio:     # no audio output: decode the video stream only (no audio VAE loaded)
        sampled = g.add("H3DirectorVideoStream", {"samples": [sampled, 0]})
    _decode([sampled, 0], ids, spec, g, audio=request.audio, fps=spec.fps, prefix=spec.filename_prefix)
    config = _apply_node_settings(settings, g)
    return Workflow(graph=g.nodes, settings=settings, config=config)


def _check_text_encoder(request) -> None:
    if request.text_encoder_weights not in TEXT_ENCODER_FORMATS:
        raise InvalidInputError(f"the plan needs the text encoder in {request.text_encoder_weights}, which no "
                                f"ComfyUI loader reads (CLIPLoader: {', '.join(TEXT_ENCODER_FORMATS)})")


def _front(request, files: ModelFiles, spec: RunSpec):
    """Loaders, the MODEL chain with its patches, the sigma shift and the conditioning of `request`:
    (graph, settings, loader ids, model node id, conditioning node id)."""
    _check_text_encoder(request)
    settings = applied_settings(request, "comfyui")
    g = _Graph()
    ids = _loaders(request, files, settings, g)
    model = _model_chain(settings, ids["dit"], g)
    model = g.add("MiniMaxH3SigmaShift", {"model": [model, 0], "shift_video": SHIFT_VIDEO, "shift_audio": SHIFT_AUDIO})
    cond = _conditioning(request, ids, spec, g, width=request.width, height=request.height, frames=request.frames)
    return g, settings, ids, model, cond


DRAFT_LATENT_PREFIX = "latents/h3_draft"


def draft_latent_name(prefix: str = DRAFT_LATENT_PREFIX) -> str:
    """The file SaveLatent writes first for `prefix` (``output/<prefix>_00001_.latent``), as LoadLatent lists it
    once copied into ComfyUI's input folder (its base name)."""
    return f"{os.path.basename(prefix)}_00001_.latent"


def staged_workflows(draft_request, final_request, files: ModelFiles, spec: RunSpec = RunSpec(), *,
                     denoise: float, draft_fps: float,
                     draft_latent: str | None = None) -> tuple[Workflow, Workflow]:
    """The two prompts of staged generation (`plan.staged`): stage one samples `draft_request` (video-only:
    ``audio_rows`` False) and saves its video latent with SaveLatent under `DRAFT_LATENT_PREFIX`, plus a
    preview MP4 at `draft_fps`; stage two loads `draft_latent` (default `draft_latent_name()`, to be copied
    from ComfyUI's output/latents/ into its input folder), resizes it onto the final AV latent and samples
    that at `denoise` with the final request's settings, ending in the streaming decode with audio.
    `InvalidInputError` for a stage-one request with audio, the two stages on different DiT weights, or
    keyframes the workflow does not have.

    Both stages load the same files (`files`); the draft request must use the final's DiT weights format."""
    for request in (draft_request, final_request):
        _check_request(request)
        if request.keyframes != (1 if spec.image else 0):
            raise InvalidInputError(f"the plan counts {request.keyframes} keyframe(s) but the workflow has "
                                    f"{'a first frame' if spec.image else 'none'}: plan image-to-video with --image")
    if draft_request.audio_rows or draft_request.audio:
        raise InvalidInputError("stage one is a video-only draft: its request must have audio_rows=False, audio=False")
    if draft_request.weights != final_request.weights:
        raise InvalidInputError(f"both stages load one DiT file: draft weights {draft_request.weights} differ from "
                                f"the final's {final_request.weights}")
    files.check(final_request)

    g, settings, ids, model, cond = _front(draft_request, files, spec)
    video_only = g.add("H3DirectorVideoOnlyLatent", {"samples": [cond, 1]})
    sampled = _sampler(model, cond, [video_only, 0], spec, g)
    video = g.add("H3DirectorVideoStream", {"samples": [sampled, 0]})
    g.add("SaveLatent", {"samples": [video, 0], "filename_prefix": DRAFT_LATENT_PREFIX}, "draft latent for stage two")
    _decode([video, 0], ids, spec, g, audio=False, fps=round(draft_fps, 3), prefix=spec.filename_prefix + "_draft")
    stage_one = Workflow(graph=g.nodes, settings=settings, config=_apply_node_settings(settings, g))

    g, settings, ids, model, cond = _front(final_request, files, spec)
    loaded = g.add("LoadLatent", {"latent": draft_latent or draft_latent_name()}, "stage one's draft latent")
    start = g.add("H3DirectorDraftToAV", {"draft": [loaded, 0], "samples": [cond, 1]})
    sampled = _sampler(model, cond, [start, 0], spec, g, denoise=denoise)
    _decode([sampled, 0], ids, spec, g, audio=final_request.audio, fps=spec.fps, prefix=spec.filename_prefix)
    stage_two = Workflow(graph=g.nodes, settings=settings, config=_apply_node_settings(settings, g))
    return stage_one, stage_two


__all__ = ["ModelFiles", "RunSpec", "Workflow", "comfy_workflow", "dit_file_kind", "draft_latent_name",
           "loadable_formats", "staged_workflows"]
