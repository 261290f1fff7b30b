"""Native core benchmark: frame packing, GGUF dequantisation and the arena, ratios in one run.

    .venv/bin/python bench/native.py [--frames 24 --height 768 --width 1344] [--values 4194304]

1. pack_frames vs the PyTorch multi-op expression on float32 [C=3, F, H, W] decoder output
   (ImageNet de-normalisation), time (median of --repeats) and extra peak RSS during the call,
   each variant in its own subprocess so peaks do not mix.
2. dequantize vs gguf.quants.dequantize for every supported type (realistic blocks, float32 out),
   and the C time as a multiple of a plain memcpy of the same output bytes.
3. Arena lease/release vs malloc/free for a decode buffer pattern (per clip: one float32 clip
   buffer, one uint8 frame buffer, four small buffers), at the C level (both through ctypes) and
   at the Python level (Arena.lease + numpy view vs np.empty, with the buffers' pages written).
Prints markdown tables; absolute times are this machine's, the ratios are the result.

With the C library available, also writes `--results` (default bench/results/native.json): the numpy
fallback's time over the C library's (1 thread) for pack_frames (what a decode to uint8 frames or an MP4
runs per clip) and for each dequantisation type, with the date, machine and code version.
`h3director doctor` and the ComfyUI decode node's report cite the pack_frames ratio from that file when the
fallback is in use.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import torch
from _gguf_blocks import random_blocks
from _results import table, table_markdown, write_results
from _timing import best_seconds, median_seconds

from h3director import native

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "native.json")
MEASURED: dict = {}   # filled by the sections, written to --results
FIGURES: dict = {}    # one-line figures for the documents' sentences, written to --results
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
TYPES = ["Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K"]


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def reset_peak_rss() -> bool:
    """Reset this process's VmHWM to its current RSS (Linux >= 4.0); False where not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def vm_hwm_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM in /proc/self/status")


# ---------------------------------------------------------------------------------------------- pack


def _video(frames: int, height: int, width: int) -> torch.Tensor:
    x = torch.empty((3, frames, height, width), dtype=torch.float32)
    x.normal_(generator=torch.Generator().manual_seed(0))  # in place: no temporary
    return x


def pack_variants(x: torch.Tensor) -> dict[str, Callable[[], object]]:
    mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(3, 1, 1, 1)

    def torch_expr():
        return ((x.float() * std + mean).clamp(0, 1) * 255).round().to(torch.uint8)

    def torch_expr_fhwc():
        return torch_expr().permute(1, 2, 3, 0).contiguous()

    variants = {
        "torch expression ([C,F,H,W] out)": torch_expr,
        "torch expression + permute to [F,H,W,C]": torch_expr_fhwc,
        "native numpy fallback": lambda: native.pack_frames(x, mean=IMAGENET_MEAN, std=IMAGENET_STD, backend="numpy"),
    }
    if native.backend() == "c":
        variants["native C, 1 thread"] = lambda: native.pack_frames(
            x, mean=IMAGENET_MEAN, std=IMAGENET_STD, threads=1, backend="c")
        variants["native C, 2 threads"] = lambda: native.pack_frames(
            x, mean=IMAGENET_MEAN, std=IMAGENET_STD, threads=2, backend="c")
    return variants


def pack_child(name: str, frames: int, height: int, width: int, repeats: int) -> dict:
    """Runs in a subprocess: one variant, its time and the peak RSS it added beyond the input."""
    x = _video(frames, height, width)
    fn = pack_variants(x)[name]
    exact = reset_peak_rss()  # else ru_maxrss/VmHWM include earlier transients: report an upper bound
    rss_before = current_rss_bytes()
    result = fn()
    extra = vm_hwm_bytes() - rss_before
    del result
    seconds = median_seconds(fn, repeats)
    return {"seconds": seconds, "extra_peak_bytes": extra, "exact": exact}


