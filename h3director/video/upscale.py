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

Out of memory: a tile that raises an allocator error (`h3director.core.oom.is_out_of_memory`) is replaced by its core
cut in half on each side (same overlap, so on the centre-crop path the result does not change; a feathered blend
follows the smaller tiles) and retried; the halving sticks for the rest of
the video. Frames already handed to the sink are never redone; a `MemmapSink(resume=True)` starts after the frames an
interrupted run finished.
"""

from __future__ import annotations

import hashlib
import resource
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from h3director.core.oom import is_out_of_memory
from h3director.errors import InvalidInputError
from h3director.video.faults import free_memory
from h3director.video.sink import FrameSink, StreamSpec
from h3director.video.upscale_field import auto_overlap, derive_field, measure_field
from h3director.video.upscale_sources import FrameSource
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

    @classmethod
    def from_module(cls, module: torch.nn.Module, scale: int, *, name: str | None = None,
                    convolutional: bool | None = None, alignment: int | None = None) -> UpscaleModel:
        """Wrap a plain torch module; its receptive field, alignment and whether it is convolutional are derived
        from its layers (`derive_field`) unless given.

        The derivation sees layers only, not operations written in `forward` (``x.mean((2, 3))``, a functional
        interpolation); so a derived field is checked with one probe (`measure_field` on an image a little over
        twice the field, two forward passes): a change reaching farther than the derived field makes the model
        not convolutional (feathered, reported not exact)."""
        first = next(module.parameters(), None)
        device = first.device if first is not None else torch.device("cpu")
        dtype = first.dtype if first is not None else torch.float32
        info = derive_field(module, device=device, dtype=dtype, probe_size=32 * (alignment or 1))
        radius, local = info.radius, info.convolutional
        step = alignment or info.alignment
        if convolutional is None and local and radius is not None:
            size = max(32, 2 * (radius + 2 * step) + 2)
            local = measure_field(module, int(scale), alignment=step, start=size, limit=size, device=device,
                                  dtype=dtype) <= radius
            radius = radius if local else None
        return cls(module, int(scale), radius, local if convolutional is None else convolutional,
                   name or type(module).__name__, step, device, dtype, module)


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

    def to_dict(self) -> dict:
        data = {k: v for k, v in vars(self).items() if k not in ("halvings", "first_frame")}
        data["result"] = str(self.result) if self.result is not None else None
        data["halvings"] = [vars(h) for h in self.halvings]
        return data

    def lines(self) -> list[str]:
        (h, w), (oh, ow) = self.input_size, self.output_size
        out = [f"{self.frames} frames {w}x{h} -> {ow}x{oh} ({self.scale}x, {self.model})",
               f"tiles: {self.tiles} ({self.tiles_per_frame} per frame), tile {self.tile} px, overlap {self.overlap} px "
               f"({self.overlap_source}; receptive field {self.receptive_field if self.receptive_field is not None else 'unknown'} px)",
               f"seams: {self.exactness}" + ("" if self.exact else " - not exact")]
        if self.resumed_from:
            out.append(f"resumed from frame {self.resumed_from}")
        out.extend(f"out of memory on frame {x.frame} tile {x.tile} ({x.size[1]}x{x.size[0]}): halved into "
                   f"{len(x.into)} tiles" for x in self.halvings)
        if self.audio:
            out.append(f"audio: {self.audio}")
        if self.peak_host_bytes:
            out.append(f"peak host memory (process): {self.peak_host_bytes / 2**20:.0f} MiB")
        if self.result is not None:
            out.append(f"saved: {self.result}")
        return out


def resolve_overlap(model: UpscaleModel, overlap: int | str, tile: int = 512) -> tuple[int, str, bool]:
    """``(overlap px, where it came from, exact)`` for `overlap` "auto" or a number of input pixels.

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
    """Upscales single frames ``[3, H, W]`` (float32, CPU) with a tile plan; the plan's halvings persist."""

    model: UpscaleModel
    height: int
    width: int
    tile: int
    overlap: int
    exact: bool
    fault: Callable[[TilePoint], None] | None = None
    halvings: list[Halving] = field(default_factory=list)
    tiles_run: int = 0

    def __post_init__(self) -> None:
        self.plan: list[Tile] = plan_tiles(self.height, self.width, self.tile, self.overlap, self.model.alignment)

    def _run(self, frame_index: int, index: int, tile: Tile, attempt: int, image: torch.Tensor) -> torch.Tensor:
        if self.fault is not None:
            self.fault(TilePoint(frame_index, index, tile.region_size, attempt))
        r0, r1, c0, c1 = tile.region
        piece = image[:, :, r0:r1, c0:c1].to(self.model.device, self.model.dtype)
        with torch.inference_mode():
            out = self.model.call(piece)
        expected = (1, 3, (r1 - r0) * self.model.scale, (c1 - c0) * self.model.scale)
        if tuple(out.shape) != expected:
            raise InvalidInputError(f"{self.model.name}: a tile [1, 3, {r1 - r0}, {c1 - c0}] gave {list(out.shape)}, "
                                    f"expected {list(expected)} (scale {self.model.scale})")
        return out.float().cpu()[0]

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
            index, tile, attempt = queue.popleft()
            try:
                result = self._run(frame_index, index, tile, attempt, image)
            except Exception as exc:  # noqa: BLE001 - only allocator failures are retried, the rest re-raised
                if not is_out_of_memory(exc):
                    raise
                free_memory(self.model.device)
                parts = split_tile(tile, self.height, self.width, self.overlap, self.model.alignment)
                if not parts:
                    raise
                self.halvings.append(Halving(frame_index, index, tile.region_size, [p.region_size for p in parts],
                                             str(exc).splitlines()[0][:200]))
                queue.extendleft((index, part, attempt + 1) for part in reversed(parts))
                continue
            self.tiles_run += 1
            done.append(tile)
            r0, r1, c0, c1 = tile.region
            if weights is None:
                a0, a1, b0, b1 = tile.core
                out[:, a0 * s:a1 * s, b0 * s:b1 * s] = result[:, (a0 - r0) * s:(a1 - r0) * s, (b0 - c0) * s:(b1 - c0) * s]
            else:
                weight = feather_weights(tile, self.height, self.width, self.overlap, s)
                out[:, r0 * s:r1 * s, c0 * s:c1 * s] += result * weight
                weights[r0 * s:r1 * s, c0 * s:c1 * s] += weight
        self.plan = done
        if weights is not None:
            out /= weights
        return out


