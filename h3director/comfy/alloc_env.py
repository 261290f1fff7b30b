"""Combine H3 Director's allocator settings with ComfyUI's `PYTORCH_CUDA_ALLOC_CONF`.

ComfyUI's `main.py` imports `cuda_malloc.py` before it runs any custom node's
`prestartup_script.py`. On CUDA builds of PyTorch >= 2.0 (unless `--disable-cuda-malloc`, or
`--fast autotune`) that module appends `backend:cudaMallocAsync` to `PYTORCH_CUDA_ALLOC_CONF`
(or sets it to exactly that). Torch is imported only after the prestartup scripts, so the value
this module computes is the one PyTorch reads. The rules (`merge_alloc_conf`):

1. Every setting already in the variable (the user's, ComfyUI's backend) is kept, in order.
2. `allocator.backend` in `h3_config.yaml`: `null` keeps ComfyUI's choice; `native` or
   `cudaMallocAsync` replaces the `backend:` entry (the config file wins over ComfyUI's default;
   `--disable-cuda-malloc` on ComfyUI's command line has the same effect as `native`).
3. `expandable_segments`, `max_split_size_mb`, `garbage_collection_threshold` configure PyTorch's
   native caching allocator only. They are added (replacing an existing entry of the same key)
   when the resulting backend is native; under `cudaMallocAsync` PyTorch ignores them, so they are
   left out and a note says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

NATIVE_ONLY_KEYS = ("expandable_segments", "max_split_size_mb", "garbage_collection_threshold")


@dataclass
class AllocConfMerge:
    """Result of `merge_alloc_conf`: the new variable value (None = leave unset) and what was done."""

    value: str | None
    notes: list[str] = field(default_factory=list)


def parse_alloc_conf(text: str | None) -> dict[str, str]:
    """`"a:1,b:2"` -> `{"a": "1", "b": "2"}` (order kept; a later duplicate key wins, as in PyTorch)."""
    entries: dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        key, sep, value = item.partition(":")
        if not sep:
            raise ValueError(f"PYTORCH_CUDA_ALLOC_CONF entry {item!r} is not key:value")
        entries.pop(key.strip(), None)
        entries[key.strip()] = value.strip()
    return entries


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def merge_alloc_conf(existing: str | None, allocator: Any) -> AllocConfMerge:
    """Merge `allocator` (an `H3Config.allocator`: backend, expandable_segments, max_split_size_mb,
    garbage_collection_threshold) into the current `PYTORCH_CUDA_ALLOC_CONF` value `existing`. Returns an
    `AllocConfMerge`: the value to set (None: leave the variable unset) and notes on what changed."""
    entries = parse_alloc_conf(existing)
    notes: list[str] = []
    backend = getattr(allocator, "backend", None)
    if backend is not None:
        previous = entries.get("backend")
        if previous is not None and previous != backend:
            notes.append(f"backend {previous} (ComfyUI default) replaced by {backend} from h3_config.yaml")
        entries["backend"] = backend
    effective = entries.get("backend", "native")
    for key in NATIVE_ONLY_KEYS:
        value = getattr(allocator, key, None)
        if value is None:
            continue
        if effective == "cudaMallocAsync":
            notes.append(f"{key} ignored: it configures the native allocator and the backend is cudaMallocAsync "
                         "(set allocator.backend: native, or start ComfyUI with --disable-cuda-malloc)")
            continue
        entries[key] = _format_value(value)
    value = ",".join(f"{k}:{v}" for k, v in entries.items()) or None
    return AllocConfMerge(value=value, notes=notes)


__all__ = ["AllocConfMerge", "merge_alloc_conf"]
