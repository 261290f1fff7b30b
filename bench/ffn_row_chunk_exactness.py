"""Is H3's FFN row-chunkable bit for bit on this CPU? SwiGLU and the fc1/fc2 GEMMs, whole vs per row chunk.

For each row count, dtype and thread count it compares, with `torch.equal`:

- `swiglu naive`: ComfyUI's SwiGLU (`silu(gate).mul_(up)` over the halves of fc1's output, real FFN width
  14336, fc1 output 28672 wide) over all rows vs one call per row chunk (2, 3, 7, 8 chunks);
- `swiglu redo`: the same per chunk, then the rows `h3director.dit.thread_split.rows_to_redo` names
  recomputed one whole-call segment per call (what the adapters run);
- `fc1` / `fc2`: `F.linear` over all rows vs per row chunk, at the real reduction widths (5376, 14336) and
  `--gemm-cols` output columns (default 1024; 0 skips them). Narrow GEMMs are NOT representative of the
  real ones: oneDNN picks kernels by the whole shape (bf16 at 256 columns differs where the real width
  does not), so only `h3director verify-kernels` at the real widths and row counts decides.

Prints one JSON line per case and a table, and writes the results file (`--out`, default
bench/results/ffn_row_chunk_exactness.json) docs/BENCHMARKS.md renders. Run it once per Python (torch version)
you want covered (the results file holds the last run):

    PYTHONPATH=$PWD .venv/bin/python bench/ffn_row_chunk_exactness.py
    PYTHONPATH=$PWD .comfy/venv/bin/python bench/ffn_row_chunk_exactness.py
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from _results import table as results_table
from _results import write_results

from h3director.dit.ranges import row_ranges
from h3director.dit.thread_split import rows_to_redo

FFN = 14336
HIDDEN = 5376
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def swiglu(x):
    """ComfyUI's `comfy.ops._swiglu_eager` (the same two ops)."""
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def chunked_swiglu(fc1_out, chunks: int, out, redo: bool) -> int:
    """SwiGLU per row chunk into `out`; with `redo`, recompute the rows whose thread cuts differ. Returns
    the number of redone rows."""
    rows, width = fc1_out.shape[0], fc1_out.shape[1] // 2
    redone = 0
    for a, b in row_ranges(rows, chunks):
        part = swiglu(fc1_out[a:b])
        if redo:
            for row, segments in rows_to_redo(a, b, rows, width, torch.get_num_threads()):
                source = fc1_out[a + row]
                for c0, c1 in segments:
                    part[row, c0:c1] = swiglu(torch.cat((source[c0:c1], source[width + c0:width + c1])))
                redone += 1
        out[a:b] = part
    return redone


def compare(reference, other) -> dict:
    if torch.equal(reference, other):
        return {"equal": True, "max_abs_diff": 0.0, "elements": 0}
    diff = (reference.float() - other.float()).abs()
    return {"equal": False, "max_abs_diff": float(diff.max()), "elements": int((diff != 0).sum())}


