"""Streaming-decode adapter over diffusers' real `AutoencoderKLMiniMaxH3` (the MiniMax H3 video VAE).

Conventions (the VAE's own, see its class docstring):

- input: latents `[B, 24, T, h, w]` NORMALIZED as the sampler produces them; the adapter applies
  ``z * latents_std + latents_mean`` with the config's statistics as float32 tensors, exactly as the
  diffusers H3 pipeline does, unless `denormalize=False`;
- output: ImageNet-normalized RGB (`pixel_mean`/`pixel_std` below), 17n+5 frames for 5n+2 latents,
  `16 h x 16 w` pixels, in the decoder's dtype;
- temporal plan: `h3director.geometry.TemporalGeometry` built from the VAE's `clip_length`,
  temporal compression and `token_drop` (diffusers' `_decode`). For the shortest inputs, where
  diffusers raises (1 or 2 latent frames: `torch.cat` of an empty list), ComfyUI's rule is followed:
  1 latent frame is decoded alone and only its last decoded frame is kept (1 frame); 2 latent frames
  get one extra chunk of copies of the last latent frame, 5 frames are kept;
- spatial tiling is the VAE's own (`use_tiling`, on by default: 256 px tiles, >= 64 px overlap).

Executions (`ClipExecution`), all bit-identical to `vae.decode(z).sample` on the same device:

- `tiles_per_call=None`: the reference path, the VAE's own `_decode_clip` (one tile per decoder
  call, every tile kept until the clip is stitched);
- `tiles_per_call=k`: the same tiles and blends, stitched into one canvas as they come, so only the
  current tiles and the overlap strips of their neighbours are alive; `k` tiles share a decoder call
  (k > 1 batches tiles: faster on a GPU; it is exact only where the kernels are batch-invariant, as on
  the CPU, where the tests check it);
- `device="cpu"`: the clip on the CPU (the decoder is moved there for the rest of the decode). On an
  accelerator this changes the device's rounding, so it is the last resort after an OOM.

The OOM ladder is: reference -> 1 tile/call -> 1 tile/call on the CPU (when the model is not there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from h3director.errors import InvalidInputError
from h3director.geometry import ClipStep, DecodeSchedule, TemporalGeometry
from h3director.integrations.diffusers_common import (
    DiffusersVideoAdapter,
    denormalize_latents,
    run_forward_hook,
)
from h3director.video.crossfade import crossfade
from h3director.video.decoder import Checkpoint, ClipExecution, DecodeSession
from h3director.video.faults import STAGE_MID
from h3director.video.latent_checks import check_latents

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def denormalize_video(latents: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...],
                      device: torch.device) -> torch.Tensor:
    """``latents * std + mean`` per channel with float32 statistics, as diffusers' H3 pipeline computes it."""
    return denormalize_latents(latents, mean, std, device)


@dataclass(frozen=True)
class TileGrid:
    """The VAE's spatial tiles of one frame, in pixels: start, length and overlap per axis."""

    y_starts: tuple[int, ...]
    y_lengths: tuple[int, ...]
    y_overlaps: tuple[int, ...]
    x_starts: tuple[int, ...]
    x_lengths: tuple[int, ...]
    x_overlaps: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.y_starts) * len(self.x_starts)


