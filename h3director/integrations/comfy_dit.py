"""ComfyUI adapter of the DiT memory tiers: a replacement for ComfyUI's H3 `DiTBlock.forward`.

`install(model_patcher, ...)` returns a clone of the MODEL whose H3 blocks run through `run_block`
(installed with ComfyUI's own hooks: `set_model_patch_replace(..., "dit", "double_block", i)` for every
block, plus a `WrappersMP.DIFFUSION_MODEL` wrapper around each forward). The input MODEL is never changed.
This module only runs tiers and reports what ran: which tier a forward runs is decided by the
`h3director.dit.memory.DiTMemoryHandle` that `install` returns (floor, mode, capacity check, kernel
verification); the Memory Guard node finds that handle with `dit_memory_of` and prices forwards with the
same capacity check (`forward_capacity`).

`run_block` is ComfyUI's `DiTBlock.forward` (`comfy/ldm/minimax/model.py`) with the same ops in the same
order; the tier (`h3director.dit.tiers.DiTMemoryPlan`) changes lifetimes and groupings only:

- lifetime (every non-stock tier, exact by construction): the modulated block input dies after the
  q/k/v projection, the FFN input after fc1, fc1's output after SwiGLU; `v` is copied only when the
  active attention function consumes ComfyUI's `AttentionTensorContainer`s (`container_function` on
  it or on the `optimized_attention_override` in `transformer_options`), which is what the copy is for;
- head groups (exact where verified): per group, q/k/v from the group's rows of the projection weight
  (cast once per block with `comfy.ops.cast_bias_weight(..., offloadable=True)`, released with
  `uncast_bias_weight` after the last group), per-head RMSNorm + rope with the same
  `comfy.quant_ops.ck.rms_rope_split_half_` call on the group's heads, attention through the same
  `optimized_attention` with `transformer_options` (so an override still acts), written into one
  preallocated `[rows, heads * head_dim]` output; the stock `out_proj` module on the whole output;
- query chunks (exact where verified): inside a group, attention per `QUERY_ALIGN`-aligned query block;
- FFN row chunks (exact where verified): norm2, modulation, fc1, SwiGLU (`comfy.ops.INPUT_ACT_EAGER`,
  what `linear_input_act` runs for unquantised weights), fc2 and the gated residual per row range,
  added into the residual stream in place as the stock block does; fc1/fc2 cast once per block. On the
  CPU, the few rows whose SiLU the stock call's thread ranges cut elsewhere than the chunk's call does are
  recomputed per segment of the stock call (`h3director.dit.blocks.swiglu_rows`), so they take the stock code path.

Quantised or unrecognised linear ops (a `QuantizedTensor` weight, a `layout_type`, fp8/cuBLAS op
classes): row-slicing the weight, or row-chunking an input whose quantisation scale comes from the whole
tensor, is not the same arithmetic, so such a projection keeps its stock call: a quantised qkv is
projected whole (head groups still apply to attention), a quantised fc1/fc2 keeps the FFN in one chunk.
The run report (`DiTMemoryHandle.last_report["kept_stock"]`) says which. The embeddings `_forward`
keeps alive are outside a block hook's reach and stay as they are.

Other packs' patches on the same blocks (`h3director.integrations.comfy_dit_foreign`), whichever was
installed first: found at install (object patches and block replacements on the MODEL) and again at each
forward (the patches actually set on the model and the block entries of that forward's options). The
director's tier steps aside for the part another pack patched (its whole block, its attention branch, or
its FFN half; that pack's code runs there) and says so: `last_report["foreign_patches"]` (who patched what
and what the director did), `["runs"]` (whose code ran the attention and the FFN of which blocks),
`["skipped"]`, a warning in the log, and the node's text. Never a silent skip.

Units: rows are packed-sequence rows (text + condition + audio + video tokens); bytes are bytes.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from h3director.dit.blocks import chunked_rows, grouped_attention, swiglu_rows
from h3director.dit.memory import DiTMemoryHandle, memory_handle
from h3director.dit.quantised import exact_only_reason
from h3director.dit.ranges import row_ranges
from h3director.dit.tiers import QUERY_ALIGN, DiTMemoryPlan, Exactness
from h3director.errors import InvalidInputError
from h3director.integrations import comfy_dit_foreign as foreign_patches

WRAPPER_KEY = "h3director_dit_memory"
PATCH_NAME = "dit"
PATCH_BLOCK = "double_block"
H3_MODEL_CLASS = "MiniMaxH3Model"
H3_MODEL_MODULE = "comfy.ldm.minimax.model"

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------- ops

def _comfy():
    import comfy.ldm.minimax.model as h3
    import comfy.model_management as mm
    import comfy.ops as ops
    import comfy.quant_ops as quant_ops

    return h3, mm, ops, quant_ops


def linear_kind(layer, use: str = "rows", for_act: bool = False, exact_only: bool = False) -> tuple[str, str | None]:
    """How `run_block` may use a linear layer for `use` ("rows": input row chunks, "weight_rows": head-group
    slices of the output rows): ("cast" | "plain" | "gguf", None) when its forward is `F.linear` with (cast,
    or dequantised) weights, so weight rows can be sliced; ("quant", None) for a ComfyUI quantised layer
    whose layout chunks that way through its own op (`h3director.integrations.comfy_quant`; `for_act`: the
    layer is fc2, called through `linear_input_act`); ("stock", reason) when it must be called as is.
    "gguf": a layer of the GGUF DiT loader (`h3director.integrations.comfy_gguf`), whose forward is
    `F.linear(x, *layer.gguf_weight_bias(x))`. `exact_only`: a quantised layer whose chunked call is reported
    approximate (`dit.quantised.exact_only_reason`) keeps its stock call."""
    import torch

    _, _, ops, quant_ops = _comfy()
    weight = getattr(layer, "weight", None)
    if weight is None:
        return "stock", "weights not materialised"
    if callable(getattr(layer, "gguf_weight_bias", None)):
        if getattr(layer, "gguf_qtype", None) is not None:
            return "gguf", None
        casts = bool(layer.comfy_cast_weights or layer.weight_function or layer.bias_function)
        return ("cast" if casts else "plain"), None      # stored unquantised: the base layer's forward
    from h3director.integrations import comfy_quant

    if comfy_quant.is_quantised(layer):
        kind, reason, rule = comfy_quant.classify(layer, use, for_act)
        if exact_only and kind == "quant" and (unverified := exact_only_reason(rule, use)):
            return "stock", unverified
        return kind, reason
    cls = type(layer)
    base = ops.disable_weight_init.Linear
    if cls.forward is base.forward and cls.forward_comfy_cast_weights is base.forward_comfy_cast_weights:
        casts = bool(layer.comfy_cast_weights or layer.weight_function or layer.bias_function)
        return ("cast" if casts else "plain"), None
    if cls.__module__ == ops.__name__ and cls.__qualname__.endswith("MixedPrecisionOps.Linear"):
        return "cast", None  # unquantised mixed-precision layer: cast_bias_weight + F.linear
    if cls is torch.nn.Linear:
        return "plain", None
    return "stock", f"linear op {cls.__module__}.{cls.__qualname__} is not plain F.linear"


class _Weights:
    """A linear layer's weight and bias cast once (released by `release`), as its own forward casts them."""

    def __init__(self, layer, kind: str, like):
        _, _, ops, _ = _comfy()
        self.layer = layer
        self.stream = None
        if kind == "cast":
            self.weight, self.bias, self.stream = ops.cast_bias_weight(layer, like, offloadable=True,
                                                                       compute_dtype=like.dtype)
        elif kind == "gguf":
            self.weight, self.bias = layer.gguf_weight_bias(like)     # dequantised once per block
        else:
            self.weight, self.bias = layer.weight, layer.bias

    def rows(self, start: int, stop: int):
        bias = None if self.bias is None else self.bias[start:stop]
        return self.weight[start:stop], bias

    def prepare(self, x):
        return x

    def linear(self, x, start: int | None = None, stop: int | None = None, prepared: bool = False):
        """`F.linear` of rows `x` with output columns `start:stop` (all when None)."""
        import torch.nn.functional as F

        return F.linear(x, *((self.weight, self.bias) if start is None else self.rows(start, stop)))

    def act_input(self, h, swiglu, start: int, stop: int, total: int):
        """fc2's input from fc1's output rows `start:stop` of `total`: SwiGLU(`h`) (`blocks.swiglu_rows`)."""
        return swiglu_rows(swiglu, h, start, stop, total)

    def linear_act(self, x):
        """fc2 of what `act_input` returned."""
        return self.linear(x)

    def release(self) -> None:
        if self.stream is not None:
            _, _, ops, _ = _comfy()
            ops.uncast_bias_weight(self.layer, self.weight, self.bias, self.stream)
        self.weight = self.bias = self.stream = None


