"""diffusers adapter for H3 DiT GGUF files: `load_h3_transformer_gguf` -> `MiniMaxH3Transformer3DModel`.

The file is opened with `h3director.weights.gguf_file.open_gguf` (validated, memory-mapped: tensors are
views of the map, nothing is copied until used); quantised tensors become diffusers' own `GGUFParameter`s
and the model is built by diffusers' `from_single_file` with `GGUFQuantizationConfig` and its H3 key
conversion (`convert_minimax_h3_transformer_checkpoint_to_diffusers`: renames, the `[q; k; v]` split and
the SwiGLU `[gate; value]` -> `[value; gate]` swap, done on whole quantised rows). Each diffusers `GGUFLinear`
dequantises its weight on use, in `compute_dtype` (= `torch_dtype`), through `h3director.weights`
(`use_exact_dequant`): diffusers' own Q8_0 decode differs from `gguf.quants.dequantize` by up to ~1e-4.

Gaps filled here:
- the config comes from the tensor shapes when none is given (no network: nothing is fetched);
- `rope.inv_freq` is taken from the file (diffusers recomputes it from `rope_theta`);
- pruned (curve-form) files carry `adaln_t_table` `[grid, k]` instead of a time embedder, which diffusers
  0.42 refuses. Here the model is built with `time_embed_dim = k` and then (`install_adaln_curves`) its
  time embedding is the table read as ComfyUI's `MiniMaxH3Model` does with `adaln_curve_grid`: for each
  distinct timestep t (in [0, 1]), position p = clamp(t, 0, 1) * (grid - 1), row i = min(floor(p), grid - 2),
  embedding = lerp(table[i], table[i + 1], p - i), in float32; the AdaLN projections take it without the
  SiLU (ComfyUI's curve form sets `apply_silu=False`) and run in float32 (ComfyUI's `adaln_dtype`).

Units: timesteps in [0, 1] as diffusers' H3 model takes them; shapes in torch order.
"""

from __future__ import annotations

import json
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch

from h3director.errors import InvalidInputError

FLOAT_QTYPES = ("F32", "F16", "BF16")


def _count(keys, prefix: str) -> int:
    return len({k[len(prefix):].split(".", 1)[0] for k in keys if k.startswith(prefix)})


