"""Out-of-core video upscaling: frame by frame, tile by tile, each finished frame straight into a sink.

`stream_upscale(model, source, sink)` reads one frame from a `FrameSource` (`upscale_sources`), cuts it into
overlapping tiles (`upscale_tiles`), runs each tile through the model, pastes the result into one output frame and
hands that frame to the sink (`MemmapSink` `.npy` with resume, `VideoFileSink` video with audio) before reading the
next. Host memory: one input frame, one output frame (float32, ``3 * H*s * W*s * 4`` bytes; twice that on the feathered
path for the weights) and the sink's buffer, whatever the length of the video.

Exactness (see docs/UPSCALE.md):
- a convolutional model (`UpscaleModel.convolutional`) with an overlap that covers its receptive field gets the
  centre-crop path: each tile contributes only its core, and the frame equals the untiled output up to float rounding
  (the same sums grouped differently by the convolution kernels): "exact up to float rounding";
- any other model, or an overlap below the receptive field, gets a feathered blend: "approximate" (the report says
  not exact).

Recipe stages (docs/UPSCALE.md, "Restoring at a lower resolution"): `pre_resize` resizes each source frame before the
model (area or Lanczos down, e.g. a 4K video to 1080p), `post_resize` resizes each model output to the target size
(Lanczos back up), both with Pillow (`h3director.video.resize`: deterministic); the model can run in float16 or
bfloat16 (`UpscaleModel.dtype`; "approximate": the report gives the measured difference from float32 on a crop of
the first frame, `measure_dtype_error`) and `tile_batch` tiles of equal size at once (the same per-tile arithmetic in
a batched call: "exact where verified", compared in tests/test_upscale_recipe.py). Every stage is streamed frame by
frame; the report gives each stage's time and host/device peak (`h3director.video.upscale_stages`).

Out of memory: a tile that raises an allocator error (`h3director.core.oom.is_out_of_memory`) is replaced by its core
cut in half on each side (same overlap, so on the centre-crop path the result does not change; a feathered blend
follows the smaller tiles) and retried; the halving sticks for the rest of
the video. Frames already handed to the sink are never redone; a `MemmapSink(resume=True)` starts after the frames an
interrupted run finished.
"""

from __future__ import annotations

import copy
import hashlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from h3director.core.guard import free_caches
from h3director.core.oom import is_out_of_memory
from h3director.errors import InvalidInputError
from h3director.video.resize import check_filter, parse_size, pillow_version, resize_frame
from h3director.video.sinks.contract import FrameSink, StreamSpec
from h3director.video.upscale_field import auto_overlap, derive_field, measure_field
from h3director.video.upscale_sources import FrameSource
from h3director.video.upscale_stages import StageClock, StageStats, dtype_name, dtype_refusal
from h3director.video.upscale_tiles import Tile, feather_weights, plan_tiles, round_up, split_tile

EXACT = "exact up to float rounding"
APPROXIMATE = "approximate (feathered blend)"
UNIT_PIXELS = ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0))
"""The sink pixel convention of [0, 1] frames: ``x * 1 + 0``."""


