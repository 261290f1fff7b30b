"""Short, stable digests of what a sampling run consumes, for the key a checkpoint is matched on.

A digest is the same in two processes that get the same inputs (no object ids, no random uuids), so a
restarted server recognises its own checkpoint; tensors are digested by dtype, shape and a CRC32 of
their bytes (copied to the host once; a 14 MB latent takes a few milliseconds).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from typing import Any

import torch

# Keys whose values change on every run without changing the result (ComfyUI gives each converted
# conditioning entry a fresh `uuid.uuid4()`).
VOLATILE_KEYS = frozenset({"uuid"})


def tensor_crc32(tensor: torch.Tensor) -> int:
    """CRC32 of `tensor`'s bytes in its own dtype (host copy when it lives elsewhere)."""
    flat = tensor.detach().contiguous().reshape(-1).cpu()
    return zlib.crc32(flat.view(torch.uint8).numpy()) if flat.numel() else 0


def tensor_digest(tensor: torch.Tensor) -> str:
    """``"<dtype> [shape] crc <hex>"``: equal exactly when dtype, shape and every byte are equal (up to CRC)."""
    dtype = str(tensor.dtype).removeprefix("torch.")
    return f"{dtype} {list(tensor.shape)} crc {tensor_crc32(tensor):08x}"


def _walk(value: Any, out: list[str], depth: int) -> None:
    if depth > 12:
        out.append("...")
        return
    if isinstance(value, torch.Tensor):
        out.append(tensor_digest(value))
    elif isinstance(value, (str, int, float, bool, type(None))):
        out.append(repr(value))
    elif isinstance(value, Mapping):
        out.append("{")
        for name in sorted(value, key=str):
            if name in VOLATILE_KEYS:
                continue
            out.append(f"{name!s}:")
            _walk(value[name], out, depth + 1)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for item in value:
            _walk(item, out, depth + 1)
        out.append("]")
    elif hasattr(value, "cond"):  # ComfyUI's CONDRegular / CONDCrossAttn / CONDConstant carry `.cond`
        out.append(type(value).__name__)
        _walk(value.cond, out, depth + 1)
    else:  # other objects (hooks, control nets): their type, never their id
        out.append(type(value).__name__)


def structure_digest(value: Any) -> str:
    """CRC32 (8 hex digits) over a nested structure: tensors by content, mappings by sorted key (skipping
    `VOLATILE_KEYS`), sequences in order, ComfyUI CONDs by their `.cond`, other objects by type name."""
    parts: list[str] = []
    _walk(value, parts, 0)
    return f"{zlib.crc32(chr(31).join(parts).encode()):08x}"


def sigmas_digest(sigmas: Iterable[float] | torch.Tensor) -> str:
    """``"<n> steps, <first> -> <last>, crc <hex>"`` over the exact float32 values of a noise schedule."""
    values = torch.as_tensor(sigmas if isinstance(sigmas, torch.Tensor) else list(sigmas)).detach().float().cpu()
    steps = max(values.numel() - 1, 0)
    ends = f"{float(values[0]):.6g} -> {float(values[-1]):.6g}" if values.numel() else "empty"
    return f"{steps} steps, {ends}, crc {tensor_crc32(values):08x}"


def module_identity(module: torch.nn.Module) -> str:
    """Class, parameter count and dtype of `module`, and a CRC of the first 4,096 values of its first and
    last parameters where they can be read (weights on a meta or quantized storage are left out, said so)."""
    params = list(module.parameters())
    text = f"{type(module).__name__}, {sum(p.numel() for p in params):,} parameters"
    if params:
        text += f", {str(params[0].dtype).removeprefix('torch.')}"
        try:
            text += (f", weights crc {tensor_crc32(params[0].reshape(-1)[:4096]):08x}"
                     f"/{tensor_crc32(params[-1].reshape(-1)[:4096]):08x}")
        except Exception:  # noqa: BLE001 - identity without the weights rather than no identity
            text += ", weights not readable"
    return text


__all__ = ["module_identity", "sigmas_digest", "structure_digest", "tensor_crc32", "tensor_digest"]
