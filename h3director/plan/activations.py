"""Activation bytes of H3's DiT (`MiniMaxH3Transformer3DModel`) for a packed sequence, from its config.

The DiT runs one packed sequence `[text, cond/refs, audio, video]` through 50 identical blocks.
`dit_forward_peak_bytes` replays diffusers' forward allocation by allocation on a `ByteLedger`
(projections, refiner, packing, every block, output heads) and returns its peak: tensor bytes live
at once beyond the weights and the inputs. `block_token_bytes` gives the per-token terms of one
block (the numbers h3-facts.md quotes: fused QKV, FFN fc1, attention out, residual).

Knobs (what users set to fit):

- `attention`: "flash" / "efficient" (fused kernels: output + float32 log-sum-exp), "sage"
  (SageAttention: also int8 copies of q and k), "math" (PyTorch's unfused path: scores and
  probabilities, `heads x S x S` each);
- the tier (`h3director.dit.tiers.DiTMemoryPlan`'s fields, taken here as plain values): `lifetime`
  frees, `head_chunks` (q/k/v projected and attended a head group at a time into a preallocated
  output), `query_chunks` (128-row-aligned query blocks per group), `ffn_chunks` (the FFN per range of
  rows). All ones and no lifetime frees = the framework's stock block.

`dit_block_peak_bytes(shape, rows, dtype, framework=..., plan=...)` replays one block of diffusers
(`MiniMaxH3TransformerBlock`) or ComfyUI (`comfy/ldm/minimax/model.py` `DiTBlock`), stock or as the
project's adapters run it; tests/test_plan_dit_tiers.py checks every replay against `LiveBytesTracker`
on the real blocks. `dit_forward_peak_bytes` is the diffusers forward.
Norms follow PyTorch's composite RMSNorm (the input upcast to float32, then cast back), which is
what runs on CPU; fused GPU kernels allocate less, so GPU estimates err on the high side. ComfyUI's
fused q/k norm + rotary kernel (comfy-kitchen) works in place and is priced at zero bytes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from h3director.errors import InvalidInputError
from h3director.plan.dtypes import dtype_bytes
from h3director.plan.ledger import ByteLedger
from h3director.plan.quantised_bytes import BlockLinears

FP32 = 4
INDEX = 8          # int64 index tensors
ATTENTION_BACKENDS = ("flash", "efficient", "sage", "math")


@dataclass(frozen=True)
class DiTShape:
    """The DiT sizes activations depend on (read from `MiniMaxH3Transformer3DModel.config`)."""

    hidden: int = 5376
    heads: int = 56
    head_dim: int = 128
    ffn: int = 14336
    layers: int = 50
    refiner_layers: int = 2
    rotary_dim: int = 96
    video_patch: int = 96
    audio_channels: int = 32
    text_dim: int = 5120

    @classmethod
    def from_config(cls, config: Mapping | None = None) -> DiTShape:
        c = dict(config or {})
        patch = c.get("patch_size", (1, 2, 2))
        return cls(
            hidden=int(c.get("hidden_size", 5376)),
            heads=int(c.get("num_attention_heads", 56)),
            head_dim=int(c.get("attention_head_dim", 128)),
            ffn=int(c.get("ffn_dim", 14336)),
            layers=int(c.get("num_layers", 50)),
            refiner_layers=int(c.get("num_refiner_layers", 2)),
            rotary_dim=6 * int(c.get("rope_freq_dim", 16)),
            video_patch=int(c.get("in_channels", 24)) * patch[0] * patch[1] * patch[2],
            audio_channels=int(c.get("audio_in_channels", 32)),
            text_dim=int(c.get("text_dim", 5120)),
        )

    @property
    def inner(self) -> int:
        """Attention width, heads x head_dim (7168 for H3, larger than `hidden`)."""
        return self.heads * self.head_dim


@dataclass(frozen=True)
class BlockTokenBytes:
    """Bytes per packed token of one block's main activations at compute dtype (h3-facts.md's terms)."""

    fused_qkv: int
    ffn_fc1: int
    attention_out: int
    residual: int
    ffn_transient: int       # fc1 output + SiLU(gate) + product, live together


def block_token_bytes(shape: DiTShape, dtype: object = "bf16") -> BlockTokenBytes:
    """Per-token activation terms: bf16 H3 -> QKV 43,008, fc1 57,344, attention out 14,336, residual 10,752."""
    e = dtype_bytes(dtype)
    return BlockTokenBytes(
        fused_qkv=3 * shape.inner * e,
        ffn_fc1=2 * shape.ffn * e,
        attention_out=shape.inner * e,
        residual=shape.hidden * e,
        ffn_transient=4 * shape.ffn * e,
    )


@dataclass(frozen=True)
class PackedRows:
    """Row counts of one packed sequence: text, conditioning (keyframes/refs), audio, video."""

    text: int
    cond: int
    audio: int
    video: int

    @property
    def total(self) -> int:
        return self.text + self.cond + self.audio + self.video


@dataclass
class _DiTLedger(ByteLedger):
    """A ledger that also knows whether RMSNorm runs as one fused kernel (CUDA) or composite (CPU)."""

    fused_norms: bool = False


def _rms_norm(ledger: _DiTLedger, name: str, numel: int, e: int, input_bytes: int, affine: bool,
              width: int | None = None) -> None:
    """PyTorch's composite `rms_norm` (CPU): upcast to float32, x*rsqrt(mean(x^2)+eps), * weight, cast back.

    `width` (the normalised last dimension) prices the float32 per-vector `rsqrt`, which lives until
    the output is made; None leaves it out. With fused norms (CUDA's fused kernel) only the output is
    allocated."""
    if ledger.fused_norms:
        ledger.alloc(name, numel * input_bytes)
        return
    upcast = input_bytes != FP32
    vectors = numel // width if width else 0
    if upcast:
        ledger.alloc(name + ".up", numel * FP32)
    ledger.transient(numel * FP32 + 2 * vectors * FP32)  # pow(x, 2) with its mean and rsqrt
    ledger.alloc(name + ".rsqrt", vectors * FP32)
    ledger.alloc(name + ".f32", numel * FP32)
    if affine:
        ledger.alloc(name + ".w32", numel * FP32)
        ledger.free(name + ".f32")
        ledger.rename(name + ".w32", name + ".f32")
    if upcast:
        ledger.free(name + ".up")
        ledger.alloc(name, numel * input_bytes)
        ledger.free(name + ".f32")
    else:
        ledger.rename(name + ".f32", name)
    ledger.free(name + ".rsqrt")


def replay_math_attention(ledger: ByteLedger, score_elements: int, out_bytes: int, e: int,
                          k_bytes: int | None = None) -> None:
    """Replay into `ledger` the allocations of PyTorch's unfused SDPA, in bytes: q and k scaled by
    sqrt(scale) (copies), scores and their softmax (`score_elements` elements of `e` bytes each), then the
    output "attn", left live, of `out_bytes` (q's size; k has `k_bytes`, default q's size). Returns None."""
    ledger.alloc("q_scaled", out_bytes)
    ledger.alloc("k_scaled", out_bytes if k_bytes is None else k_bytes)
    ledger.alloc("scores", score_elements * e)
    ledger.free("k_scaled")
    ledger.alloc("probs", score_elements * e)
    ledger.free("scores")
    ledger.alloc("attn", out_bytes)
    ledger.free("probs", "q_scaled")


# ---------------------------------------------------------------------------------------------------
# One DiT block, per framework and tier
#
# A tier is what `h3director.dit.tiers.DiTMemoryPlan` names (plan/ sits below dit/, so the ledgers take
# its four fields as plain values, `BlockTier`). The stock replays follow the frameworks' own blocks;
# the tiered replays follow the adapters (`h3director.integrations.diffusers_dit`, `comfy_dit`), which
# iterate through `h3director.dit.blocks`: head group by head group, query chunk by query chunk, FFN
# row range by row range. Chunks of one loop are the same size but the last, and each chunk's tensors
# die before the next one is made, so the first (largest) chunk holds the loop's peak: one replay of it
# is exact.
# ---------------------------------------------------------------------------------------------------

FRAMEWORKS = ("diffusers", "comfy")
QUERY_ALIGN = 128
"""Query chunks start on multiples of this many rows (`h3director.dit.tiers.QUERY_ALIGN`, same value)."""
ADALN_MODALITIES = 3
ADALN_TERMS = 6


@dataclass(frozen=True)
class BlockTier:
    """The fields of a `DiTMemoryPlan` the ledgers read. `lifetime=False` is the framework's stock block;
    chunked tiers always free by lifetime."""

    head_chunks: int = 1
    ffn_chunks: int = 1
    query_chunks: int = 1
    lifetime: bool = False

    @classmethod
    def of(cls, plan: object) -> BlockTier:
        """From any object with `head_chunks`, `ffn_chunks`, `query_chunks` and `lifetime` (a `DiTMemoryPlan`)."""
        return cls(int(plan.head_chunks), int(plan.ffn_chunks), int(getattr(plan, "query_chunks", 1)),
                   bool(getattr(plan, "lifetime", True)))

    @property
    def grouped(self) -> bool:
        """Attention runs into a preallocated output (head groups or query chunks)."""
        return self.head_chunks > 1 or self.query_chunks > 1


def block_tier(head_chunks: int = 1, ffn_chunks: int = 1, query_chunks: int = 1,
               lifetime: bool | None = None) -> BlockTier:
    """A checked `BlockTier`; `lifetime=None` means "lifetime frees exactly when something is chunked"."""
    for name, value in (("head_chunks", head_chunks), ("ffn_chunks", ffn_chunks), ("query_chunks", query_chunks)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidInputError(f"{name} must be an integer >= 1, got {value!r}")
    chunked = head_chunks > 1 or ffn_chunks > 1 or query_chunks > 1
    if lifetime is None:
        lifetime = chunked
    if chunked and not lifetime:
        raise InvalidInputError("chunked tiers always free by lifetime: lifetime=False is the stock block only")
    return BlockTier(head_chunks, ffn_chunks, query_chunks, bool(lifetime))


def first_range_rows(total: int, chunks: int, align: int = 1) -> int:
    """Rows of the first (largest) range when `total` rows are split as `h3director.dit.ranges.row_ranges`
    splits them: `ceil(total / chunks)` rounded up to `align`, at most `total`."""
    if total <= 0:
        return 0
    step = -(-total // chunks)
    step = -(-step // align) * align
    return min(step, total)


def _head_groups(shape: DiTShape, tier: BlockTier, seq: int, e: int) -> tuple[int, int, int, list[tuple[bool, bool]]]:
    """The head-group geometry both frameworks' attention replays: heads per group, bytes of one group's
    q (or k, or v) over `seq` rows at `e` bytes an element, the first query range's rows, and the groups
    replayed as ``(first, last)`` flags: the first, one middle (every middle group is alike) and the last."""
    groups = tier.head_chunks
    heads = shape.heads // groups
    part = seq * heads * shape.head_dim * e
    q_rows = first_range_rows(seq, tier.query_chunks, QUERY_ALIGN)
    replayed = [(True, groups == 1)] + ([(False, False)] if groups > 2 else []) + ([(False, True)] if groups > 1 else [])
    return heads, part, q_rows, replayed


def _adaln_bytes(shape: DiTShape, e: int, timesteps: int, terms: int = ADALN_TERMS) -> int:
    """Bytes of `terms` modulation terms x three modalities x `timesteps` rows of `hidden`."""
    return timesteps * ADALN_MODALITIES * terms * shape.hidden * e


def _adaln_table(ledger: ByteLedger, shape: DiTShape, e: int, timesteps: int) -> None:
    """The block's modulation table: six terms x three modalities x `timesteps` rows of `hidden`."""
    ledger.alloc("adaln", _adaln_bytes(shape, e, timesteps))


def _rope(ledger: _DiTLedger, name: str, rows: int, heads: int, shape: DiTShape, e: int) -> None:
    """diffusers' `_apply_rotary_emb` on `name` (rows x heads x head_dim) -> the rotated tensor, same name.

    cos and sin are cast to the compute dtype inside each call (freed when it returns)."""
    rot = rows * heads * shape.rotary_dim
    if e != FP32:
        ledger.alloc("cos_cast", rows * shape.rotary_dim * e)
        ledger.alloc("sin_cast", rows * shape.rotary_dim * e)
    ledger.transient(rot // 2 * e)                      # -x2, then cat -> rotated
    ledger.alloc("rotated", rot * e)
    ledger.alloc("x_cos", rot * e)
    ledger.alloc("r_sin", rot * e)
    ledger.alloc("rot_sum", rot * e)
    ledger.free("x_cos", "r_sin", "rotated")
    ledger.alloc(name + "r", rows * heads * shape.head_dim * e)
    ledger.free("rot_sum", name)
    ledger.rename(name + "r", name)
    if e != FP32:
        ledger.free("cos_cast", "sin_cast")


def _kernel(ledger: ByteLedger, attention: str, heads: int, q_rows: int, kv_rows: int, head_dim: int,
            e: int) -> None:
    """One attention call of `heads` heads, `q_rows` query rows over `kv_rows` keys -> "attn" live."""
    out_bytes = q_rows * heads * head_dim * e
    if attention == "math":
        replay_math_attention(ledger, heads * q_rows * kv_rows, out_bytes, e,
                              k_bytes=kv_rows * heads * head_dim * e)
        return
    if attention == "sage":
        ledger.alloc("q8", q_rows * heads * head_dim)
        ledger.alloc("k8", kv_rows * heads * head_dim)
    ledger.alloc("attn", out_bytes)
    ledger.transient(q_rows * heads * FP32)             # log-sum-exp
    if attention == "sage":
        ledger.free("q8", "k8")


def _attention(ledger: _DiTLedger, shape: DiTShape, seq: int, e: int, attention: str, tier: BlockTier,
               rope: bool) -> None:
    """diffusers' `MiniMaxH3AttnProcessor` (stock tier), or the adapter's tiered attention, on input "m"
    -> "attn_out" (seq x hidden) live.

    Tiered: per head group, q, k, v are projected from "m" over the group's weight rows, normalised and
    rotated; "m" dies right after the last group's projections. Grouped attention (head groups or query
    chunks) writes each call's output into a seq x inner buffer made after the first call returns. The
    first, a middle and the last group are replayed (every middle group is alike)."""
    heads, part, q_rows, replayed = _head_groups(shape, tier, seq, e)
    for first, last in replayed:
        for name in ("q", "k", "v"):
            ledger.alloc(name, part)
        if last and tier.lifetime:
            ledger.free("m")
        for name in ("q", "k"):
            _rms_norm(ledger, name + "n", part // e, e, e, affine=True, width=shape.head_dim)
            ledger.free(name)
            ledger.rename(name + "n", name)
        if rope:
            for name in ("q", "k"):
                _rope(ledger, name, seq, heads, shape, e)
        _kernel(ledger, attention, heads, q_rows, seq, shape.head_dim, e)
        if tier.grouped:
            if first:
                ledger.alloc("attn_all", seq * shape.inner * e)
            ledger.free("attn")                         # copied into its slice of attn_all
        ledger.free("q", "k", "v")
    if tier.grouped:
        ledger.rename("attn_all", "attn")
    ledger.alloc("attn_out", seq * shape.hidden * e)
    ledger.free("attn")


def _swiglu_ffn(ledger: ByteLedger, shape: DiTShape, rows: int, e: int, free_input: str | None = None) -> None:
    """diffusers' SwiGLU `FeedForward` over `rows` rows -> "ff_out" live: fc1, SiLU(gate), the product,
    fc2. `free_input` names the input to drop right after fc1 (the lifetime tiers), which also multiply
    into the SiLU buffer in place instead of allocating the product."""
    ledger.alloc("fc1", rows * 2 * shape.ffn * e)
    if free_input:
        ledger.free(free_input)
    ledger.alloc("silu", rows * shape.ffn * e)
    if free_input:
        ledger.rename("silu", "swiglu")
        ledger.free("fc1")
    else:
        ledger.alloc("swiglu", rows * shape.ffn * e)
        ledger.free("silu", "fc1")
    ledger.alloc("ff_out", rows * shape.hidden * e)
    ledger.free("swiglu")


def _modulate(ledger: ByteLedger, md: int, e: int) -> None:
    """norm * (1 + scale[idx]) + shift[idx] on "n" -> "m" (index_select makes full-size rows)."""
    ledger.alloc("sel", md * e)
    ledger.alloc("onep", md * e)
    ledger.free("sel")
    ledger.alloc("scaled", md * e)
    ledger.free("onep")
    ledger.alloc("sel", md * e)
    ledger.alloc("m", md * e)
    ledger.free("sel", "scaled", "n")


def _gated_residual(ledger: ByteLedger, md: int, e: int, branch: str, out: str) -> None:
    """residual + gate[idx] * branch -> `out` (the branch output stays live: a local of the block)."""
    ledger.alloc("gate", md * e)
    ledger.alloc("gated", md * e)
    ledger.free("gate")
    ledger.alloc(out, md * e)
    ledger.free("gated")


def _diffusers_block(ledger: _DiTLedger, shape: DiTShape, seq: int, e: int, attention: str, tier: BlockTier,
                     timesteps: int, sections: dict[str, int] | None) -> None:
    """One `MiniMaxH3TransformerBlock` on "x" (held by the caller) -> new "x".

    Stock: diffusers' forward, whose locals (modulated inputs, branch outputs) live until it returns.
    Tiered (`h3director.integrations.diffusers_dit`): the same ops; the attention output dies after the
    gated residual, and norm2, modulation, fc1, SwiGLU, fc2 and `gate * ff` run per range of rows (all
    rows when `ffn_chunks` is 1), the FFN input dying after fc1, the result added in place into the
    post-attention stream; with row chunks, norm1 and its modulation also run per range into one
    preallocated attention input."""
    md = seq * shape.hidden
    _adaln_table(ledger, shape, e, timesteps)
    if tier.lifetime and tier.ffn_chunks > 1:
        # norm1 and modulation per range of rows, into one preallocated input (the first range is the largest)
        mr = first_range_rows(seq, tier.ffn_chunks) * shape.hidden
        ledger.alloc("m_all", md * e)
        _rms_norm(ledger, "n", mr, e, e, affine=True, width=shape.hidden)
        _modulate(ledger, mr, e)
        ledger.free("m")
        ledger.rename("m_all", "m")
    else:
        _rms_norm(ledger, "n", md, e, e, affine=True, width=shape.hidden)
        _modulate(ledger, md, e)
    _attention(ledger, shape, seq, e, attention, tier, rope=True)
    if sections is not None:
        sections["attention"] = ledger.peak
        ledger.reset_peak()
    _gated_residual(ledger, md, e, "attn_out", "x1")
    if not tier.lifetime:
        ledger.rename("m", "m_attn")                    # lives until norm2's result is bound
        _rms_norm(ledger, "n", md, e, e, affine=True, width=shape.hidden)
        ledger.free("m_attn")
        _modulate(ledger, md, e)
        _swiglu_ffn(ledger, shape, seq, e)
        _gated_residual(ledger, md, e, "ff_out", "x2")
        # `attn_output`, `ff_output` and the modulated input are locals: they die when the block returns
        ledger.free("attn_out", "ff_out", "m", "x1", "x")
        ledger.rename("x2", "x")
    else:
        ledger.free("attn_out")
        rows = first_range_rows(seq, tier.ffn_chunks)
        mr = rows * shape.hidden
        _rms_norm(ledger, "n", mr, e, e, affine=True, width=shape.hidden)
        _modulate(ledger, mr, e)
        _swiglu_ffn(ledger, shape, rows, e, free_input="m")
        ledger.alloc("gate", mr * e)
        ledger.alloc("gated", mr * e)                   # gate * ff, then added into x1's rows in place
        ledger.free("gate", "ff_out", "gated")
        ledger.free("x")
        ledger.rename("x1", "x")
    ledger.free("adaln")
    if sections is not None:
        sections["ffn"] = ledger.peak


def _quantised_call(ledger: ByteLedger, call, rows: int, k: int, n: int, e: int, device: str,
                    held: bool = False) -> None:
    """What a quantised linear's own call holds beyond its output (`plan.quantised_bytes.LinearCall`), while
    its output exists; `held`: the block holds its weight (not made by the call)."""
    extra = call.extra_bytes(rows, k, n, e, device, held) if call is not None else 0
    if extra:
        ledger.alloc("qcall", extra)
        ledger.free("qcall")


def _comfy_block(ledger: _DiTLedger, shape: DiTShape, seq: int, e: int, attention: str, tier: BlockTier,
                 timesteps: int, sections: dict[str, int] | None, linears=None) -> None:
    """One ComfyUI `DiTBlock` (comfy/ldm/minimax/model.py) on "x" -> "x", updated in place.

    Stock: the modulation scales and shifts the norm output in place, per segment; q, k and v are views
    of one fused projection, normalised and rotated in place (a fused kernel: nothing allocated), v is
    cloned for the attention containers; the attention output reshapes without a copy; both gated
    residuals are `addcmul_` into x; the MLP's SwiGLU makes one ffn-wide tensor (SiLU of the gate, then
    multiplied in place), and fc1's output lives until fc2 returns. The attention's inputs die when the
    attention call returns.
    Tiered (`h3director.integrations.comfy_dit`): "h" dies right after the last projection that reads
    it (the fused one, or the last head group's three); no `v.clone()` (the backends priced here do not
    consume containers); grouped attention writes into a buffer made after the first call returns;
    FFN row chunks run norm2 .. fc2 per range of rows, each input dying once the next op has made its
    output, and `addcmul_` into x's rows. After the attention half the modulation table gives way to
    copies of the FFN's three terms; shift and scale die after the last range is modulated (with one
    range, before fc1).
    Quantised linears (`linears`, a `plan.quantised_bytes.BlockLinears`): each call's own transients while
    its output exists; a qkv the tiers cannot slice is projected whole before the head groups, an FFN they
    cannot chunk runs in one range; weights the tiers dequantise or cast once per block half (GGUF, fp8
    `weight_dtype`) live for that half, the stock block makes them per call."""
    calls = linears or BlockLinears()
    md = seq * shape.hidden
    _adaln_table(ledger, shape, e, timesteps)
    _rms_norm(ledger, "h", md, e, e, affine=True, width=shape.hidden)       # then scaled and shifted in place
    heads, part, q_rows, replayed = _head_groups(shape, tier, seq, e)
    held_qkv = calls.qkv is not None and calls.qkv.held_per_block and tier.lifetime
    if held_qkv:
        ledger.alloc("qkv_weight", 3 * shape.inner * shape.hidden * e)
    whole_qkv = calls.qkv is not None and not calls.qkv_sliced and tier.grouped
    if whole_qkv:
        ledger.alloc("qkv_whole", 3 * seq * shape.inner * e)
        _quantised_call(ledger, calls.qkv, seq, shape.hidden, 3 * shape.inner, e, calls.device, held_qkv)
        if tier.lifetime:
            ledger.free("h")
    for first, last in replayed:
        if not whole_qkv:
            ledger.alloc("qkv", 3 * part)
            _quantised_call(ledger, calls.qkv, seq, shape.hidden, 3 * part // (seq * e), e, calls.device, held_qkv)
        if last and tier.lifetime and not whole_qkv:
            ledger.free("h")
        if not tier.lifetime:
            ledger.alloc("v_clone", part)
        _kernel(ledger, attention, heads, q_rows, seq, shape.head_dim, e)
        if tier.grouped:
            if first:
                ledger.alloc("attn_all", seq * shape.inner * e)
            ledger.free("attn")
        if not tier.lifetime:
            ledger.free("v_clone")
        if not whole_qkv:
            ledger.free("qkv")
    if whole_qkv:
        ledger.free("qkv_whole")
    if held_qkv:
        ledger.free("qkv_weight")
    if tier.grouped:
        ledger.rename("attn_all", "attn")
    ledger.alloc("attn_out", md * e)
    ledger.free("attn")
    if sections is not None:
        sections["attention"] = ledger.peak
        ledger.reset_peak()
    ledger.free("attn_out")                             # after addcmul_ into x
    if tier.lifetime:
        # copies of the FFN half's terms (shift and scale, gate), then the table dies
        ledger.alloc("ffn_shift_scale", _adaln_bytes(shape, e, timesteps, 2))
        ledger.alloc("ffn_gate", _adaln_bytes(shape, e, timesteps, 1))
        ledger.free("adaln")
    rows = first_range_rows(seq, tier.ffn_chunks if calls.ffn_chunked else 1) if tier.lifetime else seq
    held_ffn = tier.lifetime and any(c is not None and c.held_per_block for c in (calls.fc1, calls.fc2))
    if held_ffn:
        ledger.alloc("ffn_weights", 3 * shape.ffn * shape.hidden * e)
    _rms_norm(ledger, "h2", rows * shape.hidden, e, e, affine=True, width=shape.hidden)
    if not tier.lifetime:
        ledger.free("h")                                # the stock block rebinds h to norm2's result
    elif rows == seq:
        ledger.free("ffn_shift_scale")                  # dropped after the last range's modulation
    ledger.alloc("fc1", rows * 2 * shape.ffn * e)
    _quantised_call(ledger, calls.fc1, rows, shape.hidden, 2 * shape.ffn, e, calls.device, held_ffn)
    if tier.lifetime:
        ledger.free("h2")
    ledger.alloc("swiglu", rows * shape.ffn * e)
    if tier.lifetime:
        ledger.free("fc1")
    ledger.alloc("ff_out", rows * shape.hidden * e)
    _quantised_call(ledger, calls.fc2, rows, shape.ffn, shape.hidden, e, calls.device, held_ffn)
    ledger.free("swiglu", "ff_out")                     # ff_out after addcmul_ into x
    if held_ffn:
        ledger.free("ffn_weights")
    if not tier.lifetime:
        ledger.free("fc1", "adaln", "h2")
    elif rows < seq:
        ledger.free("ffn_shift_scale", "ffn_gate")
    else:
        ledger.free("ffn_gate")
    if sections is not None:
        sections["ffn"] = ledger.peak


def _dit_block(ledger: _DiTLedger, shape: DiTShape, seq: int, e: int, attention: str, head_chunks: int,
               ffn_chunks: int, sections: dict[str, int] | None = None, *, query_chunks: int = 1,
               lifetime: bool | None = None, framework: str = "diffusers", timesteps: int = 2,
               linears=None) -> None:
    """One block on "x" (held by the caller) -> new "x", for `framework` at the given tier.

    `sections`, when given, receives the peak of the attention half and of the FFN half. `linears`
    (`plan.quantised_bytes.BlockLinears`, ComfyUI only): the block's quantised linears."""
    tier = block_tier(head_chunks, ffn_chunks, query_chunks, lifetime)
    if framework == "comfy":
        _comfy_block(ledger, shape, seq, e, attention, tier, timesteps, sections, linears)
    else:
        _diffusers_block(ledger, shape, seq, e, attention, tier, timesteps, sections)


def _refiner_block(ledger: ByteLedger, shape: DiTShape, seq: int, e: int, attention: str) -> None:
    """One `MiniMaxH3TokenRefinerBlock` on "t" -> new "t" (no modulation, no rotary)."""
    md = seq * shape.hidden
    _rms_norm(ledger, "m", md, e, e, affine=True, width=shape.hidden)
    _attention(ledger, shape, seq, e, attention, BlockTier(), rope=False)
    ledger.free("m")
    ledger.alloc("t1", md * e)
    ledger.free("attn_out")
    _rms_norm(ledger, "m", md, e, e, affine=True, width=shape.hidden)
    _swiglu_ffn(ledger, shape, seq, e)
    ledger.free("m")
    ledger.alloc("t2", md * e)
    ledger.free("ff_out", "t1", "t")
    ledger.rename("t2", "t")


def check_backend(attention: str, head_chunks: int, ffn_chunks: int, shape: DiTShape,
                  framework: str = "diffusers") -> None:
    """Refuse, with InvalidInputError, an `attention` backend or `framework` the cost model does not know,
    `head_chunks` that do not divide `shape.heads`, or `ffn_chunks` < 1; returns None."""
    if attention not in ATTENTION_BACKENDS:
        raise InvalidInputError(f"attention must be one of {ATTENTION_BACKENDS}, got {attention!r}")
    if framework not in FRAMEWORKS:
        raise InvalidInputError(f"framework must be one of {FRAMEWORKS}, got {framework!r}")
    if head_chunks < 1 or shape.heads % head_chunks:
        raise InvalidInputError(f"head_chunks must divide the {shape.heads} heads, got {head_chunks}")
    if ffn_chunks < 1:
        raise InvalidInputError(f"ffn_chunks must be >= 1, got {ffn_chunks}")


def _block_ledger(shape: DiTShape, rows: int, dtype: object, attention: str, framework: str, plan: object | None,
                  head_chunks: int, ffn_chunks: int, query_chunks: int, lifetime: bool | None,
                  fused_norms: bool, timesteps: int, sections: dict[str, int] | None, linears=None) -> int:
    if plan is not None:
        tier = BlockTier.of(plan)
        head_chunks, ffn_chunks, query_chunks, lifetime = (tier.head_chunks, tier.ffn_chunks, tier.query_chunks,
                                                           tier.lifetime)
    check_backend(attention, head_chunks, ffn_chunks, shape, framework)
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
        raise InvalidInputError(f"rows must be an integer >= 1, got {rows!r}")
    if timesteps < 1:
        raise InvalidInputError(f"timesteps must be >= 1, got {timesteps}")
    e = dtype_bytes(dtype)
    ledger = _DiTLedger(fused_norms=fused_norms)
    ledger.alloc("x", rows * shape.hidden * e)
    _dit_block(ledger, shape, rows, e, attention, head_chunks, ffn_chunks, sections, query_chunks=query_chunks,
               lifetime=lifetime, framework=framework, timesteps=timesteps, linears=linears)
    return ledger.peak


def dit_block_peak_bytes(shape: DiTShape, rows: int, dtype: object = "bf16", *, framework: str = "diffusers",
                         plan: object | None = None, head_chunks: int = 1, ffn_chunks: int = 1,
                         query_chunks: int = 1, lifetime: bool | None = None, attention: str = "flash",
                         fused_norms: bool = False, timesteps: int = 2, linears=None) -> int:
    """Peak bytes of one DiT block over a `rows`-row packed sequence, its input residual included.

    `framework`: "diffusers" (`MiniMaxH3TransformerBlock`) or "comfy" (ComfyUI's `DiTBlock`). The tier is
    `plan` (any object with `head_chunks`, `ffn_chunks`, `query_chunks`, `lifetime`: a `DiTMemoryPlan`)
    or the four keywords; `lifetime=None` = the stock block when nothing is chunked. `timesteps`: the
    distinct noise levels in the sequence (rows of the modulation table). Weights are not counted, except
    what quantised linears make while they run: `linears` (`plan.quantised_bytes.BlockLinears`, ComfyUI).
    """
    return _block_ledger(shape, rows, dtype, attention, framework, plan, head_chunks, ffn_chunks, query_chunks,
                         lifetime, fused_norms, timesteps, None, linears)


def dit_block_section_peaks(shape: DiTShape, rows: int, dtype: object = "bf16", *, framework: str = "diffusers",
                            plan: object | None = None, head_chunks: int = 1, ffn_chunks: int = 1,
                            query_chunks: int = 1, lifetime: bool | None = None, attention: str = "flash",
                            fused_norms: bool = False, timesteps: int = 2, linears=None) -> dict[str, int]:
    """Peak bytes of one block's attention half and FFN half ({"attention": ..., "ffn": ...}), input included."""
    sections: dict[str, int] = {}
    _block_ledger(shape, rows, dtype, attention, framework, plan, head_chunks, ffn_chunks, query_chunks,
                  lifetime, fused_norms, timesteps, sections, linears)
    return sections


def attention_call_bytes(shape: DiTShape, seq: int, dtype: object = "bf16", attention: str = "sage") -> int:
    """Bytes live during one attention call over `seq` tokens: q, k, v, the output, and the kernel's own
    buffers (sage: int8 q and k; fused kernels: float32 log-sum-exp; math: scores and probabilities)."""
    e = dtype_bytes(dtype)
    qkv = seq * shape.inner * e
    extra = {"sage": 2 * seq * shape.inner, "math": 2 * shape.heads * seq * seq * e}.get(attention, 0)
    return 4 * qkv + extra + seq * shape.heads * FP32


def dit_forward_peak_bytes(shape: DiTShape, rows: PackedRows, dtype: object = "bf16", *, attention: str = "flash",
                           head_chunks: int = 1, ffn_chunks: int = 1, layers: int | None = None,
                           fused_norms: bool = False) -> int:
    """Peak bytes of one diffusers DiT forward (batch 1) beyond weights and inputs.

    `rows.cond` rows are video-like rows (keyframes, references) packed with the video. The patch
    projections and output heads compute in float32 (the release keeps them float32); the block
    stack in `dtype`. `layers` overrides the block count (calibration runs use small stacks).
    """
    check_backend(attention, head_chunks, ffn_chunks, shape)
    e = dtype_bytes(dtype)
    seq = rows.total
    video_rows = rows.video + rows.cond
    d = shape.hidden
    ledger = _DiTLedger(fused_norms=fused_norms)
    freqs = seq * shape.rotary_dim // 2 * FP32
    ledger.alloc("freqs", freqs)
    ledger.alloc("freqs_cat", freqs)
    ledger.alloc("freqs2", 2 * freqs)
    ledger.free("freqs", "freqs_cat")
    ledger.alloc("cos", 2 * freqs)
    ledger.alloc("sin", 2 * freqs)
    ledger.free("freqs2")
    ledger.alloc("video_embeds", video_rows * d * FP32)
    ledger.alloc("audio_embeds", rows.audio * d * FP32)
    ledger.alloc("t", rows.text * d * e)
    for _ in range(shape.refiner_layers):
        _refiner_block(ledger, shape, rows.text, e, attention)
    _rms_norm(ledger, "text_embeds", rows.text * d, e, e, affine=True)
    ledger.free("t")
    ledger.alloc("x", seq * d * e)                      # new_zeros
    for source, count in (("text_embeds", rows.text), ("video_embeds", video_rows), ("audio_embeds", rows.audio)):
        cast = e != FP32 and source != "text_embeds"
        if cast:
            ledger.alloc("cast", count * d * e)
        ledger.alloc("x_new", seq * d * e)              # index_copy (out of place)
        ledger.free("x")
        ledger.rename("x_new", "x")
        if cast:
            ledger.free("cast")
    ledger.alloc("adaln_indices", seq * INDEX)
    ledger.transient(seq * INDEX)
    blocks = shape.layers if layers is None else layers
    if blocks > 0:
        # Every block starts from the same live tensors; when one block leaves them as it found them
        # (same names, same sizes), the next blocks replay it exactly, so one replay gives their peak.
        before = dict(ledger._held)
        _dit_block(ledger, shape, seq, e, attention, head_chunks, ffn_chunks)
        if ledger._held != before:
            for _ in range(blocks - 1):
                _dit_block(ledger, shape, seq, e, attention, head_chunks, ffn_chunks)
    _rms_norm(ledger, "n", seq * d, e, e, affine=True)
    _modulate(ledger, seq * d, e)
    ledger.alloc("out32", seq * d * FP32)
    ledger.free("m", "x")
    ledger.alloc("video_all", seq * shape.video_patch * FP32)
    ledger.alloc("video_out", video_rows * shape.video_patch * FP32)
    ledger.free("video_all")
    ledger.alloc("audio_all", seq * shape.audio_channels * FP32)
    ledger.alloc("audio_out", rows.audio * shape.audio_channels * FP32)
    ledger.free("audio_all")
    return ledger.peak


@dataclass(frozen=True)
class DiTCostModel:
    """`cost(plan, rows, dtype) -> bytes`: activation bytes one DiT forward over `rows` packed rows needs
    beyond the weights, at the tier `plan` (any object with `DiTMemoryPlan`'s fields), for `framework`.

    = the peak of one block (`dit_block_peak_bytes`, its input residual included) + what the forward
    keeps alive around the block loop: the rotary tables (diffusers: float32 cos and sin; ComfyUI: the
    2x2 rotation table in the compute dtype), the row-to-modulation index (diffusers, int64) and the
    projected embeddings the forward still holds (priced as every row at the compute dtype, float32
    for diffusers' video projection). `fused_norms` (default True: CUDA's fused RMSNorm) prices norms as
    one output each; False prices PyTorch's composite CPU norm. The block part is checked against the real blocks
    (tests/test_plan_dit_tiers.py); the forward part is an upper estimate a capacity check calibrates
    from measured peaks. `heads` is the model's head count (the tiers must divide it).
    """

    shape: DiTShape = DiTShape()
    framework: str = "diffusers"
    attention: str = "flash"
    fused_norms: bool = True
    timesteps: int = 2
    linears: object = None
    """`plan.quantised_bytes.BlockLinears` of the model's quantised linears (ComfyUI), None: unquantised."""

    def __post_init__(self) -> None:
        check_backend(self.attention, 1, 1, self.shape, self.framework)

    @property
    def heads(self) -> int:
        return self.shape.heads

    def forward_extra_bytes(self, rows: int, dtype: object) -> int:
        e = dtype_bytes(dtype)
        s = self.shape
        if self.framework == "comfy":
            return rows * (s.rotary_dim // 2) * 4 * e + rows * s.hidden * e
        return 2 * rows * s.rotary_dim * FP32 + rows * INDEX + rows * s.hidden * FP32

    def __call__(self, plan: object, rows: int, dtype: object) -> int:
        block = dit_block_peak_bytes(self.shape, rows, dtype, framework=self.framework, plan=plan,
                                     attention=self.attention, fused_norms=self.fused_norms,
                                     timesteps=self.timesteps, linears=self.linears)
        return block + self.forward_extra_bytes(rows, dtype)


__all__ = ["QUERY_ALIGN", "BlockTier", "BlockTokenBytes", "DiTCostModel", "DiTShape", "PackedRows",
           "attention_call_bytes", "block_token_bytes", "check_backend", "dit_block_peak_bytes",
           "dit_block_section_peaks", "dit_forward_peak_bytes", "first_range_rows", "replay_math_attention"]