@dataclass
class UpscaleModel:
    """An image upscaler as the streaming driver sees it.

    `call` maps float RGB ``[N, 3, h, w]`` in [0, 1] on (`device`, `dtype`) to ``[N, 3, h * scale, w * scale]``.
    `receptive_field`: input pixels an output pixel depends on, each side (None: unknown, `resolve_overlap` measures
    it). `convolutional`: every operation is local and translation-equivariant (for shifts by multiples of
    `alignment` input pixels), so centre-cropped tiles are exact; False for attention windows, global pooling or
    normalisation. `module`: the torch module behind `call`, when there is one (for `derive_field`).
    """

    call: Callable[[torch.Tensor], torch.Tensor]
    scale: int
    receptive_field: int | None = None
    convolutional: bool = False
    name: str = "model"
    alignment: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    module: torch.nn.Module | None = None
    field_measured: bool = False
    """True when `receptive_field` came from `measure_field` (a lower bound: "auto" adds margin)."""
    reference: UpscaleModel | None = None
    """For a model run in float16/bfloat16: the same weights in float32 (any device), to measure the difference."""

    @classmethod
    def from_module(cls, module: torch.nn.Module, scale: int, *, name: str | None = None,
                    convolutional: bool | None = None, alignment: int | None = None,
                    dtype: torch.dtype | None = None) -> UpscaleModel:
        """Wrap a plain torch module; its receptive field, alignment and whether it is convolutional are derived
        from its layers (`derive_field`) unless given. With a `dtype` other than the module's, a copy in that dtype
        runs and `module` (untouched) is the `reference` a run measures its difference against; a device that
        cannot run the dtype is refused (`check_dtype_runs`).

        The derivation sees layers only, not operations written in `forward` (``x.mean((2, 3))``, a functional
        interpolation); so a derived field is checked with one probe (`measure_field` on an image a little over
        twice the field, two forward passes): a change reaching farther than the derived field makes the model
        not convolutional (feathered, reported not exact)."""
        first = next(module.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
        reference = None
        if dtype is not None and first is not None and dtype != first.dtype:
            reference = cls(module.eval(), int(scale), name=name or type(module).__name__, device=device,
                            dtype=first.dtype)
            module = copy.deepcopy(module).to(dtype)
        dtype = dtype or (first.dtype if first is not None else torch.float32)
        check_dtype_runs(module, name or type(module).__name__, device, dtype, 16 * (alignment or 1))
        info = derive_field(module, device=device, dtype=dtype, probe_size=32 * (alignment or 1))
        radius, local = info.radius, info.convolutional
        step = alignment or info.alignment
        if convolutional is None and local and radius is not None:
            size = max(32, 2 * (radius + 2 * step) + 2)
            local = measure_field(module, int(scale), alignment=step, start=size, limit=size, device=device,
                                  dtype=dtype) <= radius
            radius = radius if local else None
        return cls(module, int(scale), radius, local if convolutional is None else convolutional,
                   name or type(module).__name__, step, device, dtype, module, reference=reference)


def check_dtype_runs(call: Callable[[torch.Tensor], torch.Tensor], name: str, device: torch.device,
                     dtype: torch.dtype, size: int) -> None:
    """Refuse (`InvalidInputError`, one line) a model that cannot run in `dtype` on `device`: first what the device
    reports (`dtype_refusal`), then one forward pass of a zero image ``[1, 3, size, size]`` (an operation without a
    kernel for the dtype raises there). float32 is not checked."""
    if dtype == torch.float32:
        return
    reason = dtype_refusal(device, dtype)
    if reason is None:
        try:
            with torch.inference_mode():
                out = call(torch.zeros(1, 3, size, size, device=device, dtype=dtype))
            if not torch.isfinite(out.float()).all():
                reason = f"{name} gives non-finite values in {dtype_name(dtype)} on a zero image"
        except (RuntimeError, NotImplementedError, TypeError) as exc:
            reason = f"{name} does not run in {dtype_name(dtype)} on {device}: {str(exc).splitlines()[0][:200]}"
    if reason is not None:
        raise InvalidInputError(f"--dtype {dtype_name(dtype)}: {reason}; use --dtype fp32")


@dataclass(frozen=True)
class TilePoint:
    """Where a tile attempt is: frame index, index of the tile in the frame's list, region size, attempt (0 first)."""

    frame: int
    tile: int
    size: tuple[int, int]
    attempt: int


@dataclass
class OomOnTile:
    """Fault injector: raise a real `torch.OutOfMemoryError` on the first `times` attempts at (frame, tile)."""

    frame: int
    tile: int
    times: int = 1
    hits: list[TilePoint] = field(default_factory=list)

    def __call__(self, point: TilePoint) -> None:
        if point.frame == self.frame and point.tile == self.tile and point.attempt < self.times:
            self.hits.append(point)
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected by OomOnTile at frame {point.frame}, "
                                         f"tile {point.tile}, attempt {point.attempt})")


@dataclass
class Halving:
    """A tile that ran out of memory: frame, tile index, its region size before and the sizes after."""

    frame: int
    tile: int
    size: tuple[int, int]
    into: list[tuple[int, int]]
    error: str


@dataclass
class BatchCut:
    """A batch of tiles that ran out of memory: frame, first tile index, the tile batch before and after."""

    frame: int
    tile: int
    before: int
    after: int
    error: str


