"""Chunked decode of MiniMax H3 audio latents over diffusers' real `AutoencoderKLMiniMaxH3Audio`.

The audio VAE is mono, 32 kHz, 800 samples per latent frame (40 latents/s); its decoder (BigVGAN)
is a stack of convolutions, so an output sample depends only on a window of latent frames around
it, its receptive field. Decoding a chunk of latents together with `context` latent frames on each
side that cover that window gives the same samples as decoding everything at once (up to float32
rounding: convolution kernels may sum in a different order for a different input length).

The receptive field is derived from the module tree (`decoder_influence`: interval arithmetic over
every convolution, transposed convolution and anti-aliased resampler, which depends only on kernel
sizes, strides, dilations and paddings, not on widths or weights) and measured (perturb one latent
frame, see which samples change) in `tests/test_stream_decode_audio.py`; `docs/BENCHMARKS.md`
records both. For the released config (and `tiny_h3_audio_vae`, which keeps its rates, kernels and
dilations) the derived bound is 28.6 latent frames backward and 29.6 forward, so chunks get 31
frames of context (0.78 s) each side; measured, a latent frame changes samples from 23.5 frames
before its start to 24.2 frames after it.

Layouts accepted (normalized as the sampler produces them, denormalized here with
``z * latents_std + latents_mean`` as the diffusers pipeline does, unless `denormalize=False`):

- `[S, 32, T]`: diffusers' layout, the stereo channels as batch items; decoded to `[1, S, samples]`
  (the pipeline's `permute(1, 0, 2)`);
- `[B, 32, S, T]`: ComfyUI's layout; decoded to `[B, S, samples]`.
"""

from __future__ import annotations

import math

import torch

from h3director.errors import InvalidInputError
from h3director.geometry import AUDIO_LATENTS_PER_SECOND
from h3director.integrations.diffusers_common import denormalize_latents
from h3director.video.latent_checks import check_latents


def _conv(interval: tuple[float, float], kernel: int, stride: int, padding: int, dilation: int = 1,
          left_pad: int | None = None) -> tuple[float, float]:
    """Outputs of a strided convolution influenced by inputs `interval` (padding added on the left)."""
    lo, hi = interval
    pad = padding if left_pad is None else left_pad
    return math.ceil((lo + pad - (kernel - 1) * dilation) / stride), math.floor((hi + pad) / stride)


def _conv_transpose(interval: tuple[float, float], kernel: int, stride: int, padding: int) -> tuple[float, float]:
    lo, hi = interval
    return lo * stride - padding, hi * stride + kernel - 1 - padding


def _activation(interval: tuple[float, float], act: torch.nn.Module) -> tuple[float, float]:
    """Anti-aliased activation: replicate-pad, upsample (transposed filter), crop, pointwise, low-pass."""
    up, down = act.upsample, act.downsample.lowpass
    kernel = up.filter.shape[-1]
    lo, hi = interval
    lo, hi = (lo + up.pad) * up.stride - up.pad_left, (hi + up.pad) * up.stride + kernel - 1 - up.pad_left
    return _conv((lo, hi), down.filter.shape[-1], down.stride, 0, left_pad=down.pad_left)


def _hull(*intervals: tuple[float, float]) -> tuple[float, float]:
    return min(i[0] for i in intervals), max(i[1] for i in intervals)


def _amp_block(interval: tuple[float, float], block: torch.nn.Module) -> tuple[float, float]:
    acts1, acts2 = block.activations[::2], block.activations[1::2]
    for conv1, conv2, act1, act2 in zip(block.convs1, block.convs2, acts1, acts2, strict=True):
        path = _activation(interval, act1)
        path = _conv(path, conv1.kernel_size[0], 1, conv1.padding[0], conv1.dilation[0])
        path = _activation(path, act2)
        path = _conv(path, conv2.kernel_size[0], 1, conv2.padding[0], conv2.dilation[0])
        interval = _hull(interval, path)
    return interval


def decoder_influence(vae: torch.nn.Module) -> tuple[int, int]:
    """Output samples one latent frame can change: `(first, last)` relative to that frame's first sample.

    Interval arithmetic over the decoder's real modules (a sound bound: a sample outside it cannot
    depend on the frame). Boundary effects of replicate padding are ignored: they only move the
    edges of the whole signal, where chunks and the full decode see the same edge.
    """
    decoder = vae.decoder
    interval = (0, 0)   # dec_in_proj is 1x1
    interval = _conv(interval, decoder.conv_pre.kernel_size[0], 1, decoder.conv_pre.padding[0])
    for index in range(decoder.num_upsamples):
        up = decoder.ups[index][0]
        interval = _conv_transpose(interval, up.kernel_size[0], up.stride[0], up.padding[0])
        blocks = decoder.resblocks[index * decoder.num_kernels:(index + 1) * decoder.num_kernels]
        interval = _hull(*(_amp_block(interval, block) for block in blocks))
    interval = _activation(interval, decoder.activation_post)
    post = decoder.conv_post
    lo, hi = _conv(interval, post.kernel_size[0], 1, post.padding[0])
    return int(lo), int(hi)


