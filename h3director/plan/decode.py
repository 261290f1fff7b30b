"""Bytes to decode one temporal clip with MiniMax H3's video VAE (ViT decoder), derived from its config.

The estimate replays, allocation by allocation, what diffusers' `AutoencoderKLMiniMaxH3` does when it
decodes one clip (`_decode_clip`: spatial tiles through `MiniMaxH3VideoViTDecoder3d`, then blended
and stitched) on a `ByteLedger`, and returns the ledger's peak: the most tensor bytes live at once
beyond the weights and the input latents, the returned clip included. Every size comes from the
config mapping (`vae.config`); nothing is fitted. `tests/test_plan_calibration.py` checks the
replay against the peak measured on real small configs.

Conventions: `height`/`width` are the decoded frame size in pixels; a clip is
`tokens_chunk_size + token_overlap` (5 + 2 for H3) latent frames; sizes are bytes.
The attention kernel is assumed to be a fused one (flash / memory-efficient / CPU flash): it returns
the output and a float32 log-sum-exp and never materialises the score matrix; pass
`attention="math"` for PyTorch's unfused path.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from h3director.errors import InvalidInputError
from h3director.geometry import H3_TEMPORAL, TemporalGeometry
from h3director.plan.activations import replay_math_attention
from h3director.plan.dtypes import dtype_bytes
from h3director.plan.ledger import Bindings, ByteLedger

FP32 = 4
SINKS = ("tensor", "uint8", "memmap", "video")   # h3director.video sinks, by what they keep in RAM
DEFAULT_TILE = 256          # diffusers `tile_sample_min_height/width`
DEFAULT_TILE_OVERLAP = 64   # diffusers `tile_sample_min_overlap_height/width`


@dataclass(frozen=True)
class ViTDecoderShape:
    """The sizes of H3's ViT decoder that activations depend on, read from the VAE config."""

    latent_channels: int
    out_channels: int
    dim: int
    heads: int
    head_dim: int
    layers: int
    register_tokens: int
    ffn_dim: int
    rotary_dim: int
    spatial_ratio: int
    temporal_ratio: int
    clip_latent_frames: int

    @classmethod
    def from_config(cls, config: Mapping) -> ViTDecoderShape:
        """Read `AutoencoderKLMiniMaxH3`'s config (a mapping; diffusers' `vae.config` works)."""
        try:
            heads = int(config.get("decoder_num_attention_heads", 32))
            head_dim = int(config.get("decoder_attention_head_dim", 64))
            spatial = math.prod(config.get("spatial_downsample_factors", (2, 2, 2, 2, 1, 1)))
            temporal = math.prod(config.get("temporal_downsample_factors", (1, 2, 2, 1, 1, 1)))
            temporal_geometry = TemporalGeometry(clip_length=int(config.get("clip_length", 17)),
                                                 temporal_ratio=int(temporal),
                                                 token_drop=int(config.get("token_drop", 3)))
            dim = heads * head_dim
            return cls(
                latent_channels=int(config.get("latent_channels", 24)),
                out_channels=int(config.get("out_channels", 3)),
                dim=dim,
                heads=heads,
                head_dim=head_dim,
                layers=int(config.get("decoder_num_layers", 36)),
                register_tokens=int(config.get("decoder_num_register_tokens", 4)),
                ffn_dim=int(dim * config.get("decoder_ffn_mult", 4)),
                rotary_dim=int(head_dim * config.get("decoder_rope_dim_ratio", 0.75)),
                spatial_ratio=int(spatial),
                temporal_ratio=int(temporal),
                clip_latent_frames=temporal_geometry.clip_latent_frames,
            )
        except (AttributeError, TypeError, ValueError) as exc:
            raise InvalidInputError(f"not a usable AutoencoderKLMiniMaxH3 config ({exc}): {dict(config)!r}") from exc

    @property
    def patch_values(self) -> int:
        """Pixel values one latent voxel expands to (`proj_out` width): 3 x 4 x 16 x 16 = 3072 for H3."""
        return self.out_channels * self.temporal_ratio * self.spatial_ratio**2