def _weights(layer, kind: str, like, for_act: bool = False):
    """The per-block weights of a layer `linear_kind` called `kind` (not "stock")."""
    if kind == "quant":
        from h3director.integrations.comfy_quant import QuantWeights

        return QuantWeights(layer, like, for_act)
    return _Weights(layer, kind, like)


def _note_quantised(notes: dict[str, str] | None, layer, name: str, use: str, for_act: bool = False) -> None:
    if notes is not None:
        from h3director.integrations.comfy_quant import report_line

        line, exactness = report_line(layer, name, use, for_act)
        notes[line] = exactness


def consumes_containers(transformer_options: dict) -> bool:
    """Whether the attention call `run_block` makes would hand `AttentionTensorContainer`s to a consumer
    (the override's or the backend's `container_function`) rather than unwrap them."""
    h3, _, _, _ = _comfy()
    override = transformer_options.get("optimized_attention_override")
    if override is not None:
        return hasattr(override, "container_function")
    return getattr(h3.optimized_attention, "container_function", None) is not None


def clip_segments(segments, start: int, stop: int) -> list:
    """`mod_segments` (`(a, b, row)`, row an int or a per-token LongTensor) clipped to rows `start:stop`,
    re-based so row `start` is 0."""
    clipped = []
    for a, b, row in segments:
        lo, hi = max(a, start), min(b, stop)
        if lo >= hi:
            continue
        if not isinstance(row, int):
            row = row[lo - a:hi - a]
        clipped.append((lo - start, hi - start, row))
    return clipped


