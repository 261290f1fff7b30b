"""The capability registry: every setting the director can recommend, and what applies it.

A *capability* is one kind of setting the planner may choose (a DiT weight format, head/FFN chunking, a block
offload count, a text-encoder file and placement, a decode setting, the decode buffer pool, ...). Each has:

- `comfy`: the ComfyUI executor, the node class (``class_type`` as in an API-format workflow) and the inputs it
  sets; None when nothing in ComfyUI (core or this pack) applies it;
- `diffusers`: the library executor, the dotted callable and a template of the call; None when nothing in the
  diffusers path applies it;
- a `ConfigExecutor` in either place when an ``h3_config.yaml`` key applies it (the decode buffer pool);
- `exactness`: one of `EXACTNESS` (design guide, "Exactness classes") for what the setting does to the output;
- `cost`: where the planner prices it (the `PlanRequest` field and the function of `plan/` that turns it into
  bytes).

Invariant: the planner recommends a capability for a target only when `Capability.executor(target)` is not None,
and every recommended value is turned into an `AppliedSetting` by `applied_settings` (the plan's printout, the
workflow writer, `oom`'s advice and the farm's pricing read those, never their own tables).

What loads what (checked in the vendored ComfyUI, ``.comfy/ComfyUI``):

- DiT bf16 / fp8: ``UNETLoader`` (nodes.py) with ``weight_dtype`` default / fp8_e4m3fn;
- DiT int8: ``UNETLoader`` with ``weight_dtype`` default on a file that carries ComfyUI's per-layer quantisation
  metadata (``<layer>.comfy_quant``, format ``int8_tensorwise`` in comfy/quant_ops.py ``QUANT_ALGOS``), read by
  ``load_diffusion_model_state_dict`` (comfy/sd.py) into mixed-precision ops. diffusers has no int8 loader here:
  int8 is offered for ComfyUI only. The DiT Memory node chunks these layers through the int8 kernel itself
  (`h3director.dit.quantised`: rows and weight rows exact by construction), so ``dit.chunking`` runs with int8
  weights, priced with the kernel's own buffers (`plan.quantised_bytes`);
- DiT int8_convrot / nvfp4 / fp8_scaled: ``UNETLoader`` with ``weight_dtype`` default on a file of comfy_quant
  ``int8_tensorwise`` layers with ``convrot`` / ``nvfp4`` / ``float8_e4m3fn`` layers (ComfyUI only). nvfp4 runs
  its own kernel from CUDA compute capability 10.0, fp8_scaled from 8.9, elsewhere they dequantise their
  weight per call (`weights inspect`, the plan and the farm read a file's layers: `comfy_dit_file_format`). How
  each format's linears run and which tiers act on them: `plan.quantised_tiers` (the planner offers FFN chunks
  only where they act: `check_chunking`);
- DiT GGUF Q8_0 / Q6_K / Q5_K / Q4_K / Q4_K_M: this pack's ``H3DirectorGGUFDiTLoader`` (``gguf_name``), and
  `h3director.integrations.diffusers_gguf.load_h3_transformer_gguf` (files written by ``h3director weights convert``);
- nf4 DiT: no loader in either target, never offered;
- text encoder bf16 / fp8: core ``CLIPLoader`` (``type`` minimax, ``device`` default|cpu); an fp8 Qwen3-VL file
  loads because ``load_clip`` converts an old ``scaled_fp8`` marker and ``llama_detect`` picks up ``comfy_quant``
  metadata (comfy/sd.py, comfy/text_encoders/hunyuan_video.py). No loader reads a GGUF Qwen3-VL: GGUF text
  encoders are never offered.

Targets are "comfyui" and "diffusers" (`TARGETS`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from h3director.errors import InvalidInputError

__all__ = [
    "TARGETS", "EXACTNESS", "ComfyExecutor", "LibraryExecutor", "ConfigExecutor", "Capability", "AppliedSetting",
    "REGISTRY", "capability", "check_target", "offered", "GGUF_TYPES", "weights_capability", "applied_settings",
    "dit_formats", "text_encoder_formats", "check_offered", "POOL_CONFIG_KEY", "BLOCK_SWAP_NODE", "DIT_MEMORY_NODE",
    "GGUF_LOADER_NODE", "DECODE_NODE", "CLIP_LOADER_NODE", "check_chunking", "decode_budget_gb",
    "gguf_format_from_types", "COMFY_QUANT_FORMATS", "comfy_dit_file_format", "gguf_file_format", "comfy_quant_format",
    "gguf_format_from_name",
]

TARGETS = ("comfyui", "diffusers")
EXACTNESS = ("exact by construction", "exact where verified", "approximate")

BLOCK_SWAP_NODE = "H3DirectorBlockSwap"
DIT_MEMORY_NODE = "H3DirectorDiTMemory"
GGUF_LOADER_NODE = "H3DirectorGGUFDiTLoader"
DECODE_NODE = "H3DirectorDecodeAVStreaming"
CLIP_LOADER_NODE = "CLIPLoader"
POOL_CONFIG_KEY = "pre_allocated_pool_mb"


@dataclass(frozen=True)
class ComfyExecutor:
    """A ComfyUI node that applies a setting: `node` is the ``class_type``, `inputs` the input names it sets."""

    node: str
    inputs: tuple[str, ...] = ()
    note: str = ""


@dataclass(frozen=True)
class LibraryExecutor:
    """A library call that applies a setting: `call` the dotted callable, `template` the call written with
    ``{name}`` placeholders for the setting's values (``str.format`` fields)."""

    call: str
    template: str
    note: str = ""