def split_tiles(length: int, tile_size: int, min_overlap: int, step: int) -> tuple[list[int], list[int]]:
    """Tile starts and the overlaps between neighbours over `length` pixels, as diffusers lays them out.

    The fewest `tile_size` tiles that cover `length` with every overlap >= `min_overlap`; the slack is
    added to the overlaps round-robin in `step` (= spatial compression) increments. One tile of the
    whole length when it fits.
    """
    if tile_size >= length:
        return [0], []
    count = math.ceil(length / tile_size)
    while tile_size * count - min_overlap * (count - 1) < length:
        count += 1
    overlaps = [min_overlap] * (count - 1)
    for i in range((tile_size * count - sum(overlaps) - length) // step):
        overlaps[i % (count - 1)] += step
    starts = [0]
    for overlap in overlaps:
        starts.append(starts[-1] + tile_size - overlap)
    return starts, overlaps


def _vit_decoder_forward(ledger: ByteLedger, shape: ViTDecoderShape, batch: int, tokens: int, e: int,
                         attention: str, concatenated_input: bool = False) -> None:
    """Replay one decoder forward on `ledger`; leaves the decoded pixels live as "pixels".

    `concatenated_input`: the latents are a `torch.cat` of several tiles (a temporary that dies once
    `post_quant_conv` has consumed it)."""
    if attention not in ("efficient", "math"):
        raise InvalidInputError(f"attention must be 'efficient' or 'math', got {attention!r}")
    sequence = tokens + shape.register_tokens + 1
    seq = batch * sequence
    d, r = shape.dim, shape.rotary_dim
    if concatenated_input:
        ledger.alloc("tile_latents", batch * tokens * shape.latent_channels * e)
    ledger.alloc("post_quant", batch * tokens * shape.latent_channels * e)
    if concatenated_input:
        ledger.free("tile_latents")
    ledger.alloc("tokens_in", batch * tokens * shape.latent_channels * e)
    ledger.transient(batch * tokens * d * e)          # matmul result before the bias add
    ledger.alloc("proj_in", batch * tokens * d * e)
    ledger.free("tokens_in")
    ledger.alloc("x", seq * d * e)                    # cat with register and zero tokens
    ledger.free("proj_in")
    ledger.alloc("pos_grid", tokens * 3 * FP32)
    ledger.alloc("pos", seq * 3 * FP32)
    ledger.free("pos_grid")
    ledger.transient(seq * 3 * FP32 + seq * r // 2 * FP32)   # scaled positions, angles
    ledger.alloc("cos", seq * r * FP32)
    ledger.alloc("sin", seq * r * FP32)
    # The first block reads the residual in `e`, every later one in float32. From the second block on, a
    # block that leaves the live tensors as it found them repeats its peak, so one replay stands for the rest.
    for layer in range(shape.layers):
        before = dict(ledger._held) if layer == 1 else None
        _vit_block(ledger, shape, batch, sequence, e, e if layer == 0 else FP32, attention)
        if before is not None and ledger._held == before:
            break
    ledger.alloc("norm_out", seq * d * FP32)
    ledger.free("x")
    if e != FP32:
        ledger.alloc("norm_cast", seq * d * e)
        ledger.free("norm_out")
        ledger.rename("norm_cast", "norm_out")
    ledger.alloc("proj_out", seq * shape.patch_values * e)
    ledger.free("norm_out")
    ledger.alloc("pixels", batch * tokens * shape.patch_values * e)   # permute(...).contiguous()
    ledger.free("proj_out", "pos", "cos", "sin", "post_quant")


def _rms_norm(ledger: ByteLedger, name: str, numel: int, e: int, affine: bool, input_bytes: int) -> None:
    """`nn.RMSNorm(x.float()).to(e)` as PyTorch's composite kernel allocates it; leaves `name` live."""
    upcast = input_bytes != FP32
    if upcast:
        ledger.alloc(name + ".upcast", numel * FP32)
    ledger.transient(numel * FP32)                    # x.pow(2) before the mean
    ledger.alloc(name, numel * FP32)                  # x * rsqrt(mean + eps)
    if affine:
        ledger.transient(numel * FP32)                # ... * weight, then the first product dies
    if upcast:
        ledger.free(name + ".upcast")
    if e != FP32:
        ledger.alloc(name + ".cast", numel * e)
        ledger.free(name)
        ledger.rename(name + ".cast", name)


def _vit_block(ledger: ByteLedger, shape: ViTDecoderShape, batch: int, sequence: int, e: int,
               residual_bytes: int, attention: str) -> None:
    """One `MiniMaxH3VideoTransformerBlock`: input residual "x" (held by the caller) -> new "x"."""
    seq = batch * sequence
    md = seq * shape.dim
    rot = seq * shape.heads * shape.rotary_dim       # rotated part of q (or k)
    _rms_norm(ledger, "n1", md, e, affine=True, input_bytes=residual_bytes)
    for name in ("q", "k", "v"):
        ledger.alloc(name, md * e)
    for name in ("q", "k"):                           # norm_q(q.float()).to(dtype); the pre-norm q dies
        _rms_norm(ledger, name + "n", md, e, affine=False, input_bytes=e)
        ledger.free(name)
    if e != FP32:
        ledger.alloc("cos_cast", seq * shape.rotary_dim * e)
        ledger.alloc("sin_cast", seq * shape.rotary_dim * e)
    for name in ("q", "k"):                           # -second half, then cat (rotate-half)
        ledger.transient(rot // 2 * e)
        ledger.alloc(name + "_rotated", rot * e)
    for name in ("q", "k"):                           # x*cos + rotated*sin, cat with the pass-through part
        ledger.alloc(name + "_cos", rot * e)
        ledger.alloc(name + "_sin", rot * e)
        ledger.alloc(name + "_sum", rot * e)
        ledger.free(name + "_cos", name + "_sin")
        ledger.alloc(name + "_roped", md * e)
        ledger.free(name + "_sum")
    if attention == "math":
        replay_math_attention(ledger, batch * shape.heads * sequence * sequence, md * e, e)
    else:
        ledger.alloc("attn", md * e)
        ledger.alloc("lse", seq * shape.heads * FP32)
    ledger.alloc("attn_out", md * e)
    ledger.free(*(n for n in ("attn", "lse") if ledger.holds(n)))
    ledger.free("qn", "kn", "v", "q_rotated", "k_rotated", "q_roped", "k_roped")
    if e != FP32:
        ledger.free("cos_cast", "sin_cast")
    ledger.alloc("attn_scaled", md * FP32)
    ledger.free("attn_out")
    ledger.alloc("x1", md * FP32)
    ledger.free("attn_scaled")
    _rms_norm(ledger, "n2", md, e, affine=True, input_bytes=FP32)
    ledger.free("n1")
    ledger.alloc("ff_proj", seq * 2 * shape.ffn_dim * e)
    ledger.alloc("ff_gate", seq * shape.ffn_dim * e)  # silu(gate)
    ledger.alloc("ff_hidden", seq * shape.ffn_dim * e)
    ledger.free("ff_gate", "ff_proj")
    ledger.alloc("ff_out", md * e)
    ledger.free("ff_hidden")
    ledger.alloc("ff_scaled", md * FP32)
    ledger.free("ff_out")
    ledger.alloc("x2", md * FP32)
    ledger.free("ff_scaled", "n2", "x1", "x")
    ledger.rename("x2", "x")


def decode_clip_working_set_bytes(vae_config: Mapping, height: int, width: int, tiles_per_call: int | None = None,
                                  dtype: object = "float32", *, tile_size: int = DEFAULT_TILE,
                                  tile_overlap: int = DEFAULT_TILE_OVERLAP, tiling: bool = True,
                                  attention: str = "efficient") -> int:
    """Peak bytes to decode ONE temporal clip of H3's video VAE, beyond weights and input latents.
    `InvalidInputError` for `tiles_per_call` < 1 or a size that is not a positive multiple of the spatial
    compression.

    `vae_config`: `AutoencoderKLMiniMaxH3`'s config mapping. `height`, `width`: decoded frame size in
    pixels (multiples of the spatial compression). `dtype`: the decoder's compute dtype
    (`torch.float32`, `torch.bfloat16` or their names). `tiles_per_call`:

    - None: the reference path, diffusers' `_decode_clip`: one tile per decoder call, every decoded
      tile kept until all are blended and concatenated (`tiling=False`: the whole frame in one call);
    - n: streamed tiling, n tiles batched per decoder call, each call's tiles blended into a
      preallocated clip canvas, only the overlap strips kept for the next row/column.

    The result includes the decoded clip `[1, out_channels, clip_frames, height, width]`.
    """
    shape = ViTDecoderShape.from_config(vae_config)
    e = dtype_bytes(dtype)
    ratio = shape.spatial_ratio
    for name, value in (("height", height), ("width", width)):
        if value <= 0 or value % ratio:
            raise InvalidInputError(f"{name} must be a positive multiple of {ratio} pixels, got {value}")
    if tiles_per_call is not None and tiles_per_call < 1:
        raise InvalidInputError(f"tiles_per_call must be None or >= 1, got {tiles_per_call}")
    t = shape.clip_latent_frames
    pixel_frames = t * shape.temporal_ratio
    per_pixel = shape.out_channels * pixel_frames * e
    if not tiling:
        ledger = ByteLedger()
        _vit_decoder_forward(ledger, shape, 1, t * (height // ratio) * (width // ratio), e, attention)
        return ledger.peak
    _, y_overlaps = split_tiles(height, tile_size, tile_overlap, ratio)
    _, x_overlaps = split_tiles(width, tile_size, tile_overlap, ratio)
    tile_h, tile_w = min(tile_size, height), min(tile_size, width)
    tile_tokens = t * (tile_h // ratio) * (tile_w // ratio)
    if tiles_per_call is None:
        return _reference_tiled_peak(shape, e, attention, tile_tokens, tile_h, tile_w, per_pixel,
                                     y_overlaps, x_overlaps, width)
    return _streamed_tiled_peak(shape, e, attention, tile_tokens, tile_h, tile_w, per_pixel,
                                y_overlaps, x_overlaps, height, width, tiles_per_call)


def clip_buffer_bytes(vae_config: Mapping, height: int, width: int, dtype: object = "bf16") -> int:
    """Bytes of the per-clip buffers a streamed decode leases from the slot pool (`video.clip_buffers`), for one
    `height` x `width` clip: the finished clip written into one buffer (`ClipBuffers.cat`: at most one decoder
    call's frames, `clip_latent_frames` x `temporal_ratio`) and the cross-fade tail carried to the next clip
    (`ClipBuffers.copy`: `frame_overlap` frames), both `[1, out_channels, frames, height, width]` in `dtype`.
    This is the part of `decode_clip_working_set_bytes` (which also counts the decoder's activations) that the
    pool serves; the decoder's activations never lease from it."""
    shape = ViTDecoderShape.from_config(vae_config)
    e = dtype_bytes(dtype)
    overlap = TemporalGeometry(clip_length=int(vae_config.get("clip_length", 17)),
                               temporal_ratio=shape.temporal_ratio,
                               token_drop=int(vae_config.get("token_drop", 3))).frame_overlap
    frames = shape.clip_latent_frames * shape.temporal_ratio + overlap
    return shape.out_channels * frames * height * width * e


def _streamed_tiled_peak(shape: ViTDecoderShape, e: int, attention: str, tile_tokens: int, tile_h: int,
                         tile_w: int, per_pixel: int, y_overlaps: list[int], x_overlaps: list[int],
                         height: int, width: int, tiles_per_call: int) -> int:
    """Streamed tiling (`H3VideoAdapter._decode_streamed`): `tiles_per_call` tiles per decoder call,
    each blended with the kept overlap strips of its upper and left neighbours and copied into a
    preallocated clip canvas; only those strips (and the last blended tile) outlive a call."""
    rows, cols = len(y_overlaps) + 1, len(x_overlaps) + 1
    tile_bytes = per_pixel * tile_h * tile_w
    positions = [(i, j) for i in range(rows) for j in range(cols)]
    ledger = ByteLedger()
    names = Bindings(ledger)
    canvas = False
    for first in range(0, len(positions), tiles_per_call):
        group = positions[first:first + tiles_per_call]
        call = f"call{first}"
        _vit_decoder_forward(ledger, shape, len(group), tile_tokens, e, attention, concatenated_input=len(group) > 1)
        ledger.rename("pixels", call)
        names.bind("decoded", call)
        for i, j in group:
            names.bind("tile", call)                    # a view of this call's output
            if i < rows - 1:
                ledger.alloc(f"below{i},{j}", per_pixel * y_overlaps[i] * tile_w)
                names.bind(f"below[{j}]", f"below{i},{j}")
            right = None
            if j < cols - 1:
                right = f"right{i},{j}"
                ledger.alloc(right, per_pixel * tile_h * x_overlaps[j])
            if i > 0:
                blended = _blend(ledger, f"v{i},{j}", per_pixel * tile_w, y_overlaps[i - 1], tile_bytes)
                names.bind("tile", blended)
                names.bind(f"above[{j}]", None)
            if j > 0:
                blended = _blend(ledger, f"h{i},{j}", per_pixel * tile_h, x_overlaps[j - 1], tile_bytes)
                names.bind("tile", blended)
            names.bind("left", None)
            if right:
                names.bind("left", right)
            if not canvas:
                ledger.alloc("canvas", per_pixel * height * width)
                canvas = True
            if j == cols - 1 and i < rows - 1:              # next row: this row's strips move "above"
                for k in range(cols):
                    names.bind(f"above[{k}]", names.vars.get(f"below[{k}]"))
                    names.bind(f"below[{k}]", None)
        names.bind("decoded", None)
    return ledger.peak


def _reference_tiled_peak(shape: ViTDecoderShape, e: int, attention: str, tile_tokens: int, tile_h: int,
                          tile_w: int, per_pixel: int, y_overlaps: list[int], x_overlaps: list[int],
                          width: int) -> int:
    """diffusers' `_decode_clip` + `_stitch_tiles`: all decoded tiles live, then blended row by row."""
    rows, cols = len(y_overlaps) + 1, len(x_overlaps) + 1
    tile_bytes = per_pixel * tile_h * tile_w
    ledger = ByteLedger()
    for index in range(rows * cols):
        _vit_decoder_forward(ledger, shape, 1, tile_tokens, e, attention)
        ledger.rename("pixels", f"tile{index}")
    for i in range(rows):
        for j in range(cols):
            current = None
            if i > 0:
                current = _blend(ledger, f"b{i},{j}v", per_pixel * tile_w, y_overlaps[i - 1], tile_bytes)
            if j > 0:
                blended = _blend(ledger, f"b{i},{j}h", per_pixel * tile_h, x_overlaps[j - 1], tile_bytes)
                if current:
                    ledger.free(current)
                current = blended
        row_h = tile_h - (y_overlaps[i] if i < rows - 1 else 0)
        ledger.alloc(f"row{i}", per_pixel * row_h * width)
        if i > 0:
            ledger.free(*(f"b{i - 1},{j}{k}" for j in range(cols) for k in "vh" if ledger.holds(f"b{i - 1},{j}{k}")))
    height = sum(tile_h - o for o in y_overlaps) + tile_h
    ledger.alloc("clip", per_pixel * height * width)
    return ledger.peak


def _blend(ledger: ByteLedger, name: str, strip_line_bytes: int, extent: int, tile_bytes: int) -> str:
    """diffusers' `_blend`: two weighted strips and their sum, then cat with the rest -> a new full tile."""
    strip = strip_line_bytes * extent
    ledger.alloc(name + ".a", strip)
    ledger.alloc(name + ".b", strip)
    ledger.alloc(name + ".sum", strip)
    ledger.free(name + ".a", name + ".b")
    ledger.alloc(name, tile_bytes)
    ledger.free(name + ".sum")
    return name


def output_host_bytes(sink: str, frames: int, width: int, height: int,
                      clip_frames: int = H3_TEMPORAL.clip_latent_frames * H3_TEMPORAL.temporal_ratio) -> int:
    """Host RAM the decoded video occupies by sink: float32 or uint8 whole video, or about one decoded
    clip (`clip_frames`, 28 for H3) for sinks that write to disk as they go (memmap pages, video
    encoder buffers)."""
    pixels = frames * width * height * 3
    if sink == "tensor":
        return pixels * 4
    if sink == "uint8":
        return pixels
    return clip_frames * width * height * 3 * 4


__all__ = ["SINKS", "ViTDecoderShape", "clip_buffer_bytes", "decode_clip_working_set_bytes",
           "output_host_bytes", "split_tiles"]
