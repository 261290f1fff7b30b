"""Bytes to decode audio latents with H3's audio VAE (BigVGAN decoder), derived from its config.

`audio_decode_working_set_bytes` replays `AutoencoderKLMiniMaxH3Audio.decode` allocation by
allocation on a `ByteLedger` (the `dec_in_proj` output, every upsampler, every AMP block with its
alias-free SnakeBeta activations at twice the rate, the weight-norm recomputation before each
convolution) and returns the peak of live tensor bytes beyond the weights and the input, the
returned waveform included. The decoder is float32 whatever the pipeline dtype (the release keeps it
float32). Stereo is decoded as a batch of 2.

Weight norm: `torch.nn.utils.weight_norm` recomputes every convolution's `weight` from `weight_g`
and `weight_v` before each call and keeps it as a plain attribute, so once the decoder has run, its
weights occupy twice their parameter bytes (`audio_vae_resident_weight_bytes`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from h3director.geometry import audio_samples_for
from h3director.plan.ledger import Bindings, ByteLedger

FP32 = 4
ACTIVATION_RATIO = 2      # Activation1d up/down-sampling ratio
ACTIVATION_KERNEL = 12    # its Kaiser-sinc filter length


@dataclass(frozen=True)
class BigVGANShape:
    """The audio decoder's sizes (from `AutoencoderKLMiniMaxH3Audio.config`)."""

    latent_channels: int
    latent_dim: int
    decoder_dim: int
    rates: tuple[int, ...]
    kernels: tuple[int, ...]
    res_kernels: tuple[int, ...]
    dilations: tuple[tuple[int, ...], ...]

    @classmethod
    def from_config(cls, config: Mapping | None = None) -> BigVGANShape:
        c = dict(config or {})
        return cls(
            latent_channels=int(c.get("latent_channels", 32)),
            latent_dim=int(c.get("latent_dim", 2048)),
            decoder_dim=int(c.get("decoder_dim", 1024)),
            rates=tuple(int(r) for r in c.get("decoder_rates", (5, 5, 2, 2, 2, 2, 2))),
            kernels=tuple(int(k) for k in c.get("decoder_kernel_sizes", (9, 9, 4, 4, 4, 4, 4))),
            res_kernels=tuple(int(k) for k in c.get("resblock_kernel_sizes", (3, 7, 11))),
            dilations=tuple(tuple(int(d) for d in x) for x in c.get("resblock_dilation_sizes", ((1, 3, 5),) * 3)),
        )


def _activation(ledger: ByteLedger, rows: int, length: int) -> None:
    """`MiniMaxH3AudioActivation1d` on a `rows x length` input (rows = batch x channels) -> "act" live."""
    pad = ACTIVATION_KERNEL // ACTIVATION_RATIO - 1
    up_len = (length + 2 * pad - 1) * ACTIVATION_RATIO + ACTIVATION_KERNEL
    ledger.alloc("a.pad", rows * (length + 2 * pad) * FP32)
    ledger.alloc("a.convt", rows * up_len * FP32)
    ledger.alloc("a.up", rows * up_len * FP32)          # ratio * conv_transpose
    ledger.free("a.convt", "a.pad")
    doubled = rows * length * ACTIVATION_RATIO * FP32
    ledger.alloc("a.ax", doubled)                       # alpha * x
    ledger.alloc("a.sin", doubled)
    ledger.free("a.ax")
    ledger.alloc("a.pow", doubled)
    ledger.free("a.sin")
    ledger.alloc("a.q", doubled)                        # 1/beta * sin^2
    ledger.free("a.pow")
    ledger.alloc("a.snake", doubled)
    ledger.free("a.q", "a.up")
    ledger.alloc("a.dpad", rows * (length * ACTIVATION_RATIO + ACTIVATION_KERNEL - 1) * FP32)
    ledger.alloc("act", rows * length * FP32)           # strided low-pass
    ledger.free("a.dpad", "a.snake")