@dataclass(frozen=True)
class ConfigExecutor:
    """An ``h3_config.yaml`` key that applies a setting (in both targets: the library reads the same file)."""

    key: str
    note: str = ""


Executor = ComfyExecutor | LibraryExecutor | ConfigExecutor


@dataclass(frozen=True)
class Capability:
    """One kind of setting the director can recommend (see the module docstring). `cost`: the `PlanRequest`
    field(s) and the `plan/` function that price it."""

    key: str
    summary: str
    exactness: str
    comfy: ComfyExecutor | ConfigExecutor | None = None
    diffusers: LibraryExecutor | ConfigExecutor | None = None
    cost: str = ""

    def __post_init__(self) -> None:
        if self.exactness not in EXACTNESS:
            raise ValueError(f"{self.key}: exactness must be one of {EXACTNESS}, got {self.exactness!r}")

    def executor(self, target: str) -> Executor | None:
        """The executor for `target` ("comfyui" or "diffusers"), or None when nothing there applies it."""
        check_target(target)
        return self.comfy if target == "comfyui" else self.diffusers


@dataclass(frozen=True)
class AppliedSetting:
    """One recommended value of a capability, with how it is applied for one target.

    `values`: the setting's values by name (e.g. ``{"blocks_offloaded": 24}``); `node`/`inputs`: the ComfyUI node and
    the inputs to set on it (empty for the diffusers target); `call`: the library call written out (None for
    ComfyUI); `config`: ``h3_config.yaml`` keys and values that apply it (either target); `text`: one line for
    people."""

    capability: str
    target: str
    values: Mapping[str, Any] = field(default_factory=dict)
    node: str | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    call: str | None = None
    text: str = ""
    config: Mapping[str, Any] = field(default_factory=dict)

    def how(self) -> str:
        """Where it is applied, for people: ``node H3DirectorBlockSwap: blocks_offloaded=24``, the call, or the key."""
        if self.node:
            inputs = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in self.inputs.items())
            return f"node {self.node}" + (f": {inputs}" if inputs else "")
        if self.call:
            return self.call
        return "h3_config.yaml " + ", ".join(f"{k}: {v}" for k, v in self.config.items())

    def to_dict(self) -> dict:
        return {"capability": self.capability, "target": self.target, "values": dict(self.values),
                "node": self.node, "inputs": dict(self.inputs), "call": self.call, "config": dict(self.config),
                "how": self.how(), "text": self.text}


def check_target(target: str) -> str:
    """`target` if it is one of `TARGETS`, else `InvalidInputError`."""
    if target not in TARGETS:
        raise InvalidInputError(f"target must be one of {TARGETS}, got {target!r}")
    return target


def _entries(*caps: Capability) -> dict[str, Capability]:
    return {cap.key: cap for cap in caps}


_WEIGHTS_COST = "PlanRequest.weights -> plan.models.dit_inventory x plan.formats.weight_format (estimate: sampling)"
_GGUF_LOADER = ComfyExecutor(GGUF_LOADER_NODE, ("gguf_name",),
                             "a .gguf written by `h3director weights convert --type TYPE`")
