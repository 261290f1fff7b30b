"""Recognise MiniMax H3 weights by their tensor names, and split all-in-one checkpoints into components.

Key styles of the H3 DiT (facts from ComfyUI's model detection and diffusers' single-file conversion):

- "comfy" (the published single files and the GGUFs made from them): ``video_patch_proj``,
  ``audio_patch_proj``, ``blocks.N.attn.qkv_proj``, ``blocks.N.mlp.fc1``, ``token_refiner.blocks.N``,
  ``condition_proj``, ``final_layer.*``, ``time_embedder.proj_in`` (unpruned) or ``adaln_t_table``
  (pruned: the AdaLN input is read from a table over a time grid, "curve form"), ``rope.inv_freq``;
  inside an all-in-one checkpoint under ``model.diffusion_model.``;
- "diffusers" (`MiniMaxH3Transformer3DModel`): ``proj_in``, ``audio_proj_in``, ``transformer_blocks.N.attn.to_q``,
  ``token_refiner.refiner_blocks.N``, ``context_embedder``, ``norm_out``, ``proj_out``, ``audio_proj_out``,
  ``time_embedder.linear_1``.

All-in-one checkpoints put the video VAE under ``vae.``, the text encoder under ``text_encoders.`` and the
audio VAE under ``audio_vae.``; standalone VAE files are recognised by their own key signatures.
Everything here is name matching; nothing is loaded.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from h3director.errors import InvalidInputError

DIT_PREFIX = "model.diffusion_model."
COMPONENTS = ("dit", "text-encoder", "vae", "audio-vae")
COMPONENT_PREFIXES = {"dit": (DIT_PREFIX,), "vae": ("vae.", "first_stage_model."),
                      "audio-vae": ("audio_vae.",), "text-encoder": ("text_encoders.", "cond_stage_model.")}
ACCEPTED_ARCHITECTURES = ("minimax_h3", "wan")

_P = r"^(?:model\.diffusion_model\.)?"
# Tensors the loaders use as stored (never quantised by `convert`): patch projections, the time embedder,
# the output heads, the AdaLN time table, norms, biases-free 1-D vectors are handled by shape elsewhere.
HIGH_PRECISION_PATTERNS: tuple[re.Pattern[str], ...] = tuple(re.compile(p) for p in (
    _P + r"(?:video_patch_proj|audio_patch_proj|proj_in|audio_proj_in)\.",
    _P + r"time_embedder\.",
    _P + r"(?:final_layer|norm_out|proj_out|audio_proj_out)\.",
    _P + r"adaln_t_table$",
    _P + r"rope\.",
    r"(?:^|\.)(?:norm\w*|\w*_norm|norm_[qk])(?:\.|$)",
))


def is_high_precision(name: str) -> bool:
    """True for a tensor H3's loaders use as stored (see `HIGH_PRECISION_PATTERNS`)."""
    return any(p.search(name) for p in HIGH_PRECISION_PATTERNS)


@dataclass(frozen=True)
class H3Detection:
    """What `detect_h3` found. `kind`: "dit". `curve_form`: the file carries ``adaln_t_table`` (pruned)
    instead of a time embedder. `key_style`: "comfy" or "diffusers". `prefix`: the prefix in front of the
    DiT's keys ("" or ``model.diffusion_model.``). `reason`: one line saying how it was recognised."""

    kind: str
    curve_form: bool
    key_style: str
    prefix: str
    reason: str