def job_key(model: UpscaleModel, source: FrameSource, tile: int, overlap: int, exact: bool) -> str:
    """A short key naming the work, stored with a resumable `.npy` so a resume continues only the same job.

    It covers the model's weights (a SHA-256 of `module`'s parameters and buffers, when there is a module), so a
    partial output is not continued with another model of the same architecture and scale."""
    digest = hashlib.sha256(f"{model.name}|{model.scale}|{source.identity}|{tile}|{overlap}|{exact}".encode())
    if model.module is not None:
        for name, tensor in model.module.state_dict().items():
            digest.update(f"|{name}:{tensor.dtype}:{list(tensor.shape)}|".encode())
            digest.update(tensor.detach().cpu().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes())
    return "upscale:" + digest.hexdigest()[:16]


def prepare(model: UpscaleModel, source: FrameSource, tile: int, overlap: int | str) -> tuple[int, str, bool]:
    """Check the model and tiling against the source before anything is written: ``(overlap, source, exact)``."""
    if model.scale < 1:
        raise InvalidInputError(f"{model.name}: scale must be an integer >= 1, got {model.scale}")
    if tile < 1:
        raise InvalidInputError(f"tile must be >= 1 input pixels, got {tile}")
    overlap_px, where, exact = resolve_overlap(model, overlap, tile)
    if max(source.height, source.width) > tile:
        plan_tiles(source.height, source.width, tile, overlap_px, model.alignment)  # raises on a tile too small
    return overlap_px, where, exact


def _peak_rss() -> int | None:
    """The process's peak resident set in bytes: VmHWM where /proc has it (ru_maxrss carries a forking parent's peak
    over execve on Linux), else ru_maxrss."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration, ValueError):
        pass
    usage = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(usage) if sys.platform == "darwin" else int(usage) * 1024


def stream_upscale(model: UpscaleModel, source: FrameSource, sink: FrameSink, *, tile: int = 512,
                   overlap: int | str = "auto", fault: Callable[[TilePoint], None] | None = None,
                   audio: tuple[torch.Tensor, int] | None = None, crop: bool = True,
                   on_frame: Callable[[int, int], None] | None = None, keep_first: bool = False) -> UpscaleReport:
    """Upscale every frame of `source` into `sink`; return an `UpscaleReport` (`result`: what `sink.finish()` gave).

    `tile`: largest tile side in input pixels; `overlap`: "auto" or input pixels of context each side; `audio`: a
    waveform ``([1, channels, samples] float, sample rate)`` for a sink that takes audio (a sink that copies a file's
    audio needs nothing here). ``crop=False`` forces the feathered path (for measuring seams). `on_frame(done,
    total)` is called after each frame; `keep_first` keeps a copy of the first upscaled frame (`first_frame`).
    All checks run before `sink.begin`; the sink is aborted on any failure after.
    """
    started = time.perf_counter()
    overlap_px, where, exact = prepare(model, source, tile, overlap)
    exact = exact and crop
    if audio is not None and not sink.supports_audio:
        raise InvalidInputError(f"{type(sink).__name__} does not take audio; write a video file to keep the sound")
    s = model.scale
    spec = StreamSpec(batch=1, channels=3, frames=source.count, height=source.height * s, width=source.width * s,
                      fps=source.fps, pixel_mean=UNIT_PIXELS[0], pixel_std=UNIT_PIXELS[1])
    upscaler = TiledUpscaler(model, source.height, source.width, tile, overlap_px, exact, fault)
    report = UpscaleReport(model.name, source.count, (source.height, source.width), (spec.height, spec.width), s,
                           tile, overlap_px, where, model.receptive_field, exact, EXACT if exact else APPROXIMATE,
                           tiles_per_frame=len(upscaler.plan))
    sink.begin(spec)
    try:
        if audio is not None:
            sink.write_audio(audio[0], int(audio[1]))
            report.audio = f"{audio[0].shape[-1]} samples at {int(audio[1])} Hz, encoded"
        report.resumed_from = start = min(sink.resume_from(), source.count)
        index = start
        for frame in source.frames(start):
            if tuple(frame.shape) != (source.height, source.width, 3):
                raise InvalidInputError(f"frame {index}: expected [{source.height}, {source.width}, 3], "
                                        f"got {list(frame.shape)}")
            result = upscaler.upscale(index, frame.permute(2, 0, 1).contiguous())
            sink.write(index, result.clamp_(0, 1)[None, :, None])
            if keep_first and report.first_frame is None:
                report.first_frame = result.permute(1, 2, 0).clone()
            del result
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
    report.peak_host_bytes = _peak_rss()
    report.seconds = time.perf_counter() - started
    return report
