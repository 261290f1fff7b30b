"""Exact activation tiers for diffusers' MiniMax-H3 DiT (`MiniMaxH3Transformer3DModel`).

`apply_memory_plan(transformer, head_chunks=..., ffn_chunks=..., query_chunks=..., mode=...)` installs, on
every `transformer.transformer_blocks[i]`, an attention processor (`H3DirectorAttnProcessor`, replacing
`MiniMaxH3AttnProcessor` on `block.attn`) and a block forward (a diffusers `ModelHook` registered on the
block), and returns a `DiTMemoryHandle` whose `remove()` puts the stock processors and forwards back.
The token refiner's blocks (text rows only) stay stock.

What a tier changes (see `h3director.dit.tiers` for the exactness classes):

- every tier (lifetime frees, exact by construction): the same modules are called in the stock order
  on the same tensors; the modulated block input dies right after the q/k/v projections, the attention
  output after the gated residual, the modulated FFN input after fc1 (`ff.net[0].proj`); SwiGLU's
  product is written into its SiLU buffer (`silu(gate).mul_(value)`: one IEEE multiply is commutative to
  the bit), and the FFN's gated residual is added into the post-attention stream (a tensor this block
  made) instead of a new tensor. Elementwise ops run in the stock order (`gate * ff`, then the add), so the values match;
- `head_chunks` > 1: per head group, q/k/v are `F.linear` over that group's rows of the projection
  weight (`to_q`/`to_k`/`to_v`, or the q/k/v thirds of a fused `to_qkv`), then `norm_q`/`norm_k` and
  the rotary embedding on the group, then diffusers' `dispatch_attention_fn` with the processor's
  backend, written into one preallocated `[batch, rows, heads * head_dim]` output; `to_out` runs once
  on the whole output. A projection layer that is not a plain hook-free `nn.Linear` (PEFT LoRA layers,
  layerwise casting, leaf-level offload) is called whole instead, once per block, and its output is
  sliced per group: same arithmetic as stock, no saving on that projection;
- `query_chunks` > 1: inside each group, attention runs per block of query rows starting on multiples
  of `QUERY_ALIGN` (128) rows, over all keys;
- `ffn_chunks` > 1: norm2, modulation, fc1, SwiGLU, fc2 and the gated residual run per range of packed
  rows, in that order, written back into the stream; norm1 and its modulation run over the same row
  ranges into one preallocated attention input (row-wise ops: same values, and on the CPU under
  `no_grad`, where PyTorch's `rms_norm` is composite, its float32 temporaries cover one range at a time).

Both adapters iterate through `h3director.dit.blocks` (`grouped_attention`, `chunked_rows`), so this
file decides only the arithmetic, not the order. The tiers run under `torch.no_grad()` /
`torch.inference_mode()` (how diffusers pipelines call the transformer); while autograd is recording,
the blocks run the stock forward and `last_report["tier"]` says so.

Which tier a forward runs is decided by the handle (`h3director.dit.memory.DiTMemoryHandle`, the one type
the ComfyUI node uses too), asked from a forward pre-hook with `rows` = the packed sequence length
(`position_ids.shape[0]`), the model's dtype and the input's device: `"fixed"` runs the given tier;
`"auto"` and `"exact only"` call `capacity.choose(...)` (the `h3director.dit.capacity.CapacityCheck`
interface; without `capacity=`, one built from the planner's diffusers ledgers at the model's own widths,
on the model's device, with `budget_bytes`) with the given chunk counts as the floor; `"exact only"` passes
the kernel properties verified for this device, dtype, thread count and row class (the handle's
`VerificationCache`, none when nothing is cached, which leaves only tiers exact by construction; head groups
are read from the check of the model's own q, k, v layout, `qkv_layout`: separate GEMMs unless fused) and first
drops every floor technique not verified for the forward's row class (`h3director.dit.tiers.keep_verified`:
that part runs the stock op, and the report says so). This module only runs the tier and reports it.

Composing with group offload: apply the plan first, then
`transformer.enable_group_offload(onload_device, offload_type="block_level", num_blocks_per_group=1,
use_stream=True)` (streams need a CUDA-like onload device; `use_stream=False` works on the CPU). The
offload hook registers after this module's block hook, so it wraps it: the block's weights are on the
onload device before the chunked forward reads them, and `handle.remove()` relinks the offload hook to
the stock forward. Applying the plan to blocks that already carry hooks is refused (the plan's forward
would run beneath none of them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers.hooks import HookRegistry, ModelHook
from diffusers.models.activations import SwiGLU
from diffusers.models.attention_dispatch import dispatch_attention_fn
from diffusers.models.modeling_utils import get_parameter_dtype
from diffusers.models.transformers.transformer_minimax_h3 import (
    MiniMaxH3AttnProcessor,
    MiniMaxH3Transformer3DModel,
    MiniMaxH3TransformerBlock,
    _apply_rotary_emb,
)

from h3director.dit import capacity as dit_capacity
from h3director.dit.blocks import chunked_rows, grouped_attention, thread_cut_rows
from h3director.dit.kernels import KernelWidths
from h3director.dit.memory import DiTMemoryHandle, memory_handle
from h3director.dit.tiers import LIFETIME_ONLY, STOCK, DiTMemoryPlan
from h3director.errors import InvalidInputError
from h3director.plan.activations import DiTShape

HOOK_NAME = "h3director_dit_memory"
_MARK = "_h3director_dit_memory"
_POSITION_IDS_ARG = 6  # index of `position_ids` in MiniMaxH3Transformer3DModel.forward's positional arguments


class _Rows:
    """A one-shot holder for the modulated block input, so the processor can drop the only reference
    once q, k and v are projected (a tensor passed as a plain argument stays alive in the caller)."""

    __slots__ = ("tensor",)

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def take(self) -> torch.Tensor:
        tensor, self.tensor = self.tensor, None
        if tensor is None:
            raise RuntimeError("the block input was already consumed")
        return tensor


def _plain_linear(layer: nn.Module) -> bool:
    """True when `F.linear` over slices of `layer.weight` is the layer's own arithmetic (no LoRA
    wrapper, no hooks that cast or move the weight first)."""
    return (type(layer) is nn.Linear and not layer._forward_pre_hooks and not layer._forward_hooks
            and getattr(layer, "_diffusers_hook", None) is None)


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_pre_hooks or module._forward_hooks or "forward" in module.__dict__
                or getattr(module, "_diffusers_hook", None) is not None)


class H3DirectorAttnProcessor:
    """Drop-in for `MiniMaxH3AttnProcessor` that runs the handle's current tier.

    Called as any diffusers processor: `(attn, hidden_states, rotary_emb, attention_mask)` with
    `hidden_states` `[batch, rows, hidden]`; it also accepts the block's one-shot holder (`_Rows`), which
    lets the block input die after the projections. Returns `[batch, rows, hidden]`, like the stock one.
    `_attention_backend` / `_parallel_config` are read like the stock processor's, so
    `transformer.set_attention_backend(...)` applies to it."""

    def __init__(self, handle: DiTMemoryHandle, stock: MiniMaxH3AttnProcessor) -> None:
        self._handle = handle
        self._attention_backend = getattr(stock, "_attention_backend", None)
        self._parallel_config = getattr(stock, "_parallel_config", None)

    def __call__(self, attn: nn.Module, hidden_states: torch.Tensor | _Rows,
                 rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
                 attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        plan = _attention_plan(self._handle)
        source = [hidden_states.take() if isinstance(hidden_states, _Rows) else hidden_states]
        del hidden_states
        batch, rows = source[0].shape[0], source[0].shape[1]
        heads, head_dim = attn.heads, attn.head_dim
        if (plan.head_chunks > 1 or plan.query_chunks > 1) and attention_mask is not None:
            raise InvalidInputError("head groups and query chunks run unmasked attention (MiniMax-H3 passes no mask); "
                                    "got an attention_mask")
        if (plan.head_chunks > 1 or plan.query_chunks > 1) and self._parallel_config is not None:
            raise InvalidInputError("head groups and query chunks do not run under context parallelism; "
                                    "use head_chunks=1, query_chunks=1")
        project = self._projector(attn, plan, source, rotary_emb)
        output: list[torch.Tensor | None] = [None]

        def attend_into(qkv: tuple[torch.Tensor, torch.Tensor, torch.Tensor], h0: int, h1: int, a: int, b: int) -> None:
            query, key, value = qkv
            whole = (h0, h1) == (0, heads) and (a, b) == (0, rows)
            result = dispatch_attention_fn(query if (a, b) == (0, rows) else query[:, a:b], key, value,
                                           attn_mask=attention_mask, dropout_p=0.0, is_causal=False,
                                           backend=self._attention_backend, parallel_config=self._parallel_config)
            if whole:  # the stock expression: no preallocated buffer, no copy
                output[0] = result.flatten(2, 3).type_as(query)
                return
            if output[0] is None:
                output[0] = torch.empty(batch, rows, heads * head_dim, dtype=query.dtype, device=query.device)
            output[0].view(batch, rows, heads, head_dim)[:, a:b, h0:h1].copy_(result)

        grouped_attention(plan, heads, rows, project, attend_into)
        del project
        hidden = attn.to_out[0](output.pop())
        return attn.to_out[1](hidden)

    @staticmethod
    def _projector(attn: nn.Module, plan: DiTMemoryPlan, source: list,
                   rotary_emb: tuple[torch.Tensor, torch.Tensor] | None) -> Callable[[int, int], tuple]:
        """`project(h0, h1)` for `grouped_attention`: q, k, v of heads `h0:h1`, normalised and rotated,
        `[batch, rows, h1 - h0, head_dim]` each. Drops `source[0]` (the block input) after the last
        group's projection."""
        heads, head_dim, inner = attn.heads, attn.head_dim, attn.heads * attn.head_dim
        fused = bool(getattr(attn, "fused_projections", False))
        layers = (attn.to_qkv,) if fused else (attn.to_q, attn.to_k, attn.to_v)
        sliced = plan.head_chunks > 1 and all(_plain_linear(layer) for layer in layers)
        whole: list = [None]  # stock projections, kept while groups are sliced from them

        def stock_projections() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            x = source[0]
            if fused:
                return attn.to_qkv(x).chunk(3, dim=-1)
            return attn.to_q(x), attn.to_k(x), attn.to_v(x)

        def group_projections(h0: int, h1: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            lo, hi = h0 * head_dim, h1 * head_dim
            x = source[0]
            if sliced:
                if fused:
                    weight, bias = attn.to_qkv.weight, attn.to_qkv.bias
                    spans = [(lo + i * inner, hi + i * inner) for i in range(3)]
                    return tuple(F.linear(x, weight[s:e], None if bias is None else bias[s:e]) for s, e in spans)
                return tuple(F.linear(x, layer.weight[lo:hi], None if layer.bias is None else layer.bias[lo:hi])
                             for layer in layers)
            if whole[0] is None:
                whole[0] = stock_projections()
            return tuple(t[..., lo:hi] for t in whole[0])

        def project(h0: int, h1: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
            if (h0, h1) == (0, heads):
                query, key, value = stock_projections()
            else:
                query, key, value = group_projections(h0, h1)
            if h1 == heads:  # every group is projected: the block input and any whole projections die here
                source[0] = None
                whole[0] = None
            group = h1 - h0
            query = attn.norm_q(query.unflatten(-1, (group, -1)))
            key = attn.norm_k(key.unflatten(-1, (group, -1)))
            value = value.unflatten(-1, (group, -1))
            if rotary_emb is not None:
                query = _apply_rotary_emb(query, *rotary_emb)
                key = _apply_rotary_emb(key, *rotary_emb)
            return query, key, value

        return project


def _feed_forward_rows(ff: nn.Module, hidden: list, span: tuple[int, int, int] | None = None) -> torch.Tensor:
    """`ff(hidden[0])` with the stock op order (`net[0].proj`, chunk, `x * silu(gate)`, `net[1]`,
    `net[2]`), dropping the input after fc1. `hidden` is a one-element list emptied here. `span`
    `(start, stop, total)`: these are rows `start:stop` of a `total`-row sequence; on the CPU the rows
    whose SiLU the stock call's thread ranges cut elsewhere are recomputed per segment of that call
    (`h3director.dit.blocks.thread_cut_rows`), so every element takes the stock code path."""
    x = hidden.pop()
    if _has_hooks(ff) or _has_hooks(ff.net[0]):
        return ff(x)  # hooks on the container modules: call them as stock (no lifetime saving here)
    swiglu = ff.net[0]
    projected = swiglu.proj(x)
    del x
    value, gate = projected.chunk(2, dim=-1)
    del projected
    out = swiglu.activation(gate)
    if span is not None:
        for b, row, spans in thread_cut_rows(gate.device, *span, gate.shape[-1], gate.shape[0]):
            for c0, c1 in spans:
                out[b, row, c0:c1] = swiglu.activation(gate[b, row, c0:c1])
    del gate
    # stock: value * silu(gate). One IEEE multiply is commutative to the bit, so multiplying into the SiLU
    # buffer gives the same values without allocating the product (a placement change only).
    out.mul_(value)
    del value
    for module in ff.net[1:]:
        out = module(out)
    return out


def _modulated_rows(norm: nn.Module, hidden_states: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor,
                    adaln_indices: torch.Tensor, chunks: int) -> torch.Tensor:
    """`norm(x) * (1 + scale[idx]) + shift[idx]`, the stock modulated input, computed per range of rows into
    one preallocated tensor."""
    out = torch.empty_like(hidden_states)

    def rows(a: int, b: int) -> None:
        index = adaln_indices[a:b]
        out[:, a:b] = norm(hidden_states[:, a:b]) * (1.0 + scale.index_select(0, index)) + shift.index_select(0, index)

    chunked_rows(hidden_states.shape[1], chunks, rows)
    return out


def _block_forward(block: MiniMaxH3TransformerBlock, plan: DiTMemoryPlan, hidden_states: torch.Tensor,
                   temb: torch.Tensor, adaln_indices: torch.Tensor, rotary_emb: tuple[torch.Tensor, torch.Tensor],
                   attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The block's forward under `plan` (not stock): `[batch, rows, hidden]` in, a new tensor out."""
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.adaln_proj(temb)
    rows = hidden_states.shape[1]
    if plan.ffn_chunks == 1:
        modulated = block.norm1(hidden_states)
        modulated = modulated * (1.0 + scale_msa.index_select(0, adaln_indices)) + shift_msa.index_select(
            0, adaln_indices)
    else:
        # norm1 and its modulation are row-wise too: with row chunks they fill one preallocated input, so
        # the norm's temporaries (float32 upcasts under no_grad on the CPU) cover one range of rows at a time
        modulated = _modulated_rows(block.norm1, hidden_states, scale_msa, shift_msa, adaln_indices,
                                    plan.ffn_chunks)
    ours = isinstance(block.attn.processor, H3DirectorAttnProcessor) and not _has_hooks(block.attn)
    attn_input = _Rows(modulated) if ours else modulated
    del modulated
    attn_output = block.attn(attn_input, rotary_emb, attention_mask)
    del attn_input
    stream = hidden_states + gate_msa.index_select(0, adaln_indices) * attn_output
    del attn_output

    def ffn_rows(a: int, b: int) -> None:
        whole = (a, b) == (0, rows)
        part = stream if whole else stream[:, a:b]
        index = adaln_indices if whole else adaln_indices[a:b]
        normed = block.norm2(part)
        normed = normed * (1.0 + scale_mlp.index_select(0, index)) + shift_mlp.index_select(0, index)
        carrier = [normed]
        del normed
        ff_output = _feed_forward_rows(block.ff, carrier, (a, b, rows))
        ff_output = gate_mlp.index_select(0, index) * ff_output
        part.add_(ff_output)

    chunked_rows(rows, plan.ffn_chunks, ffn_rows)
    return stream


def _block_plan(handle: DiTMemoryHandle) -> DiTMemoryPlan:
    return STOCK if torch.is_grad_enabled() else handle.plan


def _attention_plan(handle: DiTMemoryHandle) -> DiTMemoryPlan:
    # one group, one query block: the stock processor's arithmetic
    return LIFETIME_ONLY if torch.is_grad_enabled() else handle.plan


class _BlockHook(ModelHook):
    """The block forward as a diffusers hook, so hooks registered later (group offload) wrap it and
    `HookRegistry.remove_hook` relinks them on removal."""

    def __init__(self, handle: DiTMemoryHandle) -> None:
        super().__init__()
        self._handle = handle

    def new_forward(self, module: nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        plan = _block_plan(self._handle)
        if plan.is_stock:
            return self.fn_ref.original_forward(*args, **kwargs)
        return _block_forward(module, plan, *args, **kwargs)


@dataclass
class _Installed:
    block: nn.Module
    stock_processor: MiniMaxH3AttnProcessor
    processor: H3DirectorAttnProcessor
    made_registry: bool


class _Installation:
    """What `apply_memory_plan` put on one transformer for `handle`: the processors and block hooks, and the
    forward pre-hook that asks the handle for each forward's tier (`DiTMemoryHandle.decide`). `remove` puts
    the stock processors and forwards back (the handle's `remove()` calls it)."""

    def __init__(self, transformer: MiniMaxH3Transformer3DModel, handle: DiTMemoryHandle) -> None:
        self.transformer = transformer
        self.handle = handle
        self.installed: list[_Installed] = []
        self.pre_hook = None

    def before_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """The transformer's forward pre-hook: rows (`position_ids`), device and dtype of this forward ->
        the handle's decision, recorded as its report (the blocks then run `handle.plan`)."""
        position_ids = kwargs.get("position_ids")
        if position_ids is None and len(args) > _POSITION_IDS_ARG:
            position_ids = args[_POSITION_IDS_ARG]
        rows = int(position_ids.shape[0]) if isinstance(position_ids, torch.Tensor) else None
        sample = kwargs.get("hidden_states", args[0] if args else None)
        device = sample.device if isinstance(sample, torch.Tensor) else torch.device("cpu")
        _, report = self.handle.decide(rows, get_parameter_dtype(module.context_embedder), device)
        if torch.is_grad_enabled():
            report["tier"] = "stock block (autograd is recording)"
        self.handle.record(report)

    def install(self) -> None:
        try:
            for block in self.transformer.transformer_blocks:
                stock = block.attn.processor
                processor = H3DirectorAttnProcessor(self.handle, stock)
                made_registry = getattr(block, "_diffusers_hook", None) is None
                registry = HookRegistry.check_if_exists_or_initialize(block)
                registry.register_hook(_BlockHook(self.handle), HOOK_NAME)
                self.installed.append(_Installed(block, stock, processor, made_registry))
                block.attn.set_processor(processor)
            self.pre_hook = self.transformer.register_forward_pre_hook(self.before_forward, with_kwargs=True)
            setattr(self.transformer, _MARK, self.handle)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """Put the stock processors and block forwards back; the transformer is then the stock model
        (its processors are the same objects as before `apply_memory_plan`)."""
        if self.pre_hook is not None:
            self.pre_hook.remove()
            self.pre_hook = None
        for item in reversed(self.installed):
            block = item.block
            if block.attn.processor is item.processor:
                # keep a backend chosen with set_attention_backend while the plan was installed
                item.stock_processor._attention_backend = item.processor._attention_backend
                item.stock_processor._parallel_config = item.processor._parallel_config
                block.attn.set_processor(item.stock_processor)
            registry = getattr(block, "_diffusers_hook", None)
            if registry is not None and HOOK_NAME in registry.hooks:
                registry.remove_hook(HOOK_NAME, recurse=False)
                if item.made_registry and not registry.hooks:
                    del block._diffusers_hook
                    block.__dict__.pop("forward", None)  # the registry left the bound stock forward behind
        self.installed.clear()
        if getattr(self.transformer, _MARK, None) is self.handle:
            delattr(self.transformer, _MARK)


def _widths(config: Any | None) -> KernelWidths | None:
    """The `KernelWidths` of a `MiniMaxH3Transformer3DModel.config` (None: None, H3's real widths)."""
    return None if config is None else KernelWidths.of(DiTShape.from_config(config))


def qkv_layout(transformer: MiniMaxH3Transformer3DModel) -> str:
    """How `transformer` projects q, k and v now (`h3director.dit.tiers.QKV_LAYOUTS`): "fused" after
    `fuse_qkv_projections()` (every block's `to_qkv`), "separate" when no block is fused (`to_q`, `to_k`, `to_v`).
    Some blocks fused by hand and others not: `InvalidInputError` (one model, one verification to read)."""
    fused = [i for i, block in enumerate(transformer.transformer_blocks)
             if getattr(block.attn, "fused_projections", False)]
    if not fused:
        return "separate"
    if len(fused) == len(transformer.transformer_blocks):
        return "fused"
    raise InvalidInputError(f"transformer_blocks {fused} project q, k, v fused and the others separately; the DiT "
                            "memory plan reads one kernel verification per model: call "
                            "transformer.fuse_qkv_projections() (every block) or fuse none")


def verified_kernel_properties(device: torch.device, dtype: torch.dtype, config: Any | None = None,
                               rows: int | None = None, layout: str = "separate") -> frozenset[str]:
    """Kernel properties (`h3director.dit.tiers` names) that `verify-kernels` verified on `device` for
    `dtype`, at the widths of `config` (a `MiniMaxH3Transformer3DModel.config`; H3's real widths when None),
    for the row class of `rows` (None: any), read for the q, k, v `layout` (`qkv_layout(transformer)`; diffusers
    projects them separately unless fused), from `h3director.dit.kernels`' cache (`lookup_for_model`:
    empty when nothing is verified, then only tiers exact by construction count as verified), with the split
    counts each passed at (`h3director.dit.tiers.Verified`: pass it on as is to `capacity.choose`)."""
    from h3director.dit import kernels
    from h3director.dit.tiers import Verified, for_qkv_layout

    found = kernels.lookup_for_model(device, dtype, widths=_widths(config), rows=rows)
    return for_qkv_layout(found.verified if found is not None else Verified(), layout)


def default_capacity(transformer: MiniMaxH3Transformer3DModel,
                     budget_bytes: int | None = None) -> dit_capacity.CapacityCheck:
    """The capacity check `apply_memory_plan` uses when none is given: the planner's diffusers ledgers at
    this model's widths (`DiTShape.from_config`), on the device of its first block's parameters, capped by
    `budget_bytes` (bytes; None = what the device can give)."""
    device = next(transformer.transformer_blocks[0].parameters()).device
    return dit_capacity.default_capacity(DiTShape.from_config(transformer.config), "diffusers", device, budget_bytes)


def _check_model(transformer: Any) -> None:
    if not isinstance(transformer, MiniMaxH3Transformer3DModel):
        raise InvalidInputError(f"apply_memory_plan needs a diffusers MiniMaxH3Transformer3DModel, got "
                                f"{type(transformer).__module__}.{type(transformer).__name__}")
    if getattr(transformer, _MARK, None) is not None:
        raise InvalidInputError("a DiT memory plan is already applied to this transformer; call remove() on its "
                                "handle before applying another")


def _check_blocks(transformer: MiniMaxH3Transformer3DModel, plan: DiTMemoryPlan) -> None:
    for index, block in enumerate(transformer.transformer_blocks):
        where = f"transformer_blocks[{index}]"
        if not isinstance(block, MiniMaxH3TransformerBlock):
            raise InvalidInputError(f"{where} is a {type(block).__name__}, not a MiniMaxH3TransformerBlock")
        processor = block.attn.processor
        if type(processor) is not MiniMaxH3AttnProcessor:
            raise InvalidInputError(f"{where}.attn has a {type(processor).__name__} processor; apply_memory_plan "
                                    "replaces only the stock MiniMaxH3AttnProcessor (another patch is installed)")
        if _has_hooks(block):
            raise InvalidInputError(
                f"{where} already carries hooks or a replaced forward (group offload, caching, context parallel or "
                "another patch); apply_memory_plan first, then enable_group_offload")
        net = getattr(block.ff, "net", None)
        if net is None or len(net) != 3 or not isinstance(net[0], SwiGLU) or not isinstance(net[2], nn.Linear):
            raise InvalidInputError(f"{where}.ff is not the SwiGLU FeedForward (proj, dropout, linear) this adapter "
                                    "chunks")
        if (plan.head_chunks > 1 or plan.query_chunks > 1) and getattr(processor, "_parallel_config", None):
            raise InvalidInputError("head groups and query chunks do not run under context parallelism; "
                                    "use head_chunks=1, query_chunks=1")


def apply_memory_plan(transformer: MiniMaxH3Transformer3DModel, head_chunks: int = 1, ffn_chunks: int = 1,
                      query_chunks: int = 1, mode: str = "fixed", budget_bytes: int | None = None,
                      capacity: Any | None = None) -> DiTMemoryHandle:
    """Install an activation tier on every block of `transformer`; returns the handle to remove it.

    `head_chunks` (a divisor of the model's heads), `ffn_chunks` (packed-row ranges of the FFN) and
    `query_chunks` (128-row-aligned query blocks per head group) are counts >= 1; all ones is the
    lifetime-only tier. `mode`: `"fixed"` runs exactly that tier (checked against the packed rows at each
    forward); `"auto"` / `"exact only"` need `capacity`, an object with `choose(rows, dtype, floor, mode,
    verified) -> decision` (`decision.plan`, `need_bytes`, `have_bytes`, `verified_exact`, `escalated`), as
    `h3director.dit.capacity.CapacityCheck` provides; the chunk counts are its floor. Without `capacity`,
    `default_capacity(transformer, budget_bytes)` is used. `budget_bytes` (bytes, None = what the device
    can give) caps the capacity check; given in `"fixed"` mode it makes each forward check that the fixed
    tier fits (and refuse with "[Director Safety] ... memory limit exceeded" when it does not).

    Returns the `h3director.dit.memory.DiTMemoryHandle` (the same type the ComfyUI node uses); its `plan`
    is the tier the current forward runs, `last_report` what the last one ran, `remove()` uninstalls.

    Bad input (another model class, a head count the groups do not divide, counts < 1, an unknown mode,
    a plan already applied, blocks already patched or hooked) raises `InvalidInputError` before anything
    on the model changes (`h3director.dit.memory.memory_handle` checks the settings). Use with group
    offload: see this module's docstring.
    """
    _check_model(transformer)
    config = transformer.config
    handle = memory_handle(head_chunks, ffn_chunks, query_chunks, mode=mode, heads=config.num_attention_heads,
                           blocks=len(transformer.transformer_blocks), budget_bytes=budget_bytes, capacity=capacity,
                           widths=_widths(config))
    _check_blocks(transformer, handle.floor)
    qkv_layout(transformer)
    if capacity is None and (mode != "fixed" or budget_bytes is not None):
        handle.capacity, handle.own_capacity = default_capacity(transformer, budget_bytes), True
    handle.qkv_layout = lambda: qkv_layout(transformer)
    installation = _Installation(transformer, handle)
    handle.uninstall = installation.remove
    installation.install()
    return handle


__all__ = ["DiTMemoryHandle", "H3DirectorAttnProcessor", "apply_memory_plan", "default_capacity",
           "qkv_layout", "verified_kernel_properties"]
