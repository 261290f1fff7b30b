"""Measured activation peaks of ONE real H3 DiT block per framework and tier (CPU, small widths).

Each `measure_*` function builds a random-initialised block of the real class (diffusers'
`MiniMaxH3TransformerBlock` inside a `MiniMaxH3Transformer3DModel`, ComfyUI's `DiTBlock` from
`comfy/ldm/minimax/model.py`), runs it once under `LiveBytesTracker` and returns the peak of live tensor
bytes created inside the block PLUS the block input's bytes (the planner's block ledger counts the input
residual). Tiers run through the project's adapters (`h3director.integrations.diffusers_dit`,
`h3director.integrations.comfy_dit`). Attention is PyTorch's SDPA (flash kernel for CPU) in both
frameworks. Shared by `tests/test_plan_dit_tiers.py`.

ComfyUI is imported from `COMFYUI_DIR` (the vendored tree by default, see tests/conftest.py), with its
arguments parsed as `--cpu --use-pytorch-cross-attention`, in a fresh Python (`measure_comfy_blocks` runs this file as a script): the pack's other tests put stand-in `comfy` modules
on sys.path (tests/comfy_harness/stubs), and the real ComfyUI cannot share a process with them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch

from h3director.plan.live_bytes import LiveBytesTracker

# heads 4 (head groups 2 and 4), head_dim 16, rotary 12 of 16 channels, FFN 160
DIFFUSERS_CONFIG = dict(num_attention_heads=4, attention_head_dim=16, hidden_size=64, num_layers=1,
                        num_refiner_layers=1, ffn_dim=160, text_dim=32, freq_dim=16, time_embed_hidden_dim=32,
                        time_embed_dim=32, rope_freq_dim=2)
COMFY_SHAPE = dict(hidden=64, heads=4, head_dim=16, ffn=160, t_dim=32)
TIMESTEPS = 2


# a second width set (6 heads of 24, rotary 18 of 24 channels, FFN 352: every width differs from the first)
DIFFUSERS_CONFIG_WIDE = dict(DIFFUSERS_CONFIG, num_attention_heads=6, attention_head_dim=24, hidden_size=144,
                             ffn_dim=352, rope_freq_dim=3)


def dit_shape_diffusers(config: dict | None = None):
    from h3director.plan.activations import DiTShape

    return DiTShape.from_config(config or DIFFUSERS_CONFIG)


def dit_shape_comfy():
    from h3director.plan.activations import DiTShape

    s = COMFY_SHAPE
    return DiTShape(hidden=s["hidden"], heads=s["heads"], head_dim=s["head_dim"], ffn=s["ffn"], rotary_dim=12)


def measure_diffusers_block(rows: int, dtype: torch.dtype, plan: dict | None = None, seed: int = 0,
                            config: dict | None = None) -> int:
    """Peak bytes (input included) of one diffusers block; `plan` = `apply_memory_plan` keywords, None = stock;
    `config`: the model's config (default `DIFFUSERS_CONFIG`)."""
    from diffusers import MiniMaxH3Transformer3DModel
    from torch.nn.attention import SDPBackend, sdpa_kernel

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = MiniMaxH3Transformer3DModel(**(config or DIFFUSERS_CONFIG)).eval().to(dtype)
    handle = None
    if plan is not None:
        from h3director.integrations.diffusers_dit import apply_memory_plan

        handle = apply_memory_plan(model, **plan)
    block = model.transformer_blocks[0]
    x = torch.randn(1, rows, model.config.hidden_size, dtype=dtype)
    temb = torch.randn(TIMESTEPS, model.config.time_embed_dim)
    indices = torch.arange(rows) % (3 * TIMESTEPS)
    rotary = model.rope(torch.randn(rows, 3))
    try:
        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION), LiveBytesTracker() as tracker:
            out = block(x, temb, indices, rotary)
            del out
    finally:
        if handle is not None:
            handle.remove()
    return tracker.peak_bytes + x.nbytes


def comfy_root() -> Path | None:
    """`COMFYUI_DIR` with H3 support (tests/conftest.py points it at the vendored tree when unset), or None."""
    from comfy_harness.vendored import h3_comfyui_root

    return h3_comfyui_root()


