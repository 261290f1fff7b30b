"""ComfyUI adapter for H3 DiT GGUF files: ComfyUI's own `MiniMaxH3Model`, linear weights kept quantised.

`load_gguf_dit(path)` returns a MODEL (`GGUFModelPatcher`, a `comfy.model_patcher.ModelPatcher`) of
ComfyUI's `comfy.ldm.minimax.model.MiniMaxH3Model`, configured by ComfyUI's own detection
(`comfy.model_detection.model_config_from_unet` on the file's tensor shapes):

- every `Linear` whose weight is stored quantised (Q8_0, Q4_K, ...) keeps the file's bytes: its `weight`
  parameter is a uint8 tensor `[out_features, bytes_per_row]` viewing the memory map (nothing read until
  used), with the type in `gguf_qtype` and the logical shape in `gguf_shape`. On each forward the layer
  moves those bytes to the input's device, dequantises them there (`h3director.weights.dequant`: the
  native core on the CPU, torch kernels elsewhere), casts to the model's weight dtype and then the
  compute dtype (what the stock loader's stored weight and cast would give), applies LoRA patches and
  `weight_function`s to that dequantised weight, runs `F.linear`, and drops it: the dequant peak is one
  layer's weight;
- every other tensor (patch projections, time embedder, output heads, `adaln_t_table`, norms, biases,
  and any linear stored as F32/F16/BF16) is used as stored: cast once at load to the dtype ComfyUI's model
  declares for it, as `load_diffusion_model_state_dict` would.

LoRA: `GGUFModelPatcher.patch_weight_to_device` never bakes a patch into quantised bytes; the patch is
applied on the fly to the dequantised weight (in the lowvram path ComfyUI's own `LowVramPatch` in
`weight_function` does the same; one patch per key is applied, never both). ComfyUI's lowvram loading
works unchanged: a quantised layer's size is its bytes, and its offload cost (what lowvram planning reserves
while it runs) is its float32 decode plus the cast (`dequant_peak_bytes`). Under Dynamic VRAM this patcher is the classic
one (it subclasses `ModelPatcher`, not `ModelPatcherDynamic`): the GGUF MODEL is loaded and offloaded by
module, which ComfyUI supports beside dynamic models.

`comfy.ops.cast_bias_weight` on a quantised layer is not supported (it would cast the bytes as numbers):
the layer's own forward is the way in, and `GGUFLinear.gguf_weight_bias(input)` gives the dequantised
`(weight, bias)` for code that needs them. The DiT memory node (`comfy_dit.linear_kind`) sees these
layers as "stock" (their forward is not plain `F.linear` over a cast weight) and calls them whole.

Units: bytes; shapes are torch order (`[out_features, in_features]` for a linear weight).
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path
from typing import Any

from h3director.errors import InvalidInputError

log = logging.getLogger(__name__)

FLOAT_QTYPES = ("F32", "F16", "BF16")
DIT_PREFIXES = ("model.diffusion_model.", "diffusion_model.")


def qtype_name(qtype: Any) -> str:
    """"Q4_K" for `gguf.GGMLQuantizationType.Q4_K` (or a name already)."""
    return getattr(qtype, "name", str(qtype))


def is_quantised(qtype: Any) -> bool:
    return qtype_name(qtype) not in FLOAT_QTYPES


# ----------------------------------------------------------------------------------------------- ops

def dequantize_weight(raw, qtype: str, shape: tuple[int, ...], dtype, device):
    """A quantised weight's bytes (`raw`, uint8, any device) -> a new `dtype` tensor of `shape` on `device`.

    On the CPU the native core decodes into a torch-allocated buffer; elsewhere the bytes cross to the device
    and the torch kernels decode them there. Both are bit-identical to `gguf.quants.dequantize`."""
    import torch

    from h3director.weights import dequant, dequant_torch

    device = torch.device(device)
    if device.type == "cpu":
        source = raw if raw.device.type == "cpu" else raw.cpu()
        out = torch.empty(shape, dtype=torch.float32)
        dequant.dequantize_tensor(source.reshape(-1), qtype, shape, dtype=torch.float32, device="cpu", out=out)
    else:
        flat = raw.reshape(-1).to(device, non_blocking=True)
        out = dequant_torch.dequantize_blocks(flat, qtype, torch.float32).view(shape)
    return out if out.dtype == dtype else out.to(dtype)


def dequant_peak_bytes(module, patched: bool = False) -> int:
    """Bytes a quantised layer's forward adds on its device while its weight is in use: the float32 decode plus
    its cast to the model dtype (plus a float32 LoRA intermediate when `patched`)."""
    import torch

    count = module.out_features * module.in_features
    store = module.weight_comfy_model_dtype or torch.float32
    cast = 0 if store == torch.float32 else count * store.itemsize
    return count * 4 + cast + (2 * count * 4 if patched else 0)


def _linear_mixin():
    """The GGUF `Linear` behaviour, as a mixin over the Linear of the op set the stock loader would pick."""
    import torch
    import torch.nn.functional as F

    class GGUFLinear:
        """A ComfyUI `Linear` whose weight may stay quantised (see the module docstring).

        `gguf_qtype` (str or None), `gguf_shape` (`(out_features, in_features)`), `gguf_lora` (the
        `LowVramPatch` `GGUFModelPatcher` applies on the fly, or None)."""

        gguf_qtype = None
        gguf_shape = None
        gguf_lora = None

        def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
            # weights arrive from the file; nothing is allocated here
            torch.nn.Module.__init__(self)
            self.in_features = in_features
            self.out_features = out_features
            self.weight = None
            self.bias = None
            self.comfy_need_lazy_init_bias = bias
            self.weight_comfy_model_dtype = dtype
            self.bias_comfy_model_dtype = dtype

        def reset_parameters(self):
            return None

        def set_quantised(self, raw, qtype: str) -> None:
            """Keep `raw` (uint8, `[out_features, bytes_per_row]`) as this layer's weight, dequantised on use."""
            self.weight = torch.nn.Parameter(raw, requires_grad=False)
            self.gguf_qtype = qtype
            self.gguf_shape = (self.out_features, self.in_features)

        def gguf_weight_bias(self, input, dtype=None, device=None):
            """The dequantised weight (LoRA and weight functions applied) and the cast bias for `input`."""
            import comfy.model_management as mm
            from comfy.model_patcher import LowVramPatch

            dtype = input.dtype if dtype is None else dtype
            device = input.device if device is None else device
            store = self.weight_comfy_model_dtype or torch.float32
            weight = dequantize_weight(self.weight, self.gguf_qtype, self.gguf_shape, store, device)
            if weight.dtype != dtype:
                weight = weight.to(dtype)
            functions = list(self.weight_function)
            lowvram = getattr(self, "weight_lowvram_function", None)
            if lowvram is not None:
                functions.insert(0, lowvram)
            lora = self.gguf_lora
            if lora is not None and not any(isinstance(f, LowVramPatch) and f.key == lora.key for f in functions):
                functions.insert(0, lora)
            for f in functions:
                weight = f(weight)
            bias = None
            if self.bias is not None:
                bias = mm.cast_to(self.bias, dtype, device, non_blocking=mm.device_supports_non_blocking(device))
                for f in self.bias_function:
                    bias = f(bias)
            return weight, bias

        def forward(self, input, *args, **kwargs):
            if self.gguf_qtype is None:
                return super().forward(input, *args, **kwargs)
            import comfy.ops

            comfy.ops.run_every_op()
            weight, bias = self.gguf_weight_bias(input)
            return F.linear(input, weight, bias)

    return GGUFLinear


