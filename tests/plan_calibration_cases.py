"""Calibration cases: small configs of the REAL diffusers H3 classes, measured on the CPU.

Each case builds a random-initialised model, runs one forward under `LiveBytesTracker` (peak of
live tensor bytes beyond weights and inputs) and returns `(measured, predicted)`; the prediction
comes from `h3director.plan` with nothing fitted. They are not held out: two of them were run while the
byte model was written and one changed it (docs/PLANNER.md says which). Shared by `tests/test_plan_calibration.py` (asserts the error) and
`bench/planner_calibration.py` (prints the table for docs/PLANNER.md).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch

from h3director.plan.live_bytes import LiveBytesTracker


@dataclass(frozen=True)
class Case:
    name: str
    run: Callable[[], tuple[int, int]]


def _small_video_vae(layers: int, heads: int, head_dim: int, ratio4: bool, dtype: torch.dtype, ffn_mult: int = 3):
    from diffusers import AutoencoderKLMiniMaxH3

    spatial = (2, 2) if ratio4 else (2, 2, 2, 2)
    temporal = (2, 2) if ratio4 else (1, 2, 2, 1)
    vae = AutoencoderKLMiniMaxH3(block_out_channels=(8,) * len(spatial), layers_per_block=1,
                                 spatial_downsample_factors=spatial, temporal_downsample_factors=temporal,
                                 norm_num_groups=4, decoder_num_layers=layers, decoder_num_attention_heads=heads,
                                 decoder_attention_head_dim=head_dim, decoder_ffn_mult=ffn_mult).eval()
    vae.decoder.to(dtype)
    vae.post_quant_conv.to(dtype)
    for block in vae.decoder.transformer_blocks:     # what `_keep_in_fp32_modules` keeps in float32
        for module in (block.norm1, block.norm2):
            module.float()
        block.scale1.data = block.scale1.data.float()
        block.scale2.data = block.scale2.data.float()
    vae.decoder.norm_out.float()
    if ratio4:
        vae.enable_tiling(64, 64, 16, 16)
    return vae


def video_vae_case(layers, heads, head_dim, ratio4, height, width, dtype, tiles_per_call, ffn_mult=3):
    def run() -> tuple[int, int]:
        from h3director.plan.decode import decode_clip_working_set_bytes

        vae = _small_video_vae(layers, heads, head_dim, ratio4, dtype, ffn_mult)
        ratio = vae.spatial_compression_ratio
        z = torch.randn(1, 24, 12, height // ratio, width // ratio, dtype=dtype)
        tile = dict(tile_size=vae.tile_sample_min_height, tile_overlap=vae.tile_sample_min_overlap_height)
        if tiles_per_call is None:
            clip = z[:, :, :7]
            with torch.no_grad(), LiveBytesTracker() as tracker:
                vae._decode_clip(clip)
        else:
            from h3director.integrations.diffusers_h3 import H3VideoAdapter
            from h3director.video.decoder import ClipExecution

            adapter = H3VideoAdapter(vae)
            session = adapter.open(z, denormalize=False)
            step = adapter.schedule(z.shape[2]).clips[0]
            with torch.no_grad(), LiveBytesTracker() as tracker:
                session.decode_clip(step, ClipExecution(tiles_per_call=tiles_per_call))
        predicted = decode_clip_working_set_bytes(vae.config, height, width, tiles_per_call, dtype, **tile)
        return tracker.peak_bytes, predicted

    return run


def dit_case(config: dict, text: int, audio: int, video: int, dtype: torch.dtype, attention: str = "flash"):
    def run() -> tuple[int, int]:
        from diffusers import MiniMaxH3Transformer3DModel
        from torch.nn.attention import SDPBackend, sdpa_kernel

        from h3director.plan.activations import DiTShape, PackedRows, dit_forward_peak_bytes

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = MiniMaxH3Transformer3DModel(**config).eval().to(dtype)
        for name in ("proj_in", "audio_proj_in", "time_embedder", "proj_out", "audio_proj_out"):
            getattr(model, name).float()                 # the release keeps these float32
        seq = text + audio + video
        c = model.config
        tags = torch.cat([torch.ones(text), 2 * torch.ones(audio), torch.zeros(video)]).long()
        inputs = dict(
            hidden_states=torch.randn(1, video, c.in_channels * 4), audio_hidden_states=torch.randn(1, audio, 32),
            encoder_hidden_states=torch.randn(1, text, c.text_dim, dtype=dtype), timestep=torch.tensor([0.3, 0.7]),
            timestep_indices=(torch.arange(seq) % 2), token_tags=tags, position_ids=torch.randn(seq, 3),
            video_indices=torch.arange(text + audio, seq), audio_indices=torch.arange(text, text + audio),
            text_indices=torch.arange(text))
        backend = SDPBackend.MATH if attention == "math" else SDPBackend.FLASH_ATTENTION
        with torch.no_grad(), sdpa_kernel(backend), LiveBytesTracker() as tracker:
            model(**inputs)
        predicted = dit_forward_peak_bytes(DiTShape.from_config(c), PackedRows(text, 0, audio, video), dtype,
                                           attention=attention)
        return tracker.peak_bytes, predicted

    return run


def audio_case(config: dict, latents: int):
    def run() -> tuple[int, int]:
        from diffusers import AutoencoderKLMiniMaxH3Audio

        from h3director.plan.audio import audio_decode_working_set_bytes

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = AutoencoderKLMiniMaxH3Audio(**config).eval()
        z = torch.randn(2, config["latent_channels"], latents)
        with torch.no_grad(), LiveBytesTracker() as tracker:
            model.decode(z)                              # first call materialises the weight-norm weights
            start = tracker.live_bytes
            tracker.reset_peak()
            model.decode(z)
        return tracker.peak_bytes - start, audio_decode_working_set_bytes(model.config, latents)

    return run


DIT_A = dict(num_attention_heads=6, attention_head_dim=16, hidden_size=80, num_layers=2, num_refiner_layers=1,
             ffn_dim=224, text_dim=48, freq_dim=32, time_embed_hidden_dim=48, time_embed_dim=40, rope_freq_dim=2)
DIT_B = dict(num_attention_heads=3, attention_head_dim=32, hidden_size=64, num_layers=3, num_refiner_layers=2,
             ffn_dim=160, text_dim=24, freq_dim=16, time_embed_hidden_dim=32, time_embed_dim=16, rope_freq_dim=4)
AUDIO_A = dict(encoder_dim=4, latent_dim=48, latent_channels=8, num_attention_heads=2, decoder_dim=48,
               decoder_rates=(10, 8, 10), decoder_kernel_sizes=(20, 16, 20), resblock_kernel_sizes=(3, 5),
               resblock_dilation_sizes=((1, 2), (1, 3)))
AUDIO_B = dict(encoder_dim=4, latent_dim=32, latent_channels=8, num_attention_heads=1, decoder_dim=32,
               decoder_rates=(5, 5, 4, 8), decoder_kernel_sizes=(10, 10, 8, 16), resblock_kernel_sizes=(3, 7),
               resblock_dilation_sizes=((1, 3, 5), (1, 3)))

CASES = (
    Case("video VAE, released decoder width (32x64 heads, FFN x4), 1 layer, one 256 px tile, fp32",
         video_vae_case(1, 32, 64, False, 256, 256, torch.float32, None, ffn_mult=4)),
    Case("video VAE 16x/4x, ref tiling, fp32, 384x256", video_vae_case(1, 3, 16, False, 256, 384, torch.float32, None)),
    Case("video VAE 4x/4x, ref tiling, bf16, 64x112", video_vae_case(2, 4, 24, True, 64, 112, torch.bfloat16, None)),
    Case("video VAE 4x/4x, untiled-size, fp32, 64x64", video_vae_case(1, 6, 16, True, 64, 64, torch.float32, None)),
    Case("video VAE 4x/4x, streamed 1 tile, fp32, 112x144",
         video_vae_case(1, 4, 24, True, 112, 144, torch.float32, 1)),
    Case("video VAE 4x/4x, streamed 3 tiles, bf16, 112x144",
         video_vae_case(1, 4, 24, True, 112, 144, torch.bfloat16, 3)),
    Case("DiT A fp32, 24+30+700 rows", dit_case(DIT_A, 24, 30, 700, torch.float32)),
    Case("DiT A bf16, 24+30+700 rows", dit_case(DIT_A, 24, 30, 700, torch.bfloat16)),
    Case("DiT B bf16, 40+60+400 rows", dit_case(DIT_B, 40, 60, 400, torch.bfloat16)),
    Case("DiT B fp32, math attention, 40+60+400 rows", dit_case(DIT_B, 40, 60, 400, torch.float32, "math")),
    Case("audio VAE A, 5 latents", audio_case(AUDIO_A, 5)),
    Case("audio VAE B, 4 latents", audio_case(AUDIO_B, 4)),
)
