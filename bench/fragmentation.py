"""Replay an H3 decode + upscale allocation trace through SlotPool and a first-fit heap.

    .venv/bin/python bench/fragmentation.py [--width 1344 --height 768 --frames 124] [--slot-mib 2] [--headroom 1.25]
                                            [--no-hints] [--csv out.csv] [--plot out.png]

Both allocators get the same capacity and the same trace of allocations and frees. For each we
report fragmentation over time (the project's one definition, `h3director.fragmentation`,
after every event), allocations that failed (SlotPool: served by its framework fallback; first
fit: no free run large enough), and the cost of an allocation (wall time of the call, measured
side by side in one run; the first-fit call also builds the same kind of tensor view over a
backing block, so both pay for a view). No GPU here, so the same trace could not be replayed
through PyTorch's CUDA caching allocator; `h3director.core.allocator_snapshot` reads that one.

How the trace is derived (sizes in bytes, fp16 = 2 bytes; H, W = canvas, default 1344x768, 124 frames)
-----------------------------------------------------------------------------------------------------
Geometry from `h3director.geometry` (one source of truth) and `shared/h3-facts.md`. Each allocation
carries the lifetime class a caller would state (SlotPool's generation hint): 0 dies within the step
that made it, 1 lives across the steps of one clip, 2 outlives the clip.

- Clips: ``reference_clip_count(latent_frames_for(frames))`` (7 at 124 frames). Each clip decodes
  ``tokens_chunk_size + token_overlap`` = 7 latent frames into ``CLIP_LENGTH + frame_overlap`` = 22
  pixel frames; consecutive clips are cross-faded over ``frame_overlap`` = 5 frames.
- Clip latents: 24 channels x 7 x H/16 x W/16, alive for the clip's decode (class 1).
- VAE spatial tiles: diffusers' default 256 px tiles with >= 64 px overlap, counted as
  `AutoencoderKLMiniMaxH3._split_tiles` does (4 x 7 = 28 tiles at 768x1344).
  Per tile: latent input 24 x 7 x 16 x 16; then the ViT decoder (36 layers, width 32 x 64 = 2048,
  patch 16 x 16 x 4 so one token per latent cell: 7 x 16 x 16 + 4 register tokens = 1796 tokens).
  Per layer, in order: fused QKV (3 x tokens x 2048) and attention output (tokens x 2048) alive
  together, QKV freed, FFN hidden (4 x tokens x 2048, ffn_mult 4), attention output freed, the new
  residual stream (tokens x 2048), FFN freed, old residual freed (all class 0).
  Tile output: 3 x 22 x 256 x 256, kept until the clip is stitched (class 1).
- Stitching: the clip buffer 3 x 22 x H x W (class 1) is allocated while the tile outputs are
  alive, then they are freed; the previous clip's cross-fade tail is freed after blending and the
  new tail 3 x 5 x H x W, carried into the next clip, is allocated (class 2).
- Upscale (`video_upscale` defaults: 128 px tiles, overlap 8, tile_batch_size 4, fp16), 2x model:
  per finished frame (17 per clip, 22 for the last), the normalized input frame 3 x H x W and the
  upscaled frame 3 x 2H x 2W (class 0); per batch of 4 tiles: input 4 x 3 x 128 x 128, four
  64-channel feature maps 4 x 64 x 128 x 128 allocated ping-pong (the previous one freed after the
  next exists), output 4 x 3 x 256 x 256 freed after blending (class 0). The sink's uint8 frame
  2H x 2W x 3 is freed only after the next frame's upscale started (the encoder writes in the
  background; class 1), and the clip buffer is freed after the clip's last frame.

Capacity: the trace's peak of live requested bytes x ``--headroom`` (default 1.25), rounded up to
64 MiB. SlotPool slots are ``--slot-mib`` (default 2 MiB); the first-fit heap aligns to 512 bytes.
"""

from __future__ import annotations

