"""Streaming-decode adapter over diffusers' real `AutoencoderKLWan` (Wan 2.1 / 2.2 video VAE).

Wan's decoder is causal: `_decode` runs the decoder one latent frame at a time and carries a
feature cache (the last frames of every causal convolution's input) from frame to frame. The
frames each step returns are final at once, so this adapter streams them: one `ClipStep` per latent
frame (`h3director.geometry.causal_schedule`: latent frame 0 -> 1 pixel frame, each later one -> 4).

Conventions:

- input: latents `[B, z_dim, T, h, w]` normalized as the Wan pipeline's sampler produces them; the
  adapter denormalizes them as the Wan pipeline does, ``latents / (1 / std) + mean`` with float32
  statistics, unless `denormalize=False`;
- output: `[-1, 1]` RGB (clamped), `1 + 4 (T - 1)` frames of `8 h x 8 w` pixels (Wan 2.2's
  `patch_size` is undone as diffusers does);
- spatial tiling follows the VAE's `use_tiling` (off by default in diffusers). With tiling, diffusers
  decodes each tile over all frames with its own cache and then blends the tiles in place; here every
  tile keeps its own cache, each latent frame is decoded tile by tile and blended with the VAE's own
  `blend_v`/`blend_h` on the strips of the already-blended neighbours, which is the same arithmetic.

Every step is bit-identical to `vae.decode(z).sample` on the same device. A step that fails leaves
the caches as they were (the cache lists are restored from a snapshot), so it can be retried. There
is no cheaper exact execution (Wan's tiling changes the output), so after an out-of-memory error the
scheduler frees cached memory and retries the same step once.
"""

from __future__ import annotations

import torch

from h3director.errors import InvalidInputError
from h3director.geometry import ClipStep, DecodeSchedule, causal_schedule
from h3director.integrations.diffusers_common import DiffusersVideoAdapter, run_forward_hook
from h3director.video.decoder import Checkpoint, ClipExecution, DecodeSession
from h3director.video.faults import STAGE_MID
from h3director.video.latent_checks import check_latents


def denormalize_wan(latents: torch.Tensor, mean: list[float], std: list[float], device: torch.device) -> torch.Tensor:
    """``latents / (1 / std) + mean`` with float32 statistics, as diffusers' `WanPipeline` computes it."""
    channels = len(mean)
    latents_mean = torch.tensor(mean).view(1, channels, 1, 1, 1).to(device, latents.dtype)
    latents_std = 1.0 / torch.tensor(std).view(1, channels, 1, 1, 1).to(device, latents.dtype)
    return latents / latents_std + latents_mean