def _norm_rope(attn, q, k, rope_freqs, rows: int, heads: int):
    """Per-head RMSNorm + rope of `heads` heads, as the stock `Attention.forward` (in place where it is)."""
    h3, mm, _, quant_ops = _comfy()
    d = attn.head_dim
    if rope_freqs is None:
        return attn.q_norm(q.view(rows, heads, d)), attn.k_norm(k.view(rows, heads, d))
    q = q.view(1, rows, heads, d)
    k = k.view(1, rows, heads, d)
    qw = mm.cast_to(attn.q_norm.weight, device=q.device)
    kw = mm.cast_to(attn.k_norm.weight, device=q.device)
    rot = rope_freqs.shape[-3] * 2
    if mm.in_training:
        q, k = quant_ops.ck.rms_rope_split_half(q, k, rope_freqs, qw, kw, epsilon=attn.q_norm.eps, rot_dim=rot)
    else:
        quant_ops.ck.rms_rope_split_half_(q, k, rope_freqs, qw, kw, epsilon=attn.q_norm.eps, rot_dim=rot)
    return q[0], k[0]


def _attention(attn, plan: DiTMemoryPlan, hold: list, rope_freqs, transformer_options: dict, kept: set[str],
               quantised: dict[str, str] | None = None, exact_only: bool = False):
    """The attention branch (`Attention.forward` + nothing else) of one block; `hold` holds the modulated
    input, which this drops after the last projection that reads it."""
    import torch

    h3, _, _, _ = _comfy()
    rows = hold[0].shape[0]
    heads, d = attn.heads, attn.head_dim
    inner = heads * d
    consume = consumes_containers(transformer_options)
    kind, reason = linear_kind(attn.qkv_proj, "weight_rows", exact_only=exact_only)
    if kind == "stock" and plan.head_chunks > 1:
        kept.add(f"qkv_proj ({reason}): projected whole")
    elif kind == "quant" and plan.head_chunks > 1:
        _note_quantised(quantised, attn.qkv_proj, "qkv_proj", "weight_rows")
    fused = kind == "stock" or plan.head_chunks == 1
    state: dict[str, Any] = {}
    if fused:
        if kind == "stock":
            state["qkv"] = attn.qkv_proj(hold.pop())
        else:
            weights = _weights(attn.qkv_proj, kind, hold[0])
            try:
                state["qkv"] = weights.linear(hold.pop())
            finally:
                weights.release()
    else:
        weights = _weights(attn.qkv_proj, kind, hold[0])
        hold[0] = weights.prepare(hold[0])   # a quantised layer's input transform, once for every group
    single = plan.head_chunks == 1 and len(row_ranges(rows, plan.query_chunks, QUERY_ALIGN)) == 1

    def project(h0: int, h1: int):
        g = h1 - h0
        if fused:
            qkv = state["qkv"]
            q, k, v = (qkv[:, part * inner + h0 * d:part * inner + h1 * d] for part in range(3))
            if h1 == heads:
                del state["qkv"]
        else:
            x = hold[0]
            q, k, v = (weights.linear(x, part * inner + h0 * d, part * inner + h1 * d, prepared=True)
                       for part in range(3))
            del x
            if h1 == heads:
                hold.pop()
                weights.release()
        v = v.view(rows, g, d)
        q, k = _norm_rope(attn, q, k, rope_freqs, rows, g)
        if consume and fused:
            v = v.clone()  # the consumer owns what it takes: not a view of the fused qkv buffer
        return q.transpose(0, 1).unsqueeze(0), k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0)

    def attend_into(qkv, h0: int, h1: int, a: int, b: int) -> None:
        q, k, v = qkv
        if a != 0 or b != rows:
            q = q[:, :, a:b]
        if consume:
            q, k, v = (h3.AttentionTensorContainer(t) for t in (q, k, v))
        out = h3.optimized_attention(q, k, v, h1 - h0, mask=None, skip_reshape=True,
                                     transformer_options=transformer_options)
        if single:
            state["out"] = out.squeeze(0)
            return
        if "out" not in state:
            state["out"] = torch.empty(rows, inner, dtype=out.dtype, device=out.device)
        state["out"][a:b, h0 * d:h1 * d] = out[0]

    try:
        grouped_attention(plan, heads, rows, project, attend_into)
    finally:
        if not fused:
            weights.release()  # no-op when the last group released it
    return attn.out_proj(state.pop("out"))


