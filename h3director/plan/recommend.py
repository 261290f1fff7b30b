"""Choose settings that fit a device budget, with a safety margin, and say what does not fit and why.

Search order (first fit wins; exact savings before ones that cost speed, speed before quality):

1. text encoder: on the accelerator in bf16, then fp8; else on the CPU (host RAM) in bf16, then fp8 (GGUF text
   encoders are not offered: nothing loads a GGUF Qwen3-VL);
2. DiT: weights format from best to most compressed among those the target loads
   (`capabilities.dit_formats(target)`: bf16, fp8, int8 (ComfyUI only), q8_0, q6_k, q5_k, q4_k_m, q4_k; or the
   one the user fixed); for each, the least attention head / FFN chunking that fits with the DiT resident
   (exact, about as fast); else block offload of 0..50 blocks (exact, slower: each step streams the
   offloaded blocks over the bus) with the chunking that needs the fewest offloaded blocks;
3. decode: the reference tiled path, else streamed tiling with 4, 2, 1 tiles per call; the sink
   uint8 frames if the whole video fits host RAM, else memmap / video file;
4. if no setting fits the whole length: long-form generation in chunks on the 17n+5 grid, each
   chunk conditioned on the previous chunk's last `geometry.CHAIN_OVERLAP` frames (22: one encoder clip
   plus the grid's 5); the longest chunk that fits is found by bisection over the grid (every phase's
   bytes grow with the chunk's length), so a plan costs the same few hundred estimates whatever the length.

`Budget.device_usable` = VRAM x (1 - margin) - reserve (CUDA context and allocator slack);
`Budget.host_usable` = RAM x (1 - margin). On a CPU-only or MPS budget (`Budget.unified`) model and
buffers share one memory: a phase fits when its device and host bytes together fit `host_usable`, and
on the CPU the text encoder is placed on the CPU. A returned `Recommendation` always fits its own estimate.

Every setting chosen has an executor in the target (`plan.capabilities`; `recommend(..., target=...)`), and
`Recommendation.applied()` says which node input or library call applies each one. The decode buffer pool
(`pre_allocated_pool_mb`) is sized on what it serves, the streamed decode's clip buffers
(`plan.decode.clip_buffer_bytes`, whole GiB), and recommended only when it fits beside every phase (it is held
for the process).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from h3director import geometry
from h3director.errors import BudgetError
from h3director.plan import capabilities
from h3director.plan.activations import DiTShape
from h3director.plan.decode import clip_buffer_bytes
from h3director.plan.estimate import Phase, PlanEstimate, PlanRequest, estimate
from h3director.plan.formats import weight_format
from h3director.plan.quantised_tiers import tiers_for
from h3director.units import GiB, MiB, format_size

# Every DiT format some target loads, best first; `recommend` narrows it to its target's.
DIT_FORMATS = tuple(dict.fromkeys(f for t in capabilities.TARGETS for f in capabilities.dit_formats(t)))
# (device, format), best first: no GGUF text encoder (no loader reads a GGUF Qwen3-VL).
TEXT_ENCODER_CHOICES = (("gpu", "bf16"), ("gpu", "fp8"), ("cpu", "bf16"), ("cpu", "fp8"))
DEFAULT_TARGET = "comfyui"
# (head chunks, FFN chunks), cheapest to run first: stock, then the DiT memory tiers in the order
# `h3director.dit.tiers.escalation_ladder` walks them (FFN row chunks, then head groups with them).
CHUNKINGS = ((1, 1), (1, 2), (2, 8), (4, 8), (8, 16), (14, 28), (28, 56), (56, 112))
DIT_MEMORY_TITLE = "H3Director DiT Memory"   # the node's display name (its id: capabilities.DIT_MEMORY_NODE)
DECODE_TILES = (None, 4, 2, 1)
SINK_ORDER = ("uint8", "memmap")
DEFAULT_MARGIN = 0.10
DEFAULT_RESERVE = 768 * MiB


@dataclass(frozen=True)
class Budget:
    """Memory available to one generation, in bytes. `device` is "cuda", "mps" or "cpu";
    `compute_capability`: (major, minor) of the CUDA device, None when not known (it decides whether nvfp4
    weights run their own kernel: `plan.quantised_tiers`)."""

    device_bytes: int
    host_bytes: int
    device: str = "cuda"
    margin: float = DEFAULT_MARGIN
    reserve_bytes: int = DEFAULT_RESERVE
    compute_capability: tuple[int, int] | None = None

    @property
    def device_usable(self) -> int:
        return int(self.device_bytes * (1 - self.margin)) - self.reserve_bytes

    @property
    def host_usable(self) -> int:
        return int(self.host_bytes * (1 - self.margin))

    @property
    def unified(self) -> bool:
        """One memory for model and buffers (CPU-only, or Apple's unified memory under MPS)."""
        return self.device in ("cpu", "mps")

    def phase_fits(self, phase: Phase) -> bool:
        if self.unified:             # one memory: the device phases and the host buffers share it
            return phase.device_bytes + phase.host_bytes <= self.host_usable
        return phase.device_bytes <= self.device_usable and phase.host_bytes <= self.host_usable

    def fits(self, plan: PlanEstimate) -> bool:
        return all(self.phase_fits(phase) for phase in plan.phases)


@dataclass(frozen=True)
class SegmentPlan:
    """One segment of a long-form chain: its frames, the latent frames it is conditioned on (0 for the
    first), and the predicted peaks of its generation with the recommendation's settings, in bytes."""

    frames: int
    conditioning_latent_frames: int
    peak_device_bytes: int
    peak_host_bytes: int


@dataclass(frozen=True)
class LongForm:
    """Generate the chain `segments` (frame counts on the 17n+5 grid, from `geometry.chain_segments`), each
    segment after the first conditioned on the previous one's last `overlap_frames` frames, so that
    ``sum(segments) - (chunks - 1) * overlap_frames`` is exactly the requested length.

    `chunk_frames` is the longest segment, `chunks` their number, `max_chunk_frames` the longest segment
    that fits the budget (the chain is balanced below it); `plans` prices each segment."""

    chunk_frames: int
    overlap_frames: int
    chunks: int
    segments: tuple[int, ...] = ()
    max_chunk_frames: int = 0
    plans: tuple[SegmentPlan, ...] = ()

    @property
    def total_frames(self) -> int:
        """Frames of the stitched video: the segments minus one overlap per join."""
        return sum(self.segments) - (len(self.segments) - 1) * self.overlap_frames


@dataclass(frozen=True)
class Recommendation:
    """The chosen settings (`request`), their estimate, and what was rejected and why."""

    request: PlanRequest
    estimate: PlanEstimate
    budget: Budget
    long_form: LongForm | None = None
    rejected: tuple[str, ...] = field(default_factory=tuple)
    target: str = DEFAULT_TARGET
    pool_mb: int = 0
    pool_note: str = ""

    def applied(self) -> tuple[capabilities.AppliedSetting, ...]:
        """Each chosen setting with the node input or library call that applies it in `target`."""
        decode = _phase(self.estimate, "decode")
        return capabilities.applied_settings(self.request, self.target, decode_device_bytes=decode.device_bytes,
                                             pool_mb=self.pool_mb, long_form=self.long_form)

    def settings(self) -> dict:
        r = self.request
        settings = {
            "weights": r.weights, "offload_blocks": r.offload_blocks, "head_chunks": r.head_chunks,
            "ffn_chunks": r.ffn_chunks, "text_encoder": f"{r.text_encoder_weights} on {r.text_encoder_device}",
            "decode_tiles_per_call": r.decode_tiles_per_call, "sink": r.sink,
            "keep_dit_during_decode": r.keep_dit_during_decode,
            "dit_memory": dit_memory_settings(r.head_chunks, r.ffn_chunks),
        }
        if self.long_form:
            settings["long_form"] = dataclasses.asdict(self.long_form)
        return settings

    def to_dict(self) -> dict:
        return {
            "fits": True,
            "settings": self.settings(),
            "device_usable_bytes": self.budget.device_usable,
            "host_usable_bytes": self.budget.host_usable,
            "peak_device_bytes": self.estimate.peak_device_bytes,
            "peak_host_bytes": self.estimate.peak_host_bytes,
            "target": self.target,
            "applied": [a.to_dict() for a in self.applied()],
            "pool": {"recommended_mb": self.pool_mb, "config_key": capabilities.POOL_CONFIG_KEY,
                     "serves": "streamed decode clip buffers", "note": self.pool_note},
            "does_not_fit": list(self.rejected),
            "notes": list(self.estimate.notes),
        }

    def summary(self) -> str:
        s = self.settings()
        unified = self.budget.unified
        blocks = DiTShape.from_config(self.request.dit_config).layers
        lines = [
            f"Recommendation ({self.budget.device}, one memory: usable {format_size(self.budget.host_usable)}):"
            if unified else f"Recommendation (device usable {format_size(self.budget.device_usable)}, "
            f"host usable {format_size(self.budget.host_usable)}):",
            f"  text encoder      {s['text_encoder']} (unloaded before sampling)",
            f"  DiT weights       {s['weights']}, all {blocks} blocks in the one memory" if unified else
            f"  DiT weights       {s['weights']}, {s['offload_blocks']} of {blocks} blocks offloaded to host RAM",
            f"  chunking          {s['head_chunks']} attention head chunks, {s['ffn_chunks']} FFN chunks",
            f"  DiT memory        {s['dit_memory']['advice']}",
            "  decode            " + ("reference tiled path" if s["decode_tiles_per_call"] is None
                                      else f"streamed tiling, {s['decode_tiles_per_call']} tile(s) per call")
            + f", sink {s['sink']}, DiT unloaded first",
        ]
        if self.long_form:
            lf = self.long_form
            lengths = " + ".join(str(f) for f in lf.segments)
            lines.append(f"  long-form         {lf.chunks} segments ({lengths} frames), {lf.overlap_frames}-frame "
                         f"overlap -> {lf.total_frames} frames; join with `h3director stitch --overlap "
                         f"{lf.overlap_frames}`")
            for i, plan in enumerate(lf.plans):
                lines.append(f"    segment {i + 1}: {plan.frames} frames, {plan.conditioning_latent_frames} latent "
                             f"frames of conditioning, peak device {format_size(plan.peak_device_bytes)}, "
                             f"host {format_size(plan.peak_host_bytes)}")
        if unified:
            need = max(p.device_bytes + p.host_bytes for p in self.estimate.phases)
            lines.append(f"  predicted peak    {format_size(need)} (device and host columns together)")
        else:
            lines.append(f"  predicted peak    device {format_size(self.estimate.peak_device_bytes)}, "
                         f"host {format_size(self.estimate.peak_host_bytes)}")
        lines.append(f"How to apply ({self.target}):")
        lines += [f"  {a.capability:<26}{a.text}: {a.how()}" for a in self.applied()]
        if not self.pool_mb:
            lines.append(f"  {'memory.pool':<26}no pool ({capabilities.POOL_CONFIG_KEY}: 0): {self.pool_note}")
        lines += [f"  note: {note}" for note in self.estimate.notes]
        if self.rejected:
            lines.append("Does not fit:")
            lines += [f"  - {reason}" for reason in self.rejected]
        return "\n".join(lines)


def dit_memory_settings(head_chunks: int, ffn_chunks: int) -> dict:
    """How to run `head_chunks` x `ffn_chunks` (counts), as a dict: ``node`` (the ComfyUI node's display name,
    None for the stock (1, 1) block), its ``mode``, ``head_chunks`` and ``ffn_chunks`` inputs, the
    ``diffusers`` call, and an ``advice`` line.

    (1, 1) is the stock block: nothing to install. Otherwise the node "H3Director DiT Memory" in mode
    fixed with those counts (mode auto starts from them and escalates per forward when the device has
    less than planned), or `h3director.integrations.diffusers_dit.apply_memory_plan` in diffusers."""
    if (head_chunks, ffn_chunks) == (1, 1):
        return {"node": None, "advice": "stock DiT blocks: no DiT memory node needed"}
    call = f"apply_memory_plan(transformer, head_chunks={head_chunks}, ffn_chunks={ffn_chunks})"
    node = f'{DIT_MEMORY_TITLE}: mode fixed, head_chunks {head_chunks}, ffn_chunks {ffn_chunks}'
    return {"node": DIT_MEMORY_TITLE, "mode": "fixed", "head_chunks": head_chunks, "ffn_chunks": ffn_chunks,
            "diffusers": call,
            "advice": f'node "{node}" (or mode auto, which starts there); diffusers: {call}'}


def _replace(request: PlanRequest, **changes) -> PlanRequest:
    return dataclasses.replace(request, **changes)


def _phase(plan: PlanEstimate, name: str):
    return next(p for p in plan.phases if p.name == name)


def _phase_fits(budget: Budget, plan: PlanEstimate, name: str) -> bool:
    return budget.phase_fits(_phase(plan, name))


def _text_encoder_choices(budget: Budget, target: str = DEFAULT_TARGET) -> tuple[tuple[str, str], ...]:
    """(device, format) pairs to try, best first, in formats `target` loads; a CPU-only budget has no accelerator
    to place it on."""
    formats = capabilities.text_encoder_formats(target)
    choices = tuple(choice for choice in TEXT_ENCODER_CHOICES if choice[1] in formats)
    if budget.device == "cpu":
        return tuple(choice for choice in choices if choice[0] == "cpu")
    return choices


def _choose_text_encoder(request: PlanRequest, budget: Budget, rejected: list[str],
                         target: str = DEFAULT_TARGET) -> PlanRequest:
    choices = _text_encoder_choices(budget, target)
    for device, fmt in choices:
        candidate = _replace(request, text_encoder_device=device, text_encoder_weights=fmt)
        if _phase_fits(budget, estimate(candidate), "text_encoding"):
            if (device, fmt) != choices[0]:
                first_device, first_fmt = choices[0]
                first = _phase(estimate(_replace(request, text_encoder_device=first_device,
                                                 text_encoder_weights=first_fmt)), "text_encoding")
                if budget.unified:
                    rejected.append(f"text encoder {first_fmt} needs {format_size(first.device_bytes + first.host_bytes)}"
                                    " of the one memory")
                else:
                    rejected.append(f"text encoder {first_fmt} on the accelerator needs "
                                    f"{format_size(first.device_bytes)}")
            return candidate
    raise BudgetError("the text encoder fits neither the accelerator nor host RAM in any format "
                      f"(smallest: {choices[-1][1]} on the CPU); host usable {format_size(budget.host_usable)}")


def pool_recommendation(plan: PlanEstimate, budget: Budget) -> tuple[int, str]:
    """(pre_allocated_pool_mb, why) for `plan` on `budget`: the streamed decode's clip buffers
    (`clip_buffer_bytes` at the plan's canvas and VAE dtype) rounded up to whole GiB, as the config requires;
    0 when that pool, held on the device through every phase, would not fit beside some phase's need."""
    r = plan.request
    served = clip_buffer_bytes(dict(r.vae_config or {}), r.height, r.width, r.vae_dtype)
    pool = math.ceil(served / GiB) * GiB
    for phase in plan.phases:
        grown = dataclasses.replace(phase, working_bytes=phase.working_bytes + pool)
        if not budget.phase_fits(grown):
            return 0, (f"a {pool // MiB} MiB pool for the decode's {format_size(served)} of clip buffers, held "
                       f"through every phase, does not fit beside {phase.name}")
    return pool // MiB, (f"serves the streamed decode's clip buffers ({format_size(served)} per clip: finished "
                         "clip + cross-fade tail), rounded up to whole GiB; held for the process")


