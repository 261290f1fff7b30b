"""H3Director Memory Guard: preflight every diffusion-model forward against the memory budget.

The node clones the MODEL and adds a `DIFFUSION_MODEL` wrapper (ComfyUI's model-patcher wrapper
mechanism, `comfy/patcher_extension.py`). Before each forward the wrapper prices the forward's
activations with the DiT capacity check's cost model (`h3director.dit.capacity.ledger_cost_model`:
the planner's ledger of ComfyUI's H3 block at the model's widths, the packed row count and compute
dtype, at the tier the H3Director DiT Memory node starts from when it is installed, else the stock
block) and asks `h3director.core.guard.MemoryGuard` to preflight them; the guard applies the configured action (`memory_safety.action_on_exceed`) and
raises `MemoryLimitExceeded` ("[Director Safety] GPU memory limit exceeded ...") instead of letting
the forward die in the allocator, so the prompt fails with a readable node error and the worker lives.
"""

from __future__ import annotations

from comfy_api.latest import io

from h3director.geometry import PATCH_SIZE
from h3director.units import GiB

GUARD_KEY = "h3director_memory_guard"
ACTIONS = ["from config", "stop_and_clear", "reduce_batch", "fallback_to_cpu"]


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


def dit_shape_of(diffusion_model):
    """`DiTShape` of ComfyUI's H3 DiT (`comfy_dit.comfy_shape`); the released widths for anything else."""
    from h3director.plan.activations import DiTShape

    try:
        from h3director.integrations.comfy_dit import comfy_shape

        return comfy_shape(diffusion_model)
    except (AttributeError, IndexError, TypeError, ImportError):
        return DiTShape()


def _forward_rows(model, x, context, kwargs) -> int:
    """Packed rows of the forward: ComfyUI's own `PackedLayout` for the H3 model, else the token count."""
    if context is not None and getattr(model, "blocks", None) is not None:
        try:
            from h3director.integrations.comfy_dit import packed_rows

            return packed_rows(model, x, context, kwargs.get("minimax_payload"))
        except Exception:  # not the H3 layout: fall back to the token count
            pass
    return forward_tokens(x) + (int(context.shape[1]) if context is not None and context.ndim >= 2 else 0)


def _dit_memory_floor(transformer_options):
    """The tier the H3Director DiT Memory node starts from, when its wrapper is on this model; else stock."""
    from h3director.dit.tiers import STOCK

    wrappers = (transformer_options or {}).get("wrappers", {})
    for by_key in wrappers.values():
        for wrapper in (by_key or {}).get("h3director_dit_memory", []):
            handle = getattr(wrapper, "handle", None)
            floor = getattr(handle, "floor", None)
            if floor is not None:
                return floor
    return STOCK


def make_guard_wrapper(guard, cost_model=None):
    """A `DIFFUSION_MODEL` wrapper preflighting the forward's activation bytes with `guard`.

    `cost_model(plan, rows, dtype) -> bytes` (default: `ledger_cost_model` for ComfyUI's block at the
    model's widths, read at the first forward)."""
    models: dict = {}

    def wrapper(executor, x, *args, **kwargs):
        from h3director.dit.capacity import ledger_cost_model

        model = getattr(executor, "class_obj", None)
        context = args[1] if len(args) > 1 else kwargs.get("context")
        options = args[2] if len(args) > 2 else kwargs.get("transformer_options")
        context = context if hasattr(context, "shape") else None
        rows = _forward_rows(model, x, context, kwargs)
        dtype = context.dtype if context is not None else "bf16"
        cost = cost_model
        if cost is None:
            key = id(model)
            if key not in models:
                device = getattr(context, "device", None)
                models[key] = ledger_cost_model(dit_shape_of(model), "comfy", device=device)
            cost = models[key]
        plan = _dit_memory_floor(options if isinstance(options, dict) else None)
        guard.preflight(int(cost(plan, rows, dtype)),
                        f"diffusion model forward ({rows} packed rows, {plan.describe()})")
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
