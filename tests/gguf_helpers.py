"""Shared by tests/test_gguf_*.py and their ComfyUI worker: tiny H3 GGUF files written with gguf's own
`GGUFWriter` and `gguf.quants.quantize` (Q4_K: the project's encoder, gguf has none), and their dequantised
state dicts (`gguf.quants.dequantize`, the reference decoder).

Only numpy, torch and gguf are imported here (the ComfyUI worker imports this file too).
"""

from __future__ import annotations

import numpy as np
import torch

# ComfyUI MiniMaxH3Model kwargs: every quantisable linear has rows of a multiple of 256 values (K-quant blocks);
# text_dim differs from hidden_size (ComfyUI skips condition_proj and the refiner for text already at hidden_size)
CONFIG = dict(hidden_size=256, num_layers=2, token_refiner_num_layers=1, num_attention_heads=4, attention_head_dim=64,
              ffn_hidden_size=256, text_dim=512, timestep_input_dim=32, time_embed_hidden_size=64,
              time_embed_dim=256, rope_inv_freq_len=4)
CURVE_GRID = 9


def high_precision(name: str) -> bool:
    from h3director.weights.h3_keys import is_high_precision

    return is_high_precision(name)


def quantisable(name: str, value: torch.Tensor, qtype) -> bool:
    import gguf

    block = gguf.GGML_QUANT_SIZES[qtype][0]
    return value.ndim == 2 and name.endswith(".weight") and value.shape[-1] % block == 0 and not high_precision(name)


def quantize(array: np.ndarray, qtype) -> np.ndarray:
    """gguf's quantiser, or the project's Q4_K encoder (`h3director.weights.kquant`; gguf has none)."""
    import gguf

    if qtype == gguf.GGMLQuantizationType.Q4_K:
        from h3director.weights.kquant import quantize_q4_k

        return quantize_q4_k(array)
    return gguf.quants.quantize(array, qtype)


def write_gguf(path, sd: dict[str, torch.Tensor], qtype, arch: str = "minimax_h3", prefix: str = "") -> dict:
    """Write `sd` (float32 tensors) to `path`: quantisable linear weights as `qtype`, the rest F32.
    Returns {name: the dequantised float32 tensor the file holds} (keys without `prefix`)."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    dequantised = {}
    for name, value in sd.items():
        array = value.detach().to(torch.float32).contiguous().numpy()
        if quantisable(name, value, qtype):
            data = quantize(array, qtype)
            writer.add_tensor(prefix + name, data, raw_dtype=qtype)
            dequantised[name] = torch.from_numpy(gguf.quants.dequantize(data, qtype).copy())
        else:
            writer.add_tensor(prefix + name, array)
            dequantised[name] = value.detach().to(torch.float32).clone()
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dequantised


def comfy_state_dict(h3, seed: int = 0, curve: bool = False) -> dict[str, torch.Tensor]:
    """Random weights in ComfyUI's key layout for `CONFIG` (curve form: `adaln_t_table`, no time embedder)."""
    import comfy.ops

    kwargs = dict(CONFIG, adaln_curve_grid=CURVE_GRID) if curve else CONFIG
    model = h3.MiniMaxH3Model(**kwargs, dtype=torch.float32, operations=comfy.ops.disable_weight_init)
    generator = torch.Generator().manual_seed(seed)
    sd = {k: 0.1 * torch.randn(v.shape, generator=generator) for k, v in model.state_dict().items()}
    sd["rope.inv_freq"] = 1.0 / (10000 ** (torch.arange(CONFIG["rope_inv_freq_len"], dtype=torch.float32)
                                           / CONFIG["rope_inv_freq_len"]))
    return sd


def truncate(path, keep_bytes: int) -> None:
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:keep_bytes])


__all__ = ["CONFIG", "CURVE_GRID", "comfy_state_dict", "np", "quantisable", "truncate", "write_gguf"]
