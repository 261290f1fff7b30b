"""Activation peak and time of one H3 DiT block at the real width: stock vs each memory tier.

    .venv/bin/python bench/dit_memory.py [--rows 8192 16384] [--framework diffusers comfy]
        [--tiers stock lifetime ffn8 h4f8 h8f16 ffn56] [--threads 2] [--repeats 1] [--json out.json]
        [--diffusers-grad-mode no_grad|inference_mode]
    .venv/bin/python bench/dit_memory.py --table-from out.json [more.json] [--memory-only]   # reprint

One block of H3's DiT at its released width (hidden 5376, 56 heads x 128, SwiGLU FFN 14336, AdaLN
over time_embed_dim 2688), random init, bfloat16, on the CPU, over a packed sequence of `--rows` rows
with two distinct timesteps (video-like rows at one, the last eighth at the other):

- `diffusers`: `MiniMaxH3TransformerBlock` inside a one-block `MiniMaxH3Transformer3DModel`; tiers
  through `h3director.integrations.diffusers_dit.apply_memory_plan` (fixed mode), the block called
  directly with the inputs the transformer's forward would give it;
- `comfy`: ComfyUI's `DiTBlock` (`comfy/ldm/minimax/model.py`, from `$COMFYUI_DIR` or the vendored tree
  in `.comfy/ComfyUI`), attention through ComfyUI's PyTorch SDPA backend; tiers through
  `h3director.integrations.comfy_dit.run_block`.

Each framework runs under the grad mode it samples in: ComfyUI under `torch.inference_mode()` (its
executor's), diffusers under `torch.no_grad()` (its pipelines'). On the CPU this matters: PyTorch's
`rms_norm` is one fused kernel (output only) under inference mode and composite (float32 temporaries)
under no_grad. "peak" is `LiveBytesTracker`'s exact peak of tensor storage created inside the block
call (the block's input and weights excluded): what a caching allocator would hand out. "ledger" is the
planner's prediction for the same tier (`h3director.plan.activations.dit_block_peak_bytes`, norms
priced as they run, flash-style attention; its input residual subtracted to match). "wall" is the fastest
of `--repeats` calls; ratios to stock are from the same run, back to back. Every tier's output is compared with the
stock output (`torch.equal`; when they differ, the largest absolute difference is recorded).

What the product says about each tier at that shape: before measuring, the bench runs the product's kernel
verification (`h3director.dit.kernels.verify_kernels`, what `h3director verify-kernels` runs) on this CPU at each
`--rows`, bf16, the real widths and the bench's thread count, for the kernel properties the measured tiers rely on,
at its default split counts (those of `h3director verify-kernels`, every count of the escalation ladder included),
into a temporary kernel cache. Each tier is then put
to the DiT memory handle both adapters use (`h3director.dit.memory.memory_handle(...).decide`) reading that cache:
"reported" is the exactness sentence of a "fixed" run of the tier (`kernels.exactness_text`), "exact only runs" is
the tier an "exact only" run of the same settings falls back to (`tiers.keep_verified`). The run fails (exit
status 1) when a tier the product reports exact is not `torch.equal` to the stock block. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from h3director.dit import kernels  # noqa: E402
from h3director.dit.kernels import KernelWidths  # noqa: E402
from h3director.dit.memory import VerificationCache, memory_handle  # noqa: E402
from h3director.dit.tiers import (  # noqa: E402
    KERNEL_PROPERTIES,
    QKV_COLUMN_GROUPS,
    QKV_SEPARATE_COLUMN_GROUPS,
    STOCK,
    DiTMemoryPlan,
)
from h3director.plan.activations import DiTShape, dit_block_peak_bytes  # noqa: E402
from h3director.plan.live_bytes import LiveBytesTracker  # noqa: E402

TIERS = {
    "stock": STOCK,
    "lifetime": DiTMemoryPlan(),
    "ffn8": DiTMemoryPlan(ffn_chunks=8),
    "h4f8": DiTMemoryPlan(head_chunks=4, ffn_chunks=8),
    "h8f16": DiTMemoryPlan(head_chunks=8, ffn_chunks=16),
    "h8f16q2": DiTMemoryPlan(head_chunks=8, ffn_chunks=16, query_chunks=2),
    "ffn56": DiTMemoryPlan(ffn_chunks=56),
}
SHAPE = DiTShape()            # the released widths
WIDTHS = KernelWidths.of(SHAPE)
QKV_LAYOUT = {"comfy": "fused", "diffusers": "separate"}
"""How each framework's block projects q, k, v (ComfyUI's `qkv_proj`; diffusers' `to_q`, `to_k`, `to_v`)."""
TIME_EMBED = 2688
DTYPE = torch.bfloat16


