"""H3Director Cached Text Encode: CLIP + text -> CONDITIONING, the encoder run once per content.

The node does what core CLIP Text Encode does (`clip.tokenize(text)`, then
`clip.encode_from_tokens_scheduled(tokens)`), but first looks the result up in the shared store
(`h3director.comfy.nodes_shared.shared_store`) under a content key: blake2b of the text and the
text encoder's fingerprint (`clip_fingerprint`: per weight tensor its name, dtype, shape and 16
values strided across it; the patcher's patches (LoRA weights sampled the same way, strengths); the
CLIP skip layer and tokenizer options). The fingerprint is computed once per encoder object and
patch set, so a reloaded encoder with the same weights (e.g. ComfyUI run with ``--cache-none``) hits
too; two encoders that differ only in weights the samples miss would share entries. Length, seed,
resolution and every other input of the graph are not part of the key, so changing only those never
re-runs the encoder. The store keeps at most ``shared_memory_budget_mb`` in memory; least recently
used entries go to its disk tier and come back on a hit.

One physical copy: the node hands out read-only views of the store's tensors, never a clone, so every
node that encodes the same content (in this prompt or later ones) holds the conditioning's bytes once;
on a miss the encoder's output is dropped once the store holds its copy. Each node's views are its
own (named ``comfy-node-<id>``): a node downstream that writes into one in place is reported by the
store's `SharedTensorMutatedError` naming that encode node, on the next lookup of the same content.

Caching needs the shared store (memory level 3 and ``shared_memory_enabled``); otherwise the node
encodes every time, as CLIP Text Encode does, and says so in its report. A CLIP with conditioning
hooks (`patcher.forced_hooks`) is encoded every time too (hooks are scheduled per step).

Counters (`text_cache_stats`, in ``/h3director/stats`` under ``text_cache``): ``hits``, ``misses``
(encoder runs), ``bypassed`` (encodes without the cache), ``bytes_saved`` (bytes of conditioning
served from the cache instead of re-encoded).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from comfy_api.latest import io

OWNER = "h3director-text-cache"
_memo: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # encoder module -> (patches_uuid, digest)
_lock = threading.Lock()
_counters = {"hits": 0, "misses": 0, "bypassed": 0, "bytes_saved": 0}


def _sample(hasher, tensor) -> None:
    """Name-free part of a tensor's fingerprint: dtype, shape and 16 values strided across it."""
    import torch

    hasher.update(f"{tensor.dtype}{tuple(tensor.shape)}".encode())
    if tensor.device.type == "meta" or tensor.numel() == 0:
        return
    flat = tensor.detach().reshape(-1)
    picked = flat[:: max(1, flat.numel() // 16)][:16].to("cpu").contiguous()
    hasher.update(picked.view(torch.uint8).numpy().tobytes())


def _walk_patch(hasher, value, depth: int = 0) -> None:
    """Hash a patch entry: numbers and strings as text, tensors sampled, adapters through their weights."""
    import torch

    if depth > 6:
        return
    if isinstance(value, torch.Tensor):
        _sample(hasher, value)
    elif isinstance(value, (int, float, str, bool)) or value is None:
        hasher.update(repr(value).encode())
    elif isinstance(value, (list, tuple)):
        for item in value:
            _walk_patch(hasher, item, depth + 1)
    elif isinstance(value, dict):
        for key in sorted(value, key=repr):
            hasher.update(repr(key).encode())
            _walk_patch(hasher, value[key], depth + 1)
    else:
        hasher.update(type(value).__name__.encode())
        _walk_patch(hasher, getattr(value, "weights", None), depth + 1)


def _weights_fingerprint(model: Any, patcher: Any) -> str:
    import hashlib

    key = str(getattr(patcher, "patches_uuid", ""))
    with _lock:
        memo = _memo.get(model)
        if memo is not None and memo[0] == key:
            return memo[1]
    hasher = hashlib.blake2b(digest_size=16)
    hasher.update(type(model).__name__.encode())
    for name, tensor in model.state_dict().items():
        hasher.update(name.encode())
        _sample(hasher, tensor)
    patches = getattr(patcher, "patches", None) or {}
    for name in sorted(patches):
        hasher.update(b"patch" + str(name).encode())
        _walk_patch(hasher, patches[name])
    digest = hasher.hexdigest()
    with _lock:
        _memo[model] = (key, digest)
    return digest


def clip_fingerprint(clip: Any) -> str:
    """The text encoder as it will encode: sampled weights and patches, CLIP skip, tokenizer options."""
    model = getattr(clip, "cond_stage_model", None)
    patcher = getattr(clip, "patcher", None)
    if model is None or patcher is None or not hasattr(model, "state_dict"):
        from h3director.errors import InvalidInputError

        raise InvalidInputError(f"clip must be ComfyUI's CLIP (cond_stage_model, patcher), got {type(clip).__name__}")
    parts = [_weights_fingerprint(model, patcher), repr(getattr(clip, "layer_idx", None)),
             repr(sorted((getattr(clip, "tokenizer_options", None) or {}).items()))]
    return "|".join(parts)


def text_cache_stats() -> dict[str, int]:
    """A copy of this process's cache counters (hits, misses, bypassed; bytes_saved in bytes), by name."""
    with _lock:
        return dict(_counters)


def _count(name: str, amount: int = 1) -> None:
    with _lock:
        _counters[name] += amount


def _conditioning_bytes(conditioning: Any) -> int:
    import torch

    from h3director.comfy.nodes_shared import flatten

    tensors: list[torch.Tensor] = []
    flatten(conditioning, tensors)
    return sum(t.numel() * t.element_size() for t in tensors)


def encode_text(clip: Any, text: str) -> Any:
    """What core CLIP Text Encode runs."""
    tokens = clip.tokenize(text)
    return clip.encode_from_tokens_scheduled(tokens)


def cached_encode(clip: Any, text: str, reader: str = OWNER) -> tuple[Any, str]:
    """(conditioning, what happened: "hit", "miss" or why the cache was bypassed).

    Cached conditioning is `reader`'s read-only views of the store's tensors (see the module docstring).
    Raises `InvalidInputError` for a missing CLIP or a non-string text, `SharedTensorMutatedError`
    when a view of the cached entry was written in place since the last lookup."""
    from h3director.comfy.nodes_shared import get_conditioning, put_conditioning, shared_store
    from h3director.comfy.settings import pack_config
    from h3director.core.shared_store import content_key
    from h3director.errors import InvalidInputError

    if clip is None:
        raise InvalidInputError("clip input is None: the checkpoint loader gave no text encoder")
    if not isinstance(text, str):
        raise InvalidInputError(f"text must be a string, got {type(text).__name__}")
    config = pack_config()
    reason = None
    if not config.features().cross_node_shared_memory:
        reason = ("bypassed: the shared store is off (memory_optimization_level 3 and shared_memory_enabled "
                  "turn the cache on)")
    elif getattr(getattr(clip, "patcher", None), "forced_hooks", None):
        reason = "bypassed: the CLIP carries conditioning hooks"
    if reason is not None:
        _count("bypassed")
        return encode_text(clip, text), reason
    key = "textcache_" + content_key(text, model_fingerprint=clip_fingerprint(clip))
    store = shared_store()
    found = get_conditioning(store, key, keep=True, reader=reader)
    if found is not None:
        _count("hits")
        _count("bytes_saved", _conditioning_bytes(found))
        return found, "hit"
    _count("misses")
    conditioning = encode_text(clip, text)
    put_conditioning(store, key, conditioning, OWNER, replace=True)
    stored = get_conditioning(store, key, keep=True, reader=reader)
    # the memory budget may have dropped it at once (no disk tier): then the encoder's own output
    return (conditioning if stored is None else stored), "miss"


class CachedTextEncode(io.ComfyNode):
    """CLIP + `text` (str) -> CONDITIONING: the text encoder's output, encoded once per (weights, layer,
    tokenizer options, text) and handed out as read-only views of one cached copy. Raises InvalidInputError
    for a `clip` that is not ComfyUI's CLIP."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorCachedTextEncode",
            display_name="H3Director Cached Text Encode",
            category="H3 Director/shared memory",
            description=(
                "CLIP Text Encode that runs the text encoder once per (prompt, encoder): the result is kept in "
                "the shared store by content, so changing only length, seed or resolution reuses it. Needs "
                "memory_optimization_level 3 (else it encodes every time)."),
            inputs=[io.Clip.Input("clip"),
                    io.String.Input("text", multiline=True, dynamic_prompts=True)],
            outputs=[io.Conditioning.Output(display_name="conditioning"), io.String.Output(display_name="report")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, clip, text) -> io.NodeOutput:
        conditioning, what = cached_encode(clip, text, reader=f"comfy-node-{cls.hidden.unique_id}")
        stats = text_cache_stats()
        report = (f"text encoder: {what}; cache hits {stats['hits']}, misses {stats['misses']}, "
                  f"bytes saved {stats['bytes_saved']}")
        return io.NodeOutput(conditioning, report)


__all__ = ["CachedTextEncode", "text_cache_stats"]
