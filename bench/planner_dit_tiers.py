"""Per-block ledger vs measured peak for every DiT memory tier, diffusers and ComfyUI (docs/PLANNER.md).

One real block at small widths on the CPU (fixtures/dit_tier_cases.py): diffusers' block stock and through
`apply_memory_plan`, ComfyUI's `DiTBlock` stock and through `comfy_dit.run_block` (in a fresh Python),
measured with `LiveBytesTracker`; predicted by `h3director.plan.activations.dit_block_peak_bytes`.

Run: OMP_NUM_THREADS=2 .venv/bin/python bench/planner_dit_tiers.py
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import warnings
from datetime import datetime, timezone

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fixtures"))

import torch  # noqa: E402
from _results import table, write_results  # noqa: E402
from comfy_harness.vendored import use_prepared_comfyui, why_no_h3_comfyui  # noqa: E402
from dit_tier_cases import (  # noqa: E402
    ROWS,
    TIERS,
    comfy_root,
    dit_shape_comfy,
    dit_shape_diffusers,
    measure_comfy_blocks,
    measure_diffusers_block,
    predict_block_peak,
)

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path,
                        default=pathlib.Path(__file__).resolve().parent / "results" / "planner_dit_tiers.json")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    use_prepared_comfyui()          # COMFYUI_DIR, else the vendored tree scripts/setup.sh prepared
    if comfy_root() is None:
        print(f"# ComfyUI rows left out: {why_no_h3_comfyui()}", file=sys.stderr)
    print(f"# DiT block ledgers per tier, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {ROWS} rows, "
          f"hidden 64, 4 heads x 16, FFN 160")
    print("| framework | tier | dtype | measured peak (B) | ledger (B) | error |")
    print("|---|---|---|---:|---:|---:|")
    keys = [(tier, dtype) for tier in TIERS for dtype in DTYPES]
    comfy = dict(zip(keys, measure_comfy_blocks([(ROWS, d, TIERS[t]) for t, d in keys]), strict=True)) \
        if comfy_root() else {}
    rows, errors = [], []
    for framework, shape in (("diffusers", dit_shape_diffusers()), ("comfy", dit_shape_comfy())):
        for tier, dtype in keys:
            if framework == "diffusers":
                measured = measure_diffusers_block(ROWS, DTYPES[dtype], TIERS[tier])
            elif (tier, dtype) in comfy:
                measured = comfy[(tier, dtype)]
            else:
                continue
            predicted = predict_block_peak(shape, framework, DTYPES[dtype], TIERS[tier])
            errors.append(predicted / measured - 1)
            rows.append([framework, tier, dtype, f"{measured:,}", f"{predicted:,}", f"{errors[-1]:+.2%}"])
            print("| " + " | ".join(rows[-1]) + " |", flush=True)
    worst = max(errors, key=abs)
    write_results(args.out, "planner_dit_tiers", {"rows": ROWS, "comfyui": comfy_root() is not None}, {
        "tables": {"tiers": table(["framework", "tier", "dtype", "measured peak (B)", "ledger (B)", "error"], rows,
                                  note=f"One real block at small widths (hidden 64, 4 heads x 16, FFN 160), {ROWS} "
                                       "rows, CPU; measured = LiveBytesTracker's peak; ledger = "
                                       "dit_block_peak_bytes; error = ledger / measured - 1.")},
        "figures": {"worst_error": f"{worst:+.2%}"}},
        sources=("fixtures/dit_tier_cases.py", "h3director/plan/activations.py",
                 "h3director/dit", "h3director/integrations/diffusers_dit.py", "h3director/integrations/comfy_dit.py"))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