def make_ops(weight_dtype, compute_dtype):
    """The op set for the GGUF model: the stock choice for these dtypes (`disable_weight_init` or
    `manual_cast`), with a GGUF-aware `Linear`."""
    import comfy.ops

    base = comfy.ops.disable_weight_init if compute_dtype is None or compute_dtype == weight_dtype \
        else comfy.ops.manual_cast
    mixin = _linear_mixin()
    linear = type("GGUFLinear", (mixin, base.Linear), {"__module__": __name__, "__qualname__": "GGUFLinear"})
    return type("GGUFOps", (base,), {"Linear": linear, "__module__": __name__, "__qualname__": "GGUFOps"})


def is_gguf_linear(module) -> bool:
    """True when `module` is a linear layer made by `make_ops` that holds quantised GGUF weights."""
    return getattr(module, "gguf_qtype", None) is not None and hasattr(module, "gguf_weight_bias")


# ------------------------------------------------------------------------------------------- patcher

def _patcher_class():
    import comfy.model_patcher as mp
    import comfy.utils

    class GGUFModelPatcher(mp.ModelPatcher):
        """`ModelPatcher` that applies weight patches of quantised layers on the fly (never baked)."""

        def _gguf_module(self, key: str):
            owner, _, name = key.rpartition(".")
            if name != "weight" or not owner:
                return None
            try:
                module = comfy.utils.get_attr(self.model, owner)
            except AttributeError:
                return None
            return module if is_gguf_linear(module) else None

        def patch_weight_to_device(self, key, device_to=None, inplace_update=False, return_weight=False,
                                   force_cast=False):
            module = self._gguf_module(key)
            if module is None:
                return super().patch_weight_to_device(key, device_to=device_to, inplace_update=inplace_update,
                                                      return_weight=return_weight, force_cast=force_cast)
            patch = mp.LowVramPatch(key, self.patches) if key in self.patches else None
            if return_weight:
                import torch

                device = device_to if device_to is not None else module.weight.device
                weight = dequantize_weight(module.weight, module.gguf_qtype, module.gguf_shape, torch.float32,
                                           device)
                return patch(weight) if patch is not None else weight
            module.gguf_lora = patch
            return module.weight

        def _load_list(self, for_dynamic=False, default_device=None):
            # the offload cost of a quantised layer is its dequantised weight (float32 decode + the cast), not
            # its bytes x the model dtype that the stock estimate takes from the uint8 parameter
            loading = super()._load_list(for_dynamic=for_dynamic, default_device=default_device)
            if for_dynamic:
                return loading
            corrected = []
            for entry in loading:
                module = entry[-2]
                if is_gguf_linear(module):
                    module_mem = entry[-4]
                    entry = (module_mem + dequant_peak_bytes(module, f"{entry[-3]}.weight" in self.patches),
                             *entry[1:])
                corrected.append(entry)
            return corrected

        def unpatch_model(self, device_to=None, unpatch_weights=True):
            if unpatch_weights:
                for module in self.model.modules():
                    if is_gguf_linear(module):
                        module.gguf_lora = None
            return super().unpatch_model(device_to=device_to, unpatch_weights=unpatch_weights)

    return GGUFModelPatcher