def detect_h3(tensor_names: Iterable[str], architecture: str | None = None, *, where: str = "file") -> H3Detection:
    """Recognise an H3 DiT from its tensor names; refuse anything else with `InvalidInputError`.

    `architecture`: ``general.architecture`` of a GGUF (None or "" for safetensors). Accepted: "minimax_h3",
    and "wan" when the names are H3's (some published files are labelled wan so that older loaders take
    them). Any other label, or names that are not H3's DiT, are refused naming what was found.
    """
    names = set(tensor_names)
    arch = (architecture or "").strip()
    if arch and arch not in ACCEPTED_ARCHITECTURES:
        raise InvalidInputError(f"{where}: architecture {arch!r} is not MiniMax H3 (expected one of "
                                f"{', '.join(ACCEPTED_ARCHITECTURES)}); {len(names)} tensors, e.g. {_examples(names)}")
    for prefix in ("", DIT_PREFIX):
        if {prefix + "video_patch_proj.weight", prefix + "audio_patch_proj.weight"} <= names:
            style, blocks = "comfy", prefix + "blocks."
        elif {prefix + "proj_in.weight", prefix + "audio_proj_in.weight"} <= names and \
                any(n.startswith(prefix + "transformer_blocks.") for n in names):
            style, blocks = "diffusers", prefix + "transformer_blocks."
        else:
            continue
        curve = prefix + "adaln_t_table" in names
        n_blocks = len({n[len(blocks):].split(".", 1)[0] for n in names if n.startswith(blocks)})
        label = f"labelled {arch!r}" if arch else "unlabelled"
        reason = (f"H3 DiT, {style} keys{' under ' + prefix if prefix else ''}, {n_blocks} blocks, "
                  f"{'pruned (curve-form adaln_t_table)' if curve else 'unpruned (time embedder)'}, {label}")
        return H3Detection("dit", curve, style, prefix, reason)
    what = f"architecture {arch!r}" if arch else "no architecture label"
    raise InvalidInputError(f"{where}: not a MiniMax H3 DiT ({what}; no video_patch_proj/audio_patch_proj or "
                            f"proj_in/audio_proj_in keys); tensors e.g. {_examples(names)}")


def _examples(names: set[str], count: int = 3) -> str:
    shown = sorted(names)[:count]
    return ", ".join(shown) + (" ..." if len(names) > count else "") if shown else "(none)"


def _is_video_vae(name: str) -> bool:
    return name.startswith(("decoder.", "encoder.", "quant_conv", "post_quant_conv"))


def split_components(tensor_names: Iterable[str]) -> dict[str, list[str]]:
    """Assign every tensor name to one of `COMPONENTS` or "other" (keys of the result: those present).

    Prefixed names (all-in-one checkpoints) go by prefix. A file without such prefixes is one component,
    recognised by its signature: H3 DiT keys (either style), the audio VAE's ``pre_block.`` attention,
    a video VAE's ``encoder.``/``decoder.`` trees, a text encoder's ``model.layers.`` / ``language_model.``.
    """
    names = list(tensor_names)
    groups: dict[str, list[str]] = {}
    rest: list[str] = []
    for name in names:
        for component, prefixes in COMPONENT_PREFIXES.items():
            if name.startswith(prefixes):
                groups.setdefault(component, []).append(name)
                break
        else:
            rest.append(name)
    if not rest:
        return groups
    unprefixed = set(rest)
    try:
        detect_h3(unprefixed)
        groups.setdefault("dit", []).extend(rest)
        return groups
    except InvalidInputError:
        pass
    if any(n.endswith("pre_block.attn.zero_k_bias") or n.startswith("pre_block.") for n in unprefixed):
        groups.setdefault("audio-vae", []).extend(rest)
    elif any(n.startswith(("model.layers.", "language_model.", "model.language_model.", "visual.",
                           "model.visual.", "lm_head.", "model.embed_tokens.")) for n in unprefixed):
        groups.setdefault("text-encoder", []).extend(rest)
    elif sum(_is_video_vae(n) for n in unprefixed) > len(unprefixed) // 2:
        groups.setdefault("vae", []).extend(rest)
    else:
        groups.setdefault("other", []).extend(rest)
    return groups


# ComfyUI's `MiniMaxH3Model` state dict (the layout both of the project's GGUF loaders read: the ComfyUI loader
# assigns exactly these tensors, the diffusers loader converts them with diffusers' single-file H3 conversion).
COMFY_TOP_KEYS = ("video_patch_proj.weight", "video_patch_proj.bias", "audio_patch_proj.weight", "audio_patch_proj.bias",
                  "condition_proj.weight", "condition_proj.bias", "rope.inv_freq", "token_refiner.final_norm.weight",
                  "final_layer.norm.weight", "final_layer.adaln_proj.linear.weight",
                  "final_layer.adaln_proj.linear.bias", "final_layer.video_out.weight", "final_layer.video_out.bias",
                  "final_layer.audio_out.weight", "final_layer.audio_out.bias")
