"""H3Director Memory Guard: preflight every diffusion-model forward against the memory budget.

The node clones the MODEL and adds a `DIFFUSION_MODEL` wrapper (ComfyUI's model-patcher wrapper
mechanism, `comfy/patcher_extension.py`). Before each forward the wrapper estimates the forward's
transient bytes from the packed token count and asks `h3director.core.guard.MemoryGuard` to
preflight them; the guard applies the configured action (`memory_safety.action_on_exceed`) and
raises `MemoryLimitExceeded` ("[Director Safety] GPU memory limit exceeded ...") instead of letting
the forward die in the allocator, so the prompt fails with a readable node error and the worker lives.
"""

from __future__ import annotations

from comfy_api.latest import io

from h3director.geometry import PATCH_SIZE
from h3director.units import GiB

GUARD_KEY = "h3director_memory_guard"
ACTIONS = ["from config", "stop_and_clear", "reduce_batch", "fallback_to_cpu"]
# Transient bytes per packed token of one H3 DiT block forward (bf16, fused attention): measured
# ~116 KB per token (h3-facts.md, ComfyUI-H3-Extended chunked_ref2v/PLAN.md).
BYTES_PER_TOKEN = 116_000


def forward_tokens(x) -> int:
    """Packed tokens of a diffusion-model input: video `[B, C, T, H, W]` patchified 2x2 (+ audio frames)."""
    tensors = list(x) if isinstance(x, (list, tuple)) else [x]
    tokens = 0
    for tensor in tensors:
        shape = tuple(getattr(tensor, "shape", ()))
        if len(shape) == 5:
            tokens += shape[0] * shape[2] * -(-shape[3] // PATCH_SIZE) * -(-shape[4] // PATCH_SIZE)
        elif len(shape) >= 2:
            tokens += shape[0] * shape[-1]
    return tokens


def make_guard_wrapper(guard, bytes_per_token: int = BYTES_PER_TOKEN):
    """A `DIFFUSION_MODEL` wrapper preflighting `tokens * bytes_per_token` with `guard` before each forward."""

    def wrapper(executor, x, *args, **kwargs):
        tokens = forward_tokens(x)
        guard.preflight(tokens * bytes_per_token, f"diffusion model forward ({tokens} tokens)")
        return executor(x, *args, **kwargs)

    return wrapper


class MemoryGuardNode(io.ComfyNode):
    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorMemoryGuard",
            display_name="H3Director Memory Guard",
            category="H3 Director/memory",
            description="Checks each diffusion-model forward against the GPU memory budget before it runs and "
                        "applies the configured action instead of an out-of-memory crash.",
            inputs=[io.Model.Input("model"),
                    io.Combo.Input("action", options=ACTIONS, default="from config"),
                    io.Float.Input("budget_gb", default=0.0, min=0.0, max=1024.0, step=0.5,
                                   tooltip="0 = memory_safety.max_gpu_memory_mb, or the device's total memory "
                                           "when that is unset")],
            outputs=[io.Model.Output(display_name="model")],
        )

    @classmethod
    def execute(cls, model, action, budget_gb) -> io.NodeOutput:
        from comfy.patcher_extension import WrappersMP

        from h3director.comfy import runtime
        from h3director.comfy.settings import pack_config
        from h3director.core.guard import MemoryGuard

        config = pack_config()
        guard_action = config.memory_safety.action_on_exceed if action == "from config" else action
        device = model.load_device
        budget = int(budget_gb * GiB) if budget_gb else config.memory_safety.max_gpu_memory_bytes
        if budget is None:
            budget = runtime.total_bytes(device)
        guard = MemoryGuard.from_config(config, device=str(device), budget_bytes=budget, action=guard_action,
                                        enabled=True)
        patched = model.clone()
        patched.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, GUARD_KEY, make_guard_wrapper(guard))
        return io.NodeOutput(patched)