# ------------------------------------------------------------------------------------------- loading

def _strip_prefix(names, prefix: str) -> dict[str, str]:
    return {name[len(prefix):]: name for name in names if name.startswith(prefix)} if prefix else \
        {name: name for name in names}


def _meta_state_dict(tensors: dict, keys: dict[str, str]):
    import torch

    return {key: torch.empty(tensors[name].shape, dtype=torch.float32, device="meta") for key, name in keys.items()}


def _resolve(root, key: str):
    owner, _, name = key.rpartition(".")
    module = root
    for part in owner.split(".") if owner else ():
        module = getattr(module, part, None)
        if module is None:
            return None, name
    return module, name


def _declared(module, name: str):
    """(dtype, shape) the model declares for `module.name` (lazy Linears: from their features)."""
    current = getattr(module, name, None)
    if current is not None:
        return current.dtype, tuple(current.shape)
    dtype = getattr(module, f"{name}_comfy_model_dtype", None)
    if name == "weight":
        return dtype, (module.out_features, module.in_features)
    return dtype, (module.out_features,)


def assign_weights(diffusion_model, gguf, keys: dict[str, str], where: str) -> dict[str, int]:
    """Put the file's tensors into `diffusion_model`; return counts {"quantised": n, "as_stored": m}.

    Raises `InvalidInputError` naming missing, unexpected and mis-shaped tensors (before any is read)."""
    import torch

    from h3director.weights import dequant

    expected = {k for k, _ in diffusion_model.named_parameters()} | {k for k, _ in diffusion_model.named_buffers()}
    for module_name, module in diffusion_model.named_modules():
        if is_gguf_linear(module) or hasattr(module, "comfy_need_lazy_init_bias"):
            prefix = f"{module_name}." if module_name else ""
            expected.add(prefix + "weight")
            if getattr(module, "comfy_need_lazy_init_bias", False):
                expected.add(prefix + "bias")
    missing = sorted(expected - set(keys))
    unexpected = sorted(set(keys) - expected)
    plan = []
    reshaped = []
    for key in sorted(set(keys) & expected):
        module, name = _resolve(diffusion_model, key)
        info = gguf.tensors[keys[key]]
        dtype, shape = _declared(module, name)
        if tuple(info.shape) != tuple(shape):
            reshaped.append(f"{key} {list(info.shape)} (model: {list(shape)})")
        plan.append((key, module, name, info, dtype))
    if missing or unexpected or reshaped:
        parts = []
        for label, items in (("missing", missing), ("unexpected", unexpected), ("wrong shape", reshaped)):
            if items:
                parts.append(f"{len(items)} {label} (e.g. {', '.join(items[:3])})")
        raise InvalidInputError(f"{where}: tensors do not match ComfyUI's H3 model detected from it: "
                                + "; ".join(parts))
    counts = {"quantised": 0, "as_stored": 0}
    for _key, module, name, info, dtype in plan:
        qtype = qtype_name(info.qtype)
        if name == "weight" and is_quantised(qtype) and hasattr(module, "set_quantised"):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # read-only memory map: never written
                raw = torch.from_numpy(info.raw)
            module.set_quantised(raw.view(info.shape[0], -1), qtype)
            counts["quantised"] += 1
            continue
        value = dequant.dequantize_tensor(info, dtype=dtype or torch.float32)
        if name in module._buffers:
            module._buffers[name] = value
        else:
            setattr(module, name, torch.nn.Parameter(value, requires_grad=False))
        counts["as_stored"] += 1
    return counts