_GGUF_CALL = LibraryExecutor("h3director.integrations.diffusers_gguf.load_h3_transformer_gguf",
                             "load_h3_transformer_gguf({path!r})")
_TE_COST = ("PlanRequest.text_encoder_weights / text_encoder_device -> plan.models.text_encoder_inventory "
            "(estimate: text_encoding)")
_DECODE_COST = ("PlanRequest.decode_tiles_per_call / sink -> plan.decode.decode_clip_working_set_bytes, "
                "output_host_bytes (estimate: decode)")

REGISTRY: dict[str, Capability] = _entries(
    # The DiT's weight format. Formats without a loader in the target are absent for it (nf4: no loader).
    Capability("dit.weights.bf16", "DiT weights in bf16 (the release)", "exact by construction",
               ComfyExecutor("UNETLoader", ("unet_name", "weight_dtype"), "weight_dtype default"),
               LibraryExecutor("diffusers.MiniMaxH3Transformer3DModel.from_pretrained",
                               "MiniMaxH3Transformer3DModel.from_pretrained(path, torch_dtype=torch.bfloat16)"),
               _WEIGHTS_COST),
    Capability("dit.weights.fp8", "DiT weights stored in float8 e4m3, computed in bf16", "approximate",
               ComfyExecutor("UNETLoader", ("unet_name", "weight_dtype"), "weight_dtype fp8_e4m3fn"),
               LibraryExecutor("diffusers.ModelMixin.enable_layerwise_casting",
                               "transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, "
                               "compute_dtype=torch.bfloat16)"),
               _WEIGHTS_COST),
    Capability("dit.weights.int8", "DiT weights in int8 (ComfyUI's int8_tensorwise layers)", "approximate",
               ComfyExecutor("UNETLoader", ("unet_name", "weight_dtype"),
                             "weight_dtype default; a file with per-layer comfy_quant metadata (int8_tensorwise)"),
               None, _WEIGHTS_COST),
    Capability("dit.weights.int8_convrot", "DiT weights in int8 with ConvRot (ComfyUI's int8_tensorwise layers, "
               "inputs rotated)", "approximate",
               ComfyExecutor("UNETLoader", ("unet_name", "weight_dtype"),
                             "weight_dtype default; a file with comfy_quant int8_tensorwise layers with convrot"),
               None, _WEIGHTS_COST),
    Capability("dit.weights.nvfp4", "DiT weights in NVFP4 (ComfyUI's nvfp4 layers)", "approximate",
               ComfyExecutor("UNETLoader", ("unet_name", "weight_dtype"),
                             "weight_dtype default; a file with comfy_quant nvfp4 layers"),
               None, _WEIGHTS_COST),
    Capability("dit.weights.fp8_scaled", "DiT weights in scaled fp8 (ComfyUI's float8_e4m3fn layers)", "approximate",
               ComfyExecutor("UNETLoader", ("unet_name", "weight_dtype"),
                             "weight_dtype default; a file with comfy_quant float8_e4m3fn layers"),
               None, _WEIGHTS_COST),
    Capability("dit.weights.gguf", "DiT weights in a GGUF quantisation, dequantised one layer at a time",
               "approximate", _GGUF_LOADER, _GGUF_CALL, _WEIGHTS_COST),
    Capability("dit.chunking", "attention head groups and FFN row chunks inside each DiT block",
               "exact where verified",
               ComfyExecutor(DIT_MEMORY_NODE, ("mode", "head_chunks", "ffn_chunks")),
               LibraryExecutor("h3director.integrations.diffusers_dit.apply_memory_plan",
                               "apply_memory_plan(transformer, head_chunks={head_chunks}, ffn_chunks={ffn_chunks})"),
               "PlanRequest.head_chunks / ffn_chunks -> plan.activations.dit_forward_peak_bytes (estimate: sampling)"),
    Capability("dit.block_offload", "N of the DiT's blocks kept in host RAM, each streamed in before it runs",
               "exact by construction",
               ComfyExecutor(BLOCK_SWAP_NODE, ("blocks_offloaded",)),
               LibraryExecutor("h3director.integrations.diffusers_offload.apply_block_offload",
                               "apply_block_offload(transformer, blocks_offloaded={blocks_offloaded}, "
                               "onload_device='cuda')"),
               "PlanRequest.offload_blocks -> block bytes to host, two block buffers on the device (estimate: "
               "sampling)"),
    Capability("text_encoder.weights.bf16", "the Qwen3-VL text encoder file in bf16", "exact by construction",
               ComfyExecutor(CLIP_LOADER_NODE, ("clip_name", "type"), "a bf16 Qwen3-VL file, type minimax"),
               LibraryExecutor("diffusers.DiffusionPipeline.from_pretrained",
                               "pipe = DiffusionPipeline.from_pretrained(path, torch_dtype=torch.bfloat16)"),
               _TE_COST),
    Capability("text_encoder.weights.fp8", "the Qwen3-VL text encoder stored in float8 e4m3, computed in bf16",
               "approximate",
               ComfyExecutor(CLIP_LOADER_NODE, ("clip_name", "type"),
                             "an fp8 Qwen3-VL file (scaled_fp8 or comfy_quant float8_e4m3fn layers), type minimax"),
               LibraryExecutor("diffusers.hooks.apply_layerwise_casting",
                               "apply_layerwise_casting(pipe.text_encoder, storage_dtype=torch.float8_e4m3fn, "
                               "compute_dtype=torch.bfloat16)"),
               _TE_COST),
    Capability("text_encoder.placement", "where the text encoder runs (accelerator, or the CPU from host RAM)",
               "exact by construction",
               ComfyExecutor(CLIP_LOADER_NODE, ("clip_name", "type", "device"), "type minimax; device default or cpu"),
               LibraryExecutor("torch.nn.Module.to", "pipe.text_encoder.to({device!r})"),
               _TE_COST),
    Capability("decode.streaming", "streamed decode: tiles per call (from a budget) and the sink for the frames",
               "exact by construction",
               ComfyExecutor(DECODE_NODE, ("output", "budget_gb"),
                             "budget_gb: the decode phase's device need; the node picks the tiles per call from it"),
               LibraryExecutor("h3director.video.scheduler.stream_decode",
                               "stream_decode(adapter, latents, {sink_class}(...), tiles_per_call={tiles_per_call})"),
               _DECODE_COST),
    Capability("decode.audio_off", "no audio output: the audio VAE is neither loaded nor run", "exact by construction",
               ComfyExecutor(DECODE_NODE, (), "leave audio_vae unconnected (no audio VAE loader)"),
               LibraryExecutor("h3director.video.scheduler.stream_decode",
                               "stream_decode(adapter, latents, sink, audio=None)"),
               "PlanRequest.audio -> plan.audio (estimate: decode)"),
    Capability("long_form.chain", "segments on the 17n+5 grid, each conditioned on the previous one's last frames, "
               "joined where they overlap", "approximate",
               ComfyExecutor("H3DirectorStitch", ("overlap",), "chain k segments with k-1 nodes; segment 2 on is "
                                                               "guided by the previous segment's last frames"),
               LibraryExecutor("h3director.av.stitch.stitch_files",
                               "stitch_files(segment_paths, out, overlap={overlap_frames})"),
               "recommend._longest_chunk / _chain: each segment priced with the chosen settings"),
    Capability("memory.pool", "a pre-allocated slot pool that the streamed decode's clip buffers lease from",
               "exact by construction",
               ConfigExecutor(POOL_CONFIG_KEY, "whole GiB (a multiple of 1024); leased at "
                                               "memory_optimization_level >= 1; held for the process"),
               ConfigExecutor(POOL_CONFIG_KEY, "the same key: stream_decode's clip buffers lease from it"),
               "plan.decode.clip_buffer_bytes, rounded up to whole GiB; held on the device in every phase"),
)

