"""bench/dit_memory.py's exactness columns: what the product reports per tier comes from the kernel verification the
bench runs first (real `verify_kernels` at the released widths, a few rows) through the real DiT memory handle,
and the bench's pass/fail rule is "every tier reported exact is torch.equal"."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from h3director.dit.tiers import keep_verified

REPO = Path(__file__).resolve().parents[1]
ROWS = 48
TIERS = ["stock", "lifetime", "ffn8", "h4f8"]


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(REPO / "bench"))
    spec = importlib.util.spec_from_file_location("bench_dit_memory", REPO / "bench" / "dit_memory.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def verified(bench, tmp_path_factory):
    import torch

    torch.set_num_threads(1)
    cache = tmp_path_factory.mktemp("kernels") / "kernels.json"
    found = bench.verify_for_tiers(ROWS, TIERS, cache)
    return found, cache, bench.product_reports(ROWS, TIERS, cache, ["comfy", "diffusers"])


def test_verification_covers_the_tiers_properties_at_the_default_counts(verified):
    found, cache, _ = verified
    assert found["rows"] == ROWS and cache.is_file()
    assert set(found["results"]) == {"qkv_column_groups", "qkv_separate_column_groups", "attention_head_groups",
                                     "ffn_row_chunks"}
    for layout in ("qkv_column_groups", "qkv_separate_column_groups"):
        counts = found["results"][layout]["counts"]
        assert sorted(counts["passed"] + counts["failed"]) == [2, 4, 7, 8, 14, 28, 56]   # every divisor of 56 heads
    ffn = found["results"]["ffn_row_chunks"]["counts"]
    assert set(ffn["passed"] + ffn["failed"]) == set(range(2, 17)) | {28}            # the counts that fit 48 rows


@pytest.mark.parametrize("framework", ["comfy", "diffusers"])
def test_each_tier_is_reported_as_the_verification_found_it(bench, verified, framework):
    """ComfyUI's head groups split its fused QKV GEMM, diffusers' its separate q, k, v GEMMs: each is reported from
    the check of its own layout."""
    found, _, reports = verified
    assert reports[(framework, ROWS, "stock")]["reported"] == "stock (the reference)"
    assert reports[(framework, ROWS, "lifetime")]["reported"].startswith("exact (by construction")
    results = dict(found["results"])
    separate = results.pop("qkv_separate_column_groups")
    if framework == "diffusers":
        results["qkv_column_groups"] = separate
    for tier in ("ffn8", "h4f8"):
        plan = bench.TIERS[tier]
        said = reports[(framework, ROWS, tier)]
        passed = {name for name, result in results.items() if plan.splits.get(name) in result["counts"]["passed"]}
        if set(plan.relies_on) <= passed:
            assert said["reported"].startswith("exact (verified: ") and "temporary kernel cache" in said["reported"]
            assert bench.short_report(said["reported"]) == "exact (verified)"
        else:
            assert said["reported"].startswith("approximate: max difference ")
            failed = sorted(name for name in plan.relies_on
                            if plan.splits[name] in results[name]["counts"]["failed"])
            assert bench.short_report(said["reported"]).endswith(f"({', '.join(failed)})")
        assert said["exact_only"] == keep_verified(plan, passed)[0].describe()
    assert "ffn56" in bench.TIERS and bench.TIERS["ffn56"].ffn_chunks == 56


def test_the_run_fails_only_on_a_tier_reported_exact_that_differs(bench):
    exact = {"reported": "exact (verified: ffn_row_chunks at ...)", "equal": False}
    approximate = {"reported": "approximate: max difference 0.0156 measured at ...", "equal": False}
    assert bench.reported_exact(exact) and not bench.reported_exact(approximate)
    assert bench.reported_exact({"reported": "stock (the reference)"})
    assert bench.short_report("unverified: ffn_row_chunks not verified on cpu") == "unverified"
