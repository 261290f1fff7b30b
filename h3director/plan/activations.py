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
- `head_chunks`: q/k/v are projected and attended `heads / head_chunks` heads at a time into a
  preallocated output (what the published 4-head-chunk measurement did); 1 = diffusers as shipped;
- `ffn_chunks`: the FFN runs over `S / ffn_chunks` rows at a time into a preallocated output.

Chunking is not in diffusers; its ledger follows the design above and is not calibrated here.
Norms follow PyTorch's composite RMSNorm (the input upcast to float32, then cast back), which is
what runs on CPU; fused GPU kernels allocate less, so GPU estimates err on the high side.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from h3director.errors import InvalidInputError
from h3director.plan.dtypes import dtype_bytes
from h3director.plan.ledger import ByteLedger

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


def _rms_norm(ledger: _DiTLedger, name: str, numel: int, e: int, input_bytes: int, affine: bool) -> None:
    """PyTorch's composite `rms_norm` (CPU): upcast to float32, x*rsqrt(mean(x^2)+eps), * weight, cast back.

    With fused norms (CUDA's fused kernel) only the output is allocated."""
    if ledger.fused_norms:
        ledger.alloc(name, numel * input_bytes)
        return
    upcast = input_bytes != FP32
    if upcast:
        ledger.alloc(name + ".up", numel * FP32)
    ledger.transient(numel * FP32)                      # pow(x, 2), dead once averaged
    ledger.alloc(name + ".f32", numel * FP32)
    if affine:
        ledger.alloc(name + ".w32", numel * FP32)
        ledger.free(name + ".f32")
        ledger.rename(name + ".w32", name + ".f32")
    if upcast:
        ledger.alloc(name, numel * input_bytes)
        ledger.free(name + ".f32", name + ".up")
    else:
        ledger.rename(name + ".f32", name)


def replay_math_attention(ledger: ByteLedger, score_elements: int, out_bytes: int, e: int) -> None:
    """PyTorch's unfused SDPA: q and k scaled by sqrt(scale) (copies), scores, their softmax, then the
    output "attn" (left live; the output has q's size, `out_bytes`)."""
    ledger.alloc("q_scaled", out_bytes)
    ledger.alloc("k_scaled", out_bytes)
    ledger.alloc("scores", score_elements * e)
    ledger.free("k_scaled")
    ledger.alloc("probs", score_elements * e)
    ledger.free("scores")
    ledger.alloc("attn", out_bytes)
    ledger.free("probs", "q_scaled")


