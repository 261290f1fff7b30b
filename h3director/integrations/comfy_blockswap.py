"""ComfyUI adapter of the block swap (`h3director.dit.block_swap`): N of the H3 DiT's blocks in host RAM.

`install(model_patcher, blocks_offloaded)` returns `(clone, handle)`; the input MODEL is never changed.
Exactness: exact by construction (only placement changes; see `h3director.dit.block_swap`).

Mechanism (chosen after reading ComfyUI's `comfy/model_patcher.py`, `comfy/model_management.py`,
`comfy/ops.py`, `comfy/model_prefetch.py` and `comfy/ldm/minimax/model.py`):

- ComfyUI's classic `ModelPatcher.load` puts the weights on the device and bakes LoRA patches into them
  (`patch_weight_to_device`: computed in `lora_compute_dtype`, stochastically rounded to the weight's dtype).
  This adapter then moves the offloaded blocks' tensors that ComfyUI placed on the device to host copies
  (pinned on CUDA) and streams those bit copies in per block, so the blocks compute from exactly the weights
  an all-resident run uses, LoRA included; `model_loaded_weight_memory` is lowered by the bytes moved, so
  ComfyUI's own accounting (free memory, `loaded_size()`) sees them gone.
- Not ComfyUI's lowvram casting (`comfy_cast_weights` + `LowVramPatch`): it applies a LoRA per use in the
  weight's own dtype without the stochastic rounding of the resident path (different bits with a LoRA on a
  bf16 model), and it streams per layer, with no count of blocks. Layers ComfyUI itself left in lowvram mode
  (weights not on the device) are left to it: this adapter moves only what ComfyUI put on the device.
- Not Dynamic VRAM's block prefetch (`comfy/model_prefetch.py`, aimdo vbars): it pages weights on demand
  and has no block count. A dynamic MODEL is cloned with `clone(disable_dynamic=True)` (a classic
  `ModelPatcher`, as core's TorchCompileModel node does).

Hooks (ComfyUI's own):
- a `WrappersMP.DIFFUSION_MODEL` wrapper (key `h3director_block_swap`): before each forward it (re)offloads
  (`BlockSwap.sync()`: blocks ComfyUI reloaded since are taken again), starts the first prefetch, and passes
  down `transformer_options` whose `patches_replace["dit"][("double_block", i)]` entries for the offloaded
  blocks are chained: onload block i, call the entry that was there (H3Director DiT Memory's `_BlockPatch`)
  or the stock block, release block i. The chaining is made per forward on a copy of the options, so the
  MODEL's `model_options` hold no entry of ours (DiT Memory's conflict check never sees one) and DiT Memory
  may come before or after this node;
- `CallbacksMP.ON_LOAD` (offload right after ComfyUI loaded the weights) and `CallbacksMP.ON_DETACH` (when
  ComfyUI hands the model to another clone without unloading it, e.g. the stock MODEL in the same workflow or
  this MODEL's next sampling call: the offloaded layers are put in the state its loader knows, "on the offload
  device, not patched" (LoRA backups restored, `comfy_patched_weights` False, `model_lowvram` True), so its
  next `load()` re-patches and places them within its own budget, and the ON_LOAD offloads them again: one
  round trip per sampling call, not per step; when it unloaded the model, the host copies are forgotten).

GGUF DiT (`comfy_gguf`): a quantised layer's weight is its uint8 bytes; those are what move, and the layer
dequantises from the device copy. Tensor subclasses (ComfyUI `QuantizedTensor` layouts) stay where ComfyUI
put them; `handle.kept_in_place` counts them.
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

from h3director.dit.block_swap import EXACTNESS, BlockSwap, check_count, offloaded_indices
from h3director.errors import InvalidInputError
from h3director.integrations.comfy_dit import PATCH_BLOCK, PATCH_NAME, h3_diffusion_model, register_own_entry

NODE = "H3Director Block Swap"
KEY = "h3director_block_swap"

log = logging.getLogger(__name__)


def _eligible(device):
    """Tensors this adapter may move: those ComfyUI placed on the load device (a layer it left in lowvram mode
    keeps its weights on the offload device and streams them itself). A manual-cast layer's stored weight
    moves like any other: it casts whatever tensor it holds when it runs."""

    def eligible(module, name, tensor) -> bool:
        return tensor.device == device
    return eligible


@dataclass
class BlockSwapHandle:
    """One installation: the count, the chosen blocks and (once a forward ran) the `BlockSwap` doing it.

    `last_report` after a forward: blocks, offloaded (indices), moved_bytes (left the device before it),
    onloads, prefetched, peak_offloaded_on_device, kept_in_place, exactness."""

    count: int
    total: int
    base_model: Any = None
    use_stream: bool = True
    swap: BlockSwap | None = None
    last_report: dict = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def offloaded(self) -> tuple[int, ...]:
        return offloaded_indices(self.total, self.count)

    def engine(self, diffusion_model, device) -> BlockSwap:
        blocks = list(diffusion_model.blocks)
        swap = self.swap
        if swap is None or swap.blocks != blocks or swap.device != device:
            if swap is not None:
                swap.restore()
            swap = BlockSwap(blocks, self.offloaded, device, use_stream=self.use_stream,
                             eligible=_eligible(device))
            self.swap = swap
        return swap

    def sync(self, diffusion_model, device) -> int:
        """Offload what ComfyUI placed on the device; lower the model's loaded bytes (ComfyUI's
        `model_loaded_weight_memory`, shared by every clone of the MODEL) by what moved."""
        swap = self.engine(diffusion_model, device)
        moved = swap.sync()
        base = self.base_model
        if moved and base is not None and getattr(base, "diffusion_model", None) is diffusion_model:
            base.model_loaded_weight_memory = max(0, base.model_loaded_weight_memory - moved)
        return moved

    # ComfyUI callbacks ----------------------------------------------------------------------------------
    def on_load(self, model_patcher, device_to, lowvram_model_memory, force_patch_weights, full_load) -> None:
        if device_to is not None and self.count:
            import torch

            with self._lock:
                self.sync(model_patcher.model.diffusion_model, torch.device(device_to))

    def on_detach(self, model_patcher, unpatch_all) -> None:
        """ComfyUI hands the model on. With `unpatch_all` it already moved the model off the device and
        restored the unpatched weights: forget the host copies. Without (another clone of this MODEL, or this
        one again, is about to load): put the offloaded layers into the state ComfyUI's loader knows, "on the
        offload device, not patched" (their LoRA backups restored, `comfy_patched_weights` False, the model
        marked partially loaded), so the next `load()` patches and places them within its own memory budget;
        nothing is copied onto the device here."""
        with self._lock:
            swap = self.swap
            if swap is None:
                return
            if not unpatch_all:
                self._hand_back(model_patcher, swap)
            swap.forget()

    @staticmethod
    def _hand_back(model_patcher, swap: BlockSwap) -> None:
        utils = sys.modules.get("comfy.utils")  # loaded with ComfyUI; no import (a patcher's __del__ may run at exit)
        if utils is None:
            return
        base = model_patcher.model
        names = {id(module): name for name, module in base.named_modules()}
        touched = False
        for slot in swap.backed_slots():
            owner = names.get(id(slot.module))
            if owner is None:
                continue
            key = f"{owner}.{slot.name}" if owner else slot.name
            backup = model_patcher.backup.pop(key, None)
            if backup is not None:
                if backup.inplace_update:
                    utils.copy_to_param(base, key, backup.weight)
                else:
                    utils.set_attr_param(base, key, backup.weight)
            if getattr(slot.module, "comfy_patched_weights", False):
                slot.module.comfy_patched_weights = False
            touched = True
        if touched:
            base.model_lowvram = True  # partially_load then runs load(), which places these layers again


@register_own_entry
class _SwapPatch:
    """The chained `patches_replace["dit"][("double_block", i)]` entry of one offloaded block."""

    def __init__(self, swap: BlockSwap, index: int, inner):
        self.swap = swap
        self.index = index
        self.inner = inner

    def __call__(self, args: dict, extra: dict) -> dict:
        self.swap.before_block(self.index)
        try:
            if self.inner is not None:
                return self.inner(args, extra)
            return extra["original_block"](args)
        finally:
            self.swap.after_block(self.index)


def chained_options(transformer_options: dict | None, swap: BlockSwap) -> dict:
    """A copy of `transformer_options` whose block entries for `swap`'s offloaded blocks swap them in and out
    around the entry that was there (or the stock block); the input dict is not changed."""
    options = dict(transformer_options or {})
    replace = dict(options.get("patches_replace", {}))
    blocks = dict(replace.get(PATCH_NAME, {}))
    for i in swap.offloaded:
        blocks[(PATCH_BLOCK, i)] = _SwapPatch(swap, i, blocks.get((PATCH_BLOCK, i)))
    replace[PATCH_NAME] = blocks
    options["patches_replace"] = replace
    return options


class _ForwardWrapper:
    """The `DIFFUSION_MODEL` wrapper: offload, prefetch the first block, run with chained block entries."""

    def __init__(self, handle: BlockSwapHandle):
        self.handle = handle

    def __call__(self, executor, x, timestep, context, transformer_options=None, *args, **kwargs):
        handle = self.handle
        model = executor.class_obj
        if not handle.count:
            return executor(x, timestep, context, transformer_options, *args, **kwargs)
        device = context.device
        with handle._lock:
            moved = handle.sync(model, device)
            swap = handle.swap
            options = chained_options(transformer_options, swap)
            swap.begin_forward()
            try:
                out = executor(x, timestep, context, options, *args, **kwargs)
            finally:
                swap.end_forward()
        first = not handle.last_report
        stats = swap.stats
        handle.last_report = {"blocks": handle.total, "offloaded": list(swap.offloaded), "moved_bytes": int(moved),
                              "onloads": stats.onloads, "prefetched": stats.prefetched,
                              "bytes_onloaded": stats.bytes_onloaded, "forwards": stats.forwards,
                              "peak_offloaded_on_device": stats.peak_offloaded_on_device,
                              "kept_in_place": swap.kept_in_place, "exactness": EXACTNESS}
        if first:
            log.info("H3 Director block swap: %s", swap.describe())
        return out


def install(model_patcher, blocks_offloaded: int, use_stream: bool = True) -> tuple[Any, BlockSwapHandle]:
    """A clone of `model_patcher` whose H3 DiT keeps `blocks_offloaded` blocks in host RAM; `(clone, handle)`.

    Refused (`InvalidInputError`) before anything is cloned or loaded: a MODEL that is not ComfyUI's H3 DiT,
    a count outside 0..blocks (the message names the model's block count), a dynamic MODEL that cannot be
    cloned as a classic one. 0 installs nothing that acts (the clone runs as the input)."""
    model = h3_diffusion_model(model_patcher, NODE)
    total = len(model.blocks)
    count = check_count(blocks_offloaded, total, "the connected H3 DiT")
    from comfy.patcher_extension import CallbacksMP, WrappersMP

    if model_patcher.is_dynamic():
        try:
            patched = model_patcher.clone(disable_dynamic=True)
        except RuntimeError as error:
            raise InvalidInputError(f"{NODE} needs a classic (non-dynamic) ModelPatcher and this Dynamic VRAM MODEL "
                                    f"cannot be cloned as one ({error}); start ComfyUI with --disable-dynamic-vram") from error
    else:
        patched = model_patcher.clone()
    handle = BlockSwapHandle(count=count, total=total, base_model=patched.model, use_stream=use_stream)
    patched.remove_wrappers_with_key(WrappersMP.DIFFUSION_MODEL, KEY)
    patched.remove_callbacks_with_key(CallbacksMP.ON_LOAD, KEY)
    patched.remove_callbacks_with_key(CallbacksMP.ON_DETACH, KEY)
    if count:
        patched.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, KEY, _ForwardWrapper(handle))
        patched.add_callback_with_key(CallbacksMP.ON_LOAD, KEY, handle.on_load)
        patched.add_callback_with_key(CallbacksMP.ON_DETACH, KEY, handle.on_detach)
    return patched, handle


def installed_handle(model_patcher) -> BlockSwapHandle | None:
    """The handle of the block swap on `model_patcher` (or a clone of it), None when there is none."""
    from comfy.patcher_extension import WrappersMP

    for wrapper in model_patcher.get_wrappers(WrappersMP.DIFFUSION_MODEL, KEY):
        if isinstance(wrapper, _ForwardWrapper):
            return wrapper.handle
    return None


def summary(handle: BlockSwapHandle, device) -> str:
    """The node's report: what is offloaded, where, and the exactness class."""
    if not handle.count:
        return f"{NODE}: 0 of {handle.total} blocks offloaded (every block stays resident)"
    import torch

    device = torch.device(device)
    stream = device.type == "cuda" and handle.use_stream
    return "\n".join([
        f"{NODE}: {handle.count} of {handle.total} DiT blocks offloaded to host RAM (blocks {list(handle.offloaded)})",
        ("pinned host memory; each block is copied in on a side CUDA stream while the one before it computes"
         if stream else f"on {device}: the copies are made in place of the transfers (no memory saved on a CPU)"),
        f"exactness: {EXACTNESS} (the blocks run on bit copies of the weights ComfyUI loaded, LoRA included)",
        "the first forward logs 'H3 Director block swap: ...'"])


__all__ = ["KEY", "NODE", "BlockSwapHandle", "chained_options", "install", "installed_handle", "summary"]