def chunkings(heads: int, fmt: str = "bf16", target: str = DEFAULT_TARGET) -> tuple[tuple[int, int], ...]:
    """The (head chunks, FFN chunks) pairs of `CHUNKINGS` whose head chunks divide the DiT's `heads`, least
    chunked first, with FFN chunks only where they act on `fmt`'s linears in `target`
    (`plan.quantised_tiers.tiers_for`: the capability registry's `check_chunking` refuses the others)."""
    ffn_acts = tiers_for(fmt, target).ffn_chunks
    pairs = ((h, ffn if ffn_acts else 1) for h, ffn in CHUNKINGS if heads % h == 0)
    return tuple(dict.fromkeys(pairs))


def _fewest_offloaded(base: PlanRequest, budget: Budget, blocks: int) -> PlanRequest | None:
    """`base` with the fewest offloaded DiT blocks whose sampling phase fits (None if even all do not)."""
    if not _phase_fits(budget, estimate(_replace(base, offload_blocks=blocks)), "sampling"):
        return None
    low, high = 0, blocks                          # monotone in the count: bisection
    while low < high:
        mid = (low + high) // 2
        if _phase_fits(budget, estimate(_replace(base, offload_blocks=mid)), "sampling"):
            high = mid
        else:
            low = mid + 1
    return _replace(base, offload_blocks=low)