def _ffn(block, plan: DiTMemoryPlan, x, terms: list, segments, kept: set[str],
         quantised: dict[str, str] | None = None, exact_only: bool = False) -> None:
    """The FFN half of the block, added into `x` in place (norm2 ... gated residual per row chunk).

    `terms` is `[shift, scale, gate]`, the FFN half of the modulation table; shift and scale are dropped
    from it once the last row range is modulated, so with one range they are gone before fc1 runs."""

    h3, _, ops, _ = _comfy()
    mlp = block.mlp
    kind1, reason1 = linear_kind(mlp.fc1, "rows", exact_only=exact_only)
    kind2, reason2 = linear_kind(mlp.fc2, "rows", for_act=True, exact_only=exact_only)
    chunks = plan.ffn_chunks
    if kind1 == "stock" or kind2 == "stock":
        for name, kind, reason in (("fc1", kind1, reason1), ("fc2", kind2, reason2)):
            if kind == "stock" and chunks > 1:
                kept.add(f"mlp.{name} ({reason}): FFN in one chunk")
        chunks = 1
    elif chunks > 1:
        for name, layer, kind, act in (("fc1", mlp.fc1, kind1, False), ("fc2", mlp.fc2, kind2, True)):
            if kind == "quant":
                _note_quantised(quantised, layer, f"mlp.{name}", "rows", act)
    w1 = _weights(mlp.fc1, kind1, x) if kind1 != "stock" else None
    try:
        w2 = _weights(mlp.fc2, kind2, x, for_act=True) if kind2 != "stock" else None
    except BaseException:
        if w1 is not None:
            w1.release()
        raise
    swiglu = ops.INPUT_ACT_EAGER["swiglu"]

    def apply(a: int, b: int) -> None:
        segs = segments if (a, b) == (0, x.shape[0]) else clip_segments(segments, a, b)
        xs = x[a:b]
        t = h3._mod_scale_shift(block.norm2(xs), terms[0], terms[1], segs)
        if b == x.shape[0]:
            terms[0] = terms[1] = None
        t = w1.linear(t) if w1 is not None else mlp.fc1(t)
        if w2 is not None:
            t = w2.act_input(t, swiglu, a, b, x.shape[0])     # fc1's output dies here, before fc2 runs
            t = w2.linear_act(t)
        else:
            t = ops.linear_input_act(mlp.fc2, t, "swiglu")
        h3._mod_gate(xs, terms[2], t, segs)

    try:
        chunked_rows(x.shape[0], chunks, apply)
    finally:
        for w in (w1, w2):
            if w is not None:
                w.release()