COMFY_TIME_EMBEDDER_KEYS = ("time_embedder.proj_in.weight", "time_embedder.proj_in.bias",
                            "time_embedder.proj_out.weight", "time_embedder.proj_out.bias")
COMFY_CURVE_KEYS = ("adaln_t_table",)
_ATTN_MLP = ("norm1.weight", "norm2.weight", "attn.qkv_proj.weight", "attn.out_proj.weight", "attn.q_norm.weight",
             "attn.k_norm.weight", "mlp.fc1.weight", "mlp.fc2.weight")
COMFY_REFINER_BLOCK_KEYS = _ATTN_MLP
COMFY_BLOCK_KEYS = _ATTN_MLP + ("adaln_proj.linear.weight", "adaln_proj.linear.bias")
LOADERS = "the ComfyUI node 'H3Director GGUF DiT Loader' and diffusers' load_h3_transformer_gguf"


def _block_count(names: set[str], stem: str) -> int:
    """1 + the largest block index under `stem` (``blocks.``), 0 without any."""
    found = [n[len(stem):].split(".", 1)[0] for n in names if n.startswith(stem)]
    return 1 + max((int(i) for i in found if i.isdigit()), default=-1)


def comfy_dit_keys(names: Iterable[str]) -> set[str]:
    """Every key ComfyUI's H3 model has for the block counts and time-embedding form found in `names`
    (ComfyUI-keyed, the DiT prefix removed): the exact set the GGUF loaders expect."""
    names = set(names)
    expected = set(COMFY_TOP_KEYS)
    expected.update(COMFY_CURVE_KEYS if "adaln_t_table" in names else COMFY_TIME_EMBEDDER_KEYS)
    for i in range(_block_count(names, "blocks.")):
        expected.update(f"blocks.{i}.{k}" for k in COMFY_BLOCK_KEYS)
    for i in range(_block_count(names, "token_refiner.blocks.")):
        expected.update(f"token_refiner.blocks.{i}.{k}" for k in COMFY_REFINER_BLOCK_KEYS)
    return expected


def loader_key_problem(dit_names: Iterable[str], found: H3Detection) -> str | None:
    """Why the project's GGUF loaders would refuse a DiT with these tensor names (None when both take them).

    `dit_names`: the DiT's keys with `found.prefix` removed. Diffusers-keyed files are refused by both loaders
    (they read ComfyUI's layout); ComfyUI-keyed files must hold exactly ComfyUI's `MiniMaxH3Model` tensors
    (`comfy_dit_keys`). The text names a few offending keys, what the loaders expect, and the way out."""
    names = set(dit_names)
    if found.key_style == "diffusers":
        return (f"H3 DiT with diffusers keys (e.g. {_examples({n for n in names if '.attn.to_' in n} or names)}); "
                f"{LOADERS} both read ComfyUI's layout (blocks.N.attn.qkv_proj.weight, blocks.N.mlp.fc1.weight, "
                "video_patch_proj.weight, ...). Load this file as safetensors with diffusers "
                "(MiniMaxH3Transformer3DModel) instead, or convert the ComfyUI-keyed single file (the published "
                "all-in-one checkpoint's model.diffusion_model.* tensors)")
    expected = comfy_dit_keys(names)
    missing, unexpected = sorted(expected - names), sorted(names - expected)
    if not missing and not unexpected:
        return None
    parts = [f"{len(items)} {label} (e.g. {', '.join(items[:3])})"
             for label, items in (("missing", missing), ("unexpected", unexpected)) if items]
    return (f"ComfyUI-keyed H3 DiT whose tensors are not those of ComfyUI's MiniMaxH3Model: {'; '.join(parts)}; "
            f"{LOADERS} expect exactly its tensors (per block: {', '.join(COMFY_BLOCK_KEYS[:4])}, ...), "
            "so neither would load the file")


__all__ = ["COMPONENTS", "COMPONENT_PREFIXES", "LOADERS", "H3Detection", "comfy_dit_keys", "detect_h3",
           "is_high_precision", "loader_key_problem", "split_components"]
