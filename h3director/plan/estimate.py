"""Per-phase memory estimate of one H3 generation: text encoding, sampling, decode, host RAM.

`estimate(PlanRequest(...))` returns a `PlanEstimate`: the packed-sequence geometry (from
`h3director.geometry`, the one source of truth for frames and tokens) and, per phase, the bytes on
the accelerator (weights resident + working set) and in host RAM (offloaded weights, pinned
buffers, outputs). Every number is derived from the model configs (`models.py`,
`activations.py`, `decode.py`, `audio.py`); see docs/PLANNER.md for the calibration and the
external check against published measurements.

Packed sequence rows (ComfyUI's `PackedLayout`, the reference's order):
text (the prompt's tokens, `text_tokens`), conditioning (each keyframe or reference image is one
latent frame at the target size: `tokens_per_latent_frame` rows), audio (2 rows per audio latent:
stereo, `round(frames / 24 * 40)` latents), video (`latent_frames x tokens_per_latent_frame`).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from h3director import geometry
from h3director.errors import InvalidInputError
from h3director.plan.activations import (
    DiTShape,
    PackedRows,
    check_backend,
    dit_block_peak_bytes,
    dit_forward_peak_bytes,
)
from h3director.plan.audio import audio_decode_working_set_bytes, audio_samples_bytes
from h3director.plan.capabilities import check_target
from h3director.plan.decode import SINKS, decode_clip_working_set_bytes, output_host_bytes
from h3director.plan.dtypes import dtype_bytes
from h3director.plan.formats import weight_format
from h3director.plan.models import (
    ModelInventory,
    TextEncoderSpec,
    audio_vae_inventory,
    dit_inventory,
    text_encoder_inventory,
    video_vae_inventory,
)
from h3director.plan.quantised_tiers import format_tiers, kernel_paths

DEFAULT_TEXT_TOKENS = 512
TEXT_ENCODER_VISION_TOKENS_PER_IMAGE = 1024   # a ~1 MP reference image after the 2x2 merger

# What the planner accepts (`PlanRequest.validate`); the longest legal length is 86,399 frames.
MAX_FRAMES = 86_400           # one hour at 24 fps
MAX_SIDE = 4096               # pixels per side (a multiple of 32)
DEVICES = ("cuda", "mps", "cpu")
MAX_DIT_LAYERS = 100          # DiT blocks (the release has 50; the published pruned files about 30)
# The release ships the DiT's patch projections, timestep MLP and output heads in float32 and diffusers keeps
# them so (`_keep_in_fp32_modules`) whatever the weights format: 32.8 MiB more than bf16 for the released DiT.
DIT_HIGH_PRECISION_BYTES = 4


@dataclass(frozen=True)
class PlanRequest:
    """What the user wants to run, and the settings to price. Sizes in pixels, counts in frames.

    `weights`: DiT weight format (see `formats.FORMATS`); `offload_blocks`: DiT blocks kept in host RAM
    and streamed in one at a time; `text_encoder_device`: "gpu" (loaded, used, unloaded before
    sampling) or "cpu"; `decode_tiles_per_call`: None = the reference tiled path, n = streamed tiling;
    `keep_dit_during_decode`: the DiT stays on the accelerator while decoding (what runs out of memory
    in ComfyUI issue #15453). `fused_norms`: RMSNorm runs as one fused kernel (CUDA); False prices
    PyTorch's composite CPU kernel. `frames` must be on the 17n+5 grid. `audio_rows`: H3 samples its audio
    rows (True, the default); False prices a video-only draft (`H3DirectorVideoOnlyLatent`: no audio rows in
    the packed sequence, so `audio` must be False too). `target` ("comfyui" or "diffusers"), `device` ("cuda",
    "mps" or "cpu") and `compute_capability` ((major, minor) of a CUDA device, None: unknown) decide how a
    quantised format's linears run and what their calls make (`plan.quantised_tiers`).
    """

    width: int
    height: int
    frames: int
    weights: str = "bf16"
    text_encoder_weights: str = "bf16"
    text_encoder_device: str = "gpu"
    refs: int = 0
    keyframes: int = 0
    text_tokens: int = DEFAULT_TEXT_TOKENS
    audio: bool = True                  # decode audio (the audio VAE is loaded)
    audio_rows: bool = True             # the packed sequence carries audio rows (False: a video-only draft)
    attention: str = "flash"
    head_chunks: int = 1
    ffn_chunks: int = 1
    offload_blocks: int = 0
    compute_dtype: str = "bf16"
    vae_dtype: str = "bf16"
    decode_tiles_per_call: int | None = 1
    sink: str = "uint8"
    keep_dit_during_decode: bool = False
    fused_norms: bool = True
    target: str = "comfyui"
    device: str = "cuda"
    compute_capability: tuple[int, int] | None = None
    dit_config: Mapping | None = None
    vae_config: Mapping | None = None
    audio_config: Mapping | None = None

    def validate(self) -> None:
        """Refuse bad input before any estimate: canvas (each side a multiple of 32 up to `MAX_SIDE`),
        frame grid (17n+5, 5 to `MAX_FRAMES`), DiT blocks (1 to `MAX_DIT_LAYERS`), settings."""
        geometry.check_canvas(self.width, self.height)
        for name in ("width", "height"):
            if getattr(self, name) > MAX_SIDE:
                raise InvalidInputError(f"{name} {getattr(self, name)} is above the planner's {MAX_SIDE} pixels")
        if self.frames > MAX_FRAMES:
            raise InvalidInputError(f"frames {self.frames:,} is above the planner's {MAX_FRAMES:,} (one hour at "
                                    f"{geometry.VIDEO_FPS} fps); the longest legal count is "
                                    f"{geometry.nearest_grid_frames(MAX_FRAMES)[0]:,}")
        if self.frames < 5:
            raise InvalidInputError(f"frames must be >= 5 (H3's shortest 17n+5 length), got {self.frames}")
        if not geometry.is_on_grid(self.frames):
            low, high = geometry.nearest_grid_frames(self.frames)
            raise InvalidInputError(
                f"frames {self.frames} is off H3's 17n+5 grid: the nearest legal counts are {low} and {high}"
                if low != high else f"frames {self.frames} is off H3's 17n+5 grid: use {high}")
        for name in ("refs", "keyframes", "text_tokens", "offload_blocks"):
            if getattr(self, name) < 0:
                raise InvalidInputError(f"{name} must be >= 0, got {getattr(self, name)}")
        blocks = DiTShape.from_config(self.dit_config).layers
        if not 1 <= blocks <= MAX_DIT_LAYERS:
            raise InvalidInputError(f"the DiT must have 1 to {MAX_DIT_LAYERS} blocks (num_layers), got {blocks}")
        if self.offload_blocks > blocks:
            raise InvalidInputError(f"offload_blocks must be <= the DiT's {blocks} blocks, got {self.offload_blocks}")
        if self.sink not in SINKS:
            raise InvalidInputError(f"sink must be one of {SINKS}, got {self.sink!r}")
        if self.audio and not self.audio_rows:
            raise InvalidInputError("a video-only request (audio_rows=False) has no audio to decode: set audio=False")
        if self.text_encoder_device not in ("gpu", "cpu"):
            raise InvalidInputError(f"text_encoder_device must be 'gpu' or 'cpu', got {self.text_encoder_device!r}")
        weight_format(self.weights)
        weight_format(self.text_encoder_weights)
        check_target(self.target)
        if self.device not in DEVICES:
            raise InvalidInputError(f"device must be one of {DEVICES}, got {self.device!r}")
        cc = self.compute_capability
        if cc is not None and (not isinstance(cc, tuple) or len(cc) != 2
                               or not all(type(v) is int and 0 <= v < 100 for v in cc)):
            raise InvalidInputError(f"compute_capability must be a tuple (major, minor), e.g. (8, 9), got {cc!r}")
        dtype_bytes(self.compute_dtype)
        dtype_bytes(self.vae_dtype)
        check_backend(self.attention, self.head_chunks, self.ffn_chunks, DiTShape.from_config(self.dit_config))
        if self.decode_tiles_per_call is not None and self.decode_tiles_per_call < 1:
            raise InvalidInputError(f"decode_tiles_per_call must be None or >= 1, got {self.decode_tiles_per_call}")


@dataclass(frozen=True)
class Geometry:
    """Frames -> latent frames -> packed rows for one request."""

    frames: int
    latent_frames: int
    tokens_per_latent_frame: int
    video_tokens: int
    audio_latents: int
    audio_rows: int
    text_rows: int
    cond_rows: int
    packed_tokens: int

    @property
    def rows(self) -> PackedRows:
        return PackedRows(self.text_rows, self.cond_rows, self.audio_rows, self.video_tokens)


def packed_geometry(width: int, height: int, frames: int, *, text_tokens: int = DEFAULT_TEXT_TOKENS,
                    refs: int = 0, keyframes: int = 0, audio: bool = True) -> Geometry:
    """Rows of the packed sequence (see the module docstring); 124 frames at 1344x768 -> 37 x 1008 video rows."""
    per_frame = geometry.tokens_per_latent_frame(width, height)
    latent = geometry.latent_frames_for(frames)
    audio_latents = geometry.audio_latent_frames_for(frames) if audio else 0
    cond = (refs + keyframes) * per_frame
    video = latent * per_frame
    return Geometry(frames=frames, latent_frames=latent, tokens_per_latent_frame=per_frame, video_tokens=video,
                    audio_latents=audio_latents, audio_rows=2 * audio_latents, text_rows=text_tokens,
                    cond_rows=cond, packed_tokens=text_tokens + cond + 2 * audio_latents + video)


@dataclass(frozen=True)
class Phase:
    """One phase's bytes: on the accelerator (`weights_bytes` resident + `working_bytes`) and in host RAM."""

    name: str
    weights_bytes: int
    working_bytes: int
    host_bytes: int
    detail: str = ""

    @property
    def device_bytes(self) -> int:
        return self.weights_bytes + self.working_bytes


@dataclass(frozen=True)
class PlanEstimate:
    """The estimate: geometry, phases, and the notes (warnings) that go with them."""

    request: PlanRequest
    geometry: Geometry
    phases: tuple[Phase, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def peak_device_bytes(self) -> int:
        return max(p.device_bytes for p in self.phases)

    @property
    def peak_host_bytes(self) -> int:
        return max(p.host_bytes for p in self.phases)

    @property
    def largest_working_bytes(self) -> int:
        return max(p.working_bytes for p in self.phases)

    def to_dict(self) -> dict:
        request = {k: v for k, v in asdict(self.request).items() if not k.endswith("_config")}
        return {
            "request": request,
            "geometry": asdict(self.geometry),
            "phases": [dict(asdict(p), device_bytes=p.device_bytes) for p in self.phases],
            "peak_device_bytes": self.peak_device_bytes,
            "peak_host_bytes": self.peak_host_bytes,
            "notes": list(self.notes),
        }

    def summary_table(self) -> str:
        """The per-phase table as text (GiB)."""
        lines = [f"{'phase':<14}{'weights':>10}{'working':>10}{'device':>10}{'host RAM':>10}  detail"]
        for p in self.phases:
            lines.append(f"{p.name:<14}{_gib(p.weights_bytes):>10}{_gib(p.working_bytes):>10}"
                         f"{_gib(p.device_bytes):>10}{_gib(p.host_bytes):>10}  {p.detail}")
        return "\n".join(lines)


def _gib(n: int) -> str:
    return f"{n / 1024**3:.2f}G"


def text_encoder_activation_bytes(tokens: int, dtype: object = "bf16") -> int:
    """Peak activation of a Qwen3-VL text-stack forward over `tokens` tokens (residual, normed input,
    the SwiGLU MLP's gate/up/product, and one layer's Q/K/V), no KV cache: not calibrated here."""
    spec = TextEncoderSpec()
    e = dtype_bytes(dtype)
    per_token = (3 * spec.hidden + 4 * spec.intermediate + (spec.heads + 2 * spec.kv_heads) * spec.head_dim) * e
    return tokens * per_token


def _quantised_notes(request: PlanRequest, extra: int, path: str | None) -> tuple[str, ...]:
    """What the plan says about a quantised format's linears: their layout, kernel path and what their calls
    add to sampling, the layers the tiers keep whole, and a path priced without knowing the device's."""
    if path is None:
        return ()
    fmt = weight_format(request.weights).name
    tiers = format_tiers(fmt, request.target, path)
    notes = [f"DiT {fmt} linears: {tiers.layout} ({path}); their calls add {extra / 2**20:,.0f} MiB to sampling"]
    notes += list(tiers.kept)
    if len(kernel_paths(fmt, request.target, request.device, request.compute_capability)) > 1:
        notes.append(f"{tiers.layout}: priced on its {path} path, the larger; the device's compute capability is "
                     "not known (plan --device auto reads it)")
    return tuple(notes)


def int32_qkv_token_limit(shape: DiTShape) -> int:
    """Tokens beyond which a fused QKV buffer has more than 2**31 elements (99,864 for H3)."""
    return 2**31 // (3 * shape.inner)


def model_config_key(config: Mapping | None) -> str:
    """A model config (mapping, or None for the default) as a canonical JSON string (sorted keys,
    sequences as lists): the key of the per-config inventory and weight-bytes caches."""
    return json.dumps(dict(config or {}), sort_keys=True, default=list)


_INVENTORIES = {"dit": dit_inventory, "video_vae": video_vae_inventory, "audio_vae": audio_vae_inventory,
                "text_encoder": lambda _config: text_encoder_inventory()}


@functools.lru_cache(maxsize=64)
def _inventory(model: str, config_key: str) -> ModelInventory:
    """A model's parameter inventory, built once per config (the recommender prices many settings)."""
    return _INVENTORIES[model](json.loads(config_key))


@functools.lru_cache(maxsize=512)
def _weight_bytes(model: str, config_key: str, fmt: str, float_bytes: int = 2, block: bool = False) -> int:
    """Bytes of a model's weights (`block`: of one repeated block) in format `fmt`, cached per config."""
    inventory = _inventory(model, config_key)
    if block:
        return inventory.block_bytes(weight_format(fmt))
    return inventory.weight_bytes(weight_format(fmt), float_bytes=float_bytes)


@functools.lru_cache(maxsize=512)
def clip_working_set(config_key: str, height: int, width: int, tiles: int | None, dtype: str) -> int:
    """Bytes one decode call's working set needs for a `height` x `width` clip (cached per config key)."""
    return decode_clip_working_set_bytes(json.loads(config_key), height, width, tiles, dtype)


@functools.lru_cache(maxsize=512)
def audio_working_set(config_key: str, latents: int) -> int:
    """Bytes the audio decode's working set needs for `latents` audio latent frames (cached per config key)."""
    return audio_decode_working_set_bytes(json.loads(config_key), latents)


@functools.lru_cache(maxsize=2048)
def _sampling_working_set(config_key: str, rows: PackedRows, dtype: str, attention: str, heads: int, ffn: int,
                          fused_norms: bool) -> int:
    shape = DiTShape.from_config(json.loads(config_key))
    return dit_forward_peak_bytes(shape, rows, dtype, attention=attention, head_chunks=heads, ffn_chunks=ffn,
                                  fused_norms=fused_norms)


@functools.lru_cache(maxsize=2048)
def quantised_calls_bytes(config_key: str, rows: int, dtype: str, attention: str, heads: int, ffn: int,
                           fused_norms: bool, fmt: str, target: str, device: str,
                           compute_capability: tuple[int, int] | None) -> tuple[int, str | None]:
    """(bytes, path) the DiT's quantised linear calls add to a block's peak at this tier (0, None when the format
    is not quantised): ComfyUI's block ledger with the format's calls (`plan.quantised_tiers`) less without
    them, on the kernel path that costs more when the device does not decide it. `config_key`:
    `model_config_key` of the DiT config; `rows`: packed rows; `fmt`: a `formats.FORMATS` id; the rest as
    `PlanRequest`'s fields (cached: the recommender prices many settings)."""
    fmt = weight_format(fmt).name
    e = dtype_bytes(dtype)
    formats = [format_tiers(fmt, target, path, e) for path in kernel_paths(fmt, target, device, compute_capability)]
    if formats[0].call is None:
        return 0, None
    shape = DiTShape.from_config(json.loads(config_key))

    def block(linears) -> int:
        return dit_block_peak_bytes(shape, rows, dtype, framework="comfy", head_chunks=heads, ffn_chunks=ffn,
                                    attention=attention, fused_norms=fused_norms, linears=linears)

    plain = block(None)
    extra, path = max((block(tiers.block_linears(device)) - plain, tiers.path) for tiers in formats)
    return max(extra, 0), path


def estimate(request: PlanRequest) -> PlanEstimate:
    """The `PlanEstimate` (bytes per phase, device and host) for `request`, which is validated first:
    `InvalidInputError` for a size, frame count or setting out of range (see the module docstring)."""
    request.validate()
    # H3 samples its audio rows whether or not the audio is decoded (ComfyUI's empty AV latent always
    # carries them), so `request.audio` only decides the audio VAE and its output; only a video-only draft
    # (`audio_rows` False) drops them.
    geo = packed_geometry(request.width, request.height, request.frames, text_tokens=request.text_tokens,
                          refs=request.refs, keyframes=request.keyframes, audio=request.audio_rows)
    dit_key = model_config_key(request.dit_config)
    dit_bytes = _weight_bytes("dit", dit_key, request.weights, DIT_HIGH_PRECISION_BYTES)
    block_bytes = _weight_bytes("dit", dit_key, request.weights, block=True)
    offloaded = request.offload_blocks * block_bytes
    # Streaming offloaded blocks needs two block buffers on the device (one computing, one arriving).
    stream_buffers = min(request.offload_blocks, 2) * block_bytes
    dit_resident = dit_bytes - offloaded + stream_buffers

    te_bytes = _weight_bytes("text_encoder", "{}", request.text_encoder_weights)
    te_tokens = request.text_tokens + request.refs * TEXT_ENCODER_VISION_TOKENS_PER_IMAGE
    te_act = text_encoder_activation_bytes(te_tokens, request.compute_dtype)

    vae_float = dtype_bytes(request.vae_dtype)
    vae_key = model_config_key(request.vae_config)
    vae_decoder_bytes = _weight_bytes("video_vae", vae_key, "bf16" if vae_float == 2 else "fp32", vae_float) \
        - _inventory("video_vae", vae_key).group("encoder").params * vae_float
    clip_ws = clip_working_set(vae_key, request.height, request.width,
                                request.decode_tiles_per_call, request.vae_dtype)
    audio_key = model_config_key(request.audio_config)
    audio_weights = 2 * _weight_bytes("audio_vae", audio_key, "fp32", 4) if request.audio else 0
    audio_ws = audio_working_set(audio_key, geo.audio_latents) if request.audio else 0
    sampling_ws = _sampling_working_set(dit_key, geo.rows, request.compute_dtype,
                                        request.attention, request.head_chunks, request.ffn_chunks,
                                        request.fused_norms)
    quantised, path = quantised_calls_bytes(dit_key, geo.packed_tokens, request.compute_dtype, request.attention,
                                             request.head_chunks, request.ffn_chunks, request.fused_norms,
                                             request.weights, request.target, request.device,
                                             request.compute_capability)
    sampling_ws += quantised
    latent_pixels = (request.height // geometry.SPATIAL_RATIO) * (request.width // geometry.SPATIAL_RATIO)
    latents = 4 * (geo.latent_frames * geometry.VIDEO_LATENT_CHANNELS * latent_pixels
                   + 2 * geometry.AUDIO_LATENT_CHANNELS * geo.audio_latents)   # float32, stereo audio
    sampling_ws += 3 * latents                          # latents, velocity, scheduler step

    video_out = output_host_bytes(request.sink, request.frames, request.width, request.height)
    audio_out = audio_samples_bytes(geo.audio_latents) if request.audio else 0
    te_on_cpu = request.text_encoder_device == "cpu"
    phases = (
        Phase("text_encoding", 0 if te_on_cpu else te_bytes, 0 if te_on_cpu else te_act,
              te_bytes + te_act if te_on_cpu else 0,   # the DiT is loaded after the encoder is dropped
              f"Qwen3-VL {request.text_encoder_weights} on {request.text_encoder_device}, {te_tokens} tokens"),
        Phase("sampling", dit_resident, sampling_ws, offloaded + latents,
              f"DiT {request.weights}, {geo.packed_tokens:,} tokens, {request.attention} attention, "
              f"{request.head_chunks} head / {request.ffn_chunks} FFN chunks, {request.offload_blocks} blocks offloaded"),
        Phase("decode", vae_decoder_bytes + audio_weights + (dit_resident if request.keep_dit_during_decode else 0),
              max(clip_ws, audio_ws) + latents,
              offloaded + video_out + audio_out,
              f"video VAE {request.vae_dtype}, "
              + ("reference tiling" if request.decode_tiles_per_call is None else
                 f"{request.decode_tiles_per_call} tile(s)/call") + f", sink {request.sink}"
              + (", audio VAE fp32" if request.audio else ", no audio decode (audio VAE not loaded)")),
    )
    notes = list(_quantised_notes(request, quantised, path))
    int32_limit = int32_qkv_token_limit(DiTShape.from_config(request.dit_config))
    if geo.packed_tokens > int32_limit:
        notes.append(f"{geo.packed_tokens:,} packed tokens exceed {int32_limit:,}: fused QKV element "
                     "offsets overflow int32 in kernels that index with 32-bit ints; use head chunking")
    if request.attention == "math":
        notes.append("math attention materialises heads x S x S scores; a fused kernel needs none of it")
    return PlanEstimate(request=request, geometry=geo, phases=phases, notes=tuple(notes))


__all__ = ["DEFAULT_TEXT_TOKENS", "DIT_HIGH_PRECISION_BYTES", "MAX_FRAMES", "Geometry", "Phase",
           "PlanEstimate", "PlanRequest", "audio_working_set", "clip_working_set", "estimate",
           "int32_qkv_token_limit", "model_config_key", "packed_geometry", "quantised_calls_bytes"]
