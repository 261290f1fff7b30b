"""`h3director verify-kernels [--device DEV] [--dtype bf16|fp16|fp32] [--rows N] [--ffn-chunks N...]
[--query-chunks N...] [--json]`.

Runs the per-op A/B checks of `h3director.dit.kernels` at H3's real widths on this machine's device and
files the result in the kernel cache. A property that fails is a finding about the device, reported in
the table with exit code 0; bad input (unknown or unavailable device, bad dtype or rows) exits nonzero.
"""

from __future__ import annotations

import argparse
import json

HELP = "Check, on this device, that the chunked DiT tiers' GEMM and attention splits are bit-identical."


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add `h3director verify-kernels`'s options to `parser` (its argparse sub-parser)."""
    parser.add_argument("--device", default=None,
                        help="cpu, cuda, cuda:N or mps (default: the first CUDA device, else MPS, else the CPU)")
    parser.add_argument("--dtype", default="bf16", help="bf16 (default), fp16 or fp32")
    parser.add_argument("--rows", type=int, default=None,
                        help="packed rows per check (default 1024 on the CPU, 4096 on MPS, 8192 on CUDA); the "
                             "result holds for its row class (the power-of-two band of rows it falls in): run "
                             "it at the packed rows your renders have")
    parser.add_argument("--ffn-chunks", type=int, nargs="+", default=(), metavar="N",
                        help="FFN row-chunk counts to check besides the defaults and the escalation ladder's (2 to "
                             "1024: a count your DiT Memory node is set to; a tier is exact only at counts that passed)")
    parser.add_argument("--query-chunks", type=int, nargs="+", default=(), metavar="N",
                        help="query-chunk counts to check besides the defaults and the ladder's (2 to 1024)")
    parser.add_argument("--cache", default=None,
                        help="kernel cache file (default: $H3_KERNEL_CACHE or ~/.cache/h3director/kernels.json)")
    parser.add_argument("--no-cache", action="store_true", help="check only; write nothing")
    parser.add_argument("--json", action="store_true", help="print JSON for machines")


def format_report(report) -> str:
    from h3director.dit.kernel_cache import row_class

    rows = [("property", "result", "detail")]
    for name, result in report.results.items():
        rows.append((name, "bit-identical" if result.passed else "DIFFERS",
                     f"{result.detail()}; {result.seconds:.1f} s"))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    lines = [f"{a.ljust(widths[0])}  {b.ljust(widths[1])}  {c}" for a, b, c in rows]
    key = report.key
    versions = ", ".join(f"{name} {key[name]}" for name in ("torch", "cuda", "hip", "cublas", "cpu_libraries")
                         if key.get(name))
    w = report.widths
    lo, hi = row_class(report.rows)
    threads = f", {key['threads']} threads" if key.get("threads") else ""
    head = [f"device {report.device} ({key['device_name']}{threads}), {report.dtype}, {report.rows} rows "
            f"(row class {lo:,}-{hi:,}), hidden {w.hidden}, {w.heads} heads x {w.head_dim}, FFN {w.ffn}",
            f"versions: {versions}"]
    tail = [f"note: {note}" for note in report.notes]
    if report.cache_problem:
        tail.append(f"replaced an unreadable kernel cache: {report.cache_problem}")
    passed = [f"{name} at {', '.join(map(str, result.counts()['passed']))}"
              for name, result in report.results.items() if result.counts()["passed"]]
    tail.append("split counts verified (a tier counts as exact only at these): " + ("; ".join(passed) or "none"))
    tail.append(f"verified at every count checked: {', '.join(sorted(report.verified)) or 'none'}"
                + (f"; filed in {report.cache_path}" if report.cache_path else " (not filed)"))
    return "\n".join(head + [""] + lines + [""] + tail)


def run(args: argparse.Namespace) -> int:
    """Run the kernel checks of `h3director.dit.kernels` on `--device` and print the report (text or
    `--json`), caching the result unless `--no-cache`; returns 0. Raises InvalidInputError when the device is
    not available."""
    from h3director.dit.kernels import verify_kernels

    cache = False if args.no_cache else (args.cache or True)
    report = verify_kernels(args.device, args.dtype, rows=args.rows, cache=cache,
                            extra_row_chunks=tuple(args.ffn_chunks), extra_query_chunks=tuple(args.query_chunks))
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(format_report(report))
    return 0


__all__ = ["HELP", "add_arguments", "run"]
