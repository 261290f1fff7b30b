"""H3Director Memory Guard: preflight every diffusion-model forward against the memory budget.

The node clones the MODEL and adds a `DIFFUSION_MODEL` wrapper (ComfyUI's model-patcher wrapper
mechanism, `comfy/patcher_extension.py`). Before each forward the wrapper prices the forward's
activations with the cost model the H3Director DiT Memory node uses (`forward_price`: the planner's
ledger of ComfyUI's H3 block at the model's widths and attention backend, the packed row count and
compute dtype; with the DiT Memory node installed, exactly what its capacity check needs, at the tier it
starts from, found through `comfy_dit.dit_memory_of`; else at the stock block) and asks
`h3director.core.guard.MemoryGuard` to preflight them. A forward that does not fit, or
that runs out of memory, gets the node's action:

- ``stop_and_clear``: unload every model ComfyUI holds, empty the allocator caches, and fail the prompt
  with `MemoryLimitExceeded` ("[Director Safety] GPU memory limit exceeded ... on <device>"); the
  ComfyUI worker lives and the next prompt runs.
- ``reduce_batch``: retry the forward with a cheaper execution, the first whose preflight fits: more DiT
  chunks (the tiers above its floor, `DiTMemoryHandle.escalation`) when the DiT Memory node is installed
  on the model (later forwards keep the cheaper tier: `DiTMemoryHandle.escalate_floor`), else the latent
  batch split in 2, 4, ... parts (every tensor argument whose first dimension is the batch; outputs
  concatenated). Both are "exact where verified" (the same arithmetic in another grouping). When nothing
  cheaper fits it stops as above.
- ``fallback_to_cpu`` is not offered: ComfyUI's model patcher owns where the DiT weights live, so a
  DiT forward cannot be rerun on the CPU here. Steps that support it: library steps run with
  `MemoryGuard.run(step, device=...)`, and the decode (its out-of-memory ladder moves a clip to the CPU
  for diffusers VAEs). A config asking for it is refused when the node runs.
"""

from __future__ import annotations

from comfy_api.latest import io

from h3director.errors import H3DirectorError
from h3director.geometry import PATCH_SIZE
from h3director.units import GiB, format_size

GUARD_KEY = "h3director_memory_guard"
ACTIONS = ["from config", "stop_and_clear", "reduce_batch"]
DIT_FORWARD_ACTIONS = ("stop_and_clear", "reduce_batch")
"""What a DiT forward supports (see the module docstring); `fallback_to_cpu` is not among them."""


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
    from h3director.integrations import comfy_dit
    from h3director.plan.activations import DiTShape

    return comfy_dit.comfy_shape(diffusion_model) if comfy_dit.is_h3_model(diffusion_model) else DiTShape()


def _forward_rows(model, x, context, kwargs) -> int:
    """Packed rows of the forward: ComfyUI's own `PackedLayout` for the H3 model, else the token count.

    For the H3 model a failure to count is an error (`H3DirectorError` naming the cause): falling back to the
    token count would leave out the audio and conditioning rows and under-price the forward."""
    from h3director.integrations import comfy_dit

    if context is not None and comfy_dit.is_h3_model(model):
        try:
            return comfy_dit.packed_rows(model, x, context, kwargs.get("minimax_payload"))
        except Exception as error:
            raise H3DirectorError(f"[Director Safety] could not count the packed rows of this H3 forward "
                                  f"({type(error).__name__}: {error}); refusing to price it without its audio "
                                  "and conditioning rows") from error
    return forward_tokens(x) + (int(context.shape[1]) if context is not None and context.ndim >= 2 else 0)


