"""The demo's models: small random-initialised configs of the REAL diffusers H3 VAE classes.

`h3director demo` decodes with these (no download, under a minute on a CPU); the tests and the decode benches use
the same builders (and `random_initialised` for other classes, e.g. the tests' Wan VAE in `fixtures/tiny_vaes.py`).

Deterministic by seed (the global RNG is left untouched), fast on a CPU, in float32, in eval mode.
What is kept from the released models, and what is shrunk:

- `tiny_h3_vae`: `AutoencoderKLMiniMaxH3` with the real temporal geometry (clip_length 17,
  token_drop 3, time /4), the real space /16 and the ViT decoder with 4 register tokens; the
  decoder is 2 layers of 2 heads x 16 (real: 36 x 32 x 64) and the encoder 8 channels wide. Spatial
  tiling is the VAE's default (256 px tiles, 64 px overlap), so a 24x40 latent (384x640 px) is
  decoded as 2x3 tiles.
- `tiny_h3_audio_vae`: `AutoencoderKLMiniMaxH3Audio` with the real hop (800), decoder rates,
  kernel sizes and dilations, hence the real receptive field; channels shrunk (decoder 128 wide).

diffusers initialises some parameters to zero (H3's layer scales and register tokens), which would
make the decoder's attention a no-op; every all-zero floating parameter is re-drawn from a small
normal so that every path of the real architecture is exercised. `latents_mean` / `latents_std`
are non-trivial (drawn from the seed) so that denormalization is tested.
"""

from __future__ import annotations

import torch


def random_initialised(cls, seed: int, channels: int, zero_scale: float = 0.2, **config) -> torch.nn.Module:
    """`cls(**config)` initialised from `seed` with seeded latents_mean/std of `channels` values and every
    all-zero floating parameter re-drawn from N(0, zero_scale^2); float32, eval mode, no grad."""
    generator = torch.Generator().manual_seed(seed)
    mean = (torch.rand(channels, generator=generator) - 0.5).tolist()
    std = (0.5 + torch.rand(channels, generator=generator)).tolist()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(latents_mean=mean, latents_std=std, **config)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.is_floating_point() and not bool(parameter.any()):
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * zero_scale)
    return model.float().eval().requires_grad_(False)


def tiny_h3_vae(seed: int = 0):
    """A small `AutoencoderKLMiniMaxH3` (real temporal geometry, ViT decoder, default tiling)."""
    from diffusers import AutoencoderKLMiniMaxH3

    return random_initialised(AutoencoderKLMiniMaxH3, seed, 24, block_out_channels=(8, 8, 8, 8, 8, 8), layers_per_block=1,
                  norm_num_groups=4, decoder_num_layers=2, decoder_num_attention_heads=2,
                  decoder_attention_head_dim=16, decoder_num_register_tokens=4, decoder_ffn_mult=2)


def tiny_h3_audio_vae(seed: int = 0):
    """A small `AutoencoderKLMiniMaxH3Audio` with the real rates, kernels and dilations."""
    from diffusers import AutoencoderKLMiniMaxH3Audio

    return random_initialised(AutoencoderKLMiniMaxH3Audio, seed, 32, encoder_dim=4, latent_dim=64, latent_channels=32,
                  num_attention_heads=2, decoder_dim=128)


__all__ = ["random_initialised", "tiny_h3_audio_vae", "tiny_h3_vae"]