def run_block(block, plan: DiTMemoryPlan, x, t_emb, mod_segments, rope_freqs, transformer_options: dict,
              kept: set[str] | None = None, quantised: dict[str, str] | None = None,
              foreign: dict[str, str] | None = None, exact_only: bool = False):
    """ComfyUI's H3 `DiTBlock.forward` under `plan` (not STOCK): same ops, same order; `x` (the packed
    residual stream, `[rows, hidden]`) is updated in place and returned, as the stock block does.
    `kept` collects the projections that kept their stock call (quantised layouts that cannot chunk, or
    unrecognised ops) with the reason; `quantised` the quantised layers chunked ({report line: exactness class}).
    `exact_only` ("exact only" mode): quantised layers whose chunked call is reported approximate keep their
    stock call (named in `kept`).
    `foreign` ({"attention" | "ffn": origin}): parts another pack patched, which run as the stock block runs them
    (the module calls `block.attn(...)` / `block.mlp(...)`, so that pack's patch acts) instead of the tier."""
    import torch

    h3, _, _, _ = _comfy()
    kept = set() if kept is None else kept
    shift_msa, scale_msa, gate_msa, *ffn_terms = block.adaln_proj(t_emb)
    hold = [h3._mod_scale_shift(block.norm1(x), shift_msa, scale_msa, mod_segments)]
    del shift_msa, scale_msa
    foreign = foreign or {}
    if "attention" in foreign:
        attn_out = block.attn(hold.pop(), rope_freqs=rope_freqs, transformer_options=transformer_options)
    else:
        attn_out = _attention(block.attn, plan, hold, rope_freqs, transformer_options, kept, quantised, exact_only)
    x = h3._mod_gate(x, gate_msa, attn_out, mod_segments)
    del attn_out, gate_msa
    # The six terms are views of one table; copies of the FFN's three (same values) let the table die
    # now, and `_ffn` drops shift and scale once it has used them.
    if "ffn" in foreign:
        h = h3._mod_scale_shift(block.norm2(x), ffn_terms[0], ffn_terms[1], mod_segments)
        return h3._mod_gate(x, ffn_terms[2], block.mlp(h), mod_segments)
    ffn_terms = [term.clone(memory_format=torch.contiguous_format) for term in ffn_terms]
    _ffn(block, plan, x, ffn_terms, mod_segments, kept, quantised, exact_only)
    return x


# ---------------------------------------------------------------------------------------- installing

def is_h3_model(diffusion_model) -> bool:
    """Whether `diffusion_model` is ComfyUI's MiniMax H3 DiT (`comfy.ldm.minimax.model.MiniMaxH3Model`)."""
    cls = type(diffusion_model)
    return cls.__name__ == H3_MODEL_CLASS and cls.__module__ == H3_MODEL_MODULE