def run(rows: int, dtype_name: str, threads: int, chunk_counts, gemm_cols: int) -> list[dict]:
    torch.set_num_threads(threads)
    dtype = DTYPES[dtype_name]
    generator = torch.Generator().manual_seed(rows)
    results = []
    base = {"torch": torch.__version__, "rows": rows, "dtype": dtype_name, "threads": threads}
    fc1_out = torch.randn(rows, 2 * FFN, generator=generator).to(dtype)
    reference = swiglu(fc1_out)
    out = torch.empty_like(reference)
    for chunks in chunk_counts:
        for redo in (False, True):
            start = time.perf_counter()
            redone = chunked_swiglu(fc1_out, chunks, out, redo)
            results.append({**base, "op": f"swiglu {'redo' if redo else 'naive'}", "chunks": chunks,
                            "redone_rows": redone, "seconds": round(time.perf_counter() - start, 2),
                            **compare(reference, out)})
    del fc1_out, reference, out
    if not gemm_cols:
        return results
    for name, fan_in in (("fc1", HIDDEN), ("fc2", FFN)):
        x = torch.randn(rows, fan_in, generator=generator).to(dtype)
        weight = (torch.randn(gemm_cols, fan_in, generator=generator) * fan_in ** -0.5).to(dtype)
        reference = F.linear(x, weight)
        out = torch.empty_like(reference)
        for chunks in chunk_counts:
            for a, b in row_ranges(rows, chunks):
                out[a:b] = F.linear(x[a:b], weight)
            results.append({**base, "op": f"{name} {fan_in}->{gemm_cols}", "chunks": chunks, **compare(reference, out)})
        del x, weight, reference, out
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1024, 2500, 9000, 38000])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=sorted(DTYPES))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--chunks", type=int, nargs="+", default=[2, 3, 7, 8])
    parser.add_argument("--gemm-cols", type=int, default=1024, help="0: SwiGLU only")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).resolve().parent / "results" / "ffn_row_chunk_exactness.json")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}", flush=True)
    table = []
    with torch.inference_mode():
        for rows in args.rows:
            for dtype_name in args.dtypes:
                for threads in args.threads:
                    for result in run(rows, dtype_name, threads, args.chunks, args.gemm_cols):
                        print(json.dumps(result), flush=True)
                        table.append(result)
    print("\n| torch | rows | dtype | threads | op | chunks differing (of tried) | max abs diff |")
    print("|---|---:|---|---:|---|---|---:|")
    groups: dict[tuple, list[dict]] = {}
    for r in table:
        groups.setdefault((r["torch"], r["rows"], r["dtype"], r["threads"], r["op"]), []).append(r)
    for (version, rows, dtype, threads, op), items in groups.items():
        bad = [str(i["chunks"]) for i in items if not i["equal"]]
        worst = max(i["max_abs_diff"] for i in items)
        print(f"| {version} | {rows:,} | {dtype} | {threads} | {op} | {', '.join(bad) or 'none'} "
              f"(of {len(items)}) | {worst:.3g} |")
    write_results(args.out, "ffn_row_chunk_exactness", {k: v for k, v in vars(args).items() if k != "out"},
                  {"tables": {"swiglu": summary(table, args)}, "results": table},
                  sources=("h3director/dit/ranges.py", "h3director/dit/thread_split.py"))
    print(f"results: {args.out}")


def summary(results: list[dict], args) -> dict:
    """One row per (dtype, threads) and op: which chunk counts differ at each row count, and the largest
    difference."""
    cells = []
    for dtype in args.dtypes:
        for threads in args.threads:
            for op in ("swiglu naive", "swiglu redo"):
                per_rows, worst = [], 0.0
                for rows in args.rows:
                    items = [r for r in results if (r["rows"], r["dtype"], r["threads"], r["op"]) ==
                             (rows, dtype, threads, op)]
                    bad = [str(i["chunks"]) for i in items if not i["equal"]]
                    per_rows.append("none" if not bad else "all" if len(bad) == len(items) else ", ".join(bad))
                    worst = max([worst] + [i["max_abs_diff"] for i in items])
                cells.append([dtype, threads, "plain" if op == "swiglu naive" else "recompute",
                              " / ".join(per_rows), "0" if worst == 0 else f"{worst:.3g}"])
    return results_table(
        ["dtype", "threads", "SwiGLU per row chunk",
         f"chunk counts differing at {' / '.join(f'{r:,}' for r in args.rows)} rows", "max abs diff"], cells,
        note=f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}; chunk counts "
             f"{', '.join(map(str, args.chunks))}; `torch.equal` against one SwiGLU call over all rows (real FFN "
             "width, random fc1 outputs). plain: one call per chunk; recompute: what the adapters run "
             "(`rows_to_redo`: rows whose CPU thread cuts differ recomputed per stock segment).")


if __name__ == "__main__":
    main()
