"""Activation peak and time of one H3 DiT block at the real width: stock vs each memory tier.

    .venv/bin/python bench/dit_memory.py [--rows 8192 16384] [--framework diffusers comfy]
        [--tiers stock lifetime ffn8 h4f8 h8f16] [--threads 2] [--repeats 1] [--json out.json]
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
stock output (`torch.equal`); a mismatch is printed and fails the run. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from h3director.dit.tiers import STOCK, DiTMemoryPlan  # noqa: E402
from h3director.plan.activations import DiTShape, dit_block_peak_bytes  # noqa: E402
from h3director.plan.live_bytes import LiveBytesTracker  # noqa: E402

TIERS = {
    "stock": STOCK,
    "lifetime": DiTMemoryPlan(),
    "ffn8": DiTMemoryPlan(ffn_chunks=8),
    "h4f8": DiTMemoryPlan(head_chunks=4, ffn_chunks=8),
    "h8f16": DiTMemoryPlan(head_chunks=8, ffn_chunks=16),
    "h8f16q2": DiTMemoryPlan(head_chunks=8, ffn_chunks=16, query_chunks=2),
}
SHAPE = DiTShape()            # the released widths
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


def measure(runner, rows: int, tiers: list[str], repeats: int = 1) -> list[dict]:
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
        ledger = ledger_bytes(runner.name, rows, plan)
        results.append({"framework": runner.name, "rows": rows, "tier": name, "describe": plan.describe(),
                        "peak_bytes": tracker.peak_bytes, "ledger_bytes": ledger, "wall_s": wall, "equal": equal})
        print(f"  {runner.name} {rows} {name}: peak {tracker.peak_bytes / 2**20:.1f} MiB, ledger "
              f"{ledger / 2**20:.1f} MiB, {wall:.1f} s, equal={equal}", flush=True)
        del out
    runner.set_tier(STOCK)
    return results


def table(results: list[dict], wall: bool = True) -> str:
    """Markdown table of `results`; `wall=False` leaves the time columns out."""
    head = "| framework | rows | tier | peak MiB | x stock | ledger MiB | ledger error |"
    rule = "|---|---:|---|---:|---:|---:|---:|"
    if wall:
        head, rule = head + " wall s | x stock |", rule + "---:|---:|"
    lines = [head + " torch.equal |", rule + "---|"]
    for r in results:
        stock = next(s for s in results if s["framework"] == r["framework"] and s["rows"] == r["rows"]
                     and s["tier"] == "stock")
        error = (r["ledger_bytes"] - r["peak_bytes"]) / r["peak_bytes"]
        times = f" {r['wall_s']:.1f} | {r['wall_s'] / stock['wall_s']:.2f} |" if wall else ""
        lines.append(f"| {r['framework']} | {r['rows']:,} | {r['describe']} | {r['peak_bytes'] / 2**20:,.1f} | "
                     f"{r['peak_bytes'] / stock['peak_bytes']:.2f} | {r['ledger_bytes'] / 2**20:,.1f} | "
                     f"{error:+.1%} |{times} {'yes' if r['equal'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[8192, 16384])
    parser.add_argument("--framework", nargs="+", choices=["diffusers", "comfy"], default=["diffusers", "comfy"])
    parser.add_argument("--tiers", nargs="+", choices=list(TIERS), default=["stock", "lifetime", "ffn8", "h4f8",
                                                                             "h8f16"])
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
        return 0 if all(r["equal"] for r in results) else 1
    if args.tiers[0] != "stock":
        parser.error("the first tier must be stock (ratios and torch.equal are against it)")
    torch.set_num_threads(args.threads)
    DiffusersRunner.grad_mode = staticmethod(getattr(torch, args.diffusers_grad_mode))
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, torch {torch.__version__}, "
          f"{platform.processor() or platform.machine()}, {args.threads} threads", flush=True)
    results = []
    for framework in args.framework:
        runner = DiffusersRunner() if framework == "diffusers" else ComfyRunner()
        for rows in args.rows:
            results += measure(runner, rows, args.tiers, args.repeats)
        del runner
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    sys.path.insert(0, str(REPO / "bench"))
    from _results import write_results

    tables, figures = results_tables(results, args)
    write_results(args.out, "dit_memory", {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()
                                           if k not in ("json", "out", "table_from", "memory_only")},
                  {"tables": tables, "figures": figures, "results": results},
                  sources=("h3director/dit", "h3director/integrations/diffusers_dit.py",
                           "h3director/integrations/comfy_dit.py", "h3director/plan/activations.py",
                           "h3director/plan/live_bytes.py"))
    print(f"results: {args.out}")
    return 0 if all(r["equal"] for r in results) else 1


def results_tables(results: list[dict], args) -> tuple[dict, dict]:
    """The results file's tables (every measurement; one framework beside the other at the largest row count)
    and figures (the ledger's largest error, the tiers' time range against stock)."""
    from _results import table as results_table

    lines = table(results).splitlines()
    cells = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]]
    columns = [cell.strip() for cell in lines[0].strip("|").split("|")]
    grad = {"comfy": "inference_mode", "diffusers": args.diffusers_grad_mode}
    tables = {"tiers": results_table(columns, cells, note=(
        f"One block at the released width, bf16, CPU, {args.threads} threads; peak = LiveBytesTracker's exact peak of "
        "tensor storage made inside the block call; x stock = the tier's peak (or wall time, fastest of "
        f"{args.repeats}) over the stock block's, same run; ledger error = ledger / peak - 1; grad modes: "
        + ", ".join(f"{f} {grad[f]}" for f in args.framework) + "."))}
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
    figures = {"ledger_max_error": f"{max(errors):.1%}",
               "wall_range": f"{min(walls):.2f}x-{max(walls):.2f}x",
               "all_equal": "yes" if all(r["equal"] for r in results) else "NO"}
    return tables, figures


if __name__ == "__main__":
    raise SystemExit(main())