import argparse
import csv
import math
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from h3director.core.first_fit import FirstFitHeap
from h3director.core.pool import MIDDLE, OLD, YOUNG, SlotPool
from h3director.geometry import (
    CLIP_LENGTH,
    H3_TEMPORAL,
    SPATIAL_RATIO,
    VIDEO_LATENT_CHANNELS,
    latent_frames_for,
)
from h3director.plan.decode import split_tiles
from h3director.units import MiB, format_size

FP16 = 2


@dataclass(frozen=True)
class Event:
    op: str          # "alloc" or "free"
    key: int
    nbytes: int
    generation: int
    label: str


class TraceBuilder:
    def __init__(self) -> None:
        self.events: list[Event] = []
        self._sizes: dict[int, tuple[int, int, str]] = {}
        self._next = 0

    def alloc(self, label: str, nbytes: int, generation: int) -> int:
        key = self._next
        self._next += 1
        self._sizes[key] = (nbytes, generation, label)
        self.events.append(Event("alloc", key, nbytes, generation, label))
        return key

    def free(self, key: int) -> None:
        nbytes, generation, label = self._sizes.pop(key)
        self.events.append(Event("free", key, nbytes, generation, label))


def _tile_count(length: int, tile: int, overlap: int) -> int:
    """Tiles diffusers' `_split_tiles` lays over ``length`` pixels (smallest count covering it)."""
    starts, _ = split_tiles(length, tile, overlap, SPATIAL_RATIO)
    return len(starts)