def _attention(ledger: ByteLedger, shape: DiTShape, seq: int, e: int, attention: str, head_chunks: int,
               rope: bool) -> None:
    """`MiniMaxH3AttnProcessor` on input "m" -> leaves "attn_out" (seq x hidden) live."""
    heads = shape.heads // head_chunks
    part = seq * heads * shape.head_dim               # elements of q (or k, v) for one head group
    rot = seq * heads * shape.rotary_dim
    if head_chunks > 1:
        ledger.alloc("attn_all", seq * shape.inner * e)
    for name in ("q", "k", "v"):
        ledger.alloc(name, part * e)
    for name in ("q", "k"):
        _rms_norm(ledger, name + "n", part, e, e, affine=True)
        ledger.free(name)
        ledger.rename(name + "n", name)
    if rope:
        if e != FP32:
            ledger.alloc("cos_cast", seq * shape.rotary_dim * e)
            ledger.alloc("sin_cast", seq * shape.rotary_dim * e)
        for name in ("q", "k"):
            ledger.transient(rot // 2 * e)              # -x2, then cat -> rotated
            ledger.alloc("rotated", rot * e)
            ledger.alloc("x_cos", rot * e)
            ledger.alloc("r_sin", rot * e)
            ledger.alloc("rot_sum", rot * e)
            ledger.free("x_cos", "r_sin", "rotated")
            ledger.alloc(name + "r", part * e)
            ledger.free("rot_sum", name)
            ledger.rename(name + "r", name)
        if e != FP32:
            ledger.free("cos_cast", "sin_cast")
    if attention == "math":
        replay_math_attention(ledger, heads * seq * seq, part * e, e)
    else:
        if attention == "sage":
            ledger.alloc("q8", part)
            ledger.alloc("k8", part)
        ledger.alloc("attn", part * e)
        ledger.transient(seq * heads * FP32)            # log-sum-exp
        if attention == "sage":
            ledger.free("q8", "k8")
    ledger.free("q", "k", "v")
    if head_chunks > 1:
        ledger.free("attn")                             # copied into its slice of attn_all
        ledger.rename("attn_all", "attn")
    ledger.alloc("attn_out", seq * shape.hidden * e)
    ledger.free("attn")


def _ffn(ledger: ByteLedger, shape: DiTShape, seq: int, e: int, ffn_chunks: int) -> None:
    """SwiGLU FeedForward on "m" -> leaves "ff_out" live; `ffn_chunks` rows-chunks into a preallocated output."""
    rows = -(-seq // ffn_chunks)
    if ffn_chunks > 1:
        ledger.alloc("ff_all", seq * shape.hidden * e)
    ledger.alloc("fc1", rows * 2 * shape.ffn * e)
    ledger.alloc("silu", rows * shape.ffn * e)
    ledger.alloc("swiglu", rows * shape.ffn * e)
    ledger.free("silu", "fc1")
    ledger.alloc("ff_part", rows * shape.hidden * e)
    ledger.free("swiglu")
    if ffn_chunks > 1:
        ledger.free("ff_part")
        ledger.rename("ff_all", "ff_out")
    else:
        ledger.rename("ff_part", "ff_out")


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


def _dit_block(ledger: ByteLedger, shape: DiTShape, seq: int, e: int, attention: str, head_chunks: int,
               ffn_chunks: int, sections: dict[str, int] | None = None) -> None:
    """One `MiniMaxH3TransformerBlock` on "x" (held by the caller) -> new "x".

    `sections`, when given, receives the peak of the attention half and of the FFN half."""
    md = seq * shape.hidden
    _rms_norm(ledger, "n", md, e, e, affine=True)
    _modulate(ledger, md, e)
    _attention(ledger, shape, seq, e, attention, head_chunks, rope=True)
    if sections is not None:
        sections["attention"] = ledger.peak
        ledger.reset_peak()
    _gated_residual(ledger, md, e, "attn_out", "x1")
    ledger.rename("m", "m_attn")                        # lives until norm2's result is bound
    _rms_norm(ledger, "n", md, e, e, affine=True)
    ledger.free("m_attn")
    _modulate(ledger, md, e)
    _ffn(ledger, shape, seq, e, ffn_chunks)
    _gated_residual(ledger, md, e, "ff_out", "x2")
    # `attn_output`, `ff_output` and the modulated input are locals: they die when the block returns
    ledger.free("attn_out", "ff_out", "m", "x1", "x")
    ledger.rename("x2", "x")
    if sections is not None:
        sections["ffn"] = ledger.peak


def _refiner_block(ledger: ByteLedger, shape: DiTShape, seq: int, e: int, attention: str) -> None:
    """One `MiniMaxH3TokenRefinerBlock` on "t" -> new "t" (no modulation, no rotary)."""
    md = seq * shape.hidden
    _rms_norm(ledger, "m", md, e, e, affine=True)
    _attention(ledger, shape, seq, e, attention, 1, rope=False)
    ledger.free("m")
    ledger.alloc("t1", md * e)
    ledger.free("attn_out")
    _rms_norm(ledger, "m", md, e, e, affine=True)
    _ffn(ledger, shape, seq, e, 1)
    ledger.free("m")
    ledger.alloc("t2", md * e)
    ledger.free("ff_out", "t1", "t")
    ledger.rename("t2", "t")


def check_backend(attention: str, head_chunks: int, ffn_chunks: int, shape: DiTShape) -> None:
    if attention not in ATTENTION_BACKENDS:
        raise InvalidInputError(f"attention must be one of {ATTENTION_BACKENDS}, got {attention!r}")
    if head_chunks < 1 or shape.heads % head_chunks:
        raise InvalidInputError(f"head_chunks must divide the {shape.heads} heads, got {head_chunks}")
    if ffn_chunks < 1:
        raise InvalidInputError(f"ffn_chunks must be >= 1, got {ffn_chunks}")


def dit_block_peak_bytes(shape: DiTShape, seq: int, dtype: object = "bf16", *, attention: str = "flash",
                         head_chunks: int = 1, ffn_chunks: int = 1, fused_norms: bool = False) -> int:
    """Peak bytes of one block over a `seq`-row sequence, its input residual included."""
    check_backend(attention, head_chunks, ffn_chunks, shape)
    e = dtype_bytes(dtype)
    ledger = _DiTLedger(fused_norms=fused_norms)
    ledger.alloc("x", seq * shape.hidden * e)
    _dit_block(ledger, shape, seq, e, attention, head_chunks, ffn_chunks)
    return ledger.peak


def dit_block_section_peaks(shape: DiTShape, seq: int, dtype: object = "bf16", *, attention: str = "flash",
                            head_chunks: int = 1, ffn_chunks: int = 1, fused_norms: bool = False) -> dict[str, int]:
    """Peak bytes of one block's attention half and FFN half ({"attention": ..., "ffn": ...}), input included."""
    check_backend(attention, head_chunks, ffn_chunks, shape)
    e = dtype_bytes(dtype)
    ledger = _DiTLedger(fused_norms=fused_norms)
    ledger.alloc("x", seq * shape.hidden * e)
    sections: dict[str, int] = {}
    _dit_block(ledger, shape, seq, e, attention, head_chunks, ffn_chunks, sections)
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
