"""Bytes per parameter of the weight formats H3 ships in, derived from each format's storage layout.

GGUF sizes come from the block layouts of `ggml-common.h` (the same numbers `gguf.GGML_QUANT_SIZES`
holds; a test checks them against the `gguf` package):

- Q8_0: blocks of 32 weights = fp16 scale + 32 int8 -> 34 bytes (8.5 bits per weight);
- Q4_K: super-blocks of 256 = fp16 d + fp16 dmin + 12 bytes of 6-bit scales/mins + 128 bytes of nibbles -> 144 bytes (4.5 bpw);
- Q5_K: Q4_K's layout + 32 bytes of high bits -> 176 bytes (5.5 bpw);
- Q6_K: 128 bytes low nibbles + 64 bytes high bits + 16 int8 scales + fp16 d -> 210 bytes (6.5625 bpw).

`Q4_K_M` is a mix: llama.cpp's rule keeps the value projection and the FFN down projection of about
half of the layers at Q6_K and quantizes the rest to Q4_K; 1-D tensors (norms, biases, scales) stay
float32 in every GGUF file. The other formats: int8 and int8_convrot (per-output-channel float32 scale; the
latter rotates its inputs, same bytes), fp8
(per-tensor scale), nf4 (bitsandbytes: 4-bit codes + one float32 absmax per 64 weights), nvfp4
(4-bit codes + one fp8 scale per 16 weights + a per-tensor float32 scale).
"""

from __future__ import annotations

from dataclasses import dataclass

from h3director.errors import InvalidInputError

# GGML block layouts: (weights per block, bytes per block).
GGML_BLOCKS: dict[str, tuple[int, int]] = {
    "Q8_0": (32, 2 + 32),
    "Q4_K": (256, 2 + 2 + 12 + 128),
    "Q5_K": (256, 2 + 2 + 12 + 32 + 128),
    "Q6_K": (256, 128 + 64 + 16 + 2),
}


@dataclass(frozen=True)
class WeightFormat:
    """How a matrix weight is stored: `bits_per_weight` averaged over the matrix, plus per-row extras.

    `row_scale_bytes`: bytes stored per output row (int8's float32 channel scale). Vectors (1-D
    parameters) are stored as `vector_bytes` per element (bf16 checkpoints keep them bf16, GGUF float32).
    """

    name: str
    bits_per_weight: float
    row_scale_bytes: int = 0
    vector_bytes: int = 2
    description: str = ""


def _ggml_bpw(qtype: str) -> float:
    weights, nbytes = GGML_BLOCKS[qtype]
    return nbytes * 8 / weights


FORMATS: dict[str, WeightFormat] = {
    "fp32": WeightFormat("fp32", 32, vector_bytes=4, description="float32"),
    "bf16": WeightFormat("bf16", 16, description="bfloat16 (the released DiT)"),
    "fp16": WeightFormat("fp16", 16, description="float16"),
    "fp8": WeightFormat("fp8", 8, description="float8 e4m3 with a per-tensor scale"),
    "fp8_scaled": WeightFormat("fp8_scaled", 8, description="float8 e4m3 layers with their scales (ComfyUI "
                                                           "comfy_quant float8_e4m3fn: scaled fp8 files)"),
    "int8": WeightFormat("int8", 8, row_scale_bytes=4, description="int8 with a float32 scale per output channel"),
    "int8_convrot": WeightFormat("int8_convrot", 8, row_scale_bytes=4,
                                 description="int8 as int8, inputs Hadamard-rotated (ConvRot) before quantising"),
    "nf4": WeightFormat("nf4", 4 + 32 / 64, description="bitsandbytes NF4, float32 absmax per 64 weights"),
    "nvfp4": WeightFormat("nvfp4", 4 + 8 / 16, description="NVFP4, fp8 scale per 16 weights"),
    "q8_0": WeightFormat("q8_0", _ggml_bpw("Q8_0"), vector_bytes=4, description="GGUF Q8_0"),
    "q6_k": WeightFormat("q6_k", _ggml_bpw("Q6_K"), vector_bytes=4, description="GGUF Q6_K"),
    "q5_k": WeightFormat("q5_k", _ggml_bpw("Q5_K"), vector_bytes=4, description="GGUF Q5_K"),
    "q4_k": WeightFormat("q4_k", _ggml_bpw("Q4_K"), vector_bytes=4, description="GGUF Q4_K"),
    # Q4_K_M: per-matrix bits depend on the tensor's role; `bits_per_weight` is the Q4_K base.
    "q4_k_m": WeightFormat("q4_k_m", _ggml_bpw("Q4_K"), vector_bytes=4,
                           description="GGUF Q4_K_M (Q4_K; fused qkv and FFN-down of half the layers Q6_K)"),
}

ALIASES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float8": "fp8", "fp8_e4m3": "fp8",
           "int8_tensorwise": "int8", "gguf_q8_0": "q8_0", "gguf_q5_k": "q5_k", "gguf_q6_k": "q6_k",
           "gguf_q4_k": "q4_k", "gguf_q4_k_m": "q4_k_m",
           "q5_k_m": "q5_k", "nvfp4_awq": "nvfp4"}

Q6K_BPW = _ggml_bpw("Q6_K")
# The roles Q4_K_M upgrades to Q6_K in half of the layers: llama.cpp's rule upgrades attn_v and ffn_down and
# classes a fused qkv tensor with attn_v; H3's q, k and v are one fused tensor (qkv_proj), so `weights convert`
# writes all three Q6_K in those layers (weights/convert.py), and they are priced so here.
MIXED_ROLES = ("attn_qk", "attn_v", "ffn_down")


def weight_format(name: str) -> WeightFormat:
    """The `WeightFormat` called `name` (case-insensitive; e.g. "int8", "Q4_K_M", "nvfp4").
    `InvalidInputError` naming the known formats for any other."""
    key = name.strip().lower().replace("-", "_")
    key = ALIASES.get(key, key)
    if key not in FORMATS:
        raise InvalidInputError(f"unknown weights format {name!r}: expected one of {', '.join(FORMATS)}")
    return FORMATS[key]


def role_bits(fmt: WeightFormat, role: str) -> float:
    """Average bits per weight of a matrix with `role` in format `fmt` (only Q4_K_M varies by role)."""
    if fmt.name == "q4_k_m" and role in MIXED_ROLES:
        return (fmt.bits_per_weight + Q6K_BPW) / 2
    return fmt.bits_per_weight


__all__ = ["FORMATS", "GGML_BLOCKS", "WeightFormat", "role_bits", "weight_format"]