class H3VideoAdapter(DiffusersVideoAdapter):
    """`AutoencoderKLMiniMaxH3` for `stream_decode` (see the module docstring for conventions)."""

    name = "minimax-h3-video"
    fps = 24.0
    pixel_mean = IMAGENET_MEAN
    pixel_std = IMAGENET_STD

    def __init__(self, vae: torch.nn.Module) -> None:
        from diffusers import AutoencoderKLMiniMaxH3

        if not isinstance(vae, AutoencoderKLMiniMaxH3):
            raise InvalidInputError(f"H3VideoAdapter needs an AutoencoderKLMiniMaxH3, got {type(vae).__name__}")
        self.vae = vae
        config = vae.config
        self.out_channels = config.out_channels
        self.latent_channels = config.latent_channels
        self.spatial_ratio = vae.spatial_compression_ratio
        self.temporal = TemporalGeometry(clip_length=config.clip_length,
                                         temporal_ratio=vae.temporal_compression_ratio,
                                         token_drop=config.token_drop)

    # -- declared geometry -------------------------------------------------------------------------
    def schedule(self, latent_frames: int) -> DecodeSchedule:
        return self.temporal.decode_schedule(latent_frames)

    def tile_grid(self, latent_height: int, latent_width: int) -> TileGrid | None:
        """The tiles `_decode_clip` lays over a frame, from the VAE's own `_split_tiles`; None without tiling."""
        vae = self.vae
        if not vae.use_tiling:
            return None
        height, width = self.output_size(latent_height, latent_width)
        ys = vae._split_tiles(height, vae.tile_sample_min_height, vae.tile_sample_min_overlap_height)
        xs = vae._split_tiles(width, vae.tile_sample_min_width, vae.tile_sample_min_overlap_width)
        return TileGrid(*(tuple(v) for v in ys), *(tuple(v) for v in xs))

    # -- checks ------------------------------------------------------------------------------------
    def validate(self, latents: torch.Tensor, *, denormalize: bool = True) -> None:
        check_latents(latents, name="video latents", layout="[B, C, T, h, w]", channels=self.latent_channels,
                      model_device=self.device)
        vae = self.vae
        if vae.use_tiling:
            ratio = self.spatial_ratio
            for axis in ("height", "width"):
                tile = getattr(vae, f"tile_sample_min_{axis}")
                overlap = getattr(vae, f"tile_sample_min_overlap_{axis}")
                if tile % ratio or overlap % ratio or not 0 <= overlap < tile:
                    raise InvalidInputError(
                        f"the VAE's {axis} tiling (tile {tile} px, overlap {overlap} px) cannot decode: tile and "
                        f"overlap must be multiples of {ratio} px with 0 <= overlap < tile (see enable_tiling)"
                    )
        if denormalize:
            for key in ("latents_mean", "latents_std"):
                values = getattr(vae.config, key)
                if len(values) != self.latent_channels:
                    raise InvalidInputError(f"the VAE config's {key} has {len(values)} values, "
                                            f"expected {self.latent_channels} (one per latent channel)")

    # -- decoding ----------------------------------------------------------------------------------
    def open(self, latents: torch.Tensor, *, denormalize: bool = True) -> H3VideoSession:
        return H3VideoSession(self, latents, denormalize=denormalize)

    def reference_decode(self, latents: torch.Tensor, *, denormalize: bool = True) -> torch.Tensor:
        """``vae.decode(z).sample`` of the whole video, `z` denormalized as the H3 pipeline does."""
        vae = self.vae
        z = denormalize_video(latents, vae.config.latents_mean, vae.config.latents_std, latents.device) \
            if denormalize else latents
        with torch.no_grad():
            return vae.decode(z.to(device=self.device, dtype=self.dtype)).sample

    def cheaper(self, execution: ClipExecution) -> ClipExecution | None:
        if self.vae.use_tiling and (execution.tiles_per_call is None or execution.tiles_per_call > 1):
            return ClipExecution(tiles_per_call=1, device=execution.device)
        if execution.device != "cpu" and self.device.type != "cpu":
            return ClipExecution(tiles_per_call=1, device="cpu")
        return None

    def clip_working_set_bytes(self, batch: int, latent_height: int, latent_width: int,
                               execution: ClipExecution) -> int:
        """The planner's per-clip estimate (`h3director.plan.decode`) for this VAE's tiling, per batch
        item decoded at once (all of them unless `use_slicing`)."""
        from h3director.plan.decode import decode_clip_working_set_bytes

        vae = self.vae
        height, width = self.output_size(latent_height, latent_width)
        per_item = decode_clip_working_set_bytes(
            dict(vae.config), height, width, execution.tiles_per_call, self.dtype,
            tile_size=max(vae.tile_sample_min_height, vae.tile_sample_min_width),
            tile_overlap=min(vae.tile_sample_min_overlap_height, vae.tile_sample_min_overlap_width),
            tiling=vae.use_tiling)
        return int(per_item) * (1 if vae.use_slicing else batch)


