"""The DiT memory decision (`h3director.dit.memory`): one handle type, one verification cache per model and shape
class, every settings check before anything is patched, one set of mode names.

The kernel cache is a real file (`$H3_KERNEL_CACHE` in a temporary directory) written with the real
`kernel_cache.write_entry` under this process's real environment key; nothing here is a stand-in.
"""

from __future__ import annotations

import ast
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from h3director.dit import kernel_cache, kernels
from h3director.dit.capacity import MODES
from h3director.dit.kernels import KernelWidths
from h3director.dit.memory import VerificationCache, memory_handle
from h3director.dit.tiers import KERNEL_PROPERTIES, LIFETIME_ONLY, DiTMemoryPlan
from h3director.errors import InvalidInputError

WIDTHS = KernelWidths(hidden=64, heads=4, head_dim=16, ffn=96)
PACKAGE = Path(__file__).resolve().parents[1] / "h3director"


@pytest.fixture
def cache_file(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "kernels.json"
    monkeypatch.setenv("H3_KERNEL_CACHE", str(path))
    return path


def file_entry(path: Path, rows: int, widths: KernelWidths = WIDTHS) -> None:
    """A verification of every property at `rows` (its row class) for this CPU, bf16, in the cache file."""
    entry = {"key": kernel_cache.environment_key("cpu", "bf16"), "widths": asdict(widths), "rows": rows,
             "verified": list(KERNEL_PROPERTIES), "failed": [], "date": datetime.now(timezone.utc).isoformat(),
             "results": {}}
    kernel_cache.write_entry(entry, path)


def counting_reader(calls: list):
    def read(device, dtype, widths=None, rows=None):
        calls.append(rows)
        return kernels.lookup_for_model(device, dtype, widths=widths, rows=rows)
    return read


def test_a_verdict_is_remembered_for_its_shape_class_and_never_used_for_another(cache_file):
    file_entry(cache_file, rows=1024)                    # row class 1,024-2,047
    calls: list = []
    cache = VerificationCache(counting_reader(calls))
    assert cache.lookup("cpu", torch.bfloat16, WIDTHS, rows=1500).verified == frozenset(KERNEL_PROPERTIES)
    assert cache.lookup("cpu", torch.bfloat16, WIDTHS, rows=2000).verified == frozenset(KERNEL_PROPERTIES)
    assert calls == [1500]                               # the second forward of the class read nothing
    # another row class: looked up in the file (which has nothing for it), not answered from the 1,024 entry
    for rows in (5000, 900):
        found = cache.lookup("cpu", torch.bfloat16, WIDTHS, rows=rows)
        assert found.entry is None and found.verified == frozenset()
    assert calls == [1500, 5000, 900]
    # other widths, another dtype: their own keys, nothing verified
    assert cache.lookup("cpu", torch.bfloat16, KernelWidths(hidden=64, heads=4, head_dim=16, ffn=128),
                        rows=1500).verified == frozenset()
    assert cache.lookup("cpu", torch.float32, WIDTHS, rows=1500).verified == frozenset()
    # verify-kernels filing the 4,096 class (a rewritten file) is seen by the next forward of that class
    file_entry(cache_file, rows=4096)
    assert cache.lookup("cpu", torch.bfloat16, WIDTHS, rows=5000).verified == frozenset(KERNEL_PROPERTIES)


def test_exact_only_runs_a_technique_only_for_the_verified_shape_class(cache_file):
    file_entry(cache_file, rows=1024)
    handle = memory_handle(head_chunks=2, ffn_chunks=2, mode="exact only", heads=4, blocks=2, widths=WIDTHS)
    plan, report = handle.decide(1500, torch.bfloat16, torch.device("cpu"))
    assert plan == DiTMemoryPlan(head_chunks=2, ffn_chunks=2) and report["verified"]
    assert report["exactness_detail"].startswith("exact (verified: ")
    plan, report = handle.decide(5000, torch.bfloat16, torch.device("cpu"))
    assert plan == LIFETIME_ONLY and handle.plan == LIFETIME_ONLY
    assert report["kept_stock_unverified"] == [
        "head groups (2) not verified for this shape: stock attention projection",
        "FFN row chunks (2) not verified for this shape: stock FFN in one chunk"]
    handle.record(report)
    assert handle.last_report is report and report["forward"] == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(mode="fastest"), "mode must be one of auto, exact only, fixed"),
    (dict(mode="auto", budget_bytes=0), "budget_bytes must be > 0"),
    (dict(mode="auto", capacity=object()), "choose"),
    (dict(mode="auto", capacity=SimpleNamespace(choose=print), budget_bytes=1 << 30), "give budget_bytes"),
    (dict(mode="fixed", head_chunks=3), r"does not divide the model's 4 heads; use one of \[1, 2, 4\]"),
    (dict(mode="fixed", ffn_chunks=0), "ffn_chunks must be an integer >= 1"),
])
def test_every_setting_is_checked_when_the_handle_is_made(kwargs, message):
    with pytest.raises(InvalidInputError, match=message):
        memory_handle(heads=4, blocks=2, **kwargs)


def test_the_guard_may_only_raise_the_floor():
    handle = memory_handle(head_chunks=2, mode="fixed", heads=4, blocks=2)
    tiers = handle.escalation(4096)
    assert tiers and all(t.head_chunks >= 2 and t != handle.floor for t in tiers)
    with pytest.raises(InvalidInputError, match="at least as chunked"):
        handle.escalate_floor(DiTMemoryPlan(ffn_chunks=8))        # drops the head groups
    handle.escalate_floor(tiers[0])
    assert handle.floor == tiers[0]


def _assigned_mode_lists(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Tuple, ast.List)) and any(
                isinstance(e, ast.Constant) and e.value == "exact only" for e in node.elts):
            lines.append(node.lineno)
    return lines


def test_the_mode_names_are_defined_once():
    """Only `dit/capacity.py` spells the list of modes; every adapter and node imports `MODES`."""
    found = {str(p.relative_to(PACKAGE)): lines for p in sorted(PACKAGE.rglob("*.py"))
             if (lines := _assigned_mode_lists(p))}
    assert list(found) == ["dit/capacity.py"], found
    assert MODES == ("auto", "exact only", "fixed")