@dataclass
class UpscaleReport:
    """What `stream_upscale` did. Sizes in pixels, `peak_host_bytes` the process's peak resident set (ru_maxrss,
    whole process lifetime), `seconds` wall time."""

    model: str
    frames: int
    input_size: tuple[int, int]
    output_size: tuple[int, int]
    scale: int
    tile: int
    overlap: int
    overlap_source: str
    receptive_field: int | None
    exact: bool
    exactness: str
    tiles: int = 0
    tiles_per_frame: int = 0
    resumed_from: int = 0
    halvings: list[Halving] = field(default_factory=list)
    audio: str | None = None
    result: object = None
    peak_host_bytes: int | None = None
    seconds: float = 0.0
    first_frame: torch.Tensor | None = None
    """With ``keep_first=True``: the first frame this run upscaled, float32 ``[H*s, W*s, 3]`` (a preview)."""
    model_size: tuple[int, int] | None = None
    """``(height, width)`` the model sees (after `pre_resize`)."""
    pre_resize: str | None = None
    post_resize: str | None = None
    dtype: str = "fp32"
    dtype_error: dict | None = None
    """A float16/bfloat16 run: ``max_abs`` and ``mean_abs`` difference from float32 on ``crop`` (see
    `measure_dtype_error`), values in [0, 1]."""
    tile_batch: int = 1
    tile_batch_used: int = 1
    batch_cuts: list[BatchCut] = field(default_factory=list)
    stages: list[StageStats] = field(default_factory=list)

    def to_dict(self) -> dict:
        data = {k: v for k, v in vars(self).items() if k not in ("halvings", "first_frame", "batch_cuts", "stages")}
        data["result"] = str(self.result) if self.result is not None else None
        data["halvings"] = [vars(h) for h in self.halvings]
        data["batch_cuts"] = [vars(c) for c in self.batch_cuts]
        data["stages"] = [s.to_dict() for s in self.stages]
        return data

    def lines(self) -> list[str]:
        (h, w), (oh, ow) = self.input_size, self.output_size
        out = [f"{self.frames} frames {w}x{h} -> {ow}x{oh} ({self.scale}x, {self.model}, {self.dtype})"]
        if self.pre_resize:
            out.append(f"pre-resize: {self.pre_resize}")
        if self.post_resize:
            out.append(f"post-resize: {self.post_resize}")
        out += [f"tiles: {self.tiles} ({self.tiles_per_frame} per frame), tile {self.tile} px, overlap {self.overlap} px "
               f"({self.overlap_source}; receptive field {self.receptive_field if self.receptive_field is not None else 'unknown'} px)",
               f"seams: {self.exactness}" + ("" if self.exact else " - not exact")]
        if self.tile_batch > 1:
            out.append(f"tile batch: {self.tile_batch}" + (f" (cut to {self.tile_batch_used} after running out of "
                                                           "memory)" if self.tile_batch_used != self.tile_batch else ""))
        if self.dtype_error is not None:
            e = self.dtype_error
            out.append(f"{self.dtype}: approximate - max |{self.dtype} - fp32| {e['max_abs']:.3g}, mean "
                       f"{e['mean_abs']:.3g} (values in [0, 1]) on {e['crop']}")
        if self.resumed_from:
            out.append(f"resumed from frame {self.resumed_from}")
        out.extend(f"out of memory on frame {x.frame} tile {x.tile} ({x.size[1]}x{x.size[0]}): halved into "
                   f"{len(x.into)} tiles" for x in self.halvings)
        if self.audio:
            out.append(f"audio: {self.audio}")
        for stage in self.stages:
            device = ("" if stage.peak_device_bytes is None
                      else f", device peak {stage.peak_device_bytes / 2**20:.0f} MiB")
            host = "" if stage.peak_host_bytes is None else f", host peak {stage.peak_host_bytes / 2**20:.0f} MiB"
            out.append(f"stage {stage.name}: {stage.seconds:.2f} s over {stage.frames} frames{host}{device} "
                       f"- {stage.exactness}")
        if self.peak_host_bytes:
            out.append(f"peak host memory (process): {self.peak_host_bytes / 2**20:.0f} MiB")
        if self.result is not None:
            out.append(f"saved: {self.result}")
        return out