class H3VideoSession(DecodeSession):
    """One latent video being decoded by an `H3VideoAdapter`: the prepared (denormalized, cast, padded)
    latents stay where they came from; each clip's slice moves to the decoder's device when decoded."""

    def __init__(self, adapter: H3VideoAdapter, latents: torch.Tensor, *, denormalize: bool) -> None:
        self.adapter = adapter
        vae = adapter.vae
        run_forward_hook(vae)
        z = denormalize_video(latents, vae.config.latents_mean, vae.config.latents_std, latents.device) \
            if denormalize else latents
        z = z.to(adapter.dtype)
        schedule = adapter.schedule(z.shape[2])
        if schedule.pad_tokens:
            z = torch.cat([z, z[:, :, -1:].repeat(1, 1, schedule.pad_tokens, 1, 1)], dim=2)
        self.z = z
        self.grid = adapter.tile_grid(z.shape[-2], z.shape[-1])   # the same for every clip
        self.home_device = adapter.device
        self.moved_to_cpu = False

    def close(self) -> None:
        if self.moved_to_cpu:
            self._move_decoder(self.home_device)
            self.moved_to_cpu = False
        self.z = None

    def _move_decoder(self, device: torch.device | str) -> None:
        vae = self.adapter.vae
        vae.post_quant_conv.to(device)
        vae.decoder.to(device)

    def decode_clip(self, clip: ClipStep, execution: ClipExecution,
                    checkpoint: Checkpoint | None = None) -> torch.Tensor:
        device = self.home_device
        if execution.device == "cpu" and device.type != "cpu":
            if not self.moved_to_cpu:
                self._move_decoder("cpu")
                self.moved_to_cpu = True
            device = torch.device("cpu")
        z_clip = self.z[:, :, clip.latent_start:clip.latent_stop].to(device)
        vae = self.adapter.vae
        items = z_clip.split(1) if vae.use_slicing and z_clip.shape[0] > 1 else (z_clip,)
        outputs = []
        calls = 0

        def after_call() -> None:
            nonlocal calls
            calls += 1
            if calls == 1 and checkpoint is not None:
                checkpoint(STAGE_MID)

        for item in items:
            if execution.tiles_per_call is None or not vae.use_tiling:
                outputs.append(vae._decode_clip(item))
                after_call()
            else:
                outputs.append(self._decode_streamed(item, execution.tiles_per_call, after_call))
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    def _decode_streamed(self, z: torch.Tensor, tiles_per_call: int, after_call) -> torch.Tensor:
        """`_decode_clip` with the same tiles and blends, stitched into one canvas as tiles arrive.

        `_stitch_tiles` blends each tile with the ORIGINAL (unblended) tile above and to the left, so
        only their overlap strips are kept: the bottom strip of each tile of the previous row and the
        right strip of the previous tile in this row.
        """
        vae = self.adapter.vae
        ratio = self.adapter.spatial_ratio
        grid = self.grid
        rows, cols = len(grid.y_starts), len(grid.x_starts)
        positions = [(i, j) for i in range(rows) for j in range(cols)]
        canvas = None
        above: dict[int, torch.Tensor] = {}
        below: dict[int, torch.Tensor] = {}
        left = None
        out_y = out_x = 0
        for first in range(0, len(positions), tiles_per_call):
            group = positions[first:first + tiles_per_call]
            latents = [z[..., grid.y_starts[i] // ratio:(grid.y_starts[i] + grid.y_lengths[i]) // ratio,
                         grid.x_starts[j] // ratio:(grid.x_starts[j] + grid.x_lengths[j]) // ratio] for i, j in group]
            if len(latents) == 1:
                decoded = [vae.decoder(vae.post_quant_conv(latents[0]))]
            else:
                decoded = list(vae.decoder(vae.post_quant_conv(torch.cat(latents))).split(z.shape[0]))
            after_call()
            for (i, j), tile in zip(group, decoded, strict=True):
                if j == 0:
                    out_x = 0
                    if i > 0:
                        above, below = below, {}
                if i < rows - 1:
                    below[j] = tile[..., -grid.y_overlaps[i]:, :].clone()
                right = tile[..., :, -grid.x_overlaps[j]:].clone() if j < cols - 1 else None
                if i > 0:
                    tile = crossfade(above.pop(j), tile, grid.y_overlaps[i - 1], dim=-2)
                if j > 0:
                    tile = crossfade(left, tile, grid.x_overlaps[j - 1], dim=-1)
                left = right
                if i < rows - 1:
                    tile = tile[..., : -grid.y_overlaps[i], :]
                if j < cols - 1:
                    tile = tile[..., :, : -grid.x_overlaps[j]]
                if canvas is None:
                    height, width = self.adapter.output_size(z.shape[-2], z.shape[-1])
                    canvas = torch.empty(*tile.shape[:-2], height, width, dtype=tile.dtype, device=tile.device)
                canvas[..., out_y:out_y + tile.shape[-2], out_x:out_x + tile.shape[-1]].copy_(tile)
                out_x += tile.shape[-1]
                if j == cols - 1:
                    out_y += tile.shape[-2]
            del decoded, latents
        return canvas


__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "H3VideoAdapter", "H3VideoSession", "TileGrid",
           "denormalize_video"]