def choose_dit(request: PlanRequest, budget: Budget, formats: Sequence[str]) -> PlanRequest | None:
    """The `request` with the DiT settings to run it within `budget` (bytes), or None when no format of
    `formats` fits. Per weights format, in order: the least chunking that fits with the DiT resident; else,
    since offloaded blocks cross the bus every step while the chunked tiers are exact and cost little time,
    the chunking that needs the fewest offloaded blocks (the less chunked one on a tie)."""
    shape = DiTShape.from_config(request.dit_config)
    for fmt in formats:
        bases = [_replace(request, weights=fmt, head_chunks=heads, ffn_chunks=ffn, offload_blocks=0)
                 for heads, ffn in chunkings(shape.heads, fmt, request.target)]
        for base in bases:
            if _phase_fits(budget, estimate(base), "sampling"):
                return base
        best = None
        for base in bases:
            candidate = _fewest_offloaded(base, budget, shape.layers)
            if candidate is not None and (best is None or candidate.offload_blocks < best.offload_blocks):
                best = candidate
        if best is not None:
            return best
    return None


def choose_decode(request: PlanRequest, budget: Budget) -> PlanRequest | None:
    """The first decode setting, sinks in `SINK_ORDER` and tiles per call in `DECODE_TILES` order, whose decode
    phase fits `budget`; None when none does."""
    for sink in SINK_ORDER:
        for tiles in DECODE_TILES:
            candidate = _replace(request, decode_tiles_per_call=tiles, sink=sink, keep_dit_during_decode=False)
            if _phase_fits(budget, estimate(candidate), "decode"):
                return candidate
    return None