def _conv(ledger: ByteLedger, name: str, weight_numel: int, out_numel: int) -> None:
    """A weight-normed convolution: the recomputed weight replaces the old one, then the output."""
    ledger.transient(weight_numel * FP32)
    ledger.alloc(name, out_numel * FP32)


def _amp_block(ledger: ByteLedger, rows: int, channels: int, length: int, kernel: int, dilations: tuple[int, ...],
               out: str) -> None:
    """`MiniMaxH3AudioAMPBlock` on "u" -> `out`; its input "u" stays live (the caller holds it)."""
    current = "u"
    for index, _ in enumerate(dilations):
        _activation(ledger, rows, length)
        if ledger.holds("r"):
            ledger.alloc("c1", rows * length * FP32)    # conv1 output, then the old residual dies
            ledger.free("r")
        else:
            ledger.alloc("c1", rows * length * FP32)
        ledger.transient(channels * channels * kernel * FP32)
        ledger.free("act")
        ledger.rename("c1", "r")
        _activation(ledger, rows, length)
        ledger.transient(channels * channels * kernel * FP32)
        ledger.alloc("c2", rows * length * FP32)
        ledger.free("act", "r")
        ledger.rename("c2", "r")
        new = f"h{index}"
        ledger.alloc(new, rows * length * FP32)
        if current != "u":
            ledger.free(current)
        current = new
    ledger.free("r")
    ledger.rename(current, out)


def audio_decode_working_set_bytes(audio_config: Mapping | None, latent_frames: int, batch: int = 2) -> int:
    """Peak bytes of `AutoencoderKLMiniMaxH3Audio.decode` for `latent_frames` latents (40 per second).

    `batch` 2 = one stereo track. Includes the returned waveform `[batch, 1, latent_frames * hop]`.
    """
    s = BigVGANShape.from_config(audio_config)
    ledger = ByteLedger()
    frame = Bindings(ledger)
    _conv(ledger, "pq", s.latent_dim * s.latent_channels, batch * s.latent_dim * latent_frames)
    channels, length = s.decoder_dim, latent_frames
    _conv(ledger, "x0", s.decoder_dim * s.latent_dim * 7, batch * channels * length)
    frame.bind("hidden", "x0")
    for i, (rate, kernel) in enumerate(zip(s.rates, s.kernels, strict=False)):
        out_channels = channels // 2
        length = (length - 1) * rate - 2 * ((kernel - rate) // 2) + kernel   # ConvTranspose1d output length
        rows = batch * out_channels
        _conv(ledger, f"u{i}", channels * out_channels * kernel, rows * length)
        frame.bind("hidden", f"u{i}")
        frame.bind("residual", None)
        for j, (res_kernel, dil) in enumerate(zip(s.res_kernels, s.dilations, strict=False)):
            ledger.rename("u" + str(i), "u")
            _amp_block(ledger, rows, out_channels, length, res_kernel, dil, f"b{i}.{j}")
            ledger.rename("u", "u" + str(i))
            frame.bind("block", f"b{i}.{j}")
            if j == 0:
                frame.bind("residual", f"b{i}.{j}")
            else:
                ledger.alloc(f"r{i}.{j}", rows * length * FP32)
                frame.bind("residual", f"r{i}.{j}")
        ledger.alloc(f"x{i + 1}", rows * length * FP32)   # residual / num_kernels
        frame.bind("hidden", f"x{i + 1}")
        channels = out_channels
    _activation(ledger, batch * channels, length)
    frame.bind("hidden", None)
    _conv(ledger, "wave", channels * 7, batch * length)
    ledger.free("act")
    ledger.alloc("clamped", batch * length * FP32)
    ledger.free("wave")
    frame.bind("residual", None)
    frame.bind("block", None)
    ledger.free("pq")
    return ledger.peak


def audio_samples_bytes(latent_frames: int, batch: int = 2) -> int:
    """Bytes of the decoded float32 waveform: `batch x latent_frames x hop` samples."""
    return batch * audio_samples_for(latent_frames) * FP32


__all__ = ["BigVGANShape", "audio_decode_working_set_bytes", "audio_samples_bytes"]