def config_from_shapes(shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """`MiniMaxH3Transformer3DModel` config from ComfyUI-keyed tensor shapes (the DiT prefix removed).
    `InvalidInputError` naming a tensor the config cannot be inferred without."""
    try:
        head_dim = shapes["blocks.0.attn.q_norm.weight"][0]
        config = dict(
            hidden_size=shapes["video_patch_proj.weight"][0], num_layers=_count(shapes, "blocks."),
            num_refiner_layers=_count(shapes, "token_refiner.blocks."), attention_head_dim=head_dim,
            num_attention_heads=shapes["blocks.0.attn.qkv_proj.weight"][0] // (3 * head_dim),
            ffn_dim=shapes["blocks.0.mlp.fc1.weight"][0] // 2,
            in_channels=shapes["final_layer.video_out.weight"][0] // 4,
            audio_in_channels=shapes["final_layer.audio_out.weight"][0],
            text_dim=shapes["condition_proj.weight"][1], rope_freq_dim=shapes["rope.inv_freq"][0])
        if "adaln_t_table" in shapes:
            config.update(time_embed_dim=shapes["adaln_t_table"][1], time_embed_hidden_dim=1)
        else:
            config.update(freq_dim=shapes["time_embedder.proj_in.weight"][1],
                          time_embed_hidden_dim=shapes["time_embedder.proj_in.weight"][0],
                          time_embed_dim=shapes["time_embedder.proj_out.weight"][0])
    except KeyError as missing:
        raise InvalidInputError(f"H3 DiT tensor {missing} is missing: cannot infer the model config") from None
    return config


class AdalnCurveEmbedding(torch.nn.Module):
    """The curve-form time embedding: `forward(t)` [M] in [0, 1] -> [M, k] float32 (see the module docstring)."""

    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.register_buffer("adaln_t_table", table.to(torch.float32))

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        table = self.adaln_t_table
        pos = t.to(device=table.device, dtype=torch.float32).clamp(0.0, 1.0) * (table.shape[0] - 1)
        i0 = pos.floor().long().clamp(max=table.shape[0] - 2)
        return torch.lerp(table[i0], table[i0 + 1], (pos - i0).unsqueeze(1))


def _curve_modulation_forward(self, temb):
    temb = self.linear(temb.to(torch.float32)).to(self._h3_block_dtype)
    return temb.view(-1, 6 * self.hidden_size).chunk(6, dim=-1)


def _curve_norm_out_forward(self, hidden_states, temb, timestep_indices):
    shift, scale = self.linear(temb.to(torch.float32)).chunk(2, dim=-1)
    hidden_states = self.norm(hidden_states)
    return hidden_states * (1.0 + scale.index_select(0, timestep_indices)) + shift.index_select(0, timestep_indices)


def install_adaln_curves(model, table: torch.Tensor, block_dtype: torch.dtype = torch.float32) -> None:
    """Make `model` (a `MiniMaxH3Transformer3DModel`) a curve-form H3: time embedding from `table`, AdaLN
    projections without SiLU, in float32. Its `time_embed_dim` must be `table.shape[1]`. The blocks'
    modulation vectors are cast to `block_dtype` (the block stack's dtype) before use, as ComfyUI casts
    them to the residual stream's dtype; `norm_out`'s stay float32 (ComfyUI's final layer modulates in the
    AdaLN dtype). `InvalidInputError` for a `table` that is not ``[grid >= 2, time_embed_dim]``."""
    import types

    if table.ndim != 2 or table.shape[0] < 2 or table.shape[1] != model.config.time_embed_dim:
        raise InvalidInputError(f"adaln_t_table must be [grid >= 2, {model.config.time_embed_dim}], "
                                f"got {list(table.shape)}")
    model.time_proj = torch.nn.Identity()
    model.time_embedder = AdalnCurveEmbedding(table)
    for block in model.transformer_blocks:
        block.adaln_proj._h3_block_dtype = block_dtype
        block.adaln_proj.forward = types.MethodType(_curve_modulation_forward, block.adaln_proj)
    model.norm_out.forward = types.MethodType(_curve_norm_out_forward, model.norm_out)
    model.adaln_curve_grid = int(table.shape[0])


def _exact_gguf_forward(self, inputs):
    from h3director.integrations.comfy_gguf import dequantize_weight

    raw = self.weight.as_subclass(torch.Tensor)
    qtype = getattr(self.weight.quant_type, "name", str(self.weight.quant_type))
    weight = dequantize_weight(raw, qtype, (self.out_features, self.in_features), self.compute_dtype, inputs.device)
    bias = self.bias.to(self.compute_dtype) if self.bias is not None else None
    return torch.nn.functional.linear(inputs, weight, bias)


def use_exact_dequant(model) -> int:
    """Route every diffusers `GGUFLinear` of `model` through `h3director.weights` dequantisation (bit-identical
    to `gguf.quants.dequantize`; diffusers' own Q8_0 decode is not), per layer on use; returns the count."""
    import types

    from diffusers.quantizers.gguf.utils import GGUFLinear

    count = 0
    for module in model.modules():
        if isinstance(module, GGUFLinear) and hasattr(module.weight, "quant_type"):
            module.forward = types.MethodType(_exact_gguf_forward, module)
            count += 1
    return count


def _checkpoint(gguf, prefix: str, torch_dtype) -> dict[str, torch.Tensor]:
    """ComfyUI-keyed tensors: quantised ones as diffusers `GGUFParameter`s viewing the map, others as stored."""
    from diffusers.quantizers.gguf.utils import SUPPORTED_GGUF_QUANT_TYPES, GGUFParameter

    from h3director.weights.dequant import dequantize_tensor

    checkpoint = {}
    for name, info in gguf.tensors.items():
        key = name[len(prefix):]
        qtype = getattr(info.qtype, "name", str(info.qtype))
        if qtype in FLOAT_QTYPES:
            checkpoint[key] = dequantize_tensor(info, dtype=torch.float32 if qtype == "F32" else
                                                torch.float16 if qtype == "F16" else torch.bfloat16)
            continue
        if info.qtype not in SUPPORTED_GGUF_QUANT_TYPES:
            raise InvalidInputError(f"{gguf.path}: {name} is {qtype}, which diffusers' GGUF support does not decode")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only memory map: never written
            raw = torch.from_numpy(info.raw).view(info.shape[0], -1)
        checkpoint[key] = GGUFParameter(raw, quant_type=info.qtype)
    return checkpoint


def load_h3_transformer_gguf(path: str | os.PathLike, config: dict | str | os.PathLike | None = None,
                             torch_dtype: torch.dtype = torch.bfloat16):
    """`MiniMaxH3Transformer3DModel` from an H3 DiT GGUF (ComfyUI keys; `minimax_h3`, or H3 labelled `wan`).

    `config`: a config dict, a folder with `config.json`, or None to infer it from the tensor shapes.
    `torch_dtype`: the compute dtype of the quantised linears and the dtype of the unquantised weights
    (diffusers keeps its fp32 modules in float32). Raises `InvalidInputError` for a malformed file,
    another architecture, diffusers-keyed files, or quant types diffusers cannot decode."""
    from diffusers import GGUFQuantizationConfig, MiniMaxH3Transformer3DModel

    from h3director.weights.gguf_file import open_gguf
    from h3director.weights.h3_keys import detect_h3

    path = Path(path)
    gguf = open_gguf(path)
    detection = detect_h3(gguf.tensors, gguf.architecture, where=str(path))
    if detection.key_style != "comfy":
        raise InvalidInputError(f"{path}: {detection.reason}; only ComfyUI-keyed H3 GGUFs are converted here")
    checkpoint = _checkpoint(gguf, detection.prefix, torch_dtype)
    shapes = {k: tuple(gguf.tensors[detection.prefix + k].shape) for k in checkpoint}
    inferred = config_from_shapes(shapes)
    if config is None:
        config = inferred
    elif not isinstance(config, dict):
        config = json.loads((Path(config) / "config.json").read_text())
    table = checkpoint.pop("adaln_t_table", None)
    inv_freq = checkpoint.get("rope.inv_freq")
    if table is not None:
        config = {**config, "time_embed_dim": int(table.shape[1]), "time_embed_hidden_dim": 1}
        freq = int(config.get("freq_dim", 256))
        # placeholders for the time embedder the curve replaces (1 hidden unit, zero weights; removed below)
        checkpoint.update({"time_embedder.proj_in.weight": torch.zeros(1, freq),
                           "time_embedder.proj_in.bias": torch.zeros(1),
                           "time_embedder.proj_out.weight": torch.zeros(int(table.shape[1]), 1),
                           "time_embedder.proj_out.bias": torch.zeros(int(table.shape[1]))})
    with tempfile.TemporaryDirectory(prefix="h3-gguf-config-") as folder:
        (Path(folder) / "config.json").write_text(json.dumps(
            {"_class_name": "MiniMaxH3Transformer3DModel", **config}))
        model = MiniMaxH3Transformer3DModel.from_single_file(
            checkpoint, config=folder, quantization_config=GGUFQuantizationConfig(compute_dtype=torch_dtype),
            torch_dtype=torch_dtype)
    if inv_freq is not None:
        if tuple(inv_freq.shape) != tuple(model.rope.inv_freq.shape):
            raise InvalidInputError(f"{path}: rope.inv_freq has shape {list(inv_freq.shape)}, "
                                    f"the model {list(model.rope.inv_freq.shape)}")
        model.rope.inv_freq.copy_(inv_freq.to(torch.float32))
    if table is not None:
        install_adaln_curves(model, table, block_dtype=torch_dtype)
        for module in [*(b.adaln_proj for b in model.transformer_blocks), model.norm_out]:
            module.linear.to(torch.float32)
            if hasattr(module.linear, "compute_dtype"):
                module.linear.compute_dtype = torch.float32
    model.gguf_exact_layers = use_exact_dequant(model)
    model.gguf_file = gguf  # the memory map lives as long as the model
    model.gguf_detection = detection.reason
    return model


__all__ = ["AdalnCurveEmbedding", "config_from_shapes", "install_adaln_curves", "load_h3_transformer_gguf",
           "use_exact_dequant"]