def h3_decode_upscale_trace(width: int, height: int, frames: int, *, layers: int = 36, upscale: int = 2) -> list[Event]:
    """The allocation trace of decoding and upscaling one H3 video (see the module docstring)."""
    t = TraceBuilder()
    latent_frames = latent_frames_for(frames)
    clips = H3_TEMPORAL.reference_clip_count(latent_frames)
    clip_latents = H3_TEMPORAL.clip_latent_frames                                   # 7
    clip_frames = CLIP_LENGTH + H3_TEMPORAL.frame_overlap                           # 22
    lh, lw = height // SPATIAL_RATIO, width // SPATIAL_RATIO
    tile = min(256, height, width)
    tiles = _tile_count(height, 256, 64) * _tile_count(width, 256, 64)
    lt = tile // SPATIAL_RATIO
    tokens = clip_latents * lt * lt + 4
    hidden = tokens * 2048 * FP16
    frame = 3 * height * width * FP16
    big_frame = 3 * height * upscale * width * upscale * FP16
    up_tiles = _tile_count(height, 128, 8) * _tile_count(width, 128, 8)
    batches = math.ceil(up_tiles / 4)
    tail = None
    pending_sink = None
    for clip in range(clips):
        latents = t.alloc("clip latents", VIDEO_LATENT_CHANNELS * clip_latents * lh * lw * FP16, MIDDLE)
        tile_outputs = []
        for _ in range(tiles):
            tile_in = t.alloc("tile latents", VIDEO_LATENT_CHANNELS * clip_latents * lt * lt * FP16, YOUNG)
            residual = t.alloc("residual", hidden, YOUNG)
            for _ in range(layers):
                qkv = t.alloc("qkv", 3 * hidden, YOUNG)
                attn = t.alloc("attention out", hidden, YOUNG)
                t.free(qkv)
                ffn = t.alloc("ffn", 4 * hidden, YOUNG)
                t.free(attn)
                new_residual = t.alloc("residual", hidden, YOUNG)
                t.free(ffn)
                t.free(residual)
                residual = new_residual
            t.free(tile_in)
            tile_outputs.append(t.alloc("tile pixels", 3 * clip_frames * tile * tile * FP16, MIDDLE))
            t.free(residual)
        t.free(latents)
        clip_buffer = t.alloc("clip buffer", clip_frames * frame, MIDDLE)
        for key in tile_outputs:
            t.free(key)
        if tail is not None:
            t.free(tail)
        tail = t.alloc("cross-fade tail", H3_TEMPORAL.frame_overlap * frame, OLD)
        emitted = clip_frames if clip == clips - 1 else CLIP_LENGTH
        for _ in range(emitted):
            frame_in = t.alloc("frame in", frame, YOUNG)
            frame_out = t.alloc("upscaled frame", big_frame, YOUNG)
            if pending_sink is not None:
                t.free(pending_sink)
            for _ in range(batches):
                tiles_in = t.alloc("upscale tiles in", 4 * 3 * 128 * 128 * FP16, YOUNG)
                feature = t.alloc("upscale features", 4 * 64 * 128 * 128 * FP16, YOUNG)
                t.free(tiles_in)
                for _ in range(3):
                    nxt = t.alloc("upscale features", 4 * 64 * 128 * 128 * FP16, YOUNG)
                    t.free(feature)
                    feature = nxt
                tiles_out = t.alloc("upscale tiles out", 4 * 3 * 256 * 256 * FP16, YOUNG)
                t.free(feature)
                t.free(tiles_out)
            t.free(frame_in)
            pending_sink = t.alloc("sink uint8 frame", big_frame // FP16, MIDDLE)
            t.free(frame_out)
        t.free(clip_buffer)
    if pending_sink is not None:
        t.free(pending_sink)
    t.free(tail)
    return t.events


def peak_live_bytes(events: list[Event]) -> int:
    live = peak = 0
    for event in events:
        live += event.nbytes if event.op == "alloc" else -event.nbytes
        peak = max(peak, live)
    return peak


@dataclass
class ReplayResult:
    name: str
    fragmentation: list[float]
    failed: int
    allocations: int
    alloc_ns: list[int]
    extra: dict


def replay_slot_pool(events: list[Event], capacity: int, slot_bytes: int) -> ReplayResult:
    pool = SlotPool(capacity, slot_bytes, "cpu")
    leases = {}
    frag, costs = [], []
    failed = allocations = 0
    peak_waste = 0
    for event in events:
        if event.op == "alloc":
            allocations += 1
            start = time.perf_counter_ns()
            lease = pool.lease((event.nbytes,), torch.uint8, generation=event.generation)
            costs.append(time.perf_counter_ns() - start)
            failed += not lease.from_pool
            leases[event.key] = lease
        else:
            leases.pop(event.key).release()
        stats = pool.stats()
        frag.append(stats.fragmentation)
        peak_waste = max(peak_waste, stats.used_bytes - stats.requested_bytes)
    stats = pool.stats()
    return ReplayResult("SlotPool", frag, failed, allocations, costs, {
        "collections": stats.collections, "collection_s": stats.collection_seconds_total,
        "peak_rounding_waste": peak_waste,
    })


def replay_first_fit(events: list[Event], capacity: int, alignment: int = 512) -> ReplayResult:
    heap = FirstFitHeap(capacity, alignment)
    block = torch.empty(heap.capacity_bytes, dtype=torch.uint8)
    offsets, views = {}, {}
    frag, costs = [], []
    failed = allocations = 0
    for event in events:
        if event.op == "alloc":
            allocations += 1
            start = time.perf_counter_ns()
            offset = heap.allocate(event.nbytes)
            view = block[offset:offset + event.nbytes] if offset is not None else None
            costs.append(time.perf_counter_ns() - start)
            if offset is None:
                failed += 1
            else:
                offsets[event.key], views[event.key] = offset, view
        elif event.key in offsets:
            heap.free(offsets.pop(event.key))
            views.pop(event.key)
        frag.append(heap.fragmentation())
    return ReplayResult("first-fit heap", frag, failed, allocations, costs, {})


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


SWEEP = (  # (configuration, arguments): the set docs/BENCHMARKS.md shows, one results file
    ("default", {}),
    ("--headroom 1.1", {"headroom": 1.1}),
    ("--slot-mib 4 --headroom 1.1", {"slot_mib": 4.0, "headroom": 1.1}),
    ("--frames 362", {"frames": 362}),
    ("--no-hints", {"no_hints": True}),
    ("--slot-mib 1", {"slot_mib": 1.0}),
)


def replay(width: int, height: int, frames: int, layers: int, slot_mib: float, headroom: float,
           no_hints: bool) -> dict:
    """Replay the trace of one configuration through both allocators: {"events", "peak", "capacity", "slot_bytes",
    "results": [SlotPool, first fit] `ReplayResult`s, "rows": one summary dict per allocator, "where": SlotPool's
    fragmentation at the events where first fit exceeds 30%}."""
    events = h3_decode_upscale_trace(width, height, frames, layers=layers)
    if no_hints:
        events = [Event(e.op, e.key, e.nbytes, YOUNG, e.label) for e in events]
    peak = peak_live_bytes(events)
    capacity = math.ceil(peak * headroom / (64 * MiB)) * 64 * MiB
    slot_bytes = int(slot_mib * MiB) // 64 * 64
    results = [replay_slot_pool(events, capacity, slot_bytes), replay_first_fit(events, capacity)]
    base_cost = sum(results[1].alloc_ns) / len(results[1].alloc_ns)
    rows = []
    for result, grain in zip(results, (format_size(slot_bytes) + " slots", "512 B"), strict=True):
        frag = result.fragmentation
        rows.append({"allocator": result.name, "granularity": grain, "mean": sum(frag) / len(frag),
                     "p95": _percentile(frag, 0.95), "max": max(frag), "failed": result.failed,
                     "allocations": result.allocations,
                     "cost_vs_first_fit": sum(result.alloc_ns) / len(result.alloc_ns) / base_cost})
    where = [p for p, f in zip(results[0].fragmentation, results[1].fragmentation, strict=True) if f > 0.30]
    return {"events": events, "peak": peak, "capacity": capacity, "slot_bytes": slot_bytes, "results": results,
            "rows": rows, "where": where}


def _sweep_tables(width: int, height: int, layers: int) -> dict:
    """Every configuration of `SWEEP` replayed: the results file's tables."""
    from _results import table

    rows, where_rows = [], []
    for label, overrides in SWEEP:
        settings = {"frames": 124, "slot_mib": 2.0, "headroom": 1.25, "no_hints": False, **overrides}
        run = replay(width, height, settings["frames"], layers, settings["slot_mib"], settings["headroom"],
                     settings["no_hints"])
        for row in run["rows"]:
            rows.append([f"`{label}`", f"{settings['frames']} frames, {len(run['events']):,} events, capacity "
                         f"{format_size(run['capacity'])} for a {format_size(run['peak'])} peak", row["allocator"],
                         row["granularity"], f"{row['mean']:.1%}", f"{row['p95']:.1%}", f"{row['max']:.1%}",
                         f"{row['failed']} of {row['allocations']}", f"{row['cost_vs_first_fit']:.2f}"])
        where = run["where"]
        extra = run["results"][0].extra
        where_rows.append([f"`{label}`", f"{len(where):,} of {len(run['events']):,}",
                           f"{sum(where) / len(where):.1%}" if where else "-",
                           f"{_percentile(where, 0.95):.1%}" if where else "-",
                           format_size(extra["peak_rounding_waste"]),
                           f"{extra['collections']} ({extra['collection_s'] * 1e3:.1f} ms)"])
        print(f"  replayed {label}", file=sys.stderr, flush=True)
    return {
        "replay": table(["configuration", "trace", "allocator", "granularity", "fragmentation mean", "p95", "max",
                         "failed allocations", "alloc cost (x first-fit)"], rows,
                        note=f"Synthetic trace at {width}x{height} (sizes and lifetimes derived from the geometry, "
                             "not recorded from a run), replayed into SlotPool and into the first-fit heap written "
                             "here, same capacity; fragmentation = 1 - largest free run / free, after every event; "
                             "alloc cost = mean wall time of an allocation call over first fit's, same run."),
        "where_first_fit_over_30": table(
            ["configuration", "events where first fit > 30%", "SlotPool mean there", "SlotPool p95 there",
             "SlotPool peak slot-rounding waste", "SlotPool generation collections"], where_rows,
            note="SlotPool's fragmentation at the events where the first-fit heap's exceeds 30%, same replays."),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--frames", type=int, default=124)
    parser.add_argument("--layers", type=int, default=36, help="ViT decoder layers per tile (H3: 36)")
    parser.add_argument("--slot-mib", type=float, default=2.0, help="SlotPool slot size in MiB")
    parser.add_argument("--headroom", type=float, default=1.25, help="capacity = peak live bytes x this")
    parser.add_argument("--no-hints", action="store_true",
                        help="lease everything as generation 0 (plain best fit) to see what the hints buy")
    parser.add_argument("--csv", help="write fragmentation after every event to this CSV")
    parser.add_argument("--plot", help="write a PNG of fragmentation over time (matplotlib)")
    parser.add_argument("--sweep", action="store_true",
                        help="replay every configuration of SWEEP at --width/--height and write --out")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "fragmentation.json"),
                        help="results file of --sweep (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.sweep:
        from _results import table_markdown, write_results

        tables = _sweep_tables(args.width, args.height, args.layers)
        for found in tables.values():
            print(table_markdown(found) + "\n")
        write_results(args.out, "fragmentation", {"sweep": [label for label, _ in SWEEP], "width": args.width,
                                                  "height": args.height, "layers": args.layers},
                      {"tables": tables}, sources=("h3director/core/pool.py", "h3director/core/first_fit.py", "h3director/fragmentation.py",
                                                   "h3director/geometry.py", "h3director/plan/decode.py"))
        print(f"results: {args.out}")
        return 0

    run = replay(args.width, args.height, args.frames, args.layers, args.slot_mib, args.headroom, args.no_hints)
    events, peak, capacity, results = run["events"], run["peak"], run["capacity"], run["results"]
    print(f"# H3 decode + upscale trace: {args.width}x{args.height}, {args.frames} frames, "
          f"{len(events)} events, peak live {format_size(peak)}, capacity {format_size(capacity)}")
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()} CPU, "
          f"python {platform.python_version()}, torch {torch.__version__}")
    print("| allocator | granularity | fragmentation mean | p95 | max | failed allocations | alloc cost (x first-fit) |")
    print("|---|---|---|---|---|---|---|")
    for row in run["rows"]:
        print(f"| {row['allocator']} | {row['granularity']} | {row['mean']:.1%} | {row['p95']:.1%} | {row['max']:.1%} "
              f"| {row['failed']} of {row['allocations']} | {row['cost_vs_first_fit']:.2f} |")
    where = run["where"]
    if where:
        print(f"# where the first-fit heap exceeds 30% ({len(where)} of {len(events)} events): SlotPool mean "
              f"{sum(where) / len(where):.1%}, p95 {_percentile(where, 0.95):.1%}, max {max(where):.1%}")
    else:
        print("# the first-fit heap never exceeds 30% on this trace")
    extra = results[0].extra
    print(f"# SlotPool: peak slot-rounding waste {format_size(extra['peak_rounding_waste'])}, "
          f"{extra['collections']} generation collections costing {extra['collection_s'] * 1e3:.1f} ms in total")

    if args.csv:
        with open(args.csv, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["event", "op", "label", "slot_pool_fragmentation", "first_fit_fragmentation"])
            for i, event in enumerate(events):
                writer.writerow([i, event.op, event.label, f"{results[0].fragmentation[i]:.5f}",
                                 f"{results[1].fragmentation[i]:.5f}"])
    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(10, 4))
        for result in results:
            ax.plot(result.fragmentation, label=result.name, linewidth=0.6)
        ax.set_xlabel("trace event")
        ax.set_ylabel("fragmentation (1 - largest free / free)")
        ax.set_ylim(0, 1)
        ax.legend()
        fig.savefig(args.plot, dpi=100, bbox_inches="tight")
        plt.close(fig)
    return 0


if __name__ == "__main__":
    sys.exit(main())