def _fit_length(request: PlanRequest, budget: Budget, formats: Sequence[str],
                rejected: list[str]) -> PlanRequest | None:
    chosen = choose_dit(request, budget, formats)
    if chosen is None:
        return None
    chosen = choose_decode(chosen, budget)
    if chosen is None:
        rejected.append("decoding even one tile per call does not fit the accelerator")
        return None
    return chosen if budget.fits(estimate(chosen)) else None


def _longest_chunk(request: PlanRequest, budget: Budget, formats: Sequence[str],
                   overlap: int) -> tuple[int, PlanRequest] | None:
    """The longest chunk on the 17n+5 grid, longer than `overlap` and shorter than `request.frames`, whose
    generation (conditioned on `overlap` frames of the previous chunk) fits; with its settings.

    Bisection over n: every phase's bytes grow with the chunk's length, so if a chunk fits, every
    shorter one does; about log2(frames / 17) fits are tried instead of one per grid step."""
    cond = geometry.latent_frames_for(overlap)

    def fit(n: int) -> PlanRequest | None:
        frames = geometry.CLIP_LENGTH * n + 5
        return _fit_length(_replace(request, frames=frames, keyframes=request.keyframes + cond), budget, formats, [])

    low = (overlap - 5) // geometry.CLIP_LENGTH + 1            # shortest chunk longer than the overlap
    high = (geometry.nearest_grid_frames(request.frames - 1)[0] - 5) // geometry.CLIP_LENGTH
    if high < low:
        return None
    best = fit(low)
    if best is None:
        return None
    while low < high:                                          # invariant: chunk n=low fits (settings `best`)
        mid = (low + high + 1) // 2
        chosen = fit(mid)
        if chosen is None:
            high = mid - 1
        else:
            low, best = mid, chosen
    return geometry.CLIP_LENGTH * low + 5, best


