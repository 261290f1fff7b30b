"""Block offload for diffusers' MiniMax-H3 DiT at the planner's count: exactly N of `transformer_blocks` in host RAM.

`apply_block_offload(transformer, blocks_offloaded, *, onload_device, offload_device="cpu", use_stream=True)`
keeps `blocks_offloaded` of the transformer's blocks (`offloaded_indices`: evenly spread, the last block among
them) in `offload_device` memory, pinned when `onload_device` is CUDA, and everything else on `onload_device`;
each offloaded block is copied onto `onload_device` just before it runs and released after it, the next
offloaded block arriving on a side CUDA stream meanwhile (`use_stream`; on a device without streams the
copies are made synchronously at the same points). Returns a `BlockOffloadHandle`.

Exactness: exact by construction (only placement changes: blocks run on bit copies of their weights).

Why not `diffusers.hooks.apply_group_offloading` / `ModelMixin.enable_group_offload` (diffusers 0.42.1,
`hooks/group_offloading.py`): at `offload_type="block_level"` it groups every `ModuleList` child of the module
it is given by `num_blocks_per_group` and puts every other parameter of that module into one group onloaded
per forward; it takes no count of blocks. Aiming it at N blocks (a holder module with only those blocks) would
leave its prefetch order unset (only its lazy hook on the top-level module links `next_group`s) and its
stream copies of a self-onloading group unsynchronised with the compute stream. So the offload runs through
`h3director.dit.block_swap` (plain torch; the ComfyUI node uses the same engine), installed with diffusers'
own hook registry: a `ModelHook` ("h3director_block_offload") on each offloaded block whose `new_forward`
onloads, runs the block's forward and releases it, plus a forward pre-hook on the transformer that starts
the first copy.

Composing: apply `h3director.integrations.diffusers_dit.apply_memory_plan` first, then this (its hook then
wraps the plan's block forward, which reads the onloaded weights). Diffusers group offloading, accelerate
hooks, or a block offload already on the transformer are refused.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from diffusers.hooks import HookRegistry, ModelHook

from h3director.dit.block_swap import EXACTNESS, BlockSwap, check_count, offloaded_indices
from h3director.errors import InvalidInputError

HOOK_NAME = "h3director_block_offload"
GROUP_OFFLOADING_HOOK = "group_offloading"  # diffusers' name for its own group offloading hook
_MARK = "_h3director_block_offload"


class _OffloadHook(ModelHook):
    """One offloaded block: onload, the forward beneath (stock or a plan's), release."""

    def __init__(self, swap: BlockSwap, index: int) -> None:
        super().__init__()
        self.swap = swap
        self.index = index

    def new_forward(self, module: nn.Module, *args: Any, **kwargs: Any):
        self.swap.before_block(self.index)
        try:
            return self.fn_ref.original_forward(*args, **kwargs)
        finally:
            self.swap.after_block(self.index)


class BlockOffloadHandle:
    """What `apply_block_offload` installed on one transformer.

    - `blocks`: the transformer's block count; `offloaded`: the indices kept in host RAM;
    - `resident_blocks()`: indices of the blocks whose weights are on the onload device now;
    - `placement()`: per block `index`, `offloaded`, `device_bytes`, `host_bytes` (measured from its tensors);
    - `stats`: `h3director.dit.block_swap.SwapStats` (onloads, prefetched, bytes copied, peak offloaded blocks
      on the device at once);
    - `exactness`: "exact by construction";
    - `remove(onload=True)`: removes the hooks; the offloaded blocks' weights go back to `onload_device`
      (`onload=False`: they stay in host memory as ordinary tensors). Calling it twice does nothing.
    """

    exactness = EXACTNESS

    def __init__(self, transformer: nn.Module, swap: BlockSwap) -> None:
        self.transformer = transformer
        self.swap = swap
        self.blocks = len(swap.blocks)
        self.offloaded = swap.offloaded
        self._pre_hook = None
        self._made_registry: list[nn.Module] = []
        self.removed = False

    @property
    def stats(self):
        return self.swap.stats

    def placement(self) -> list[dict]:
        return self.swap.placement()

    def resident_blocks(self) -> list[int]:
        return [row["index"] for row in self.placement() if row["host_bytes"] == 0]

    def _begin(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.swap.begin_forward()

    def remove(self, onload: bool = True) -> None:
        if self.removed:
            return
        if self._pre_hook is not None:
            self._pre_hook.remove()
            self._pre_hook = None
        for i in self.offloaded:
            block = self.swap.blocks[i]
            registry = getattr(block, "_diffusers_hook", None)
            if registry is not None and HOOK_NAME in registry.hooks:
                registry.remove_hook(HOOK_NAME, recurse=False)
                if block in self._made_registry and not registry.hooks:
                    del block._diffusers_hook
                    block.__dict__.pop("forward", None)
        if onload:
            self.swap.restore()
        else:
            self.swap.forget()
        if getattr(self.transformer, _MARK, None) is self:
            delattr(self.transformer, _MARK)
        self.removed = True


def _blocks(transformer: Any) -> nn.ModuleList:
    blocks = getattr(transformer, "transformer_blocks", None)
    if not isinstance(blocks, nn.ModuleList) or not len(blocks):
        raise InvalidInputError(f"apply_block_offload needs a DiT with `transformer_blocks` (diffusers' "
                                f"MiniMaxH3Transformer3DModel), got {type(transformer).__module__}."
                                f"{type(transformer).__name__}")
    return blocks


def _check_hooks(transformer: nn.Module) -> None:
    if getattr(transformer, _MARK, None) is not None:
        raise InvalidInputError("a block offload is already applied to this transformer; call remove() on its handle "
                                "before applying another")
    for name, module in transformer.named_modules():
        registry = getattr(module, "_diffusers_hook", None)
        if registry is not None and GROUP_OFFLOADING_HOOK in registry.hooks:
            raise InvalidInputError(f"diffusers group offloading is already applied ({name or 'the transformer'}); "
                                    "use one offload: remove it (or reload the model) before apply_block_offload")
        if getattr(module, "_hf_hook", None) is not None:
            raise InvalidInputError(f"an accelerate hook is on {name or 'the transformer'} (device map or CPU offload); "
                                    "apply_block_offload places the weights itself")


def apply_block_offload(transformer, blocks_offloaded: int, *, onload_device, offload_device="cpu",
                        use_stream: bool = True) -> BlockOffloadHandle:
    """Keep `blocks_offloaded` of `transformer.transformer_blocks` in `offload_device` memory; the rest of the
    model moves to `onload_device`. See the module docstring for the mechanism and how it composes.

    Args: `blocks_offloaded` (0 to the model's block count; H3: 50), `onload_device` (the compute device),
    `offload_device` (host memory, "cpu"), `use_stream` (prefetch on a side CUDA stream where there is one).
    Returns a `BlockOffloadHandle`. Raises `InvalidInputError` before anything moves: a count out of range (the
    message names the model's block count), a model without `transformer_blocks`, another offload present."""
    blocks = _blocks(transformer)
    count = check_count(blocks_offloaded, len(blocks), f"this {type(transformer).__name__}")
    _check_hooks(transformer)
    onload = torch.device(onload_device)
    offload = torch.device(offload_device)
    if onload.type == "cuda" and not torch.cuda.is_available():
        raise InvalidInputError(f"onload_device {onload} is not available (torch.cuda.is_available() is False)")
    chosen = set(offloaded_indices(len(blocks), count))
    swap = BlockSwap(list(blocks), sorted(chosen), onload, host=offload, use_stream=use_stream)
    handle = BlockOffloadHandle(transformer, swap)
    try:
        swap.sync()  # the offloaded blocks' tensors to host copies first: they never need to fit the device
        if swap.kept_in_place:
            raise InvalidInputError(f"{swap.kept_in_place} tensors of the offloaded blocks are tensor subclasses "
                                    "(quantised weights): apply_block_offload moves plain tensors only")
        for child in transformer.children():
            if child is blocks:
                for i, block in enumerate(blocks):
                    if i not in chosen:
                        block.to(onload)
            else:
                child.to(onload)
        for store in (transformer._parameters, transformer._buffers):
            for tensor in store.values():
                if tensor is not None:
                    tensor.data = tensor.data.to(onload)
        for i in sorted(chosen):
            block = blocks[i]
            if getattr(block, "_diffusers_hook", None) is None:
                handle._made_registry.append(block)
            HookRegistry.check_if_exists_or_initialize(block).register_hook(_OffloadHook(swap, i), HOOK_NAME)
        handle._pre_hook = transformer.register_forward_pre_hook(handle._begin, with_kwargs=True)
        setattr(transformer, _MARK, handle)
    except BaseException:
        handle.remove()
        raise
    return handle


__all__ = ["HOOK_NAME", "BlockOffloadHandle", "apply_block_offload"]
