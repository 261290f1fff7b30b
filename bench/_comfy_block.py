"""One ComfyUI H3 `DiTBlock`, optionally with its linear layers in a ComfyUI quantised layout, and the three ways
the benches run it side by side: ComfyUI's stock block, H3 Director's tiers (`comfy_dit.run_block`) and KJNodes'
H3 nodes (their object patches, applied as ComfyUI applies them).

Used by bench/dit_quantised_vs_kjnodes.py (CPU) and bench/gpu/dit_quantised_kjnodes.py (CUDA); bench/dit_memory.py
imports ComfyUI and makes its block inputs through `import_comfy` and `block_inputs`.

- `import_comfy(comfy_dir, cpu)`: ComfyUI's H3 model module, attention forced to PyTorch SDPA;
- `build_block(h3, shape, time_embed, layout, device)`: the block built with the operations ComfyUI picks for
  that layout on that device (`comfy.ops.pick_operations` with the layer quantisation detected from the state
  dict, as `comfy.sd` loads a quantised H3 file): the four big linears (`attn.qkv_proj`, `attn.out_proj`,
  `mlp.fc1`, `mlp.fc2`) quantised from random bf16 weights by the layout's own `quantize`, loaded through the
  layers' `_load_from_state_dict`; a layout the device has no kernel for runs ComfyUI's fallback (the weight
  dequantised per call, "emulated");
- `KJNodes(path)`: KJNodes' `nodes/minimax_nodes.py` loaded as ComfyUI loads a custom node folder (from a
  `custom_nodes/ComfyUI-KJNodes` link); `.patched(block, head_chunks, ffn_chunks)` runs its two H3 nodes on a
  `ModelPatcher` holding the block and sets their object patches while the `with` lasts.

Units: rows are packed-sequence rows; bytes are bytes.
"""

from __future__ import annotations

import contextlib
import json
import sys
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
LAYOUTS = {"bf16": None, "int8_tensorwise": "int8_tensorwise", "fp8_e4m3fn": "float8_e4m3fn",
           "fp8_e5m2": "float8_e5m2", "nvfp4": "nvfp4", "mxfp8": "mxfp8"}
"""Bench names -> ComfyUI `quant_ops.QUANT_ALGOS` formats (None: unquantised bf16)."""
QUANTISED_LINEARS = ("attn.qkv_proj", "attn.out_proj", "mlp.fc1", "mlp.fc2")
DTYPE = torch.bfloat16


def import_comfy(comfy_dir: str | None = None, cpu: bool = True):
    """ComfyUI's `comfy.ldm.minimax.model` from `comfy_dir` (default $COMFYUI_DIR, else the vendored
    .comfy/ComfyUI), its attention set to PyTorch SDPA (`attention_pytorch`). SystemExit when absent. Without
    torchvision / torchaudio (ComfyUI imports them for other models) the test harness's stand-ins take their place."""
    import importlib.util
    import os

    comfy_dir = comfy_dir or os.environ.get("COMFYUI_DIR") or str(REPO / ".comfy" / "ComfyUI")
    if not Path(comfy_dir, "comfy").is_dir():
        raise SystemExit(f"ComfyUI not found at {comfy_dir}: run scripts/setup_comfyui.sh or set COMFYUI_DIR")
    missing = [name for name in ("torchvision", "torchaudio") if importlib.util.find_spec(name) is None]
    finder = None
    if missing:     # ComfyUI imports them at module level for other models; the test harness's raising stand-ins
        sys.path.insert(0, str(REPO / "fixtures" / "comfy_harness"))
        from dit_worker import _UnavailableFinder

        finder = _UnavailableFinder(missing)
        sys.meta_path.insert(0, finder)
    if comfy_dir not in sys.path:
        sys.path.insert(0, comfy_dir)
    argv, sys.argv = sys.argv, [sys.argv[0], *(["--cpu"] if cpu else []), "--use-pytorch-cross-attention"]
    try:
        import comfy.options

        comfy.options.enable_args_parsing()
        import comfy.ldm.minimax.model as h3
        import comfy.ldm.modules.attention as attention
    finally:
        sys.argv = argv
        if finder is not None:      # only for ComfyUI's imports: others (transformers) must see them absent
            sys.meta_path.remove(finder)
    h3.optimized_attention = attention.attention_pytorch
    return h3


