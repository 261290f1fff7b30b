"""safetensors H3 DiT -> GGUF, streaming: one tensor in memory at a time, written atomically.

Conventions (those ComfyUI-GGUF's loader reads):

- ``general.architecture = "minimax_h3"``; tensor names are the DiT's own keys (an all-in-one checkpoint's
  ``model.diffusion_model.`` prefix is removed; its other components are left out and listed in the summary);
- before anything is written, the DiT's keys are checked against what the project's GGUF loaders read
  (`h3_keys.loader_key_problem`: ComfyUI's layout, exactly ComfyUI's `MiniMaxH3Model` tensors); a
  diffusers-keyed or incomplete checkpoint is refused, naming offending keys;
- tensors the loaders use as stored (`h3_keys.HIGH_PRECISION_PATTERNS`) and every 1-D tensor keep their
  stored float type (F32, F16 or BF16; float8 is widened to F16, which is exact);
- matrices are quantised to the requested type by ``gguf.quants.quantize``, or by `kquant` for the K-quants
  (Q4_K, Q5_K, Q6_K; gguf has no K-quant encoder); a matrix whose rows do not hold whole blocks keeps its
  stored type (listed). `TYPES` lists what ``--type`` accepts: the types both loaders decode;
- ``Q4_K_M`` is a per-tensor mix, the analogue of llama.cpp's (``LLAMA_FTYPE_MOSTLY_Q4_K_M`` in
  ``llama_tensor_get_type``): there, attention-value tensors (``attn_v``, and a fused ``attn_qkv``, which it
  classes with them) and ``ffn_down`` are Q6_K in the layers where ``use_more_bits(i, n)`` holds (``i < n/8``
  or ``i >= 7n/8`` or ``(i - n/8) % 3 == 2``, integer division: the first and last eighth and every third
  layer between, about half of them), the output matrix Q6_K, everything else Q4_K. For H3: a block's fused
  ``attn.qkv_proj`` (it holds the value projection) and ``mlp.fc2`` (the FFN down projection) are Q6_K in
  the blocks chosen by ``use_more_bits(block, blocks)``, counted separately for ``blocks.N`` and
  ``token_refiner.blocks.N``; every other quantised matrix is Q4_K (the output heads are kept as stored
  already). Each tensor's type is recorded in the GGUF tensor table as usual; ``h3director.convert.type``
  says ``Q4_K_M``;
- a tensor of more than 4 dims (ggml's limit) is refused (ComfyUI's H3 model has none).

`plan_conversion` decides every tensor's output type from the header alone; `convert` writes the file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from h3director.core.atomic_file import atomic_path
from h3director.errors import InvalidInputError
from h3director.weights.files import SafetensorsWeights
from h3director.weights.h3_keys import detect_h3, is_high_precision, loader_key_problem

ARCHITECTURE = "minimax_h3"
MAX_GGML_DIMS = 4
_STORED = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F8_E4M3": "F16", "F8_E5M2": "F16", "F64": "F32",
           "I8": "I8", "I16": "I16", "I32": "I32", "I64": "I64"}
_OWN_ENCODERS = ("Q4_K", "Q5_K", "Q6_K")  # weights.kquant
_GGUF_ENCODERS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # gguf.quants.quantize
MIXES = {"Q4_K_M": ("Q4_K", "Q6_K")}  # mix -> (base type, upgraded type)
TYPES = _GGUF_ENCODERS + _OWN_ENCODERS + tuple(MIXES)  # what --type accepts (case-insensitive)
_MIXED_STACKS = ("token_refiner.blocks.", "blocks.")  # longest first
_MIXED_ROLES = ("attn.qkv_proj.weight", "mlp.fc2.weight")  # value (fused qkv), FFN down


def use_more_bits(index: int, count: int) -> bool:
    """llama.cpp's layer choice for its _M mixes: the first and last eighth of `count` layers and every third
    layer between them (about half)."""
    return index < count // 8 or index >= 7 * count // 8 or (index - count // 8) % 3 == 2


def mix_type(out_name: str, base: str, upgraded: str, counts: dict[str, int]) -> str:
    """The type of quantisable matrix `out_name` in a mix (see the module docstring); `counts`: blocks per stack."""
    for stack in _MIXED_STACKS:
        if out_name.startswith(stack):
            index, _, role = out_name[len(stack):].partition(".")
            if role in _MIXED_ROLES and index.isdigit() and use_more_bits(int(index), counts[stack]):
                return upgraded
            return base
    return base


@dataclass(frozen=True)
class TensorPlan:
    """Source `name` -> `out_name` of `out_type`, written with ggml `write_shape` (torch order); `reason`."""

    name: str
    out_name: str
    shape: tuple[int, ...]
    source_type: str
    out_type: str
    write_shape: tuple[int, ...]
    nbytes: int
    reason: str


@dataclass
class ConversionPlan:
    """What `plan_conversion` decided for a `target` type, before any tensor is read: one `TensorPlan` per
    tensor written, the `dropped` tensors of other components (name -> bytes), and the DiT's `key_style` and
    `curve_form` as `h3_keys.detect_h3` found them."""

    target: str
    tensors: list[TensorPlan] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)  # name -> bytes (other components)
    key_style: str = ""
    curve_form: bool = False


def _nbytes(qtype_name: str, shape: tuple[int, ...]) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[qtype_name]]
    return math.prod(shape) // block * size


def plan_conversion(source: SafetensorsWeights, target: str) -> ConversionPlan:
    """The `ConversionPlan` for writing `source` as a GGUF of `target` type (one of `TYPES`, checked by
    `convert`): each tensor's output name, type and bytes, decided from the validated header alone (no
    tensor data read). `InvalidInputError` for a source that is not an H3 DiT the GGUF loaders take."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    where = repr(str(source.path))
    found = detect_h3(source.entries, None, where=where)
    dit_names = [n[len(found.prefix):] for n in source.entries if n.startswith(found.prefix)]
    problem = loader_key_problem(dit_names, found)
    if problem:
        raise InvalidInputError(f"{where}: {problem}; nothing written")
    plan = ConversionPlan(target, key_style=found.key_style, curve_form=found.curve_form)
    base, upgraded = MIXES.get(target, (target, target))
    counts = {stack: len({n[len(stack):].split(".", 1)[0] for n in dit_names if n.startswith(stack)})
              for stack in _MIXED_STACKS}
    block = max(GGML_QUANT_SIZES[GGMLQuantizationType[t]][0] for t in (base, upgraded))
    for entry in source.entries.values():
        if not entry.name.startswith(found.prefix):
            plan.dropped[entry.name] = entry.nbytes
            continue
        out_name = entry.name[len(found.prefix):]
        if entry.type not in _STORED:
            raise InvalidInputError(f"{str(source.path)!r}: tensor {entry.name!r} has dtype {entry.type}, which "
                                    "GGUF cannot store")
        stored = _STORED[entry.type]
        shape = entry.shape or (1,)
        if len(shape) > MAX_GGML_DIMS:
            raise InvalidInputError(f"{where}: tensor {entry.name!r} has {len(shape)} dims, more than GGUF's "
                                    f"{MAX_GGML_DIMS}; nothing written")
        write_shape = shape
        floating = entry.type.startswith(("F", "BF"))
        if not floating:
            out, reason = stored, "integer tensor, kept"
        elif is_high_precision(out_name):
            out, reason = stored, "high precision, kept as stored"
        elif len(shape) < 2:
            out, reason = stored, "1-D, kept as stored"
        elif write_shape[-1] % block:
            out, reason = stored, f"rows of {write_shape[-1]} are not whole {block}-value blocks, kept as stored"
        elif upgraded != base:
            out = mix_type(out_name, base, upgraded, counts)
            reason = f"quantised ({target}: {'value/FFN-down, more bits' if out == upgraded else 'base'})"
        else:
            out, reason = target, "quantised"
        plan.tensors.append(TensorPlan(entry.name, out_name, shape, entry.type, out, write_shape,
                                       _nbytes(out, write_shape), reason))
    return plan