def bench_pack(args) -> dict:
    x = _video(args.frames, args.height, args.width)
    names = list(pack_variants(x))
    reference = native.pack_frames(x, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    want = pack_variants(x)["torch expression + permute to [F,H,W,C]"]()
    assert np.array_equal(reference, want.numpy()), "pack_frames differs from the torch expression"
    del x, want, reference
    out_bytes = 3 * args.frames * args.height * args.width
    rows = {}
    for name in names:
        cmd = [sys.executable, __file__, "--pack-child", name, "--frames", str(args.frames), "--height",
               str(args.height), "--width", str(args.width), "--repeats", str(args.repeats)]
        rows[name] = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    base = rows["torch expression + permute to [F,H,W,C]"]["seconds"]
    if "native C, 1 thread" in rows:
        numpy_s, c_s = rows["native numpy fallback"]["seconds"], rows["native C, 1 thread"]["seconds"]
        MEASURED["pack_frames"] = {"shape": [3, args.frames, args.height, args.width], "dtype": "float32",
                                   "numpy_seconds": numpy_s, "c_seconds": c_s, "fallback_over_c": numpy_s / c_s,
                                   "repeats": args.repeats, "statistic": "median"}
    cells = [[name, f"{row['seconds']:.3f}", f"{base / row['seconds']:.2f}x",
              f"{'' if row['exact'] else '<= '}{row['extra_peak_bytes'] / 2**20:.0f}",
              f"{'' if row['exact'] else '<= '}{row['extra_peak_bytes'] / out_bytes:.2f}"] for name, row in rows.items()]
    if "native C, 1 thread" in rows:
        c1, torch_row = rows["native C, 1 thread"], rows["torch expression + permute to [F,H,W,C]"]
        FIGURES["pack_c_vs_torch"] = (
            f"{base / c1['seconds']:.1f}x faster than that expression at {args.width}x{args.height}x{args.frames} "
            f"frames (C, 1 thread, median of {args.repeats}), with "
            f"{c1['extra_peak_bytes'] / max(torch_row['extra_peak_bytes'], 1):.2f}x of its extra peak memory")
    return table(["variant", "median time (s)", "speed-up vs torch + permute", "extra peak RSS during call (MiB)",
                  "extra / output"], cells,
                 note=f"pack_frames, float32 [3, {args.frames}, {args.height}, {args.width}] -> uint8 "
                      f"[{args.frames}, {args.height}, {args.width}, 3] (output {out_bytes / 2**20:.0f} MiB); torch "
                      f"threads: {torch.get_num_threads()}; median of {args.repeats} calls, each variant in its own "
                      "subprocess (VmHWM reset after the input exists); speed-up = torch + permute's time / the "
                      "variant's, same run.")


# ------------------------------------------------------------------------------------------- dequant


def bench_dequant(args) -> dict:
    import gguf
    from gguf import quants

    rng = np.random.default_rng(0)
    have_c = native.backend() == "c"
    cells = []
    src = np.ones(args.values, np.float32)
    dst = np.zeros(args.values, np.float32)
    many = 3 * args.repeats
    speedups, over_memcpy = [], []
    for name in TYPES:
        data = random_blocks(name, args.values, rng).reshape(1, -1)
        qtype = gguf.GGMLQuantizationType[name]
        out = np.zeros((1, args.values), np.float32)
        ref = quants.dequantize(data, qtype)
        t_gguf = best_seconds(partial(quants.dequantize, data, qtype), args.repeats)
        t_np = best_seconds(partial(native.dequantize, data, name, out=out, backend="numpy"), args.repeats)
        assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))
        memcpy = best_seconds(partial(np.copyto, dst, src), many)
        row = [name, f"{t_gguf * 1e3:.1f}", f"{t_np * 1e3:.1f}"]
        if have_c:
            t_c1 = best_seconds(partial(native.dequantize, data, name, out=out, backend="c"), many)
            t_c2 = best_seconds(partial(native.dequantize, data, name, out=out, threads=2, backend="c"), many)
            assert np.array_equal(out.view(np.uint32), ref.view(np.uint32))
            MEASURED.setdefault("dequantize", {})[name] = {
                "values": args.values, "numpy_seconds": t_np, "c_seconds": t_c1, "fallback_over_c": t_np / t_c1,
                "statistic": "best"}
            row += [f"{t_c1 * 1e3:.2f}", f"{t_c2 * 1e3:.2f}", f"{memcpy * 1e3:.2f}", f"{t_gguf / t_c1:.1f}x",
                    f"{t_gguf / t_c2:.1f}x", f"{t_c1 / memcpy:.2f}"]
            speedups.append(t_gguf / t_c1)
            over_memcpy.append(t_c1 / memcpy)
        else:
            row += ["n/a", "n/a", f"{memcpy * 1e3:.2f}", "n/a", "n/a", "n/a"]
        cells.append(row)
    if speedups:
        FIGURES["dequant_c_vs_gguf"] = (f"{min(speedups):.0f}-{max(speedups):.0f}x faster than `gguf.quants` on "
                                        f"{args.values:,} values per type (C, 1 thread, best of {many})")
        FIGURES["dequant_over_memcpy"] = (f"{min(over_memcpy):.1f}-{max(over_memcpy):.1f}x the time of copying the "
                                          "same float32 bytes")
    return table(["type", "gguf.quants (ms)", "numpy fallback (ms)", "C 1 thread (ms)", "C 2 threads (ms)",
                  "memcpy (ms)", "speed-up C1 vs gguf", "speed-up C2 vs gguf", "C1 time / memcpy time"], cells,
                 note=f"dequantize to float32, {args.values} values per type ({args.values * 4 / 2**20:.0f} MiB "
                      f"output); best of {many} runs (gguf, fallback: best of {args.repeats}); native writes into "
                      "a pre-faulted out= buffer; memcpy = np.copyto of the same output bytes, timed next to each "
                      "type; speed-up = gguf's time / C's, same run.")


