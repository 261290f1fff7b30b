"""Shared by tests/test_gguf_*.py and their ComfyUI worker: tiny H3 GGUF files written with gguf's own
`GGUFWriter` and `gguf.quants.quantize` (K-quants: the project's encoders, gguf has none), and their dequantised
state dicts (`gguf.quants.dequantize`, the reference decoder).

Only numpy, torch and gguf are imported at the top (the ComfyUI worker imports this file too); `converted_gguf`
imports safetensors and h3director when called.
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
    """gguf's quantiser, or the project's K-quant encoders (`h3director.weights.kquant`; gguf has none)."""
    import gguf

    from h3director.weights import kquant

    if qtype.name in kquant.ENCODERS:
        return kquant.quantize(array, qtype.name)
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


def converted_gguf(sd: dict[str, torch.Tensor], folder, type_name: str) -> tuple[str, dict]:
    """Save `sd` (ComfyUI keys) as safetensors in `folder`, convert it with `h3director weights convert`'s
    library call to `type_name` (e.g. "Q4_K_M"), and return (the GGUF's path, {name: the float32 tensor the
    file holds, decoded by `gguf.quants.dequantize`} for every tensor)."""
    import os

    import gguf
    from safetensors.torch import save_file

    from h3director.weights.convert import convert
    from h3director.weights.gguf_file import open_gguf

    source = os.path.join(str(folder), f"h3-{type_name}-source.safetensors")
    save_file({k: v.contiguous() for k, v in sd.items()}, source)
    out = os.path.join(str(folder), f"h3-convert-{type_name}.gguf")
    convert(source, out, type_name)
    held = {}
    with open_gguf(out) as f:
        for name, info in f.tensors.items():
            if info.qtype.name in ("F32", "F16", "BF16"):
                held[name] = sd[name].detach().to(torch.float32).clone()
            else:
                rows = np.array(info.raw).reshape(info.shape[0], -1)
                held[name] = torch.from_numpy(gguf.quants.dequantize(rows, info.qtype).copy()).reshape(info.shape)
    return out, held


def comfy_keyed(model) -> dict[str, torch.Tensor]:
    """A diffusers `MiniMaxH3Transformer3DModel`'s weights in ComfyUI's single-file layout (the inverse of
    diffusers' conversion)."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {"rope.inv_freq": model.rope.inv_freq.detach().clone()}
    renames = [("token_refiner.refiner_blocks.", "token_refiner.blocks."), ("time_embedder.linear_1.", "time_embedder.proj_in."),
               ("time_embedder.linear_2.", "time_embedder.proj_out."), ("audio_proj_in.", "audio_patch_proj."),
               ("context_embedder.", "condition_proj."), ("norm_out.norm.", "final_layer.norm."),
               ("norm_out.linear.", "final_layer.adaln_proj.linear."), ("audio_proj_out.", "final_layer.audio_out."),
               (".attn.norm_q.", ".attn.q_norm."), (".attn.norm_k.", ".attn.k_norm."), (".attn.to_out.0.", ".attn.out_proj."),
               (".ff.net.0.proj.", ".mlp.fc1."), (".ff.net.2.", ".mlp.fc2.")]
    for key in list(sd):
        if ".attn.to_k." in key or ".attn.to_v." in key:
            continue
        value = sd[key]
        new = key.replace("transformer_blocks.", "blocks.", 1) if key.startswith("transformer_blocks.") else key
        if new.startswith("proj_in."):
            new = "video_patch_proj." + new[len("proj_in."):]
        elif new.startswith("proj_out."):
            new = "final_layer.video_out." + new[len("proj_out."):]
        for a, b in renames:
            new = new.replace(a, b)
        if ".attn.to_q." in key:
            stem = key.split(".attn.to_q.")[0]
            value = torch.cat([sd[f"{stem}.attn.to_q.weight"], sd[f"{stem}.attn.to_k.weight"],
                               sd[f"{stem}.attn.to_v.weight"]])
            new = new.replace(".attn.to_q.", ".attn.qkv_proj.")
        if ".mlp.fc1." in new:
            value_half, gate = value.chunk(2)
            value = torch.cat([gate, value_half])
        out[new] = value
    return out


def truncate(path, keep_bytes: int) -> None:
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:keep_bytes])


__all__ = ["CONFIG", "CURVE_GRID", "comfy_keyed", "comfy_state_dict", "converted_gguf", "np", "quantisable", "truncate",
           "write_gguf"]
