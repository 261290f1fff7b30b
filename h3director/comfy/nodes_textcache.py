"""H3Director Cached Text Encode: CLIP + text -> CONDITIONING, the encoder run once per content.

The node does what core CLIP Text Encode does (`clip.tokenize(text)`, then
`clip.encode_from_tokens_scheduled(tokens)`), but first looks the result up in the shared store
(`h3director.comfy.nodes_shared.shared_store`) under a content key: blake2b of the text and the
text encoder's fingerprint (`clip_fingerprint`: the encoder module's identity in this process, the
patcher's patch set `patches_uuid`, the CLIP skip layer and tokenizer options). Length, seed,
resolution and every other input of the graph are not part of the key, so changing only those never
re-runs the encoder. The store keeps at most ``shared_memory_budget_mb`` in memory; least recently
used entries go to its disk tier and come back on a hit.

Caching needs the shared store (memory level 3 and ``shared_memory_enabled``); otherwise the node
encodes every time, as CLIP Text Encode does, and says so in its report. A CLIP with conditioning
hooks (`patcher.forced_hooks`) is encoded every time too (hooks are scheduled per step).

Counters (`text_cache_stats`, in ``/h3director/stats`` under ``text_cache``): ``hits``, ``misses``
(encoder runs), ``bypassed`` (encodes without the cache), ``bytes_saved`` (bytes of conditioning
served from the cache instead of re-encoded).
"""

from __future__ import annotations

import threading
import uuid
import weakref
from typing import Any

from comfy_api.latest import io

OWNER = "h3director-text-cache"
_tokens: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_counters = {"hits": 0, "misses": 0, "bypassed": 0, "bytes_saved": 0}


def _model_token(module: Any) -> str:
    """A token naming one encoder module object for this process's lifetime (never reused, unlike id())."""
    with _lock:
        token = _tokens.get(module)
        if token is None:
            token = uuid.uuid4().hex
            _tokens[module] = token
        return token


def clip_fingerprint(clip: Any) -> str:
    """The text encoder's identity as it will encode: module, patches, CLIP skip, tokenizer options."""
    model = getattr(clip, "cond_stage_model", None)
    patcher = getattr(clip, "patcher", None)
    if model is None or patcher is None:
        from h3director.errors import InvalidInputError

        raise InvalidInputError(f"clip must be ComfyUI's CLIP (cond_stage_model, patcher), got {type(clip).__name__}")
    parts = [type(model).__name__, _model_token(model), str(getattr(patcher, "patches_uuid", "")),
             repr(getattr(clip, "layer_idx", None)), repr(sorted(getattr(clip, "tokenizer_options", {}).items()))]
    return "|".join(parts)


def text_cache_stats() -> dict[str, int]:
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


def cached_encode(clip: Any, text: str) -> tuple[Any, str]:
    """(conditioning, what happened: "hit", "miss" or why the cache was bypassed)."""
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
    found = get_conditioning(store, key, keep=True)
    if found is not None:
        _count("hits")
        _count("bytes_saved", _conditioning_bytes(found))
        return found, "hit"
    _count("misses")
    conditioning = encode_text(clip, text)
    put_conditioning(store, key, conditioning, OWNER, replace=True)
    # the store holds the encoder's tensors themselves; hand the graph copies it may modify in place
    return get_conditioning(store, key, keep=True), "miss"


class CachedTextEncode(io.ComfyNode):
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
        )

    @classmethod
    def execute(cls, clip, text) -> io.NodeOutput:
        conditioning, what = cached_encode(clip, text)
        stats = text_cache_stats()
        report = (f"text encoder: {what}; cache hits {stats['hits']}, misses {stats['misses']}, "
                  f"bytes saved {stats['bytes_saved']}")
        return io.NodeOutput(conditioning, report)