def import_comfy():
    """Import ComfyUI's H3 model module (CPU, PyTorch attention); returns `comfy.ldm.minimax.model`."""
    if "comfy.ldm.minimax.model" not in sys.modules:
        root = comfy_root()
        if root is None:
            raise RuntimeError("no ComfyUI source tree found")
        if str(root) not in sys.path:
            sys.path.insert(0, str(root))
        argv = sys.argv
        sys.argv = ["main.py", "--cpu", "--use-pytorch-cross-attention"]
        try:
            import comfy.options

            comfy.options.enable_args_parsing()
            import comfy.ldm.minimax.model  # noqa: F401
        finally:
            sys.argv = argv
    return sys.modules["comfy.ldm.minimax.model"]


def _comfy_block(dtype: torch.dtype, seed: int):
    model_module = import_comfy()
    import comfy.ops

    torch.manual_seed(seed)
    s = COMFY_SHAPE
    block = model_module.DiTBlock(s["hidden"], s["heads"], s["head_dim"], s["ffn"], s["t_dim"], 1e-6, 1e-6,
                                  dtype=dtype, operations=comfy.ops.disable_weight_init)
    block.requires_grad_(False)
    for param in block.parameters():
        param.data.normal_(0.0, 0.05)
    return model_module, block


def comfy_inputs(model_module, rows: int, dtype: torch.dtype):
    """Block inputs as ComfyUI's `_forward` makes them: x [rows, hidden], t_emb, contiguous modulation
    segments (text, audio, video rows at two timesteps), the rotation table."""
    s = COMFY_SHAPE
    x = torch.randn(rows, s["hidden"], dtype=dtype)
    t_emb = torch.randn(TIMESTEPS, s["t_dim"], dtype=dtype)
    third = rows // 3
    segments = [(0, third, 1), (third, 2 * third, 3 + 2), (2 * third, rows, 3 + 0)]
    rope = model_module.rope_rotation_table(torch.randn(rows, 12), dtype)
    return x, t_emb, segments, rope


def measure_comfy_block(rows: int, dtype: torch.dtype, plan: dict | None = None, seed: int = 0,
                        inference: bool = False) -> int:
    """Peak bytes (input included) of ComfyUI's `DiTBlock` with PyTorch attention: stock (`plan` None), or
    through `h3director.integrations.comfy_dit.run_block` at `DiTMemoryPlan(**plan)`; under
    `torch.inference_mode()` (as ComfyUI's executor samples) when `inference`, else `torch.no_grad()`."""
    model_module, block = _comfy_block(dtype, seed)
    import comfy.ldm.modules.attention as attention

    x, t_emb, segments, rope = comfy_inputs(model_module, rows, dtype)
    stock = model_module.optimized_attention
    model_module.optimized_attention = attention.attention_pytorch
    if plan is None:
        def forward():
            return block(x, t_emb, segments, rope, transformer_options={})
    else:
        from h3director.dit.tiers import DiTMemoryPlan
        from h3director.integrations.comfy_dit import run_block

        tier = DiTMemoryPlan(**plan)

        def forward():
            return run_block(block, tier, x, t_emb, segments, rope, {})
    try:
        grad_mode = torch.inference_mode() if inference else torch.no_grad()
        with grad_mode, LiveBytesTracker() as tracker:
            out = forward()
            del out
    finally:
        model_module.optimized_attention = stock
    return tracker.peak_bytes + x.nbytes


_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def measure_comfy_blocks(cases: list[tuple]) -> list[int]:
    """`measure_comfy_block` for each `(rows, "fp32" | "bf16", plan[, inference])` case, in one fresh Python."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(root / "tests")]))
    run = subprocess.run([sys.executable, __file__, json.dumps(cases)], capture_output=True, text=True, env=env,
                         cwd=str(root), timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"ComfyUI block measurement failed:\n{run.stderr[-4000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    cases = json.loads(sys.argv[1])
    print(json.dumps([measure_comfy_block(rows, _DTYPES[dtype], plan, inference=bool(rest and rest[0]))
                      for rows, dtype, plan, *rest in cases]))
