"""safetensors H3 DiT -> GGUF, streaming: one tensor in memory at a time, written atomically.

Conventions (those ComfyUI-GGUF's loader reads):

- ``general.architecture = "minimax_h3"``; tensor names are the DiT's own keys (an all-in-one checkpoint's
  ``model.diffusion_model.`` prefix is removed; its other components are left out and listed in the summary);
- tensors the loaders use as stored (`h3_keys.HIGH_PRECISION_PATTERNS`) and every 1-D tensor keep their
  stored float type (F32, F16 or BF16; float8 is widened to F16, which is exact);
- matrices are quantised to the requested type by ``gguf.quants.quantize``, or by `kquant` for Q4_K (gguf
  has no K-quant encoder); a matrix whose rows do not hold whole blocks keeps its stored type (listed);
- a tensor of more than 4 dims (ggml's limit) is stored flattened to 2-D, with its torch shape in
  ``comfy.gguf.orig_shape.<name>`` (an INT32 array).

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
from h3director.weights.gguf_file import ORIG_SHAPE_PREFIX
from h3director.weights.h3_keys import detect_h3, is_high_precision

ARCHITECTURE = "minimax_h3"
MAX_GGML_DIMS = 4
_STORED = {"F32": "F32", "F16": "F16", "BF16": "BF16", "F8_E4M3": "F16", "F8_E5M2": "F16", "F64": "F32",
           "I8": "I8", "I16": "I16", "I32": "I32", "I64": "I64"}
_OWN_ENCODERS = ("Q4_K",)


def quantisable_types() -> tuple[str, ...]:
    """Every GGML type `convert` can write: those ``gguf.quants.quantize`` implements, plus `kquant`'s."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

    found = []
    for qtype in GGMLQuantizationType:
        block = GGML_QUANT_SIZES[qtype][0]
        try:
            quants.quantize(np.zeros((1, max(block, 256)), np.float32), qtype)
        except (NotImplementedError, ValueError, AssertionError):
            continue
        found.append(qtype.name)
    return tuple(found) + tuple(t for t in _OWN_ENCODERS if t not in found)


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
    """Decide each tensor's output from the validated header (no tensor data read)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    found = detect_h3(source.entries, None, where=repr(str(source.path)))
    plan = ConversionPlan(target, key_style=found.key_style, curve_form=found.curve_form)
    block = GGML_QUANT_SIZES[GGMLQuantizationType[target]][0]
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
        write_shape = shape if len(shape) <= MAX_GGML_DIMS else (shape[0], math.prod(shape[1:]))
        floating = entry.type.startswith(("F", "BF"))
        if not floating:
            out, reason = stored, "integer tensor, kept"
        elif is_high_precision(out_name):
            out, reason = stored, "high precision, kept as stored"
        elif len(shape) < 2:
            out, reason = stored, "1-D, kept as stored"
        elif write_shape[-1] % block:
            out, reason = stored, f"rows of {write_shape[-1]} are not whole {block}-value blocks, kept as stored"
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
    if item.out_type in _OWN_ENCODERS and item.out_type not in _gguf_native():
        from h3director.weights import kquant

        return kquant.quantize(values, item.out_type)
    return quants.quantize(values, GGMLQuantizationType[item.out_type])


def _gguf_native() -> tuple[str, ...]:
    return tuple(t for t in quantisable_types() if t not in _OWN_ENCODERS)


def convert(in_path: str | os.PathLike, out_path: str | os.PathLike, target: str,
            progress: Callable[[int, int, TensorPlan], None] | None = None) -> ConversionPlan:
    """Convert the safetensors H3 DiT at `in_path` into a GGUF of `target` type at `out_path`.

    Streams: the tensor table is written first from the plan, then each tensor is loaded, encoded and
    appended before the next is read. The output appears under its final name only when complete.
    """
    from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFValueType, GGUFWriter

    target = target.upper()
    types = quantisable_types()
    if target not in types:
        raise InvalidInputError(f"--type {target!r} is not a type the quantiser writes; expected one of "
                                f"{', '.join(types)}")
    out_path = Path(out_path)
    with SafetensorsWeights(Path(in_path)) as source:
        plan = plan_conversion(source, target)
        with atomic_path(out_path) as temporary:
            writer = GGUFWriter(str(temporary), ARCHITECTURE)
            writer.add_uint32("general.quantization_version", GGML_QUANT_VERSION)
            writer.add_string("general.name", Path(in_path).stem)
            writer.add_string("h3director.convert.type", target)
            for item in plan.tensors:
                if item.write_shape != item.shape:
                    # ComfyUI-GGUF reads orig_shape as an array of INT32
                    writer.add_key_value(ORIG_SHAPE_PREFIX + item.out_name, [int(d) for d in item.shape],
                                         GGUFValueType.ARRAY, sub_type=GGUFValueType.INT32)
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