def block_inputs(h3, rows: int, hidden: int, time_embed: int, device="cpu", seed: int = 0):
    """`(x, t_emb, mod_segments, rope)` for one block call over `rows` packed rows: the residual stream (bf16,
    `[rows, hidden]`), two timesteps' embedding (the last eighth of the rows at the second), and the rope
    table of a 64 x 8 x 8 position grid, as ComfyUI's `_forward` hands them to a block."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g).to(DTYPE)
    temb = torch.randn(2, time_embed, generator=g).to(DTYPE)
    split = rows - rows // 8
    segments = [(0, split, 0), (split, rows, 3)]
    position_ids = torch.stack([torch.arange(rows) // 64, (torch.arange(rows) // 8) % 8,
                                torch.arange(rows) % 8], dim=-1).double()
    inv = 1.0 / (10000.0 ** (torch.arange(0, 32, 2, dtype=torch.float32) / 32))
    per_axis = position_ids.float().unsqueeze(-1) * inv.view(1, 1, -1)
    half = torch.cat(per_axis.unbind(dim=1), dim=-1)
    rope = h3.rope_rotation_table(torch.cat((half, half), dim=-1), DTYPE)
    return x.to(device), temb.to(device), segments, rope.to(device)


def _quantise(state_dict: dict, fmt: str) -> dict:
    """`state_dict` with `QUANTISED_LINEARS` in ComfyUI's on-disk layout for `fmt`: the quantised data, its
    scales under the names `comfy.ops._load_quantized_module` reads, and the `comfy_quant` JSON tensor."""
    import comfy.quant_ops as quant_ops

    layout = quant_ops.QUANT_ALGOS[fmt]["comfy_tensor_layout"]
    conf = torch.tensor(list(json.dumps({"format": fmt}).encode()), dtype=torch.uint8)
    out = dict(state_dict)
    for name in QUANTISED_LINEARS:
        weight = out.pop(f"{name}.weight")
        qt = quant_ops.QuantizedTensor.from_float(weight, layout)
        params = qt._params
        out[f"{name}.weight"] = qt._qdata
        if fmt == "nvfp4":
            out[f"{name}.weight_scale"] = params.block_scale
            out[f"{name}.weight_scale_2"] = params.scale
        else:
            out[f"{name}.weight_scale"] = params.scale
        out[f"{name}.comfy_quant"] = conf
        del weight, qt
    return out


def build_block(h3, shape, time_embed: int, layout: str, device="cpu", seed: int = 0):
    """ComfyUI's `DiTBlock` at `shape` (a `DiTShape`) with random weights (normal, std 0.02, bf16), its big
    linears in `layout` (a `LAYOUTS` key); returns `(block, path)`, path "native" (the layout's kernel),
    "emulated" (ComfyUI dequantises the weight per call: the device has no kernel for it) or "bf16"."""
    import comfy.ops
    import comfy.utils

    fmt = LAYOUTS[layout]
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    meta = h3.DiTBlock(shape.hidden, shape.heads, shape.head_dim, shape.ffn, time_embed, 1e-5, 1e-5, dtype=DTYPE,
                       device="meta", operations=comfy.ops.disable_weight_init)
    state = {}
    for key, value in meta.state_dict().items():
        t = torch.empty(value.shape, dtype=DTYPE, device=device)
        state[key] = t.normal_(0.0, 0.02, generator=gen) if not key.endswith("norm.weight") else t.fill_(1.0)
    del meta
    config = None
    if fmt is not None:
        state = _quantise(state, fmt)
        config = types.SimpleNamespace(quant_config=comfy.utils.detect_layer_quantization(state, ""))
    ops = comfy.ops.pick_operations(DTYPE, DTYPE, load_device=device, model_config=config)
    block = h3.DiTBlock(shape.hidden, shape.heads, shape.head_dim, shape.ffn, time_embed, 1e-5, 1e-5, dtype=DTYPE,
                        device=device, operations=ops)
    missing, unexpected = block.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise RuntimeError(f"{layout}: the block did not load its state dict (missing {missing}, "
                           f"unexpected {unexpected})")
    block.eval().requires_grad_(False)
    fc1 = block.mlp.fc1
    path = "bf16" if fmt is None else ("emulated" if getattr(fc1, "_full_precision_mm", False) else "native")
    return block, path


class KJNodes:
    """KJNodes' H3 nodes (`MiniMaxLowVRAMAttention`, `MiniMaxChunkFeedForward`) from a checkout at `path`."""

    def __init__(self, path: str | Path, custom_nodes: Path):
        sys.path.insert(0, str(REPO / "fixtures"))
        try:
            from comfy_harness.packs import load_pack_module
        finally:
            sys.path.pop(0)
        source = Path(path).resolve()
        if not (source / "nodes" / "minimax_nodes.py").is_file():
            raise SystemExit(f"--kjnodes {path}: no nodes/minimax_nodes.py there (a ComfyUI-KJNodes checkout?)")
        self.module = load_pack_module(source, custom_nodes, "ComfyUI-KJNodes", "nodes/minimax_nodes.py")
        self.path = source

    @contextlib.contextmanager
    def patched(self, block, head_chunks: int, ffn_chunks: int, seq_threshold: int = 256):
        """While the `with` lasts, `block` carries the object patches KJNodes' two H3 nodes add (LowVRAM
        attention with `head_chunks` head groups, then the FFN in `ffn_chunks` row chunks), set as ComfyUI's
        `ModelPatcher.patch_model` sets them; yields the `transformer_options` the nodes leave on the MODEL."""
        import comfy.model_patcher
        import comfy.utils

        holder = torch.nn.Module()
        holder.diffusion_model = torch.nn.Module()
        holder.diffusion_model.blocks = torch.nn.ModuleList([block])
        device = next(block.parameters()).device
        patcher = comfy.model_patcher.ModelPatcher(holder, device, device)
        m = self.module.MiniMaxLowVRAMAttention.execute(patcher, head_chunks).result[0]
        m = self.module.MiniMaxChunkFeedForward.execute(m, ffn_chunks, seq_threshold).result[0]
        backup = {}
        try:
            for key, value in m.object_patches.items():
                backup[key] = comfy.utils.set_attr(holder, key, value)
            yield m.model_options["transformer_options"]
        finally:
            for key, value in backup.items():
                comfy.utils.set_attr(holder, key, value)
            for module in (block, block.attn, block.mlp):
                vars(module).pop("forward", None)       # the restored value was the class's own bound forward


__all__ = ["DTYPE", "LAYOUTS", "QUANTISED_LINEARS", "KJNodes", "block_inputs", "build_block", "import_comfy"]