GGUF_TYPES = {"q8_0": "Q8_0", "q6_k": "Q6_K", "q5_k": "Q5_K", "q4_k": "Q4_K", "q4_k_m": "Q4_K_M"}
"""Planner weight-format ids of GGUF quantisations -> the `weights convert --type` names that write them."""

# Best to most compressed: the order the planner tries them in.
_DIT_FORMAT_ORDER = ("bf16", "fp8", "fp8_scaled", "int8", "int8_convrot", "q8_0", "q6_k", "q5_k", "nvfp4", "q4_k_m",
                     "q4_k")
_TEXT_ENCODER_FORMAT_ORDER = ("bf16", "fp8")
_COMFY_QUANT_FILES = {"int8": " (a file with comfy_quant int8_tensorwise layers)",
                      "int8_convrot": " (a file with comfy_quant int8_tensorwise layers with convrot)",
                      "nvfp4": " (a file with comfy_quant nvfp4 layers)",
                      "fp8_scaled": " (a file with comfy_quant float8_e4m3fn layers)"}
_SINK_CLASSES = {"uint8": "Uint8FrameSink", "memmap": "MemmapSink", "tensor": "TensorSink",
                 "video": "VideoFileSink"}


def capability(key: str) -> Capability:
    """The registry entry `key`; `InvalidInputError` naming the known keys when there is none."""
    try:
        return REGISTRY[key]
    except KeyError:
        raise InvalidInputError(f"unknown capability {key!r}; known: {', '.join(sorted(REGISTRY))}") from None