def split_batch(x, args: tuple, kwargs: dict, parts: int) -> list[tuple]:
    """``(x, args, kwargs)`` for each of `parts` slices of the latent batch: every tensor whose first
    dimension is the batch is sliced (``torch.chunk``), the transformer options' per-item lists
    (``cond_or_uncond``, ``uuids``) too; everything else is passed as it is."""
    import torch

    batch = int(x.shape[0])
    chunks = [len(c) for c in torch.arange(batch).chunk(parts)]
    bounds = [sum(chunks[:i]) for i in range(len(chunks) + 1)]

    def cut(value, i):
        if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] == batch:
            return value[bounds[i]:bounds[i + 1]]
        if isinstance(value, dict) and any(k in value for k in ("cond_or_uncond", "uuids")):
            copied = dict(value)
            for key in ("cond_or_uncond", "uuids"):
                if isinstance(copied.get(key), list) and len(copied[key]) == batch:
                    copied[key] = copied[key][bounds[i]:bounds[i + 1]]
            return copied
        return value

    return [(cut(x, i), tuple(cut(a, i) for a in args), {k: cut(v, i) for k, v in kwargs.items()})
            for i in range(len(chunks))]


class _GuardedForward:
    """One guarded forward: its measurements, the cheaper executions `reduce_batch` may try, the stop."""

    def __init__(self, guard, stopper, executor, x, args, kwargs, cost, rows, dtype, handle) -> None:
        self.guard, self.stopper, self.executor = guard, stopper, executor
        self.x, self.args, self.kwargs = x, args, kwargs
        self.cost, self.rows, self.dtype, self.handle = cost, rows, dtype, handle

    def what(self, plan, rows=None, parts: int = 1) -> str:
        text = f"diffusion model forward ({rows or self.rows} packed rows, {plan.describe()}"
        return text + (f", batch in {parts} parts)" if parts > 1 else ")")

    def fits(self, plan, rows: int, what: str) -> bool:
        from h3director.core.guard import MemoryLimitExceeded

        try:
            self.guard.preflight(int(self.cost(plan, rows, self.dtype)), what)
        except MemoryLimitExceeded:
            return False
        return True

    def call(self, x, args, kwargs, what: str):
        """Run the executor; an allocator failure becomes `MemoryLimitExceeded` for `what`."""
        from h3director.core.oom import is_out_of_memory

        try:
            return self.executor(x, *args, **kwargs)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            self.guard.cache_clearer(self.guard.device)
            raise self.guard.limit_error(what, detail=f"out of memory: {str(error).splitlines()[0][:200]}") from error

    def record(self, what: str, action: str, error) -> None:
        from h3director.core.guard import GuardEvent

        self.guard.events.append(GuardEvent(what, "preflight", action, error.memory, error.measured_bytes,
                                            error.budget_bytes, None, self.guard.device))

    def reduce(self, plan, error):
        """The first cheaper execution that fits (more DiT chunks, else a batch split); None if none does."""
        import torch

        if self.handle is not None:
            for cheaper in self.handle.escalation(self.rows):
                what = self.what(cheaper)
                if self.fits(cheaper, self.rows, what):
                    self.handle.escalate_floor(cheaper)      # later forwards start from the cheaper tier
                    self.record(what, "reduce_batch", error)
                    return (self.call(self.x, self.args, self.kwargs, what),)
        batch = int(self.x.shape[0]) if isinstance(self.x, torch.Tensor) and self.x.ndim >= 1 else 1
        parts = 2
        while parts <= batch:
            rows = -(-self.rows * -(-batch // parts) // batch)
            what = self.what(plan, rows, parts)
            if self.fits(plan, rows, what):
                self.record(what, "reduce_batch", error)
                outputs = [self.call(x, args, kwargs, what) for x, args, kwargs in
                           split_batch(self.x, self.args, self.kwargs, parts)]
                return (torch.cat(outputs, dim=0),)
            parts *= 2
        return None

    def stop(self, error, note: str = "", model=None):
        from h3director.core.guard import MemoryLimitExceeded

        self.stopper()
        self.record(error.phase, "stop_and_clear", error)
        detail = "; ".join(part for part in (str(error).split("; ", 1)[1] if "; " in str(error) else "", note,
                                             "models unloaded and caches emptied") if part)
        heads = self.handle.heads if self.handle is not None else dit_shape_of(model).heads
        blocks = list(getattr(model, "blocks", None) or [])
        block_bytes = sum(p.numel() * p.element_size() for p in blocks[0].parameters()) if blocks else 0
        fit = would_have_fit(self.cost, self.rows, self.dtype, heads, error.budget_bytes, error.measured_bytes,
                             block_bytes=block_bytes, blocks=len(blocks))
        raise MemoryLimitExceeded(error.phase, error.memory, error.budget_bytes, error.measured_bytes,
                                  error.requested_bytes, detail=detail, device=error.device, would_fit=fit) from error


def would_have_fit(cost, rows: int, dtype, heads: int, budget_bytes: int, measured_bytes: int, *,
                   block_bytes: int = 0, blocks: int = 0) -> str:
    """The setting that would have let a refused DiT forward fit, named by the node and inputs that apply it
    (`plan.capabilities`), or "" when the guard had no budget.

    `cost(plan, rows, dtype) -> bytes` prices a tier (the guard's cost model); the room is `budget_bytes -
    measured_bytes` (what the device held before the forward, resident weights included). The first tier of
    `dit.tiers.escalation_ladder` (without query chunks, which the DiT Memory node's inputs do not set) whose
    activations fit the room; else, with the model's `blocks` blocks of `block_bytes` each, the fewest blocks to
    offload (two stay as streaming buffers, as the planner prices it) with the most chunked tier; else a pointer
    to a smaller weight format or length."""
    from h3director.dit.tiers import escalation_ladder
    from h3director.plan import capabilities as caps

    if not budget_bytes:
        return ""
    room = budget_bytes - measured_bytes
    tiers = [t for t in escalation_ladder(heads, rows) if t.query_chunks == 1]
    for tier in tiers:
        need = int(cost(tier, rows, dtype))
        if need <= room:
            return (f"node {caps.DIT_MEMORY_NODE}: mode='fixed', head_chunks={tier.head_chunks}, "
                    f"ffn_chunks={tier.ffn_chunks} ({tier.describe()}: {format_size(need)} of activations within the "
                    f"{format_size(max(room, 0))} left)")
    last = tiers[-1]
    need = int(cost(last, rows, dtype))
    if block_bytes and blocks:
        offload = -(-(need - room) // block_bytes) + 2
        if offload <= blocks:
            return (f"node {caps.BLOCK_SWAP_NODE}: blocks_offloaded={offload} with node {caps.DIT_MEMORY_NODE}: "
                    f"mode='fixed', head_chunks={last.head_chunks}, ffn_chunks={last.ffn_chunks} (frees "
                    f"{format_size((offload - 2) * block_bytes)} of resident weights for {format_size(need)} of "
                    "activations)")
    return (f"no chunking{' or block offload' if block_bytes and blocks else ''} of this model: even "
            f"{last.describe()} needs {format_size(need)} with {format_size(max(room, 0))} left; a smaller weight "
            "format or a shorter length (`h3director plan` computes what fits)")


def forward_price(model, device, transformer_options: dict, handle=None):
    """`price(plan, rows, dtype) -> bytes` of one forward of `model` on `device`, from the capacity check the
    DiT Memory node uses (`comfy_dit.forward_capacity`: the planner's ledger at the model's widths and the
    attention backend the forward calls). With that node's `handle` installed: exactly what its check needs
    (`need_bytes`: cost x calibration + resident, plus its margin), so the guard and the node agree on
    whether a tier fits the same room; without it, the check's cost model (the activation bytes)."""
    from h3director.integrations.comfy_dit import forward_capacity

    if handle is not None:
        check = forward_capacity(model, device, transformer_options, handle)
        if callable(getattr(check, "need_bytes", None)):
            return check.need_bytes
    return forward_capacity(model, device, transformer_options).cost_model


def make_guard_wrapper(guard, cost_model=None, stopper=None):
    """A `DIFFUSION_MODEL` wrapper preflighting the forward's activation bytes with `guard` and applying
    ``guard.action`` (``stop_and_clear`` or ``reduce_batch``, see the module docstring).

    `cost_model(plan, rows, dtype) -> bytes` (default: `forward_price`, read at each forward). `stopper()`
    unloads models and empties caches (default: `h3director.comfy.runtime.unload_models_and_empty_caches`)."""

    def stop_default() -> None:
        from h3director.comfy import runtime

        runtime.unload_models_and_empty_caches()

    def wrapper(executor, x, *args, **kwargs):
        from h3director.core.guard import MemoryLimitExceeded
        from h3director.dit.tiers import STOCK
        from h3director.integrations.comfy_dit import dit_memory_of

        model = getattr(executor, "class_obj", None)
        context = args[1] if len(args) > 1 else kwargs.get("context")
        options = args[2] if len(args) > 2 else kwargs.get("transformer_options")
        options = options if isinstance(options, dict) else {}
        context = context if hasattr(context, "shape") else None
        rows = _forward_rows(model, x, context, kwargs)
        dtype = context.dtype if context is not None else "bf16"
        handle = dit_memory_of(options)
        cost = cost_model if cost_model is not None else forward_price(model, getattr(context, "device", None), options, handle)
        plan = handle.floor if handle is not None else STOCK
        forward = _GuardedForward(guard, stopper or stop_default, executor, x, args, kwargs, cost, rows, dtype, handle)
        what = forward.what(plan)
        try:
            guard.preflight(int(cost(plan, rows, dtype)), what)
            return forward.call(x, args, kwargs, what)
        except MemoryLimitExceeded as error:
            if not guard.enabled:
                raise
            if guard.action == "reduce_batch":
                reduced = forward.reduce(plan, error)
                if reduced is not None:
                    return reduced[0]
                forward.stop(error, "reduce_batch: no cheaper execution fits (more DiT chunks need the DiT Memory "
                                    "node; a batch of 1 cannot be split)", model=model)
            forward.stop(error, model=model)

    return wrapper


class MemoryGuardNode(io.ComfyNode):
    """MODEL -> MODEL (a clone with a diffusion-model wrapper; the input is unchanged).

    Inputs: `action` ("from config" = memory_safety.action_on_exceed, "stop_and_clear" or "reduce_batch"),
    `budget_gb` (GiB; 0 = memory_safety.max_gpu_memory_mb, else the device's total). Each forward is priced
    (with the DiT Memory node's own capacity check when that node is installed) before it runs. Raises
    InvalidInputError for an action a DiT forward cannot take (fallback_to_cpu)."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorMemoryGuard",
            display_name="H3Director Memory Guard",
            category="H3 Director/memory",
            description="Checks each diffusion-model forward against the GPU memory budget before it runs. "
                        "stop_and_clear: unload models, empty caches, stop the prompt with a [Director Safety] "
                        "message (the next prompt runs). reduce_batch: retry with more DiT chunks (DiT Memory "
                        "node installed) or a split latent batch, else stop. fallback_to_cpu is not supported "
                        "for DiT forwards (ComfyUI owns where the weights live).",
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
        from h3director.errors import InvalidInputError

        config = pack_config()
        guard_action = config.memory_safety.action_on_exceed if action == "from config" else action
        if guard_action not in DIT_FORWARD_ACTIONS:
            raise InvalidInputError(
                f"action {guard_action!r}{' (from memory_safety.action_on_exceed)' if action == 'from config' else ''} "
                f"is not supported for DiT forwards: ComfyUI's model patcher owns where the weights live, so the "
                f"forward cannot be rerun on the CPU. Use {' or '.join(DIT_FORWARD_ACTIONS)}")
        device = model.load_device
        budget = int(budget_gb * GiB) if budget_gb else config.memory_safety.max_gpu_memory_bytes
        if budget is None:
            budget = runtime.total_bytes(device)
        guard = MemoryGuard.from_config(config, device=str(device), budget_bytes=budget, action=guard_action,
                                        enabled=True)
        patched = model.clone()
        patched.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, GUARD_KEY, make_guard_wrapper(guard))
        return io.NodeOutput(patched)


__all__ = ["ACTIONS", "GUARD_KEY", "MemoryGuardNode", "dit_shape_of", "forward_tokens", "make_guard_wrapper"]