def _chain(request: PlanRequest, budget: Budget, formats: Sequence[str], longest: int, overlap: int,
           rejected: list[str]) -> Recommendation:
    """The chain sized to `request.frames` with segments of at most `longest` frames (which fits), the
    settings for its longest segment (conditioned on `overlap` frames), and each segment priced with them."""
    segments = geometry.chain_segments(request.frames, longest, overlap)
    cond = geometry.latent_frames_for(overlap)
    chosen = _fit_length(_replace(request, frames=max(segments), keyframes=request.keyframes + cond), budget,
                         formats, [])
    if chosen is None:   # pragma: no cover - a chunk no longer than one that fits always fits
        raise AssertionError(f"a {max(segments)}-frame segment does not fit though {longest} frames do")
    priced: dict[tuple[int, int], SegmentPlan] = {}      # at most 3 distinct segments: O(1) estimates
    plans = []
    for i, frames in enumerate(segments):
        key = (frames, cond if i else 0)
        if key not in priced:
            seg = estimate(_replace(chosen, frames=frames, keyframes=request.keyframes + key[1]))
            priced[key] = SegmentPlan(frames=frames, conditioning_latent_frames=key[1],
                                      peak_device_bytes=seg.peak_device_bytes, peak_host_bytes=seg.peak_host_bytes)
        plans.append(priced[key])
    long_form = LongForm(chunk_frames=max(segments), overlap_frames=overlap, chunks=len(segments),
                         segments=segments, max_chunk_frames=longest, plans=tuple(plans))
    return Recommendation(chosen, estimate(chosen), budget, long_form=long_form, rejected=tuple(rejected))


