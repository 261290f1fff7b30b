"""The capability registry: every setting the director can recommend, and what applies it.

A *capability* is one kind of setting the planner may choose (a DiT weight format, head/FFN chunking, a block
offload count, a text-encoder placement, a decode setting, ...). Each has:

- `comfy`: the ComfyUI executor, the node class (``class_type`` as in an API-format workflow) and the inputs it
  sets; None when nothing in ComfyUI (core or this pack) applies it;
- `diffusers`: the library executor, the dotted callable and a template of the call; None when nothing in the
  diffusers path applies it;
- `exactness`: one of `EXACTNESS` (design guide, "Exactness classes") for what the setting does to the output.

Invariant: the planner recommends a capability for a target only when `Capability.executor(target)` is not None,
and every recommended value is turned into an `AppliedSetting` by `applied_settings` (the plan's printout, the
workflow writer, `oom`'s advice and the farm's pricing read those, never their own tables).

Targets are "comfyui" and "diffusers" (`TARGETS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from h3director.errors import InvalidInputError

__all__ = [
    "TARGETS", "EXACTNESS", "ComfyExecutor", "LibraryExecutor", "Capability", "AppliedSetting", "REGISTRY",
    "capability", "check_target", "offered", "GGUF_TYPES", "weights_capability", "applied_settings",
]

TARGETS = ("comfyui", "diffusers")
EXACTNESS = ("exact by construction", "exact where verified", "approximate")


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
class Capability:
    """One kind of setting the director can recommend (see the module docstring)."""

    key: str
    summary: str
    exactness: str
    comfy: ComfyExecutor | None = None
    diffusers: LibraryExecutor | None = None

    def __post_init__(self) -> None:
        if self.exactness not in EXACTNESS:
            raise ValueError(f"{self.key}: exactness must be one of {EXACTNESS}, got {self.exactness!r}")

    def executor(self, target: str) -> ComfyExecutor | LibraryExecutor | None:
        """The executor for `target` ("comfyui" or "diffusers"), or None when nothing there applies it."""
        check_target(target)
        return self.comfy if target == "comfyui" else self.diffusers


@dataclass(frozen=True)
class AppliedSetting:
    """One recommended value of a capability, with how it is applied for one target.

    `values`: the setting's values by name (e.g. ``{"blocks_offloaded": 24}``); `node`/`inputs`: the ComfyUI node and
    the inputs to set on it (empty for the diffusers target); `call`: the library call written out (None for
    ComfyUI); `text`: one line for people."""

    capability: str
    target: str
    values: Mapping[str, Any] = field(default_factory=dict)
    node: str | None = None
    inputs: Mapping[str, Any] = field(default_factory=dict)
    call: str | None = None
    text: str = ""

    def to_dict(self) -> dict:
        return {"capability": self.capability, "target": self.target, "values": dict(self.values),
                "node": self.node, "inputs": dict(self.inputs), "call": self.call, "text": self.text}


def check_target(target: str) -> str:
    """`target` if it is one of `TARGETS`, else `InvalidInputError`."""
    if target not in TARGETS:
        raise InvalidInputError(f"target must be one of {TARGETS}, got {target!r}")
    return target


def _entries(*caps: Capability) -> dict[str, Capability]:
    return {cap.key: cap for cap in caps}


_GGUF_LOADER = ComfyExecutor("H3DirectorGGUFDiTLoader", ("gguf_name",),
                             "a .gguf written by `h3director weights convert --type TYPE`")
_GGUF_CALL = LibraryExecutor("h3director.integrations.diffusers_gguf.load_gguf_transformer",
                             "load_gguf_transformer({path!r})")

REGISTRY: dict[str, Capability] = _entries(
    # The DiT's weight format. Formats without a loader in the target are absent for it (nf4: no loader here).
    Capability("dit.weights.bf16", "DiT weights in bf16 (the release)", "exact by construction",
               ComfyExecutor("UNETLoader", ("unet_name", "weight_dtype"), "weight_dtype default"),
               LibraryExecutor("diffusers.MiniMaxH3Transformer3DModel.from_pretrained",
                               "MiniMaxH3Transformer3DModel.from_pretrained(path, torch_dtype=torch.bfloat16)")),
    Capability("dit.weights.fp8", "DiT weights stored in float8 e4m3, computed in bf16", "approximate",
               ComfyExecutor("UNETLoader", ("unet_name", "weight_dtype"), "weight_dtype fp8_e4m3fn"),
               LibraryExecutor("diffusers.ModelMixin.enable_layerwise_casting",
                               "transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, "
                               "compute_dtype=torch.bfloat16)")),
    Capability("dit.weights.gguf", "DiT weights in a GGUF quantisation, dequantised one layer at a time",
               "approximate", _GGUF_LOADER, _GGUF_CALL),
    Capability("dit.chunking", "attention head groups and FFN row chunks inside each DiT block",
               "exact where verified",
               ComfyExecutor("H3DirectorDiTMemory", ("mode", "head_chunks", "ffn_chunks")),
               LibraryExecutor("h3director.integrations.diffusers_dit.apply_memory_plan",
                               "apply_memory_plan(transformer, head_chunks={head_chunks}, ffn_chunks={ffn_chunks})")),
    Capability("dit.block_offload", "N of the DiT's blocks kept in host RAM, each streamed in before it runs",
               "exact by construction",
               ComfyExecutor("H3DirectorBlockSwap", ("blocks_offloaded",)),
               LibraryExecutor("h3director.integrations.diffusers_offload.apply_block_offload",
                               "apply_block_offload(transformer, blocks_offloaded={blocks_offloaded}, "
                               "onload_device='cuda')")),
    Capability("text_encoder.placement", "where the text encoder runs (accelerator, or the CPU from host RAM)",
               "exact by construction",
               ComfyExecutor("CLIPLoader", ("clip_name", "type", "device"), "type minimax; device default or cpu"),
               LibraryExecutor("torch.nn.Module.to", "pipe.text_encoder.to({device!r})")),
    Capability("decode.streaming", "streamed decode, tiles per call and the sink for the frames",
               "exact by construction",
               ComfyExecutor("H3DirectorDecodeAVStreaming", ("output", "budget_gb")),
               LibraryExecutor("h3director.video.scheduler.stream_decode",
                               "stream_decode(adapter, latents, sink)")),
)


def capability(key: str) -> Capability:
    """The registry entry `key`; `InvalidInputError` naming the known keys when there is none."""
    try:
        return REGISTRY[key]
    except KeyError:
        raise InvalidInputError(f"unknown capability {key!r}; known: {', '.join(sorted(REGISTRY))}") from None


def offered(key: str, target: str) -> bool:
    """True when the capability `key` has an executor for `target` (what the planner may recommend)."""
    return capability(key).executor(target) is not None


GGUF_TYPES = {"q8_0": "Q8_0", "q6_k": "Q6_K", "q5_k": "Q5_K", "q4_k": "Q4_K", "q4_k_m": "Q4_K_M"}
"""Planner weight-format ids of GGUF quantisations -> the `weights convert --type` names that write them."""


def weights_capability(fmt: str) -> str:
    """The registry key that loads DiT weights in the planner format `fmt` (formats.FORMATS ids)."""
    if fmt in GGUF_TYPES:
        return "dit.weights.gguf"
    return f"dit.weights.{fmt}"


def _apply(key: str, target: str, values: Mapping[str, Any], inputs: Mapping[str, Any], text: str) -> AppliedSetting:
    executor = capability(key).executor(target)
    if executor is None:
        raise InvalidInputError(f"{key} has no executor for {target}: it cannot be recommended there")
    if target == "comfyui":
        return AppliedSetting(key, target, dict(values), node=executor.node, inputs=dict(inputs), text=text)
    return AppliedSetting(key, target, dict(values), call=executor.template.format(**values), text=text)


def applied_settings(request, target: str) -> tuple[AppliedSetting, ...]:
    """How to apply the settings of a `plan.estimate.PlanRequest` (normally `Recommendation.request`) in `target`:
    one `AppliedSetting` per setting that differs from doing nothing, in workflow order (loaders, DiT, decode).

    Raises `InvalidInputError` when a setting has no executor for `target` (the planner must not have chosen it)."""
    check_target(target)
    out = []
    fmt = request.weights
    key = weights_capability(fmt)
    if key == "dit.weights.gguf":
        values = {"format": fmt, "type": GGUF_TYPES[fmt], "path": f"h3_dit_{fmt}.gguf"}
        out.append(_apply(key, target, values, {}, f"DiT weights {GGUF_TYPES[fmt]} GGUF "
                          f"(h3director weights convert --type {GGUF_TYPES[fmt]})"))
    else:
        dtype = {"bf16": "default", "fp8": "fp8_e4m3fn"}.get(fmt, "default")
        out.append(_apply(key, target, {"format": fmt}, {"weight_dtype": dtype}, f"DiT weights {fmt}"))
    te_device = "cpu" if request.text_encoder_device == "cpu" else "default"
    out.append(_apply("text_encoder.placement", target,
                      {"device": "cpu" if te_device == "cpu" else "cuda", "format": request.text_encoder_weights},
                      {"type": "minimax", "device": te_device},
                      f"text encoder {request.text_encoder_weights} on "
                      f"{'the CPU' if te_device == 'cpu' else 'the accelerator'}"))
    if (request.head_chunks, request.ffn_chunks) != (1, 1):
        values = {"head_chunks": request.head_chunks, "ffn_chunks": request.ffn_chunks}
        out.append(_apply("dit.chunking", target, values, {"mode": "fixed", **values},
                          f"{request.head_chunks} head groups, {request.ffn_chunks} FFN chunks"))
    if request.offload_blocks:
        values = {"blocks_offloaded": request.offload_blocks}
        out.append(_apply("dit.block_offload", target, values, values,
                          f"{request.offload_blocks} DiT blocks offloaded to host RAM"))
    out.append(_apply("decode.streaming", target,
                      {"tiles_per_call": request.decode_tiles_per_call, "sink": request.sink},
                      {"output": "video_file"}, "streamed decode to an MP4"))
    return tuple(out)