def _inputs(rows: int, seed: int = 0):
    """Block inputs: residual stream, the two timesteps' embedding and per-row table indices."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, SHAPE.hidden, generator=g).to(DTYPE)
    temb = torch.randn(2, TIME_EMBED, generator=g)
    split = rows - rows // 8           # the last eighth sits at the second timestep
    return x, temb, split


class DiffusersRunner:
    name = "diffusers"
    grad_mode = staticmethod(torch.no_grad)           # diffusers pipelines call the transformer under no_grad

    def __init__(self):
        from diffusers.models.transformers.transformer_minimax_h3 import MiniMaxH3Transformer3DModel

        torch.manual_seed(0)
        self.model = MiniMaxH3Transformer3DModel(num_layers=1, num_refiner_layers=0).to(DTYPE).eval()
        self.model.requires_grad_(False)
        self.block = self.model.transformer_blocks[0]
        self.handle = None

    def prepare(self, rows: int):
        x, temb, split = _inputs(rows)
        tags = torch.zeros(rows, dtype=torch.long)
        steps = torch.zeros(rows, dtype=torch.long)
        steps[split:] = 1
        adaln_indices = steps * 3 + tags
        position_ids = torch.stack([torch.arange(rows) // 64, (torch.arange(rows) // 8) % 8,
                                    torch.arange(rows) % 8], dim=-1).float()
        rotary = self.model.rope(position_ids)
        self.args = (x.unsqueeze(0), temb, adaln_indices, rotary)

    def set_tier(self, plan: DiTMemoryPlan):
        from h3director.integrations.diffusers_dit import apply_memory_plan

        if self.handle is not None:
            self.handle.remove()
            self.handle = None
        if not plan.is_stock:
            self.handle = apply_memory_plan(self.model, head_chunks=plan.head_chunks, ffn_chunks=plan.ffn_chunks,
                                            query_chunks=plan.query_chunks)

    def fresh_input(self):
        pass                              # the block is out of place

    def run(self):
        x, temb, idx, rotary = self.args
        return self.block(x, temb, idx, rotary)


class ComfyRunner:
    name = "comfy"
    grad_mode = staticmethod(torch.inference_mode)    # ComfyUI's executor runs nodes in inference mode

    def __init__(self):
        from _comfy_block import import_comfy

        h3 = import_comfy(cpu=True)           # ComfyUI's H3 model code, PyTorch SDPA attention
        import comfy.ops

        self.h3 = h3
        torch.manual_seed(0)
        ops = comfy.ops.disable_weight_init
        self.block = h3.DiTBlock(SHAPE.hidden, SHAPE.heads, SHAPE.head_dim, SHAPE.ffn, TIME_EMBED, 1e-5, 1e-5,
                                 dtype=DTYPE, operations=ops)
        for p in self.block.parameters():
            torch.nn.init.normal_(p, std=0.02)
        self.block.eval().requires_grad_(False)       # as ComfyUI loads models
        self.plan = STOCK

    def prepare(self, rows: int):
        from _comfy_block import block_inputs

        self.x, self.t_emb, self.segments, self.rope = block_inputs(self.h3, rows, SHAPE.hidden, TIME_EMBED)

    def set_tier(self, plan: DiTMemoryPlan):
        self.plan = plan

    def fresh_input(self):
        self.x_run = self.x.clone()       # the block updates its input in place

    def run(self):
        from h3director.integrations.comfy_dit import run_block

        x = self.x_run
        if self.plan.is_stock:
            return self.block(x, self.t_emb, self.segments, self.rope, transformer_options={})
        return run_block(self.block, self.plan, x, self.t_emb, self.segments, self.rope, {})


def ledger_bytes(framework: str, rows: int, plan: DiTMemoryPlan) -> int:
    """The planner's block peak for this tier on the CPU, its input residual taken off so that it counts
    what `LiveBytesTracker` counts."""
    input_bytes = rows * SHAPE.hidden * DTYPE.itemsize
    fused = framework == "comfy"                      # inference mode: fused rms_norm (see the docstring)
    return dit_block_peak_bytes(SHAPE, rows, "bf16", framework=framework, plan=plan, fused_norms=fused) - input_bytes


def measure(runner, rows: int, tiers: list[str], repeats: int = 1,
            product_reports: dict | None = None) -> list[dict]:
    """Each tier's peak, ledger, wall time and output against the stock tier's (the first), one dict per tier;
    `product_reports[(framework, rows, tier)]` (from `product_reports`) is merged into it."""
    runner.prepare(rows)
    results, reference = [], None
    for name in tiers:
        plan = TIERS[name]
        runner.set_tier(plan)
        runner.fresh_input()
        with runner.grad_mode():
            tracker = LiveBytesTracker()
            start = time.perf_counter()
            with tracker:
                out = runner.run()
            wall = time.perf_counter() - start
            for _ in range(repeats - 1):          # timing only: the fastest of the calls
                runner.fresh_input()
                start = time.perf_counter()
                runner.run()
                wall = min(wall, time.perf_counter() - start)
        out = out.detach().clone()
        if reference is None:
            reference = out
        equal = bool(torch.equal(out, reference))
        max_diff = None if equal else float((out.float() - reference.float()).abs().max())
        ledger = ledger_bytes(runner.name, rows, plan)
        results.append({"framework": runner.name, "rows": rows, "tier": name, "describe": plan.describe(),
                        "peak_bytes": tracker.peak_bytes, "ledger_bytes": ledger, "wall_s": wall, "equal": equal,
                        "max_abs_diff": max_diff, **(product_reports or {}).get((runner.name, rows, name), {})})
        print(f"  {runner.name} {rows} {name}: peak {tracker.peak_bytes / 2**20:.1f} MiB, ledger "
              f"{ledger / 2**20:.1f} MiB, {wall:.1f} s, equal={equal}"
              + ("" if equal else f" (max |diff| {max_diff:.3g})"), flush=True)
        del out
    runner.set_tier(STOCK)
    return results


def verify_for_tiers(rows: int, tiers: list[str], cache_path: Path) -> dict | None:
    """The product's kernel verification on this CPU at `rows` packed rows, bf16, the real widths, for the kernel
    properties the `tiers` rely on, at `verify-kernels`' default split counts, filed in the kernel cache
    `cache_path`. Returns the report as a dict (None when no tier relies on a property)."""
    needed = {p for name in tiers for p in TIERS[name].relies_on}
    if QKV_COLUMN_GROUPS in needed:
        needed.add(QKV_SEPARATE_COLUMN_GROUPS)  # diffusers' head groups split its separate q, k, v GEMMs
    properties = tuple(p for p in KERNEL_PROPERTIES if p in needed)
    if not properties:
        return None
    start = time.perf_counter()
    report = kernels.verify_kernels("cpu", DTYPE, rows, widths=WIDTHS, properties=properties, cache=cache_path)
    seconds = time.perf_counter() - start
    for name, result in report.results.items():
        print(f"  verify-kernels {rows} rows: {name}: {'bit-identical' if result.passed else 'DIFFERS'}; "
              f"{result.detail()}", flush=True)
    found = report.to_dict()
    found["seconds"] = round(seconds, 1)
    found["cache_path"] = "temporary kernel cache of this run"
    return found


def short_report(text: str) -> str:
    """The table's form of an exactness sentence (`kernels.exactness_text`): its class, with the measured
    difference and the properties it comes from for an approximate tier."""
    if text.startswith("exact (by construction"):
        return "exact (by construction)"
    if text.startswith("exact (verified"):
        return "exact (verified)"
    found = re.match(r"approximate: max difference (\S+) measured at .*?\((.*)\)$", text)
    if found:
        failed = re.findall(r"(?:^|; )([a-z_]+): ", found.group(2))
        return f"approximate: {found.group(1)} ({', '.join(failed)})"
    return text.split(":")[0]


def product_reports(rows: int, tiers: list[str], cache_path: Path, frameworks: list[str]) -> dict:
    """What the product says about each tier at `rows` packed rows, bf16, on this CPU, reading the kernel cache
    `cache_path` through the DiT memory handle both adapters use, for each framework's q, k, v layout
    (`QKV_LAYOUT`): {(framework, rows, tier): {"reported": the exactness
    sentence of a "fixed" run, "exact_only": the tier an "exact only" run of the same settings runs (its
    `describe()`), "exact_only_notes": what that run keeps stock}}. The stock tier is the reference."""

    def reader(device, dtype, widths=None, rows=None):
        return kernels.lookup(device, dtype, path=cache_path, widths=widths, rows=rows)

    reports = {}
    for framework in frameworks:
        for name in tiers:
            plan = TIERS[name]
            if plan.is_stock:
                reports[(framework, rows, name)] = {"reported": "stock (the reference)", "exact_only": plan.describe(),
                                                    "exact_only_notes": []}
                continue
            said = {}
            for mode in ("fixed", "exact only"):
                handle = memory_handle(plan.head_chunks, plan.ffn_chunks, plan.query_chunks, mode=mode,
                                       heads=SHAPE.heads, blocks=1, widths=WIDTHS)
                handle.verification = VerificationCache(reader)
                handle.qkv_layout = lambda framework=framework: QKV_LAYOUT[framework]
                said[mode] = handle.decide(rows, DTYPE, "cpu")
            text = said["fixed"][1]["exactness_detail"].replace(str(cache_path), "temporary kernel cache of this run")
            reports[(framework, rows, name)] = {"reported": text, "exact_only": said["exact only"][0].describe(),
                                                "exact_only_notes": said["exact only"][1]["kept_stock_unverified"]}
    return reports


def reported_exact(result: dict) -> bool:
    """Whether the product reports this measured tier exact (the stock tier is the reference: exact)."""
    return result.get("reported", "").startswith(("exact", "stock"))


def exact_only_cell(result: dict, results: list[dict]) -> str:
    """The "exact only runs" cell: "same" when "exact only" runs the tier itself, else the tier it runs instead
    and whether that one was `torch.equal` here (when the run measured it)."""
    runs = result.get("exact_only")
    if runs is None:
        return "-"
    if runs == result["describe"]:
        return "same"
    other = next((r for r in results if (r["framework"], r["rows"], r["describe"]) ==
                  (result["framework"], result["rows"], runs)), None)
    return runs + ("" if other is None else f" ({'equal' if other['equal'] else 'not equal'})")


def table(results: list[dict], wall: bool = True) -> str:
    """Markdown table of `results`; `wall=False` leaves the time columns out."""
    head = "| framework | rows | tier | peak MiB | x stock | ledger MiB | ledger error |"
    rule = "|---|---:|---|---:|---:|---:|---:|"
    if wall:
        head, rule = head + " wall s | x stock |", rule + "---:|---:|"
    lines = [head + " torch.equal | max abs diff | reported | exact only runs |", rule + "---|---:|---|---|"]
    for r in results:
        stock = next(s for s in results if s["framework"] == r["framework"] and s["rows"] == r["rows"]
                     and s["tier"] == "stock")
        error = (r["ledger_bytes"] - r["peak_bytes"]) / r["peak_bytes"]
        times = f" {r['wall_s']:.1f} | {r['wall_s'] / stock['wall_s']:.2f} |" if wall else ""
        lines.append(f"| {r['framework']} | {r['rows']:,} | {r['describe']} | {r['peak_bytes'] / 2**20:,.1f} | "
                     f"{r['peak_bytes'] / stock['peak_bytes']:.2f} | {r['ledger_bytes'] / 2**20:,.1f} | "
                     f"{error:+.1%} |{times} {'yes' if r['equal'] else 'NO'} | "
                     f"{'-' if r.get('max_abs_diff') is None else format(r['max_abs_diff'], '.3g')} | "
                     f"{short_report(r['reported']) if 'reported' in r else '-'} | {exact_only_cell(r, results)} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--framework", nargs="+", choices=["diffusers", "comfy"], default=["diffusers", "comfy"])
    parser.add_argument("--tiers", nargs="+", choices=list(TIERS), default=["stock", "lifetime", "ffn8", "h4f8",
                                                                             "h8f16", "ffn56"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=1, help="calls per tier; wall = the fastest (peak: the first)")
    parser.add_argument("--diffusers-grad-mode", choices=["no_grad", "inference_mode"], default="no_grad",
                        help="grad mode of the diffusers block (default: no_grad, as its pipelines call it)")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "dit_memory.json",
                        help="the results file the documents render (default: %(default)s)")
    parser.add_argument("--table-from", type=Path, nargs="+", help="reprint the table of earlier --json runs, "
                        "with the ledger recomputed by the current planner")
    parser.add_argument("--memory-only", action="store_true", help="with --table-from: leave the time columns out")
    args = parser.parse_args(argv)
    if args.table_from:
        results = [r for path in args.table_from for r in json.loads(path.read_text())]
        for r in results:
            r["ledger_bytes"] = ledger_bytes(r["framework"], r["rows"], TIERS[r["tier"]])
        print(table(results, wall=not args.memory_only))
        return 0 if all(r["equal"] or not reported_exact(r) for r in results) else 1
    if args.tiers[0] != "stock":
        parser.error("the first tier must be stock (ratios and torch.equal are against it)")
    torch.set_num_threads(args.threads)
    DiffusersRunner.grad_mode = staticmethod(getattr(torch, args.diffusers_grad_mode))
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, {args.threads} threads", flush=True)
    results, verification, reports = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="h3_dit_memory_") as scratch:
        cache_path = Path(scratch) / "kernels.json"
        for rows in args.rows:
            verification[str(rows)] = verify_for_tiers(rows, args.tiers, cache_path)
            reports.update(product_reports(rows, args.tiers, cache_path, args.framework))
    for framework in args.framework:
        runner = DiffusersRunner() if framework == "diffusers" else ComfyRunner()
        for rows in args.rows:
            results += measure(runner, rows, args.tiers, args.repeats, reports)
        del runner
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    sys.path.insert(0, str(REPO / "bench"))
    from _results import write_results

    tables, figures = results_tables(results, args, verification)
    write_results(args.out, "dit_memory", {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                                           if k not in ("json", "out", "table_from", "memory_only")},
                  {"tables": tables, "figures": figures, "results": results, "verification": verification},
                  sources=("h3director/dit", "h3director/integrations/diffusers_dit.py",
                           "h3director/integrations/comfy_dit.py", "h3director/plan/activations.py",
                           "h3director/plan/live_bytes.py"))
    print(f"results: {args.out}")
    for r in results:
        if reported_exact(r) and not r["equal"]:
            print(f"FAIL: {r['framework']} {r['rows']:,} rows, {r['describe']} is reported exact "
                  f"({r['reported']}) but differs from the stock block by up to {r['max_abs_diff']:.3g}", flush=True)
    return 0 if all(r["equal"] or not reported_exact(r) for r in results) else 1


def _cell(text: str) -> str:
    """`text` safe in a Markdown table cell (its pipes escaped)."""
    return text.replace("|", "\\|")


def results_tables(results: list[dict], args, verification: dict | None = None) -> tuple[dict, dict]:
    """The results file's tables (every measurement; one framework beside the other at the largest row count;
    what the product reports per tier; the kernel verification the reports rest on) and figures (the ledger's
    largest error, the tiers' time range against stock, whether every tier reported exact is `torch.equal`,
    which tiers are not)."""
    from _results import table as results_table

    lines = table(results).splitlines()
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    columns = [cell.strip() for cell in lines[0].strip("|").split("|")]
    grad = {"comfy": "inference_mode", "diffusers": args.diffusers_grad_mode}
    tables = {"tiers": results_table(columns, cells, note=(
        f"One block at the released width, bf16, CPU, {args.threads} threads; peak = LiveBytesTracker's exact peak of "
        "tensor storage made inside the block call; x stock = the tier's peak (or wall time, fastest of "
        f"{args.repeats}) over the stock block's, same run; ledger error = ledger / peak - 1; grad modes: "
        + ", ".join(f"{f} {grad[f]}" for f in args.framework) + "; max abs diff = the largest |tier - stock| over the "
        "block's output (- when torch.equal); reported = what the DiT memory handle reports for the tier at this "
        "shape from the kernel verification this run made first (bf16, these rows, this CPU and thread count; "
        "table `verification`); exact only runs = the tier an \"exact only\" run of the same settings falls back "
        "to (same: the tier itself)."))}
    largest = max(args.rows)
    stock = {r["framework"]: r for r in results if r["rows"] == largest and r["tier"] == "stock"}
    frameworks = [f for f in ("comfy", "diffusers") if f in stock]
    side = []
    for tier in args.tiers:
        row = [next(r["describe"] for r in results if r["tier"] == tier)]
        for f in frameworks:
            r = next(r for r in results if (r["framework"], r["rows"], r["tier"]) == (f, largest, tier))
            mib = f"{r['peak_bytes'] / 2**20:,.0f} MiB"
            row.append(mib if tier == "stock" else f"{mib} ({r['peak_bytes'] / stock[f]['peak_bytes']:.2f}x)")
        side.append(row)
    names = {"comfy": "ComfyUI (inference mode)", "diffusers": f"diffusers ({args.diffusers_grad_mode})"}
    tables["side_by_side"] = results_table([f"one block, {largest:,} rows, bf16"] + [names[f] for f in frameworks],
                                           side, note="x = the tier's peak over the stock block's, same run.")
    errors = [abs(r["ledger_bytes"] / r["peak_bytes"] - 1) for r in results]
    walls = [r["wall_s"] / next(s["wall_s"] for s in results if (s["framework"], s["rows"], s["tier"]) ==
                                (r["framework"], r["rows"], "stock")) for r in results if r["tier"] != "stock"]
    unequal = [r for r in results if not r["equal"]]
    false_exact = [r for r in unequal if reported_exact(r)]
    figures = {"ledger_max_error": f"{max(errors):.1%}",
               "wall_range": f"{min(walls):.2f}x-{max(walls):.2f}x",
               "all_equal": "yes" if all(r["equal"] for r in results) else "NO",
               "reported_exact_all_equal": "yes" if not false_exact else "NO: " + "; ".join(
                   f"{r['framework']} {r['rows']:,} rows {r['describe']}" for r in false_exact),
               "unequal_tiers": "none" if not unequal else "; ".join(
                   f"{names[r['framework']].split(' (')[0]} \"{r['describe']}\" at {r['rows']:,} rows (differs by up to "
                   f"{r['max_abs_diff']:.3g}; reported {short_report(r.get('reported', 'not reported'))})"
                   for r in unequal)}
    if "reported" in results[0]:
        reports = []
        for rows in args.rows:
            for tier in args.tiers:
                r = next(r for r in results if (r["rows"], r["tier"]) == (rows, tier))
                notes = "; ".join(r.get("exact_only_notes") or []) or "-"
                reports.append([f"{rows:,}", r["describe"], _cell(r["reported"]), r["exact_only"], _cell(notes)])
        tables["reports"] = results_table(
            ["rows", "tier", "reported (a fixed run's exactness sentence)", "exact only runs", "exact only keeps stock"],
            reports, note="From the DiT memory handle (`h3director.dit.memory`), the same for both frameworks, reading "
                          "the kernel cache this run's verification wrote.")
    checked = []
    for rows, found in (verification or {}).items():
        for name, result in (found or {}).get("results", {}).items():
            counts = result.get("counts") or {}
            checked.append([f"{int(rows):,}", name, "bit-identical" if result["passed"] else "differs",
                            ", ".join(map(str, counts.get("passed") or [])) or "-",
                            ", ".join(map(str, counts.get("failed") or [])) or "-", _cell(result["detail"])])
    if checked:
        tables["verification"] = results_table(
            ["rows", "kernel property", "result", "split counts bit-identical", "split counts differing",
             "what was compared"], checked,
            note=f"`h3director.dit.kernels.verify_kernels` on this CPU, bf16, {args.threads} threads, the released "
                 "widths, its default split counts (every count of the escalation ladder included), run by the bench "
                 "before it measured (a temporary kernel cache); `torch.equal` of the whole op against one call per "
                 "split; a tier counts as verified only at the split counts that passed.")
    return tables, figures


if __name__ == "__main__":
    raise SystemExit(main())
