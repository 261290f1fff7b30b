"""Parameter inventories of H3's models, computed from their config fields (no model is built).

An inventory lists every weight matrix (role, rows, cols) and the count of 1-D parameters (norms,
biases, scales), grouped into repeated blocks so that block offload can be priced. The counts follow
the diffusers classes' `__init__` exactly; `tests/test_plan_models.py` compares them with
`sum(p.numel())` of instantiated small configs. Full-size defaults are the classes' own defaults
(the released H3). Convolution kernels count as matrices `out x (in * kernel)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from h3director.plan.activations import DiTShape
from h3director.plan.decode import ViTDecoderShape
from h3director.plan.formats import WeightFormat, role_bits

MODALITIES = 3   # H3's AdaLN table has one row per (timestep, modality): video, text, audio


@dataclass(frozen=True)
class ParamGroup:
    """`repeat` identical copies of a set of matrices `(role, rows, cols)` plus `vectors` 1-D parameters.

    `high_precision`: kept in the checkpoint's float precision whatever the weights format
    (H3's patch projections, timestep MLP and output heads are float32 in the release).
    """

    name: str
    matrices: tuple[tuple[str, int, int], ...]
    vectors: int
    repeat: int = 1
    high_precision: bool = False

    @property
    def params_per_copy(self) -> int:
        return sum(rows * cols for _, rows, cols in self.matrices) + self.vectors

    @property
    def params(self) -> int:
        return self.params_per_copy * self.repeat

    def bytes_per_copy(self, fmt: WeightFormat, float_bytes: int = 2) -> int:
        """Bytes of one copy in `fmt`; high-precision groups and vectors use `float_bytes`/the format's vector size."""
        if self.high_precision:
            return self.params_per_copy * float_bytes
        total = self.vectors * fmt.vector_bytes
        for role, rows, cols in self.matrices:
            total += int(rows * cols * role_bits(fmt, role) / 8) + rows * fmt.row_scale_bytes
        return total


@dataclass(frozen=True)
class ModelInventory:
    """A model's parameters as `ParamGroup`s; `block_group` names the group that offload moves block by block."""

    name: str
    groups: tuple[ParamGroup, ...]
    block_group: str | None = None

    @property
    def params(self) -> int:
        """Total parameter count (what `sum(p.numel() for p in model.parameters())` returns)."""
        return sum(g.params for g in self.groups)

    def weight_bytes(self, fmt: WeightFormat, float_bytes: int = 2) -> int:
        """Bytes of all weights in `fmt` (high-precision groups at `float_bytes` per parameter)."""
        return sum(g.bytes_per_copy(fmt, float_bytes) * g.repeat for g in self.groups)

    def block_bytes(self, fmt: WeightFormat) -> int:
        """Bytes of one repeated block in `fmt` (0 when the model has no block group)."""
        group = self.group(self.block_group) if self.block_group else None
        return group.bytes_per_copy(fmt) if group else 0

    def group(self, name: str) -> ParamGroup:
        return next(g for g in self.groups if g.name == name)


def _linear(role: str, out: int, inp: int) -> tuple[str, int, int]:
    return (role, out, inp)


def dit_inventory(config: Mapping | None = None) -> ModelInventory:
    """`MiniMaxH3Transformer3DModel`'s parameters from its config (defaults: the released 50-block DiT)."""
    c = dict(config or {})
    shape = DiTShape.from_config(c)
    head_dim, d, layers, refiners, ffn = shape.head_dim, shape.hidden, shape.layers, shape.refiner_layers, shape.ffn
    video_in, audio_in, text_dim = shape.video_patch, shape.audio_channels, shape.text_dim
    freq_dim = int(c.get("freq_dim", 256))
    t_hidden = int(c.get("time_embed_hidden_dim", 5376))
    t_dim = int(c.get("time_embed_dim", 2688))
    inner = shape.inner
    attention = (
        _linear("attn_qk", inner, d), _linear("attn_qk", inner, d), _linear("attn_v", inner, d),
        _linear("attn_out", d, inner), _linear("ffn_up", 2 * ffn, d), _linear("ffn_down", d, ffn),
    )
    block_vectors = 2 * d + 2 * head_dim   # norm1, norm2, norm_q, norm_k
    adaln_rows = 6 * d * MODALITIES
    return ModelInventory(
        name="MiniMaxH3Transformer3DModel",
        block_group="blocks",
        groups=(
            ParamGroup("inputs", (_linear("embed", d, video_in), _linear("embed", d, audio_in),
                                  _linear("embed", t_hidden, freq_dim), _linear("embed", t_dim, t_hidden)),
                       vectors=2 * d + t_hidden + t_dim, high_precision=True),
            ParamGroup("context_embedder", (_linear("embed", d, text_dim),), vectors=d),
            ParamGroup("refiner", attention, vectors=block_vectors, repeat=refiners),
            ParamGroup("refiner_norm", (), vectors=d),
            ParamGroup("blocks", attention + (_linear("adaln", adaln_rows, t_dim),),
                       vectors=block_vectors + adaln_rows, repeat=layers),
            ParamGroup("norm_out", (_linear("adaln", 2 * d, t_dim),), vectors=d + 2 * d),
            ParamGroup("heads", (_linear("embed", video_in, d), _linear("embed", audio_in, d)),
                       vectors=video_in + audio_in, high_precision=True),
        ),
    )


def video_vae_inventory(config: Mapping | None = None) -> ModelInventory:
    """`AutoencoderKLMiniMaxH3`'s parameters from its config (defaults: the released VAE)."""
    c = dict(config or {})
    channels = tuple(c.get("block_out_channels", (128, 256, 256, 512, 512, 1024)))
    layers = int(c.get("layers_per_block", 2))
    s_factors = tuple(c.get("spatial_downsample_factors", (2, 2, 2, 2, 1, 1)))
    t_factors = tuple(c.get("temporal_downsample_factors", (1, 2, 2, 1, 1, 1)))
    decoder = ViTDecoderShape.from_config(c)
    latent = decoder.latent_channels
    in_ch = int(c.get("in_channels", 3))
    dim, ffn, dec_layers, registers, patch = (decoder.dim, decoder.ffn_dim, decoder.layers, decoder.register_tokens,
                                              decoder.patch_values)

    enc_m: list[tuple[str, int, int]] = [("conv", channels[0], in_ch * 27)]
    enc_v = channels[0]
    previous = channels[0]
    for i, cout in enumerate(channels):
        for k in range(layers):
            cin = previous if k == 0 else cout
            enc_m += [("conv", cout, cin * 27), ("conv", cout, cout * 27)]
            enc_v += 2 * cin + 2 * cout + 2 * cout    # two group norms, two conv biases
            if cin != cout:
                enc_m.append(("conv", cout, cin))
                enc_v += cout
        if s_factors[i] * t_factors[i] > 1:
            enc_m.append(("conv", cout, cout * 27))
            enc_v += cout
        previous = cout
    enc_m.append(("conv", 2 * latent, channels[-1] * 27))
    enc_v += 2 * channels[-1] + 2 * latent
    block = (("attn_qk", dim, dim), ("attn_qk", dim, dim), ("attn_v", dim, dim), ("attn_out", dim, dim),
             ("ffn_up", 2 * ffn, dim), ("ffn_down", dim, ffn))
    block_vectors = 4 * dim + 2 * ffn + dim + 4 * dim   # 4 attn biases, ff biases, norm1/2 + scale1/2
    return ModelInventory(
        name="AutoencoderKLMiniMaxH3",
        block_group="decoder_blocks",
        groups=(
            ParamGroup("encoder", tuple(enc_m), vectors=enc_v, high_precision=True),
            ParamGroup("latent_convs", (("conv", 2 * latent, 2 * latent), ("conv", latent, latent)),
                       vectors=3 * latent, high_precision=True),
            ParamGroup("decoder_in", (("embed", dim, latent),), vectors=dim + registers * dim),
            ParamGroup("decoder_blocks", block, vectors=block_vectors, repeat=dec_layers),
            ParamGroup("decoder_out", (("embed", patch, dim),), vectors=2 * dim + patch),
        ),
    )


def audio_vae_inventory(config: Mapping | None = None) -> ModelInventory:
    """`AutoencoderKLMiniMaxH3Audio`'s parameters (weight-normed convs count `weight_g` + `weight_v`)."""
    c = dict(config or {})
    d = int(c.get("encoder_dim", 64))
    rates = tuple(int(r) for r in c.get("encoder_rates", (2, 4, 4, 5, 5)))
    latent_dim = int(c.get("latent_dim", 2048))
    lc = int(c.get("latent_channels", 32))
    dec = int(c.get("decoder_dim", 1024))
    dec_rates = tuple(int(r) for r in c.get("decoder_rates", (5, 5, 2, 2, 2, 2, 2)))
    dec_kernels = tuple(int(k) for k in c.get("decoder_kernel_sizes", (9, 9, 4, 4, 4, 4, 4)))
    res_kernels = tuple(int(k) for k in c.get("resblock_kernel_sizes", (3, 7, 11)))
    dilations = tuple(tuple(x) for x in c.get("resblock_dilation_sizes", ((1, 3, 5),) * 3))

    def wn_conv(out: int, inp: int, k: int) -> tuple[tuple, int]:
        """A weight-normed Conv1d: weight_v `out x inp x k`; weight_g and bias, `out` each."""
        return ("conv", out, inp * k), 2 * out

    enc_m, enc_v = [], 0

    def add(item):
        nonlocal enc_v
        enc_m.append(item[0])
        enc_v += item[1]

    add(wn_conv(d, 1, 7))
    for stride in rates:
        d *= 2
        half = d // 2
        for _ in range(3):
            add(wn_conv(half, half, 7))
            add(wn_conv(half, half, 1))
            enc_v += 2 * half                        # two Snake alphas
        enc_v += half
        add(wn_conv(d, half, 2 * stride))
    enc_v += d
    add(wn_conv(latent_dim, d, 3))
    pre_m = (("attn_qk", 3 * latent_dim, latent_dim), ("embed", lc, lc), ("embed", lc, latent_dim),
             ("ffn_up", 2 * lc, lc), ("ffn_up", 2 * lc, lc), ("ffn_down", lc, 2 * lc))
    pre_v = 2 * latent_dim + 2 * latent_dim + lc + lc + 2 * latent_dim + 2 * lc + 2 * lc + 4 * lc + lc
    dec_m, dec_v = [("conv", dec, latent_dim * 7)], 2 * dec
    channels = dec
    for kernel in dec_kernels[:len(dec_rates)]:
        out = channels // 2
        dec_m.append(("conv", out, channels * kernel))   # ConvTranspose1d weight (in, out, k); g has `in` rows
        dec_v += channels + out
        for k, dil in zip(res_kernels, dilations, strict=False):   # diffusers zips the same way
            for _ in range(2 * len(dil)):
                dec_m.append(("conv", out, out * k))
                dec_v += 2 * out + 2 * out              # weight_g + bias, SnakeBeta alpha + beta
        channels = out
    dec_m.append(("conv", 1, channels * 7))
    dec_v += 1 + 2 * channels
    return ModelInventory(
        name="AutoencoderKLMiniMaxH3Audio",
        groups=(
            ParamGroup("encoder", tuple(enc_m), vectors=enc_v, high_precision=True),
            ParamGroup("pre_block", pre_m, vectors=pre_v, high_precision=True),
            ParamGroup("latent_convs", (("conv", lc, lc), ("conv", lc, lc), ("conv", latent_dim, lc)),
                       vectors=2 * lc + latent_dim, high_precision=True),
            ParamGroup("decoder", tuple(dec_m), vectors=dec_v, high_precision=True),
        ),
    )


@dataclass(frozen=True)
class TextEncoderSpec:
    """Qwen3-VL-32B as H3 uses it (text stack truncated to 50 layers, as in ComfyUI's single files).

    Field names follow transformers' `Qwen3VLConfig` (text_config / vision_config). Text: hidden 5120,
    MLP 25600, 64 query heads / 8 key-value heads of 128, vocab 151,936. Vision tower: 27 blocks of
    width 1152 (MLP 4304), 2x2 patch merger to 5120 and one deepstack merger per deepstack layer (3).
    """

    layers: int = 50
    hidden: int = 5120
    intermediate: int = 25600
    heads: int = 64
    kv_heads: int = 8
    head_dim: int = 128
    vocab: int = 151_936
    vision_depth: int = 27
    vision_hidden: int = 1152
    vision_intermediate: int = 4304
    vision_patch_values: int = 3 * 2 * 16 * 16     # channels x temporal patch x patch x patch
    vision_position_embeddings: int = 2304
    vision_merge: int = 4                           # spatial_merge_size ** 2
    deepstack_mergers: int = 3

    @classmethod
    def from_transformers(cls, config, layers: int | None = None) -> TextEncoderSpec:
        """From a transformers `Qwen3VLConfig` (`layers` truncates the text stack)."""
        t, v = config.text_config, config.vision_config
        return cls(layers=layers or t.num_hidden_layers, hidden=t.hidden_size, intermediate=t.intermediate_size,
                   heads=t.num_attention_heads, kv_heads=t.num_key_value_heads, head_dim=t.head_dim,
                   vocab=t.vocab_size, vision_depth=v.depth, vision_hidden=v.hidden_size,
                   vision_intermediate=v.intermediate_size,
                   vision_patch_values=v.in_channels * v.temporal_patch_size * v.patch_size**2,
                   vision_position_embeddings=v.num_position_embeddings, vision_merge=v.spatial_merge_size**2,
                   deepstack_mergers=len(v.deepstack_visual_indexes))


def text_encoder_inventory(spec: TextEncoderSpec | None = None) -> ModelInventory:
    """Qwen3-VL parameters from `TextEncoderSpec` (no LM head: H3 reads hidden states).

    Equals `sum(p.numel())` of transformers' `Qwen3VLModel` for the same config (tested)."""
    s = spec or TextEncoderSpec()
    h = s.hidden
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    layer = (("attn_qk", q, h), ("attn_qk", kv, h), ("attn_v", kv, h), ("attn_out", h, q),
             ("ffn_up", s.intermediate, h), ("ffn_up", s.intermediate, h), ("ffn_down", h, s.intermediate))
    v, mlp = s.vision_hidden, s.vision_intermediate
    merged = v * s.vision_merge
    vision_block = (("attn_qk", 3 * v, v), ("attn_out", v, v), ("ffn_up", mlp, v), ("ffn_down", v, mlp))
    merger = (("embed", merged, merged), ("embed", h, merged))
    return ModelInventory(
        name="Qwen3-VL text encoder",
        block_group="layers",
        groups=(
            ParamGroup("embed_tokens", (("embed", s.vocab, h),), vectors=0),
            ParamGroup("layers", layer, vectors=2 * h + 2 * s.head_dim, repeat=s.layers),
            ParamGroup("norm", (), vectors=h),
            ParamGroup("vision_patch", (("embed", v, s.vision_patch_values),
                                        ("embed", s.vision_position_embeddings, v)), vectors=v),
            ParamGroup("vision_blocks", vision_block, vectors=2 * v + 2 * v + 3 * v + v + mlp + v,
                       repeat=s.vision_depth),
            ParamGroup("merger", merger, vectors=2 * v + merged + h),          # LayerNorm over the patch width
            ParamGroup("deepstack_mergers", merger, vectors=2 * merged + merged + h,   # LayerNorm after merging
                       repeat=s.deepstack_mergers),
        ),
    )


__all__ = ["ModelInventory", "ParamGroup", "TextEncoderSpec", "audio_vae_inventory", "dit_inventory",
           "text_encoder_inventory", "video_vae_inventory"]