def load_gguf_dit(path: str | os.PathLike, dtype=None, load_device=None, offload_device=None):
    """A MODEL of ComfyUI's H3 DiT from a GGUF file, quantised linears dequantised per layer on use.

    `dtype`: the model's weight dtype (None: ComfyUI's choice for the device, as for a safetensors DiT).
    Raises `InvalidInputError` for a malformed file, another architecture, or tensors that do not match
    the model ComfyUI detects from the file (one line naming the file and the problem)."""
    import comfy.model_detection
    import comfy.model_management as mm

    from h3director.weights.gguf_file import open_gguf
    from h3director.weights.h3_keys import detect_h3

    path = Path(path)
    gguf = open_gguf(path)
    try:
        detection = detect_h3(gguf.tensors, gguf.architecture, where=str(path))
        if detection.kind != "dit":
            raise InvalidInputError(f"{path}: not an H3 DiT ({detection.reason})")
        if detection.key_style != "comfy":
            raise InvalidInputError(f"{path}: H3 DiT with {detection.key_style} keys ({detection.reason}); "
                                    "the ComfyUI loader takes ComfyUI-keyed files (blocks.N.attn.qkv_proj...)")
        keys = _strip_prefix(gguf.tensors, detection.prefix)
        meta = _meta_state_dict(gguf.tensors, keys)
        config = comfy.model_detection.model_config_from_unet(meta, "")
        if config is None or config.unet_config.get("image_model") != "minimax_h3":
            raise InvalidInputError(f"{path}: ComfyUI does not detect an H3 DiT from these tensors ({detection.reason})")
        load_device = mm.get_torch_device() if load_device is None else load_device
        offload_device = mm.unet_offload_device() if offload_device is None else offload_device
        params = sum(info.n_elements for info in gguf.tensors.values())
        supported = list(config.supported_inference_dtypes)
        unet_dtype = dtype if dtype is not None else mm.unet_dtype(model_params=params, supported_dtypes=supported)
        manual_cast = mm.unet_manual_cast(unet_dtype, load_device, supported)
        config.set_inference_dtype(unet_dtype, manual_cast, device=load_device)
        config.custom_operations = make_ops(unet_dtype, manual_cast)
        model = config.get_model({}, "")
        counts = assign_weights(model.diffusion_model, gguf, keys, str(path))
    except InvalidInputError:
        gguf.close()
        raise
    model.gguf_file = gguf  # the memory map lives as long as the model
    model.gguf_summary = {"path": str(path), "architecture": gguf.architecture, "detection": detection.reason,
                          "dtype": str(unet_dtype).replace("torch.", ""), **counts,
                          "quantised_bytes": sum(info.nbytes for k, info in gguf.tensors.items()
                                                 if is_quantised(qtype_name(info.qtype)))}
    patcher = _patcher_class()(model, load_device=load_device, offload_device=offload_device)
    log.info("H3 Director GGUF DiT: %s (%s): %d quantised linears, %d tensors as stored, weights %s",
             path.name, detection.reason, counts["quantised"], counts["as_stored"], model.gguf_summary["dtype"])
    return patcher


__all__ = ["dequant_peak_bytes", "dequantize_weight", "is_gguf_linear", "load_gguf_dit", "make_ops"]