class WanVideoAdapter(DiffusersVideoAdapter):
    """`AutoencoderKLWan` for `stream_decode` (see the module docstring for conventions)."""

    name = "wan-video"
    fps = 16.0

    def __init__(self, vae: torch.nn.Module, *, fps: float = 16.0) -> None:
        from diffusers import AutoencoderKLWan

        if not isinstance(vae, AutoencoderKLWan):
            raise InvalidInputError(f"WanVideoAdapter needs an AutoencoderKLWan, got {type(vae).__name__}")
        self.vae = vae
        self.fps = fps
        config = vae.config
        self.out_channels = config.out_channels
        self.latent_channels = config.z_dim
        self.spatial_ratio = vae.spatial_compression_ratio
        self.temporal_ratio = config.scale_factor_temporal or 4

    def schedule(self, latent_frames: int) -> DecodeSchedule:
        return causal_schedule(latent_frames, self.temporal_ratio)

    def validate(self, latents: torch.Tensor, *, denormalize: bool = True) -> None:
        check_latents(latents, name="video latents", layout="[B, C, T, h, w]", channels=self.latent_channels,
                      model_device=self.device)
        patch = self.vae.config.patch_size
        if patch and self.vae.use_tiling:
            for key in ("tile_sample_min_height", "tile_sample_min_width",
                        "tile_sample_stride_height", "tile_sample_stride_width"):
                if getattr(self.vae, key) % patch:
                    raise InvalidInputError(f"the VAE's {key} ({getattr(self.vae, key)}) must be a multiple of "
                                            f"patch_size {patch}")

    def open(self, latents: torch.Tensor, *, denormalize: bool = True) -> WanVideoSession:
        return WanVideoSession(self, latents, denormalize=denormalize)

    def cheaper(self, execution: ClipExecution) -> ClipExecution | None:
        """None: Wan's tiling changes the output and its caches live on the model's device, so the
        scheduler's only recourse is to free cached memory and retry the same step once."""
        return None

    def clip_working_set_bytes(self, batch: int, latent_height: int, latent_width: int,
                               execution: ClipExecution) -> int:
        """Rough: a handful of full-resolution activations of the widest output level for 4 frames,
        plus the feature caches (2 frames per causal convolution, bounded by the same width)."""
        element = torch.finfo(self.dtype).bits // 8
        height, width = self.output_size(latent_height, latent_width)
        config = self.vae.config
        base = config.decoder_base_dim or config.base_dim
        widest = base * max(config.dim_mult)
        convs = self.vae._cached_conv_counts["decoder"]
        items = 1 if self.vae.use_slicing else batch
        activations = 8 * self.temporal_ratio * height * width * base * config.dim_mult[0]
        caches = 2 * convs * (height // 2) * (width // 2) * widest
        return int(items * element * (activations + caches))


class WanVideoSession(DecodeSession):
    """One latent video being decoded by a `WanVideoAdapter`: the post-quant latents and the caches."""

    def __init__(self, adapter: WanVideoAdapter, latents: torch.Tensor, *, denormalize: bool) -> None:
        self.adapter = adapter
        vae = adapter.vae
        run_forward_hook(vae)
        # the Wan pipeline casts to the VAE's device and dtype first, then denormalizes in that dtype
        z = latents.to(adapter.device, dtype=vae.dtype)
        self.z = denormalize_wan(z, vae.config.latents_mean, vae.config.latents_std, z.device) if denormalize else z
        self.items = list(self.z.split(1)) if vae.use_slicing and self.z.shape[0] > 1 else [self.z]
        _, _, _, height, width = self.z.shape
        self.tiled = vae.use_tiling and (width > vae.tile_sample_min_width // adapter.spatial_ratio
                                         or height > vae.tile_sample_min_height // adapter.spatial_ratio)
        conv_count = vae._cached_conv_counts["decoder"]
        if self.tiled:
            self.tiles = [(i, j) for i in range(0, height, self._latent_stride("height"))
                          for j in range(0, width, self._latent_stride("width"))]
            self.caches = [[[None] * conv_count for _ in self.tiles] for _ in self.items]
            self.tile_layout = self._tile_layout(height, width)
            self.post_quant = None
        else:
            self.caches = [[[None] * conv_count] for _ in self.items]
            # diffusers applies post_quant_conv to the whole latent video before the frame loop
            self.post_quant = [vae.post_quant_conv(item) for item in self.items]

    def _latent_stride(self, axis: str) -> int:
        return getattr(self.adapter.vae, f"tile_sample_stride_{axis}") // self.adapter.spatial_ratio

    def _tile_layout(self, height: int, width: int) -> tuple[int, int, int, int, int, int, int, int]:
        """`tiled_decode`'s sizes for a `height x width` latent video, computed once per video:
        `(tile_h, tile_w)` in latent pixels; `(stride_h, stride_w)`, `(blend_h, blend_w)` and the output
        `(out_h, out_w)` in output pixels (after Wan 2.2's `patch_size` is undone)."""
        vae = self.adapter.vae
        ratio = self.adapter.spatial_ratio
        tile_h = vae.tile_sample_min_height // ratio
        tile_w = vae.tile_sample_min_width // ratio
        stride_h, stride_w = vae.tile_sample_stride_height, vae.tile_sample_stride_width
        out_h, out_w = height * ratio, width * ratio
        blend_h, blend_w = vae.tile_sample_min_height - stride_h, vae.tile_sample_min_width - stride_w
        patch = vae.config.patch_size
        if patch is not None:
            out_h, out_w = out_h // patch, out_w // patch
            stride_h, stride_w = stride_h // patch, stride_w // patch
            blend_h = vae.tile_sample_min_height // patch - stride_h
            blend_w = vae.tile_sample_min_width // patch - stride_w
        return tile_h, tile_w, stride_h, stride_w, blend_h, blend_w, out_h, out_w

    def close(self) -> None:
        self.caches = self.items = self.post_quant = self.z = None

    def decode_clip(self, clip: ClipStep, execution: ClipExecution,
                    checkpoint: Checkpoint | None = None) -> torch.Tensor:
        snapshot = [[list(cache) for cache in item] for item in self.caches]
        try:
            outputs = []
            decode = self._decode_tiled_frame if self.tiled else self._decode_frame
            for index in range(len(self.items)):
                outputs.append(decode(index, clip.latent_start, checkpoint))
                checkpoint = None
            return outputs[0] if len(outputs) == 1 else torch.cat(outputs)
        except BaseException:
            for item, saved in zip(self.caches, snapshot, strict=True):
                for cache, values in zip(item, saved, strict=True):
                    cache[:] = values
            raise

    def _finish(self, out: torch.Tensor) -> torch.Tensor:
        from diffusers.models.autoencoders.autoencoder_kl_wan import unpatchify

        patch = self.adapter.vae.config.patch_size
        if patch is not None:
            out = unpatchify(out, patch_size=patch)
        return torch.clamp(out, min=-1.0, max=1.0)

    def _decode_frame(self, item: int, frame: int, checkpoint: Checkpoint | None) -> torch.Tensor:
        x = self.post_quant[item][:, :, frame:frame + 1]
        out = self.adapter.vae.decoder(x, feat_cache=self.caches[item][0], feat_idx=[0], first_chunk=frame == 0)
        if checkpoint is not None:
            checkpoint(STAGE_MID)
        return self._finish(out)

    def _decode_tiled_frame(self, item: int, frame: int, checkpoint: Checkpoint | None) -> torch.Tensor:
        """One latent frame through every tile, blended and cropped exactly as `tiled_decode` does."""
        vae = self.adapter.vae
        z = self.items[item]
        tile_h, tile_w, stride_h, stride_w, blend_h, blend_w, out_h, out_w = self.tile_layout
        above: dict[int, torch.Tensor] = {}
        rows = []
        row: list[torch.Tensor] = []
        left = None
        previous_i = None
        for tile_index, (i, j) in enumerate(self.tiles):
            if i != previous_i:
                if row:
                    rows.append(torch.cat(row, dim=-1))
                row, left, previous_i = [], None, i
            tile = z[:, :, frame:frame + 1, i:i + tile_h, j:j + tile_w]
            tile = vae.post_quant_conv(tile)
            tile = vae.decoder(tile, feat_cache=self.caches[item][tile_index], feat_idx=[0], first_chunk=frame == 0)
            if checkpoint is not None:
                checkpoint(STAGE_MID)
                checkpoint = None
            if j in above:
                tile = vae.blend_v(above[j], tile, blend_h)
            if left is not None:
                tile = vae.blend_h(left, tile, blend_w)
            above[j] = tile[:, :, :, -blend_h:, :].clone() if blend_h > 0 else tile[:, :, :, :0, :]
            left = tile[:, :, :, :, -blend_w:].clone() if blend_w > 0 else tile[:, :, :, :, :0]
            row.append(tile[:, :, :, :stride_h, :stride_w])
        rows.append(torch.cat(row, dim=-1))
        dec = torch.cat(rows, dim=3)[:, :, :, :out_h, :out_w]
        return self._finish(dec)


__all__ = ["WanVideoAdapter", "WanVideoSession"]