def offered(key: str, target: str) -> bool:
    """True when the capability `key` exists and has an executor for `target` (what the planner may recommend)."""
    return key in REGISTRY and REGISTRY[key].executor(target) is not None


def weights_capability(fmt: str) -> str:
    """The registry key that loads DiT weights in the planner format `fmt` (formats.FORMATS ids)."""
    if fmt in GGUF_TYPES:
        return "dit.weights.gguf"
    return f"dit.weights.{fmt}"


def dit_formats(target: str) -> tuple[str, ...]:
    """The DiT weight formats some loader of `target` reads, best (least compressed) first."""
    check_target(target)
    return tuple(fmt for fmt in _DIT_FORMAT_ORDER if offered(weights_capability(fmt), target))


def text_encoder_formats(target: str) -> tuple[str, ...]:
    """The text-encoder formats some loader of `target` reads, best first (no GGUF: nothing loads one)."""
    check_target(target)
    return tuple(fmt for fmt in _TEXT_ENCODER_FORMAT_ORDER if offered(f"text_encoder.weights.{fmt}", target))


def check_offered(fmt: str, target: str, *, what: str = "DiT") -> None:
    """`InvalidInputError` when no loader of `target` reads `what` ("DiT" or "text encoder") weights in `fmt`."""
    allowed = dit_formats(target) if what == "DiT" else text_encoder_formats(target)
    if fmt not in allowed:
        raise InvalidInputError(f"{what} weights {fmt!r} have no loader for target {target}: "
                                f"it loads {', '.join(allowed)}")


def check_chunking(fmt: str, target: str, head_chunks: int, ffn_chunks: int) -> None:
    """`InvalidInputError` when `ffn_chunks` > 1 would not act on the DiT's linears in format `fmt` in `target`
    (the tiers keep them whole: `plan.quantised_tiers.tiers_for`); head groups act in every format."""
    from h3director.plan.quantised_tiers import tiers_for

    tiers = tiers_for(fmt, target)
    if ffn_chunks > 1 and not tiers.ffn_chunks:
        raise InvalidInputError(f"ffn_chunks={ffn_chunks} does not act on {fmt} DiT weights in {target}: "
                                + "; ".join(tiers.kept))


def _chunking_text(fmt: str, target: str, head_chunks: int, ffn_chunks: int) -> str:
    from h3director.plan.quantised_bytes import CAST, GGUF
    from h3director.plan.quantised_tiers import tiers_for

    text = f"{head_chunks} head groups, {ffn_chunks} FFN chunks"
    layout = tiers_for(fmt, target).layout
    how = {None: "", CAST: f" (the {fmt} weights cast to the compute dtype)",
           GGUF: f" (the {fmt} weights dequantised)"}
    return text + how.get(layout, f" (the {fmt} linears through {layout}'s own kernel)")


def decode_budget_gb(device_bytes: int) -> float:
    """A decode phase's device need as the decode node's ``budget_gb`` (GiB, rounded up to 1e-4)."""
    return math.ceil(device_bytes / 2**30 * 10_000) / 10_000


def _apply(key: str, target: str, values: Mapping[str, Any], inputs: Mapping[str, Any], text: str) -> AppliedSetting:
    executor = capability(key).executor(target)
    if executor is None:
        raise InvalidInputError(f"{key} has no executor for {target}: it cannot be recommended there")
    if isinstance(executor, ConfigExecutor):
        return AppliedSetting(key, target, dict(values), text=text, config={executor.key: values[executor.key]})
    if target == "comfyui":
        return AppliedSetting(key, target, dict(values), node=executor.node, inputs=dict(inputs), text=text)
    return AppliedSetting(key, target, dict(values), call=executor.template.format(**values), text=text)