# --------------------------------------------------------------------------------------------- arena


def _decode_pattern(width: int, height: int, frames: int) -> list[int]:
    """Buffer sizes (bytes) one decoded clip needs on the host, in allocation order."""
    clip = 3 * frames * height * width
    return [clip * 4, clip, 64 << 10, 256 << 10, 1 << 20, 16 << 10]


def bench_arena(args) -> dict:
    sizes = _decode_pattern(672, 384, 21)
    clips = args.clips
    capacity = sum(-(-s // 4096) * 4096 for s in sizes)
    cells = []
    if native.backend() == "c":
        from h3director.native import _c

        libc = ctypes.CDLL(None)
        libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
        libc.free.restype, libc.free.argtypes = None, [ctypes.c_void_p]
        lib = _c._lib
        arena = lib.h3_arena_create(capacity, 4096, 0)
        handle, offset = ctypes.c_uint64(), ctypes.c_uint64()
        handles = [0] * len(sizes)

        def c_malloc():
            for _ in range(clips):
                ptrs = [libc.malloc(s) for s in sizes]
                for p in ptrs:
                    libc.free(p)

        def c_arena():
            for _ in range(clips):
                for i, s in enumerate(sizes):
                    lib.h3_arena_alloc(arena, s, ctypes.byref(handle), ctypes.byref(offset))
                    handles[i] = handle.value
                for h in handles:
                    lib.h3_arena_free(arena, h)

        t_malloc = median_seconds(c_malloc, args.repeats) / clips
        t_arena = median_seconds(c_arena, args.repeats) / clips
        lib.h3_arena_destroy(arena)
        cells.append(["C (via ctypes)", "malloc/free", f"{t_malloc * 1e6:.1f}", "1.00x"])
        cells.append(["C (via ctypes)", "h3_arena_alloc/free", f"{t_arena * 1e6:.1f}", f"{t_malloc / t_arena:.2f}x"])

    def py_numpy():
        for _ in range(clips):
            bufs = [np.empty(s, np.uint8) for s in sizes]
            for b in bufs:
                b[::4096] = 1  # write one byte per page: the first touch is where fresh mappings pay
            del bufs

    py_arena = native.Arena(capacity, alignment=4096)

    def py_lease():
        for _ in range(clips):
            leases = [py_arena.lease(s) for s in sizes]
            for lease in leases:
                lease.numpy()[::4096] = 1
            for lease in leases:
                lease.release()

    t_np = median_seconds(py_numpy, args.repeats) / clips
    t_lease = median_seconds(py_lease, args.repeats) / clips
    cells.append(["Python, pages written", "np.empty (malloc)", f"{t_np * 1e6:.1f}", "1.00x"])
    cells.append(["Python, pages written", f"Arena.lease ({py_arena.backend}) + numpy view", f"{t_lease * 1e6:.1f}",
                  f"{t_np / t_lease:.2f}x"])
    return table(["level", "variant", "time per clip (µs)", "ratio vs malloc/free"], cells,
                 note=f"decode buffer pattern per clip: {', '.join(f'{s / 2**20:.2f}' for s in sizes)} MiB; {clips} "
                      f"clips; arena capacity = one clip's buffers; median of {args.repeats}; ratio = malloc/free's "
                      "time / the variant's, same run.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--height", type=int, default=768)
    parser.add_argument("--width", type=int, default=1344)
    parser.add_argument("--values", type=int, default=1 << 22, help="values per quantisation type")
    parser.add_argument("--clips", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=["pack", "dequant", "arena"], action="append",
                        help="run only these sections (repeatable; default: all)")
    parser.add_argument("--results", default=RESULTS, help="results JSON to write (default: %(default)s)")
    parser.add_argument("--render", action="store_true",
                        help="print the fallback/C table of --results as markdown (for docs/BENCHMARKS.md) and exit")
    parser.add_argument("--pack-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.render:
        print(render_results(args.results))
        return 0
    if args.pack_child:
        print(json.dumps(pack_child(args.pack_child, args.frames, args.height, args.width, args.repeats)))
        return 0
    print(f"# bench/native.py  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  "
          f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
          f"backend {native.describe()}, load average {os.getloadavg()[0]:.1f}")
    sections = {"pack": bench_pack, "dequant": bench_dequant, "arena": bench_arena}
    tables = {}
    for key, section in sections.items():
        if args.only and key not in args.only:
            continue
        tables[key] = section(args)
        print()
        print(table_markdown(tables[key]))
        sys.stdout.flush()
    if MEASURED:
        if "pack_frames" in MEASURED:
            tables["fallback"] = fallback_table(MEASURED)
            FIGURES["fallback_pack"] = f"{MEASURED['pack_frames']['fallback_over_c']:.1f}x"
        if "dequantize" in MEASURED:
            ratios = [row["fallback_over_c"] for row in MEASURED["dequantize"].values()]
            FIGURES["fallback_dequant"] = f"{min(ratios):.0f}-{max(ratios):.0f}x"
        write_results(args.results, "native", {k: v for k, v in vars(args).items() if k not in ("render", "results",
                                                                                                   "pack_child")},
                      {"load_average": round(os.getloadavg()[0], 1), "torch_threads": torch.get_num_threads(),
                       "backend": native.describe(), **MEASURED, "tables": tables, "figures": FIGURES},
                      sources=("h3director/native",))
        print(f"\nresults: {args.results}")
    else:
        print("\nresults not written: the C library is unavailable, so there is no fallback/C ratio to record")
    return 0


def fallback_table(measured: dict) -> dict:
    """The numpy fallback's cost over the C library (1 thread), one row per operation measured."""
    pack = measured["pack_frames"]
    cells = [[f"pack_frames float32 {'x'.join(map(str, pack['shape']))} -> uint8 ({pack['statistic']} of "
              f"{pack['repeats']})", f"{pack['numpy_seconds']:.3f}", f"{pack['c_seconds']:.3f}",
              f"**{pack['fallback_over_c']:.1f}x**"]]
    for name, row in measured.get("dequantize", {}).items():
        cells.append([f"dequantize {name}, {row['values']} values -> float32 ({row['statistic']})",
                      f"{row['numpy_seconds']:.4f}", f"{row['c_seconds']:.4f}", f"{row['fallback_over_c']:.1f}x"])
    return table(["operation", "numpy fallback (s)", "C, 1 thread (s)", "fallback / C"], cells,
                 note="fallback / C = the numpy fallback's time over the C library's (1 thread), same run; "
                      "pack_frames: each variant in its own subprocess; dequantize: the fallback's best against C's "
                      "best (the bench's statistics).")


def render_results(path: str) -> str:
    """The fallback/C table of a results file, as markdown."""
    with open(path) as f:
        return table_markdown(json.load(f)["tables"]["fallback"])


if __name__ == "__main__":
    raise SystemExit(main())