def resolve_overlap(model: UpscaleModel, overlap: int | str, tile: int = 512) -> tuple[int, str, bool]:
    """``(overlap px, where it came from, exact)`` for `overlap` "auto" or a number of input pixels.
    `InvalidInputError` for anything but "auto" or a number >= 0.

    "auto" for a convolutional model: its receptive field when known (derived), else measured with `measure_field`
    plus margin; for any other model (no overlap makes it exact) a feathering band of ``tile // 8``. A model is exact
    when it is convolutional and the overlap covers its receptive field (measured: with the margin)."""
    alignment = model.alignment
    if overlap == "auto":
        if not model.convolutional:
            return round_up(max(1, tile // 8), alignment), "feather band tile/8", False
        if model.receptive_field is None:
            model.receptive_field = measure_field(model.call, model.scale, alignment=alignment, device=model.device,
                                                  dtype=model.dtype)
            model.field_measured = True
        if model.field_measured:
            measured = model.receptive_field
            return auto_overlap(measured, alignment), f"measured {measured} px + margin", True
        return round_up(model.receptive_field, alignment), "derived", True
    try:
        value = int(overlap)
    except (TypeError, ValueError):
        raise InvalidInputError(f"overlap must be 'auto' or a number of input pixels >= 0, got {overlap!r}") from None
    if value < 0:
        raise InvalidInputError(f"overlap must be 'auto' or >= 0 input pixels, got {value}")
    value = round_up(value, alignment)
    needed = None if model.receptive_field is None else (
        auto_overlap(model.receptive_field, alignment) if model.field_measured else model.receptive_field)
    covers = needed is not None and value >= needed
    return value, "given", model.convolutional and covers


@dataclass
class TiledUpscaler:
    """Upscales single frames ``[3, H, W]`` (float32, CPU) with a tile plan; the plan's halvings persist.

    `tile_batch`: up to that many consecutive tiles of the same region size go through the model in one call
    (``[N, 3, h, w]``). A batch that runs out of memory is retried with half the batch (the cut persists, listed in
    `batch_cuts`); at a batch of 1 the tile itself is halved as before."""

    model: UpscaleModel
    height: int
    width: int
    tile: int
    overlap: int
    exact: bool
    fault: Callable[[TilePoint], None] | None = None
    halvings: list[Halving] = field(default_factory=list)
    tiles_run: int = 0
    tile_batch: int = 1
    batch_cuts: list[BatchCut] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.plan: list[Tile] = plan_tiles(self.height, self.width, self.tile, self.overlap, self.model.alignment)

    def _run(self, frame_index: int, batch: list[tuple[int, Tile, int]], image: torch.Tensor) -> torch.Tensor:
        """Model output ``[N, 3, h*s, w*s]`` (float32, CPU) of the N same-size tile regions in `batch`."""
        for index, tile, attempt in batch:
            if self.fault is not None:
                self.fault(TilePoint(frame_index, index, tile.region_size, attempt))
        pieces = [image[:, :, r0:r1, c0:c1] for r0, r1, c0, c1 in (tile.region for _, tile, _ in batch)]
        piece = (pieces[0] if len(pieces) == 1 else torch.cat(pieces)).to(self.model.device, self.model.dtype)
        with torch.inference_mode():
            out = self.model.call(piece)
        (h, w), s = batch[0][1].region_size, self.model.scale
        expected = (len(batch), 3, h * s, w * s)
        if tuple(out.shape) != expected:
            raise InvalidInputError(f"{self.model.name}: tiles {list(piece.shape)} gave {list(out.shape)}, "
                                    f"expected {list(expected)} (scale {s})")
        return out.float().cpu()

    def _next_batch(self, queue: deque) -> list[tuple[int, Tile, int]]:
        batch = [queue.popleft()]
        size = batch[0][1].region_size
        while len(batch) < self.tile_batch and queue and queue[0][1].region_size == size:
            batch.append(queue.popleft())
        return batch

    def upscale(self, frame_index: int, frame: torch.Tensor) -> torch.Tensor:
        """The upscaled frame ``[3, H*s, W*s]`` float32 for `frame` ``[3, H, W]`` float32 in [0, 1]."""
        s = self.model.scale
        image = frame.unsqueeze(0)
        out = torch.empty(3, self.height * s, self.width * s)
        weights = None if self.exact else torch.zeros(self.height * s, self.width * s)
        if weights is not None:
            out.zero_()
        queue = deque((index, tile, 0) for index, tile in enumerate(self.plan))
        done: list[Tile] = []
        while queue:
            batch = self._next_batch(queue)
            try:
                results = self._run(frame_index, batch, image)
            except Exception as exc:  # noqa: BLE001 - only allocator failures are retried, the rest re-raised
                if not is_out_of_memory(exc):
                    raise
                free_caches(self.model.device)
                error = str(exc).splitlines()[0][:200]
                if len(batch) > 1:
                    smaller = max(1, len(batch) // 2)
                    self.batch_cuts.append(BatchCut(frame_index, batch[0][0], self.tile_batch, smaller, error))
                    self.tile_batch = smaller
                    queue.extendleft(reversed(batch))
                    continue
                index, tile, attempt = batch[0]
                parts = split_tile(tile, self.height, self.width, self.overlap, self.model.alignment)
                if not parts:
                    raise
                self.halvings.append(Halving(frame_index, index, tile.region_size, [p.region_size for p in parts],
                                             error))
                queue.extendleft((index, part, attempt + 1) for part in reversed(parts))
                continue
            for (_, tile, _), result in zip(batch, results, strict=True):
                self.tiles_run += 1
                done.append(tile)
                r0, r1, c0, c1 = tile.region
                if weights is None:
                    a0, a1, b0, b1 = tile.core
                    out[:, a0 * s:a1 * s, b0 * s:b1 * s] = result[:, (a0 - r0) * s:(a1 - r0) * s,
                                                                  (b0 - c0) * s:(b1 - c0) * s]
                else:
                    weight = feather_weights(tile, self.height, self.width, self.overlap, s)
                    out[:, r0 * s:r1 * s, c0 * s:c1 * s] += result * weight
                    weights[r0 * s:r1 * s, c0 * s:c1 * s] += weight
        self.plan = done
        if weights is not None:
            out /= weights
        return out


def measure_dtype_error(model: UpscaleModel, frame: torch.Tensor, limit: int = 128) -> dict | None:
    """How far a float16/bfloat16 `model` is from its float32 `reference` on `frame` ``[3, H, W]``: both run on the
    top-left crop of at most `limit` px a side (a multiple of the alignment); ``{"max_abs", "mean_abs", "crop"}``
    over the output values (in [0, 1]), or None for a float32 model or one without a reference."""
    reference = model.reference
    if model.dtype == torch.float32 or reference is None:
        return None
    step = model.alignment
    h = max(step, min(frame.shape[1], limit) // step * step)
    w = max(step, min(frame.shape[2], limit) // step * step)
    crop = frame[None, :, :h, :w]
    with torch.inference_mode():
        low = model.call(crop.to(model.device, model.dtype)).float().cpu()
        high = reference.call(crop.to(reference.device, reference.dtype)).float().cpu()
    difference = (low - high).abs()
    return {"max_abs": float(difference.max()), "mean_abs": float(difference.mean()),
            "crop": f"a {w}x{h} crop of the first frame, fp32 on {reference.device}"}


@dataclass(frozen=True)
class Recipe:
    """The stages around the model: `pre_resize` / `post_resize` ``(height, width)`` or None, their Pillow
    filters (`h3director.video.resize.FILTERS`) and `tile_batch` (tiles per model call, >= 1)."""

    pre_resize: tuple[int, int] | None = None
    pre_resample: str = "area"
    post_resize: tuple[int, int] | None = None
    resample: str = "lanczos"
    tile_batch: int = 1

    @classmethod
    def build(cls, *, pre_resize: str | tuple[int, int] | None = None, pre_resample: str | None = None,
              post_resize: str | tuple[int, int] | None = None, resample: str | None = None,
              tile_batch: int = 1) -> Recipe:
        """Check and normalise the options (sizes as ``"WxH"`` or ``(height, width)``); `InvalidInputError` for a
        size that is not positive and even, an unknown filter, a filter without its resize, a tile batch < 1."""
        def size(value, what):
            if value is None or value == "":
                return None
            if isinstance(value, str):
                return parse_size(value, what)
            height, width = value
            return parse_size(f"{width}x{height}", what)

        pre, post = size(pre_resize, "--pre-resize"), size(post_resize, "--post-resize")
        if pre is None and pre_resample is not None:
            raise InvalidInputError("--pre-resample applies to --pre-resize: give --pre-resize WxH or drop it")
        if post is None and resample is not None:
            raise InvalidInputError("--resample applies to --post-resize: give --post-resize WxH or drop it")
        try:
            batch = int(tile_batch)
        except (TypeError, ValueError):
            batch = 0
        if batch < 1 or str(tile_batch).strip() != str(batch):
            raise InvalidInputError(f"--tile-batch must be a whole number >= 1, got {tile_batch!r}")
        return cls(pre, check_filter(pre_resample or "area", "--pre-resample"), post,
                   check_filter(resample or "lanczos", "--resample"), batch)

    def key(self) -> str:
        return f"{self.pre_resize}|{self.pre_resample}|{self.post_resize}|{self.resample}|{self.tile_batch}"


def job_key(model: UpscaleModel, source: FrameSource, tile: int, overlap: int, exact: bool,
            recipe: Recipe | None = None) -> str:
    """A short key naming the work, stored with a resumable `.npy` so a resume continues only the same job.

    It covers the recipe (resizes, filters, tile batch), the model's dtype and its weights (a SHA-256 of `module`'s parameters and buffers, when there is a module), so a
    partial output is not continued with another model of the same architecture and scale."""
    text = f"{model.name}|{model.scale}|{source.identity}|{tile}|{overlap}|{exact}"
    if recipe is not None and recipe != Recipe():
        text += f"|{recipe.key()}"
    if model.dtype != torch.float32:
        text += f"|{model.dtype}"
    digest = hashlib.sha256(text.encode())
    if model.module is not None:
        for name, tensor in model.module.state_dict().items():
            digest.update(f"|{name}:{tensor.dtype}:{list(tensor.shape)}|".encode())
            digest.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return "upscale:" + digest.hexdigest()[:16]


def prepare(model: UpscaleModel, source: FrameSource, tile: int, overlap: int | str,
            recipe: Recipe | None = None) -> tuple[int, str, bool]:
    """Check the model and tiling against the source (after `recipe.pre_resize`, the size the model sees)
    before anything is written: ``(overlap, source, exact)``. `InvalidInputError` for a model scale that is
    not an integer >= 1, a `tile` < 1, a bad `overlap`, or a tile too small for its overlap."""
    if model.scale < 1:
        raise InvalidInputError(f"{model.name}: scale must be an integer >= 1, got {model.scale}")
    if tile < 1:
        raise InvalidInputError(f"tile must be >= 1 input pixels, got {tile}")
    height, width = (recipe.pre_resize if recipe is not None and recipe.pre_resize is not None
                     else (source.height, source.width))
    overlap_px, where, exact = resolve_overlap(model, overlap, tile)
    if max(height, width) > tile:
        plan_tiles(height, width, tile, overlap_px, model.alignment)  # raises on a tile too small
    return overlap_px, where, exact


def _resize_note(size: tuple[int, int] | None, resample: str) -> str | None:
    return None if size is None else f"{size[1]}x{size[0]} {resample} (Pillow {pillow_version()}, float32)"


def stream_upscale(model: UpscaleModel, source: FrameSource, sink: FrameSink, *, tile: int = 512,
                   overlap: int | str = "auto", fault: Callable[[TilePoint], None] | None = None,
                   audio: tuple[torch.Tensor, int] | None = None, crop: bool = True,
                   on_frame: Callable[[int, int], None] | None = None, keep_first: bool = False,
                   recipe: Recipe | None = None) -> UpscaleReport:
    """Upscale every frame of `source` into `sink`; return an `UpscaleReport` (`result`: what `sink.finish()`
    gave). `InvalidInputError` for `audio` given to a sink that does not take it, and for a source whose
    frames differ from what it announced.

    `tile`: largest tile side in input pixels (of the frame the model sees); `overlap`: "auto" or input pixels of
    context each side; `audio`: a waveform ``([1, channels, samples] float, sample rate)`` for a sink that takes
    audio (a sink that copies a file's audio needs nothing here). ``crop=False`` forces the feathered path (for
    measuring seams). `on_frame(done, total)` is called after each frame; `keep_first` keeps a copy of the first
    upscaled frame (`first_frame`, after the post-resize). `recipe`: pre-/post-resize and tile batch (`Recipe`).
    All checks run before `sink.begin`; the sink is aborted on any failure after.
    """
    started = time.perf_counter()
    recipe = recipe or Recipe()
    overlap_px, where, exact = prepare(model, source, tile, overlap, recipe)
    exact = exact and crop
    if audio is not None and not sink.supports_audio:
        raise InvalidInputError(f"{type(sink).__name__} does not take audio; write a video file to keep the sound")
    s = model.scale
    height, width = recipe.pre_resize or (source.height, source.width)
    out_height, out_width = recipe.post_resize or (height * s, width * s)
    spec = StreamSpec(batch=1, channels=3, frames=source.count, height=out_height, width=out_width,
                      fps=source.fps, pixel_mean=UNIT_PIXELS[0], pixel_std=UNIT_PIXELS[1])
    upscaler = TiledUpscaler(model, height, width, tile, overlap_px, exact, fault, tile_batch=recipe.tile_batch)
    report = UpscaleReport(model.name, source.count, (source.height, source.width), (spec.height, spec.width), s,
                           tile, overlap_px, where, model.receptive_field, exact, EXACT if exact else APPROXIMATE,
                           tiles_per_frame=len(upscaler.plan), model_size=(height, width),
                           pre_resize=_resize_note(recipe.pre_resize, recipe.pre_resample),
                           post_resize=_resize_note(recipe.post_resize, recipe.resample),
                           dtype=dtype_name(model.dtype), tile_batch=recipe.tile_batch)
    clock = StageClock(model.device)
    clock.add("read", "as decoded")
    if recipe.pre_resize is not None:
        clock.add("pre-resize", f"deterministic, {report.pre_resize}")
    clock.add("model", report.exactness + ("" if model.dtype == torch.float32 else f"; {report.dtype}: approximate")
              + ("" if recipe.tile_batch == 1 else f"; tile batch {recipe.tile_batch}"))
    if recipe.post_resize is not None:
        clock.add("post-resize", f"deterministic, {report.post_resize}")
    clock.add("write", "quantised by the sink: uint8 .npy or H.264")
    sink.begin(spec)
    try:
        if audio is not None:
            sink.write_audio(audio[0], int(audio[1]))
            report.audio = f"{audio[0].shape[-1]} samples at {int(audio[1])} Hz, encoded"
        report.resumed_from = start = min(sink.resume_from(), source.count)
        index = start
        frames = source.frames(start)
        while True:
            with clock.measure("read") as state:
                frame = next(frames, None)
                state["frame"] = frame is not None
            if frame is None:
                break
            if tuple(frame.shape) != (source.height, source.width, 3):
                raise InvalidInputError(f"frame {index}: expected [{source.height}, {source.width}, 3], "
                                        f"got {list(frame.shape)}")
            frame = frame.permute(2, 0, 1).contiguous()
            if recipe.pre_resize is not None:
                with clock.measure("pre-resize"):
                    frame = resize_frame(frame, recipe.pre_resize, recipe.pre_resample)
            if report.dtype_error is None and index == start:
                report.dtype_error = measure_dtype_error(model, frame)
            with clock.measure("model"):
                result = upscaler.upscale(index, frame)
            if recipe.post_resize is not None:
                with clock.measure("post-resize"):
                    result = resize_frame(result, recipe.post_resize, recipe.resample)
            with clock.measure("write"):
                sink.write(index, result.clamp_(0, 1)[None, :, None])
            if keep_first and report.first_frame is None:
                report.first_frame = result.permute(1, 2, 0).clone()
            del result, frame
            index += 1
            if on_frame is not None:
                on_frame(index, source.count)
        if index != source.count:
            raise InvalidInputError(f"the source gave {index} frames, {source.count} were announced")
        report.result = sink.finish()
    except BaseException:
        sink.abort()
        raise
    packets = getattr(sink, "audio_packets", None)
    if packets:
        report.audio = f"{packets} packets copied unchanged from {getattr(sink, 'audio_path', 'the source')}"
    report.tiles = upscaler.tiles_run
    report.halvings = upscaler.halvings
    report.batch_cuts = upscaler.batch_cuts
    report.tile_batch_used = upscaler.tile_batch
    report.stages = clock.report()
    report.peak_host_bytes = clock.peak_host_bytes()
    report.seconds = time.perf_counter() - started
    return report


__all__ = ["BatchCut", "Halving", "OomOnTile", "Recipe", "TilePoint", "TiledUpscaler", "UpscaleModel",
           "UpscaleReport", "check_dtype_runs", "job_key", "prepare", "resolve_overlap", "stream_upscale"]