def recommend(request: PlanRequest, budget: Budget | int, *, formats: Sequence[str] | None = None,
              host_bytes: int | None = None, target: str = DEFAULT_TARGET) -> Recommendation:
    """Settings for `request` that fit `budget` (a `Budget`, or device bytes plus `host_bytes`;
    `host_bytes` None = this machine's available RAM, read with psutil), every one with an executor in
    `target` ("comfyui" or "diffusers", `plan.capabilities`).

    `formats`: the DiT weight formats allowed, best first (default: those `target` loads,
    `capabilities.dit_formats`). Raises `InvalidInputError` for a format `target` cannot load, `BudgetError`
    naming the smallest need when nothing fits, not even long-form chunks.
    """
    rec = _recommend(request, budget, formats=formats, host_bytes=host_bytes, target=target)
    pool_mb, note = pool_recommendation(rec.estimate, rec.budget)
    return dataclasses.replace(rec, target=target, pool_mb=pool_mb, pool_note=note)


def _recommend(request: PlanRequest, budget: Budget | int, *, formats: Sequence[str] | None,
               host_bytes: int | None, target: str) -> Recommendation:
    if not isinstance(budget, Budget):
        if host_bytes is None:
            import psutil

            host_bytes = psutil.virtual_memory().available
        budget = Budget(device_bytes=int(budget), host_bytes=int(host_bytes))
    capabilities.check_target(target)
    request = _replace(request, target=target, device=budget.device, compute_capability=budget.compute_capability)
    request.validate()
    if formats:
        formats = tuple(weight_format(fmt).name for fmt in formats)
        for fmt in formats:
            capabilities.check_offered(fmt, target)
    formats = tuple(formats or capabilities.dit_formats(target))
    rejected: list[str] = []
    if budget.device_usable <= 0 and not budget.unified:
        raise BudgetError(f"device budget {format_size(budget.device_bytes)} leaves nothing after the "
                          f"{budget.margin:.0%} margin and {format_size(budget.reserve_bytes)} reserve")
    request = _choose_text_encoder(request, budget, rejected, target)

    best = estimate(_replace(request, weights=formats[0]))
    sampling = _phase(best, "sampling")
    chosen = _fit_length(request, budget, formats, rejected)
    if chosen is not None:
        if chosen.weights != formats[0] or chosen.offload_blocks or chosen.head_chunks > 1:
            rejected.insert(0, f"DiT {formats[0]} fully resident needs {format_size(sampling.device_bytes)} "
                               f"({format_size(sampling.weights_bytes)} weights + "
                               f"{format_size(sampling.working_bytes)} activations for "
                               f"{best.geometry.packed_tokens:,} tokens)")
        return Recommendation(chosen, estimate(chosen), budget, rejected=tuple(rejected))

    rejected.append(f"{request.frames} frames in one pass do not fit with any format, chunking or offload "
                    f"(activations alone need {format_size(sampling.working_bytes)} in {formats[0]})")
    overlap = geometry.CHAIN_OVERLAP
    found = _longest_chunk(request, budget, formats, overlap)
    if found is not None:
        longest, _ = found
        return _chain(request, budget, formats, longest, overlap, rejected)
    shape = DiTShape.from_config(request.dit_config)
    heads, ffn = chunkings(shape.heads, formats[-1], target)[-1]
    smallest = estimate(_replace(request, frames=geometry.nearest_grid_frames(overlap + 1)[1],
                                 keyframes=request.keyframes + geometry.latent_frames_for(overlap),
                                 weights=formats[-1], head_chunks=heads, ffn_chunks=ffn, offload_blocks=shape.layers,
                                 decode_tiles_per_call=1, sink="memmap"))
    what = f"even a {smallest.request.frames}-frame chunk (conditioned on the previous chunk's last {overlap} " \
           f"frames) with {formats[-1]} weights, every block offloaded and full chunking needs"
    if budget.unified:
        need = max(p.device_bytes + p.host_bytes for p in smallest.phases)
        raise BudgetError(f"nothing fits: {what} {format_size(need)} of RAM (model and buffers share it); "
                          f"usable: {format_size(budget.host_usable)}")
    raise BudgetError(
        f"nothing fits: {what} {format_size(smallest.peak_device_bytes)} on the device and "
        f"{format_size(smallest.peak_host_bytes)} of host RAM; usable: {format_size(budget.device_usable)} device, "
        f"{format_size(budget.host_usable)} host")


__all__ = ["CHUNKINGS", "DECODE_TILES", "DEFAULT_MARGIN", "DEFAULT_RESERVE", "DIT_FORMATS", "SINK_ORDER",
           "TEXT_ENCODER_CHOICES", "Budget", "LongForm", "Recommendation", "SegmentPlan", "choose_decode",
           "choose_dit", "dit_memory_settings", "recommend"]