def applied_settings(request, target: str, *, decode_device_bytes: int | None = None,
                     pool_mb: int = 0, long_form=None) -> tuple[AppliedSetting, ...]:
    """How to apply the settings of a `plan.estimate.PlanRequest` (normally `Recommendation.request`) in `target`:
    one `AppliedSetting` per setting, in workflow order (loaders, DiT, decode, pool).

    `decode_device_bytes`: the decode phase's device need (bytes), given to the ComfyUI decode node as
    ``budget_gb`` (None: the input is left to h3_config.yaml); `pool_mb`: the recommended
    ``pre_allocated_pool_mb`` (0: no pool setting); `long_form`: the plan's `recommend.LongForm` chain, or None.
    Raises `InvalidInputError` when a setting has no executor for
    `target` (the planner must not have chosen it) or a block count is out of the DiT's range."""
    from h3director.plan.activations import DiTShape

    check_target(target)
    out = []
    fmt = request.weights
    key = weights_capability(fmt)
    if key == "dit.weights.gguf":
        values = {"format": fmt, "type": GGUF_TYPES[fmt], "path": f"h3_dit_{fmt}.gguf"}
        out.append(_apply(key, target, values, {"gguf_name": values["path"]},
                          f"DiT weights {GGUF_TYPES[fmt]} GGUF (h3director weights convert --type {GGUF_TYPES[fmt]})"))
    else:
        dtype = {"fp8": "fp8_e4m3fn"}.get(fmt, "default")
        out.append(_apply(key, target, {"format": fmt}, {"weight_dtype": dtype},
                          f"DiT weights {fmt}" + _COMFY_QUANT_FILES.get(fmt, "")))
    te_fmt = request.text_encoder_weights
    check_offered(te_fmt, target, what="text encoder")
    out.append(_apply(f"text_encoder.weights.{te_fmt}", target, {"format": te_fmt}, {"type": "minimax"},
                      f"text encoder file in {te_fmt}"))
    te_cpu = request.text_encoder_device == "cpu"
    out.append(_apply("text_encoder.placement", target,
                      {"device": "cpu" if te_cpu else "cuda", "format": te_fmt},
                      {"type": "minimax", "device": "cpu" if te_cpu else "default"},
                      f"text encoder {te_fmt} on {'the CPU' if te_cpu else 'the accelerator'}"))
    if (request.head_chunks, request.ffn_chunks) != (1, 1):
        check_chunking(fmt, target, request.head_chunks, request.ffn_chunks)
        values = {"head_chunks": request.head_chunks, "ffn_chunks": request.ffn_chunks}
        out.append(_apply("dit.chunking", target, values, {"mode": "fixed", **values},
                          _chunking_text(fmt, target, request.head_chunks, request.ffn_chunks)))
    if request.offload_blocks:
        blocks = DiTShape.from_config(request.dit_config).layers
        if not 0 < request.offload_blocks <= blocks:
            raise InvalidInputError(f"blocks_offloaded must be 1 to the DiT's {blocks} blocks, "
                                    f"got {request.offload_blocks}")
        values = {"blocks_offloaded": request.offload_blocks}
        out.append(_apply("dit.block_offload", target, values, values,
                          f"{request.offload_blocks} of {blocks} DiT blocks offloaded to host RAM"))
    tiles = request.decode_tiles_per_call
    inputs: dict[str, Any] = {"output": "video_file"}
    if decode_device_bytes is not None:
        inputs["budget_gb"] = decode_budget_gb(decode_device_bytes)
    out.append(_apply("decode.streaming", target,
                      {"tiles_per_call": tiles, "sink": request.sink, "sink_class": _SINK_CLASSES[request.sink]},
                      inputs, "streamed decode, " + ("the reference tiles" if tiles is None else
                                                     f"{tiles} tile(s) per call")
                      + (", straight to an MP4" if target == "comfyui" else f", sink {request.sink}")))
    if not request.audio:
        out.append(_apply("decode.audio_off", target, {"audio": False}, {},
                          "no audio: leave the audio VAE out" if target == "comfyui" else "no audio decode"))
    if long_form is not None:
        values = {"overlap_frames": long_form.overlap_frames, "segments": list(long_form.segments)}
        out.append(_apply("long_form.chain", target, values, {"overlap": long_form.overlap_frames},
                          f"{len(long_form.segments)} segments ({' + '.join(map(str, long_form.segments))} frames), "
                          f"{long_form.overlap_frames}-frame overlap"))
    if pool_mb:
        out.append(_apply("memory.pool", target, {POOL_CONFIG_KEY: pool_mb}, {},
                          f"decode buffer pool of {pool_mb} MiB"))
    return tuple(out)