def packed_rows(diffusion_model, x, context, payload: dict | None) -> int:
    """Rows of the packed sequence `_forward` will build for these inputs (text, condition, reference,
    audio and video rows), from ComfyUI's own `PackedLayout`."""
    h3, _, _, _ = _comfy()
    video, audio = x[0], x[1]
    pt, ph, pw = diffusion_model.patch_size
    t = -(-video.shape[2] // pt) * pt
    lat_h = -(-video.shape[3] // ph) * ph
    lat_w = -(-video.shape[4] // pw) * pw
    signature = (context.shape[1], t, lat_h, lat_w, audio.shape[-1])
    payload = payload or {}
    layout = payload.get("layout")
    if layout is None or layout.signature != signature:
        layout = h3.PackedLayout(*signature, keyframes=payload.get("keyframes"), refs=payload.get("refs"))
    return int(layout.seq_len)



def kernel_widths(diffusion_model):
    """`h3director.dit.kernels.KernelWidths` of a ComfyUI `MiniMaxH3Model` (what its blocks run)."""
    from h3director.dit.kernels import KernelWidths

    return KernelWidths.of(comfy_shape(diffusion_model))


def comfy_shape(diffusion_model):
    """`h3director.plan.activations.DiTShape` of a ComfyUI `MiniMaxH3Model` (read from its modules)."""
    from h3director.plan.activations import DiTShape

    block = diffusion_model.blocks[0]
    patch = diffusion_model.patch_size
    return DiTShape(hidden=int(diffusion_model.hidden_size), heads=int(block.attn.heads),
                    head_dim=int(block.attn.head_dim), ffn=int(block.mlp.fc2.in_features),
                    layers=len(diffusion_model.blocks), refiner_layers=len(diffusion_model.token_refiner.blocks),
                    rotary_dim=6 * int(diffusion_model.rope.inv_freq.shape[0]),
                    video_patch=int(diffusion_model.latents_dim) * patch[0] * patch[1] * patch[2],
                    audio_channels=int(diffusion_model.audio_latents_dim),
                    text_dim=int(diffusion_model.condition_proj.in_features))


ATTENTION_LEDGER = {"attention_sage": "sage", "attention3_sage": "sage", "attention_xformers": "efficient",
                    "attention_basic": "math"}
"""ComfyUI attention functions -> the planner's attention kinds; any other (PyTorch SDPA, flash, kitchen,
sub-quadratic, overrides) is priced as a fused kernel ("flash"), and the first measured peak calibrates."""

def attention_ledger_kind(transformer_options: dict) -> str:
    """The planner's attention kind of the attention function this forward calls (`ATTENTION_LEDGER`)."""
    h3, _, _, _ = _comfy()
    if transformer_options.get("optimized_attention_override") is not None:
        return "flash"
    return ATTENTION_LEDGER.get(getattr(h3.optimized_attention, "__name__", ""), "flash")


def forward_capacity(diffusion_model, device, transformer_options: dict, handle: DiTMemoryHandle | None = None):
    """The capacity check that prices a forward: `handle.capacity` (given at install, or built here at first
    use, then `handle.own_capacity`), or without a handle a new one with no budget. Built:
    `h3director.dit.capacity.default_capacity` with the planner's ledger of ComfyUI's H3 block at the model's
    widths and the attention backend this forward calls (`attention_ledger_kind`), on `device`, under the
    handle's budget, with the blocks' quantised linears (`comfy_quant.block_linears`); a model that is not
    ComfyUI's H3 DiT is priced at the released widths with a fused kernel. The DiT Memory node and the Memory Guard both price forwards through this function."""
    from h3director.dit.capacity import default_capacity

    if handle is not None and handle.capacity is not None:
        return handle.capacity
    from h3director.integrations.comfy_quant import block_linears

    h3 = is_h3_model(diffusion_model)
    check = default_capacity(comfy_shape(diffusion_model) if h3 else None, "comfy", device,
                             handle.budget_bytes if handle is not None else None,
                             attention_ledger_kind(transformer_options) if h3 else "flash",
                             block_linears(diffusion_model.blocks[0], device) if h3 else None)
    if handle is not None:
        handle.capacity, handle.own_capacity = check, True
    return check


def reclaimable_weight_bytes(diffusion_model) -> int:
    """Weight bytes ComfyUI's Dynamic VRAM would evict to make room for activations: what the dynamic
    patcher running `diffusion_model` has resident (`loaded_size()`), less one block (the block being run
    keeps its weights). 0 when the model is not loaded through a dynamic patcher."""
    _, mm, _, _ = _comfy()
    for loaded in list(getattr(mm, "current_loaded_models", ())):
        patcher = loaded.model
        if patcher is None or getattr(getattr(patcher, "model", None), "diffusion_model", None) is not diffusion_model:
            continue
        if not patcher.is_dynamic():
            return 0
        block = sum(p.numel() * p.element_size() for p in diffusion_model.blocks[0].parameters())
        return max(int(patcher.loaded_size()) - block, 0)
    return 0




class _Forwards(threading.local):
    """The forward running on this thread under one installation: diffusion model, tier, kept-stock notes
    (`active` is None outside one)."""

    active: dict | None = None


DIRECTOR = "H3 Director"
STOCK_CODE = "ComfyUI stock block"


_CHAINED_ENTRIES: list[type] = []


def register_own_entry(entry_type: type) -> type:
    """Declare `entry_type` one of this project's block entries that wrap the entry before them in `inner` (the
    block swap registers its own when imported: an entry that exists was made by a module that is imported).
    Returns `entry_type`."""
    if entry_type not in _CHAINED_ENTRIES:
        _CHAINED_ENTRIES.append(entry_type)
    return entry_type


def own_entries() -> tuple[type, ...]:
    """This project's block-entry types that wrap the entry before them in `inner` (ours, the block swap's)."""
    return (_BlockPatch, *_CHAINED_ENTRIES)


def _report_foreign(handle: DiTMemoryHandle, report: dict, found: list, ran: dict, blocks: int) -> None:
    """Add what other packs' patches did in this forward to `report`; when that differs from the last forward's,
    log it as a warning and pass the text to `handle.notify` (the node shows it)."""
    last = handle.last_report or {}
    lines = foreign_patches.describe_patches(found)
    runs = foreign_patches.runs_summary(ran, blocks, foreign_patches.parts_by_block(found))
    skipped = [line for line in lines if "stepped aside" in line]
    missing = [i for i in range(blocks) if i not in ran]
    if missing:
        skipped.append(f"the director's block entry did not run for blocks {foreign_patches.block_list(missing)} "
                       "(another pack replaced it, or a patch of the model bypassed the block loop's entries)")
    report.update(foreign_patches=lines, runs=runs, skipped=skipped,
                  director_blocks=sum(1 for record in ran.values() if DIRECTOR in record.values()))
    if (lines or missing) and (lines, skipped, runs) != (last.get("foreign_patches"), last.get("skipped"),
                                                        last.get("runs")):
        notes = lines + (skipped[-1:] if missing else [])
        text = (f"H3 Director DiT memory: other packs' patches on the H3 DiT: {'; '.join(notes)}. Who ran what: "
                f"{'; '.join(foreign_patches.summary_lines(runs))}")
        log.warning("%s", text)
        if handle.notify is not None:
            handle.notify(text)


class _BlockPatch:
    """The `patches_replace["dit"][("double_block", i)]` entry: runs block `index` under the tier the
    wrapper chose for this forward; the stock block when no forward of ours is active."""

    def __init__(self, handle: DiTMemoryHandle, forwards: _Forwards, index: int, inner=None):
        self.handle = handle
        self.forwards = forwards
        self.index = index
        self.inner = inner  # another pack's entry for this block, registered before ours: it runs instead

    def _other(self, args: dict, extra: dict) -> dict:
        return self.inner(args, extra) if self.inner is not None else extra["original_block"](args)

    def __call__(self, args: dict, extra: dict) -> dict:
        active = self.forwards.active
        if active is None:
            return self._other(args, extra)
        parts = active["foreign"].get(self.index, {})
        if self.inner is not None or "block" in parts or active["plan"].is_stock:
            who = parts.get("block") or (foreign_patches.origin_of(self.inner) if self.inner is not None else None)
            active["ran"][self.index] = {part: who or parts.get(part, STOCK_CODE) for part in ("attention", "ffn")}
            return self._other(args, extra)
        block = active["model"].blocks[self.index]
        self.handle.block_calls += 1
        active["ran"][self.index] = {part: parts.get(part, DIRECTOR) for part in ("attention", "ffn")}
        img = run_block(block, active["plan"], args["img"], args["t_emb"], args["mod_segments"], args["rope_freqs"],
                        args["transformer_options"], active["kept"], active["quantised"], foreign=parts,
                        exact_only=self.handle.mode == "exact only")
        return {"img": img}


class _ForwardWrapper:
    """The `DIFFUSION_MODEL` wrapper: the handle decides the tier before each forward (`DiTMemoryHandle.decide`),
    the blocks run it, and what ran is recorded after it (`DiTMemoryHandle.record`)."""

    def __init__(self, handle: DiTMemoryHandle, forwards: _Forwards):
        self.handle = handle
        self.forwards = forwards

    def __call__(self, executor, x, timestep, context, transformer_options=None, *args, **kwargs):
        import torch

        handle = self.handle
        model = executor.class_obj
        rows = packed_rows(model, x, context, kwargs.get("minimax_payload"))
        device = context.device
        capacity = forward_capacity(model, device, transformer_options or {}, handle)
        if handle.own_capacity:
            capacity.reclaimable_bytes = reclaimable_weight_bytes(model)
        plan, report = handle.decide(rows, context.dtype, device)
        if handle.own_capacity:
            report["reclaimable_bytes"] = capacity.reclaimable_bytes
        from h3director.integrations.comfy_quant import check_model_head_groups

        check_model_head_groups(model.blocks, plan.head_chunks)   # before the forward: a layout's row group
        found = foreign_patches.scan_model(model, transformer_options or {}, PATCH_NAME, PATCH_BLOCK, own_entries())
        active = {"model": model, "plan": plan, "kept": set(), "quantised": {}, "ran": {},
                  "foreign": foreign_patches.parts_by_block(found)}
        measure = device.type == "cuda"
        if measure:
            base = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        outer = self.forwards.active
        self.forwards.active = active
        try:
            out = executor(x, timestep, context, transformer_options, *args, **kwargs)
        finally:
            self.forwards.active = outer
        report["kept_stock"] = sorted(active["kept"])
        report["quantised"] = sorted(active["quantised"])
        if Exactness.APPROXIMATE.value in active["quantised"].values():   # a chunked layer sets the run's class
            report["exactness"] = Exactness.APPROXIMATE.value
            report["exactness_detail"] += "; quantised layers chunked through kernels not verified at these shapes"
        _report_foreign(handle, report, found, active["ran"], len(model.blocks))
        peak = torch.cuda.max_memory_allocated(device) - base if measure else None
        handle.record(report, plan, peak, context.dtype)
        return out


def h3_diffusion_model(model_patcher, node: str = "H3Director DiT Memory"):
    """ComfyUI's `MiniMaxH3Model` inside `model_patcher`; `InvalidInputError` (naming `node`) for another model."""
    base = getattr(model_patcher, "model", None)
    model = getattr(base, "diffusion_model", None)
    if model is None or not is_h3_model(model):
        cls = type(model if model is not None else (base if base is not None else model_patcher))
        what = f"{cls.__module__}.{cls.__qualname__}"
        raise InvalidInputError(f"{node} works on ComfyUI's MiniMax H3 DiT ({H3_MODEL_MODULE}."
                                f"{H3_MODEL_CLASS}); the connected MODEL is {what}")
    return model


def check_conflicts(model_patcher) -> list:
    """Other packs' patches already on `model_patcher`'s H3 blocks (`comfy_dit_foreign.ForeignPatch`es): the
    director's tier will step aside for the parts they patched; logged as a warning, never refused."""
    found = foreign_patches.scan_patcher(model_patcher, PATCH_NAME, PATCH_BLOCK, own_entries())
    if found:
        log.warning("H3Director DiT Memory installed after other packs' patches on the H3 DiT: %s",
                    "; ".join(foreign_patches.describe_patches(found)))
    return found


def install(model_patcher, head_chunks: int = 1, ffn_chunks: int = 1, query_chunks: int = 1, mode: str = "fixed",
            budget_bytes: int | None = None, capacity=None) -> tuple[Any, DiTMemoryHandle]:
    """A clone of `model_patcher` whose H3 DiT blocks run the memory tiers; returns `(clone, handle)`.

    `mode`: "fixed" runs the given chunking; "auto" starts there and escalates to a cheaper tier when the
    capacity check says it does not fit; "exact only" escalates only through tiers whose kernel properties
    passed `verify-kernels` on this device. `budget_bytes` None = what the device can give; `capacity`: a
    `CapacityCheck` to use instead of the default (`forward_capacity`). Every check (the model, the settings:
    `h3director.dit.memory.memory_handle`, conflicting patches) runs before anything is patched: a refused
    call (`InvalidInputError`) leaves nothing installed, and the input MODEL is never changed."""
    model = h3_diffusion_model(model_patcher)
    handle = memory_handle(head_chunks, ffn_chunks, query_chunks, mode=mode, heads=model.blocks[0].attn.heads,
                           blocks=len(model.blocks), budget_bytes=budget_bytes, capacity=capacity,
                           widths=kernel_widths(model))
    from h3director.integrations.comfy_quant import block_decisions, check_model_head_groups

    check_model_head_groups(model.blocks, handle.floor.head_chunks)
    handle.quantised = block_decisions(model.blocks[0])
    handle.foreign_at_install = check_conflicts(model_patcher)
    from comfy.patcher_extension import WrappersMP

    forwards = _Forwards()
    patched = model_patcher.clone()
    patched.remove_wrappers_with_key(WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY)
    before = patched.model_options.get("transformer_options", {}).get("patches_replace", {}).get(PATCH_NAME, {})
    for i in range(handle.blocks):
        previous = foreign_patches.unwrap(before.get((PATCH_BLOCK, i)), (_BlockPatch,))
        patched.set_model_patch_replace(_BlockPatch(handle, forwards, i, previous), PATCH_NAME, PATCH_BLOCK, i)
    patched.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, WRAPPER_KEY, _ForwardWrapper(handle, forwards))
    return patched, handle


def dit_memory_of(transformer_options: dict | None) -> DiTMemoryHandle | None:
    """The DiT Memory handle installed on the model whose transformer options these are (a MODEL's
    `model_options["transformer_options"]`, or the options a forward receives); None when there is none."""
    replaced = (transformer_options or {}).get("patches_replace", {}).get(PATCH_NAME, {})
    for patch in replaced.values():
        if isinstance(patch, _BlockPatch):
            return patch.handle
    return None


def installed_handle(model_patcher) -> DiTMemoryHandle | None:
    """The handle of the installation on `model_patcher` (or a clone of it), None when there is none."""
    return dit_memory_of(model_patcher.model_options.get("transformer_options"))


__all__ = ["DiTMemoryHandle", "check_conflicts", "clip_segments", "consumes_containers", "dit_memory_of",
           "forward_capacity", "install", "installed_handle", "is_h3_model", "linear_kind",
           "packed_rows", "register_own_entry", "run_block"]