def _to_numpy_float32(tensor) -> np.ndarray:
    import torch

    return tensor.to(torch.float32).contiguous().numpy()


def _encode(tensor, item: TensorPlan) -> np.ndarray:
    """The bytes (uint8, or a plain numpy array for F32/F16/ints) of one tensor in its output type."""
    import torch
    from gguf import GGMLQuantizationType, quants

    if item.out_type == "BF16":
        return tensor.to(torch.bfloat16).contiguous().reshape(item.write_shape).view(torch.uint8).numpy()
    if item.out_type in ("I8", "I16", "I32", "I64"):
        return tensor.contiguous().reshape(item.write_shape).numpy()
    values = _to_numpy_float32(tensor).reshape(item.write_shape)
    if item.out_type == "F32":
        return values
    if item.out_type == "F16":
        return values.astype(np.float16)
    if item.out_type in _OWN_ENCODERS:
        from h3director.weights import kquant

        return kquant.quantize(values, item.out_type)
    return quants.quantize(values, GGMLQuantizationType[item.out_type])


def convert(in_path: str | os.PathLike, out_path: str | os.PathLike, target: str,
            progress: Callable[[int, int, TensorPlan], None] | None = None) -> ConversionPlan:
    """Convert the safetensors H3 DiT at `in_path` into a GGUF of `target` type (one of `TYPES`) at
    `out_path`; returns the `ConversionPlan` followed. `progress(done, total, tensor_plan)` is called after
    each tensor. `InvalidInputError` for an unknown `target`, or an input that is not a convertible H3 DiT,
    before anything is written.

    Streams: the tensor table is written first from the plan, then each tensor is loaded, encoded and
    appended before the next is read. The output appears under its final name only when complete.
    """
    from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter

    target = target.upper()
    if target not in TYPES:
        raise InvalidInputError(f"--type {target!r} is not a type the quantiser writes; expected one of "
                                f"{', '.join(TYPES)}")
    out_path = Path(out_path)
    with SafetensorsWeights(Path(in_path)) as source:
        plan = plan_conversion(source, target)
        with atomic_path(out_path) as temporary:
            writer = GGUFWriter(str(temporary), ARCHITECTURE)
            writer.add_uint32("general.quantization_version", GGML_QUANT_VERSION)
            writer.add_string("general.name", Path(in_path).stem)
            writer.add_string("h3director.convert.type", target)
            for item in plan.tensors:
                qtype = GGMLQuantizationType[item.out_type]
                if item.out_type in ("F32", "F16", "I8", "I16", "I32", "I64"):
                    dtype = {"F32": np.float32, "F16": np.float16, "I8": np.int8, "I16": np.int16,
                             "I32": np.int32, "I64": np.int64}[item.out_type]
                    writer.add_tensor_info(item.out_name, item.write_shape, np.dtype(dtype), item.nbytes)
                else:
                    writer.add_tensor_info(item.out_name, item.write_shape, np.dtype(np.float32), item.nbytes,
                                           raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_ti_data_to_file()
            for index, item in enumerate(plan.tensors):
                data = _encode(source.load(item.name), item)
                if data.nbytes != item.nbytes:
                    raise InvalidInputError(f"internal: {item.name} encoded to {data.nbytes} bytes, "
                                            f"planned {item.nbytes}")
                writer.write_tensor_data(data)
                del data
                if progress is not None:
                    progress(index + 1, len(plan.tensors), item)
            writer.close()
    return plan


__all__ = ["MIXES", "TYPES", "ConversionPlan", "TensorPlan", "convert", "mix_type", "plan_conversion",
           "use_more_bits"]