_GGUF_NAME = re.compile(r"(?<![a-z0-9])(q8_0|q6_k|q5_k(?:_[ms])?|q4_k(?:_[ms])?)(?![a-z0-9])")


def gguf_format_from_types(type_bytes: Mapping[str, int]) -> str | None:
    """The planner format of a GGUF DiT from its bytes per storage type (``{"Q4_K": n, "Q6_K": m, "F32": k}``, as
    ``h3director weights inspect`` tallies them): the type holding most bytes among the quantised ones; Q4_K beside
    Q6_K is Q4_K_M's mix. None when it is none of `GGUF_TYPES`."""
    quantised = {t.upper(): n for t, n in type_bytes.items() if t.upper() not in ("F32", "F16", "BF16")}
    if not quantised:
        return None
    main = max(quantised, key=quantised.get)
    if main == "Q4_K" and "Q6_K" in quantised:
        return "q4_k_m"
    return {v: k for k, v in GGUF_TYPES.items()}.get(main)


COMFY_QUANT_FORMATS = {"int8_tensorwise": "int8", "int8_tensorwise+convrot": "int8_convrot", "nvfp4": "nvfp4",
                       "float8_e4m3fn": "fp8_scaled"}
"""ComfyUI quantisations (`weights.inspect.comfy_quant_layers` keys) -> the planner format priced for them."""


def comfy_quant_format(layers: Mapping[str, int]) -> str | None:
    """The planner format of a ComfyUI quantised DiT from its layers per quantisation (`comfy_quant_layers`):
    the quantisation of most layers; None when it has no quantised layers. `InvalidInputError` when that
    quantisation has no planner format (mxfp8, convrot_w4a4, asym_w4a8_int8 are not priced)."""
    if not layers:
        return None
    main = max(layers, key=layers.get)
    if main not in COMFY_QUANT_FORMATS:
        raise InvalidInputError(f"a DiT of {main} layers cannot be planned: the planner prices "
                                f"{', '.join(COMFY_QUANT_FORMATS)} layers")
    return COMFY_QUANT_FORMATS[main]


def gguf_file_format(path) -> str:
    """The planner format of the GGUF DiT at `path` from its header (`gguf_format_from_types` of the bytes per
    storage type); `InvalidInputError` when none of its types is one the GGUF loader runs."""
    from h3director.weights.inspect import summarise

    types = {t: row["bytes"] for t, row in summarise(path)["types"].items()}
    fmt = gguf_format_from_types(types)
    if fmt is None:
        raise InvalidInputError(f"GGUF DiT {str(path)!r}: its tensors are {sorted(types)}, none of the types the "
                                f"loader runs ({', '.join(GGUF_TYPES.values())})")
    return fmt


def comfy_dit_file_format(path) -> str | None:
    """The planner format of the ComfyUI safetensors DiT at `path` read from its layers (`comfy_quant_format`
    of `weights.inspect.comfy_quant_layers`): None for a file without quantised layers. The header is validated
    (`InvalidInputError` for a bad file)."""
    from h3director.weights.files import open_weights
    from h3director.weights.inspect import comfy_quant_layers

    with open_weights(path) as source:
        return comfy_quant_format(comfy_quant_layers(source))


def gguf_format_from_name(name: str) -> str | None:
    """The planner format a GGUF file name states (``h3_dit_Q4_K_M.gguf`` -> "q4_k_m"; Q5_K_M/S read as q5_k,
    Q4_K_S as q4_k), or None when the name states none."""
    match = _GGUF_NAME.search(name.lower().replace("-", "_"))
    if not match:
        return None
    found = match.group(1)
    return {"q5_k_m": "q5_k", "q5_k_s": "q5_k", "q4_k_s": "q4_k"}.get(found, found)
