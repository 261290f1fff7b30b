"""What a weight file holds, from its validated header (and ComfyUI's per-layer quantisation entries).

`summarise(path)` returns a plain dict (JSON-ready): format, architecture label, tensor count, parameter
count, bytes, a breakdown by storage type, the components found (DiT, text encoder, video VAE, audio VAE,
other; see `h3_keys.split_components`), and for an H3 DiT its key style, block count, whether it is pruned
(curve-form ``adaln_t_table``) and the bytes of its largest block and of everything outside the blocks
(what a planner needs to decide residency and block offload), and for a ComfyUI quantised safetensors file its
layers per quantisation (`comfy_quant_layers`: the small ``comfy_quant`` entries are the only data read).
"""

from __future__ import annotations

import json
import math
import os
import re
from typing import Any

from h3director.errors import InvalidInputError
from h3director.weights.files import open_weights
from h3director.weights.h3_keys import detect_h3, split_components

_BLOCK = re.compile(r"^(?:blocks|transformer_blocks)\.(\d+)\.")


def _tally(rows: dict[str, dict[str, int]], key: str, params: int, nbytes: int) -> None:
    row = rows.setdefault(key, {"tensors": 0, "params": 0, "bytes": 0})
    row["tensors"] += 1
    row["params"] += params
    row["bytes"] += nbytes


COMFY_QUANT_SUFFIX = ".comfy_quant"
MAX_COMFY_QUANT_BYTES = 4096
"""A layer's ``comfy_quant`` entry (JSON as uint8) larger than this is refused: ComfyUI's are tens of bytes."""


def comfy_quant_layers(source) -> dict[str, int]:
    """Layers per ComfyUI quantisation of an open safetensors `source` (`files.SafetensorsWeights`), read from
    the ``<layer>.comfy_quant`` entries ComfyUI's loader reads (comfy/sd.py): {format: layers}, where format is
    the entry's ``format`` (a `comfy.quant_ops.QUANT_ALGOS` key), ``+convrot`` appended for int8 layers with a
    rotation. {} for a file without such entries (or a GGUF). `InvalidInputError` for an entry that is not
    a 1-D uint8 JSON object of at most `MAX_COMFY_QUANT_BYTES` bytes with a string ``format``."""
    if getattr(source, "kind", "") != "safetensors":
        return {}
    layers: dict[str, int] = {}
    for name, entry in source.entries.items():
        if not name.endswith(COMFY_QUANT_SUFFIX):
            continue
        if entry.type != "U8" or len(entry.shape) != 1 or entry.nbytes > MAX_COMFY_QUANT_BYTES:
            raise InvalidInputError(f"{name}: a comfy_quant entry must be 1-D uint8 of at most "
                                    f"{MAX_COMFY_QUANT_BYTES} bytes, got {entry.type} {list(entry.shape)}")
        raw = b"".join(source.raw_chunks(name))
        try:
            conf = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise InvalidInputError(f"{name}: not JSON ({exc})") from None
        fmt = conf.get("format") if isinstance(conf, dict) else None
        if not isinstance(fmt, str) or not 0 < len(fmt) <= 64:
            raise InvalidInputError(f"{name}: no string 'format' in {raw[:80]!r}")
        key = fmt + ("+convrot" if fmt == "int8_tensorwise" and conf.get("convrot") is True else "")
        layers[key] = layers.get(key, 0) + 1
    return layers


def summarise(path: str | os.PathLike) -> dict[str, Any]:
    """The summary of the weight file at `path` (see the module docstring); sizes in bytes."""
    with open_weights(path) as source:
        entries = source.entries
        by_type: dict[str, dict[str, int]] = {}
        components: dict[str, dict[str, int]] = {}
        for component, names in split_components(entries).items():
            for name in names:
                e = entries[name]
                params = math.prod(e.shape)
                _tally(components, component, params, e.nbytes)
                _tally(by_type, e.type, params, e.nbytes)
        summary: dict[str, Any] = {
            "path": str(path), "format": source.kind, "architecture": source.architecture or None,
            "tensors": len(entries), "params": sum(r["params"] for r in components.values()),
            "bytes": sum(e.nbytes for e in entries.values()),
            "types": dict(sorted(by_type.items(), key=lambda kv: -kv[1]["bytes"])),
            "components": components, "dit": None, "comfy_quant": comfy_quant_layers(source),
        }
        if source.kind == "gguf" and source.architecture:
            try:
                detect_h3(entries, source.architecture, where=repr(str(path)))
            except InvalidInputError as exc:
                summary["refused"] = str(exc)
        dit_names = split_components(entries).get("dit", [])
        if dit_names:
            found = detect_h3(dit_names)
            blocks: dict[int, int] = {}
            outside = 0
            for name in dit_names:
                match = _BLOCK.match(name[len(found.prefix):])
                if match:
                    blocks[int(match.group(1))] = blocks.get(int(match.group(1)), 0) + entries[name].nbytes
                else:
                    outside += entries[name].nbytes
            patch = found.prefix + ("video_patch_proj.weight" if found.key_style == "comfy" else "proj_in.weight")
            summary["dit"] = {
                "hidden": entries[patch].shape[0] if patch in entries else None,
                "key_style": found.key_style, "prefix": found.prefix, "pruned": found.curve_form,
                "blocks": len(blocks), "largest_block_bytes": max(blocks.values(), default=0),
                "block_bytes": sum(blocks.values()), "outside_blocks_bytes": outside, "reason": found.reason,
            }
    return summary


__all__ = ["COMFY_QUANT_SUFFIX", "MAX_COMFY_QUANT_BYTES", "comfy_quant_layers", "summarise"]