def context_latents(vae: torch.nn.Module) -> int:
    """Latent frames of context needed on each side of a chunk so its samples equal the full decode."""
    hop = vae.hop_length
    first, last = decoder_influence(vae)
    # a sample s is influenced by frame m when first <= s - m * hop <= last
    return max(math.ceil(-first / hop), math.ceil((last + 1) / hop)) + 1


class H3AudioAdapter:
    """`AutoencoderKLMiniMaxH3Audio` decoded in chunks with receptive-field context (see module docstring)."""

    name = "minimax-h3-audio"

    def __init__(self, vae: torch.nn.Module, *, chunk_seconds: float = 10.0) -> None:
        from diffusers import AutoencoderKLMiniMaxH3Audio

        if not isinstance(vae, AutoencoderKLMiniMaxH3Audio):
            raise InvalidInputError(f"H3AudioAdapter needs an AutoencoderKLMiniMaxH3Audio, got {type(vae).__name__}")
        if chunk_seconds <= 0:
            raise InvalidInputError(f"chunk_seconds must be > 0, got {chunk_seconds}")
        self.vae = vae
        self.chunk_seconds = chunk_seconds
        self.sample_rate = int(vae.config.sampling_rate)
        self.hop = int(vae.hop_length)
        self.latent_channels = int(vae.config.latent_channels)
        self.context = context_latents(vae)

    @property
    def device(self) -> torch.device:
        return self.vae.dec_in_proj.weight.device

    @property
    def latents_per_second(self) -> float:
        return self.sample_rate / self.hop if self.hop else float(AUDIO_LATENTS_PER_SECOND)

    def validate(self, latents: torch.Tensor, *, denormalize: bool = True) -> None:
        """Refuse anything but `[S, C, T]` or `[B, C, S, T]` finite float latents with C latent channels."""
        layout = "[B, C, S, T]" if isinstance(latents, torch.Tensor) and latents.ndim == 4 else "[S, C, T]"
        check_latents(latents, name="audio latents", layout=layout, channels=self.latent_channels,
                      model_device=self.device)
        if denormalize:
            for key in ("latents_mean", "latents_std"):
                values = getattr(self.vae.config, key)
                if values is None or len(values) != self.latent_channels:
                    raise InvalidInputError(f"the audio VAE config's {key} must hold {self.latent_channels} values "
                                            f"to denormalize, got {values!r}")

    def output_samples(self, latent_frames: int) -> int:
        """Samples per channel decoded from `latent_frames` latent frames."""
        return latent_frames * self.hop

    def chunk_latents(self, chunk_seconds: float | None = None) -> int:
        """Latent frames per chunk (without context) for `chunk_seconds` (default: the adapter's)."""
        seconds = self.chunk_seconds if chunk_seconds is None else chunk_seconds
        return max(1, round(seconds * self.latents_per_second))

    def _prepare(self, latents: torch.Tensor, denormalize: bool) -> tuple[torch.Tensor, int, int]:
        if latents.ndim == 4:
            batch, channels, streams, frames = latents.shape
            latents = latents.permute(0, 2, 1, 3).reshape(batch * streams, channels, frames)
        else:
            batch, streams = 1, latents.shape[0]
        if denormalize:
            latents = denormalize_latents(latents, self.vae.config.latents_mean, self.vae.config.latents_std)
        return latents, batch, streams

    def decode_reference(self, latents: torch.Tensor, *, denormalize: bool = True) -> torch.Tensor:
        """The stock full decode (`vae.decode`), reshaped like `decode`: `[B, S, samples]`."""
        z, batch, streams = self._prepare(latents, denormalize)
        out = self.vae.decode(z.to(self.device)).sample
        return out.reshape(batch, streams, -1)

    def decode(self, latents: torch.Tensor, *, denormalize: bool = True,
               chunk_seconds: float | None = None) -> torch.Tensor:
        """Decode in chunks of `chunk_seconds` with `self.context` latent frames each side: `[B, S, samples]`.

        Peak memory is one chunk plus context through the decoder, plus the float32 output.
        """
        z, batch, streams = self._prepare(latents, denormalize)
        frames = z.shape[-1]
        step = self.chunk_latents(chunk_seconds)
        out = torch.empty(z.shape[0], 1, frames * self.hop, dtype=torch.float32, device=self.device)
        for start in range(0, frames, step):
            stop = min(start + step, frames)
            lo, hi = max(0, start - self.context), min(frames, stop + self.context)
            piece = self.vae.decode(z[..., lo:hi].to(self.device)).sample
            out[..., start * self.hop:stop * self.hop] = piece[..., (start - lo) * self.hop:(stop - lo) * self.hop]
            del piece
        return out.reshape(batch, streams, -1)


__all__ = ["H3AudioAdapter", "context_latents", "decoder_influence"]
