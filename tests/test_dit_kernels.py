"""`h3director.dit.kernels` and `verify-kernels`: the per-op A/B checks, the cache, the command.

The checks run on this CPU at small widths (the CLI's real widths are patched down where the command is
run). A check must be able to fail: kernels whose result depends on the call's row count, column count,
head count or query count are injected and must be reported as failing exactly the property they break.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from h3director.cli import main
from h3director.dit import kernel_cache, kernels
from h3director.dit.kernels import KernelWidths, lookup, verified_properties, verify_kernels
from h3director.dit.tiers import (
    ATTENTION_HEAD_GROUPS,
    ATTENTION_QUERY_CHUNKS,
    FFN_ROW_CHUNKS,
    KERNEL_PROPERTIES,
    QKV_COLUMN_GROUPS,
    QKV_SEPARATE_COLUMN_GROUPS,
)
from h3director.errors import InvalidInputError

SMALL = KernelWidths(hidden=64, heads=4, head_dim=16, ffn=96)
ROWS = 300  # not a multiple of the 128-row query blocks: uneven last chunks everywhere


@pytest.fixture
def cache_file(tmp_path, monkeypatch):
    path = tmp_path / "kernels.json"
    monkeypatch.setenv("H3_KERNEL_CACHE", str(path))
    return path


def _rows_noise(x, weight):
    """A GEMM whose result depends on how many rows the call has (not batch-invariant in M)."""
    return F.linear(x, weight) + x.shape[0] * 1e-2


def _columns_noise(x, weight):
    """A GEMM whose result depends on how many output columns the call has."""
    return F.linear(x, weight) + weight.shape[0] * 1e-2


def _heads_noise(q, k, v):
    return F.scaled_dot_product_attention(q, k, v) + q.shape[1] * 1e-2


def _queries_noise(q, k, v):
    return F.scaled_dot_product_attention(q, k, v) + q.shape[2] * 1e-3


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_cpu_report_runs_every_property_and_its_verdicts_follow_the_splits(dtype, cache_file):
    """Whether a split is bit-identical is a fact of this CPU and library (bf16 attention query chunks differed on
    one build machine and not on another): the report must run every property and state what it found, a
    property passing exactly when every one of its splits was equal, with the largest difference otherwise."""
    report = verify_kernels("cpu", dtype, rows=ROWS, widths=SMALL)
    assert report.device == "cpu" and report.dtype == dtype and report.rows == ROWS
    assert set(report.results) == set(KERNEL_PROPERTIES)
    for name, result in report.results.items():
        assert result.variants and all(v.calls >= 2 for v in result.variants), name
        assert result.passed == all(v.equal for v in result.variants), name
        assert (result.max_abs_diff is None) == result.passed, (name, result.detail())
        assert ("bit-identical" in result.detail()) == result.passed and result.seconds >= 0
    assert report.verified == frozenset(n for n, r in report.results.items() if r.passed)
    assert set(report.failed) == {n for n, r in report.results.items() if not r.passed}
    # every head-group count a tier can use (divisors of 4 above 1), uneven row chunks included
    qkv = [v.label for v in report.results[QKV_COLUMN_GROUPS].variants]
    assert qkv[:2] == ["2 head groups", "4 head groups"]
    separate = report.results[QKV_SEPARATE_COLUMN_GROUPS]
    assert [v.label for v in separate.variants][:2] == ["q, k, v each: 2 head groups", "q, k, v each: 4 head groups"]
    assert separate.shapes["weight"] == [SMALL.heads * SMALL.head_dim, SMALL.hidden]
    assert report.results[QKV_COLUMN_GROUPS].shapes["weight"] == [3 * SMALL.heads * SMALL.head_dim, SMALL.hidden]
    assert report.results[FFN_ROW_CHUNKS].shapes["fc1 weight"] == [2 * SMALL.ffn, SMALL.hidden]
    assert report.results[FFN_ROW_CHUNKS].shapes["fc2 weight"] == [SMALL.hidden, SMALL.ffn]
    assert report.key["dtype"] == dtype and report.key["torch"] == torch.__version__
    assert report.key["device_name"].startswith("cpu: ")
    document = report.to_dict()
    assert json.loads(json.dumps(document))["verified"] == sorted(report.verified)
    assert report.cache_path is None and not cache_file.exists()  # cache=False writes nothing


@pytest.mark.parametrize("linear,attention,broken", [
    # QKV's last variant also splits the rows
    (_rows_noise, None, {FFN_ROW_CHUNKS, QKV_COLUMN_GROUPS, QKV_SEPARATE_COLUMN_GROUPS}),
    (_columns_noise, None, {QKV_COLUMN_GROUPS, QKV_SEPARATE_COLUMN_GROUPS}),
    # the query-chunk check also runs inside one-head groups (as the ladder's query tiers do)
    (None, _heads_noise, {ATTENTION_HEAD_GROUPS, ATTENTION_QUERY_CHUNKS}),
    (None, _queries_noise, {ATTENTION_QUERY_CHUNKS}),
], ids=["rows", "columns", "heads", "queries"])
def test_a_kernel_that_is_not_invariant_is_reported_failed(linear, attention, broken):
    report = verify_kernels("cpu", "fp32", rows=ROWS, widths=SMALL, linear=linear, attention=attention)
    assert report.failed == broken
    assert report.verified == frozenset(KERNEL_PROPERTIES) - broken
    for name in broken:
        result = report.results[name]
        assert not result.passed and result.max_abs_diff > 0
        assert "differ" in result.detail()


def test_rows_dependent_gemm_fails_every_row_split():
    report = verify_kernels("cpu", "fp32", rows=ROWS, widths=SMALL, linear=_rows_noise,
                            properties=(FFN_ROW_CHUNKS,))
    assert set(report.results) == {FFN_ROW_CHUNKS}
    variants = report.results[FFN_ROW_CHUNKS].variants
    gemms = [v for v in variants if v.label.startswith(("fc1", "fc2"))]
    assert gemms and not any(v.equal for v in gemms)
    # the SwiGLU over fc1's output, chunked as the adapters run it, is checked beside them (real silu: equal)
    swiglu = [v for v in variants if v.label.startswith("swiglu")]
    assert len(swiglu) == len(gemms) // 2 and all(v.equal for v in swiglu)
    assert not report.results[FFN_ROW_CHUNKS].passed
    # the real rms_norm checked per row range beside them, in both grad modes
    assert {v.label.split(")")[0] for v in variants if v.label.startswith("rms_norm")} == {
        "rms_norm (no_grad", "rms_norm (inference_mode"}


def test_cache_roundtrip_and_lookup(cache_file):
    report = verify_kernels("cpu", "bf16", rows=ROWS, widths=SMALL, cache=True)
    assert report.cache_path == str(cache_file) and report.cache_problem is None
    assert FFN_ROW_CHUNKS in report.verified and QKV_COLUMN_GROUPS in report.verified
    assert verified_properties("cpu", "bf16", widths=SMALL) == set(report.verified)
    assert verified_properties("cpu", torch.bfloat16, path=cache_file, widths=SMALL) == set(report.verified)
    # another dtype, or the real widths, were never verified
    assert verified_properties("cpu", "fp32", widths=SMALL) == set()
    assert verified_properties("cpu", "bf16") == set()
    # a failing property is filed as failed, replacing the earlier entry for the same key and widths
    verify_kernels("cpu", "bf16", rows=ROWS, widths=SMALL, linear=_columns_noise, cache=True)
    assert verified_properties("cpu", "bf16", widths=SMALL) == set(report.verified) - {
        QKV_COLUMN_GROUPS, QKV_SEPARATE_COLUMN_GROUPS}
    document = json.loads(cache_file.read_text())
    assert document["format"] == "h3director-kernels" and len(document["entries"]) == 1
    assert QKV_COLUMN_GROUPS in document["entries"][0]["failed"]
    verify_kernels("cpu", "fp32", rows=ROWS, widths=SMALL, cache=True)
    assert len(json.loads(cache_file.read_text())["entries"]) == 2
    assert not list(cache_file.parent.glob(".kernels.json.*"))  # no temporaries left behind


def test_absent_cache_gives_nothing(cache_file):
    found = lookup("cpu", "bf16", widths=SMALL)
    assert found.verified == frozenset() and found.problem is None and found.entry is None


def test_key_mismatch_gives_empty_set(cache_file, monkeypatch):
    verify_kernels("cpu", "bf16", rows=ROWS, widths=SMALL, cache=True)
    assert verified_properties("cpu", "bf16", widths=SMALL)
    monkeypatch.setattr(torch, "__version__", "2.99.0+other")
    assert verified_properties("cpu", "bf16", widths=SMALL) == set()
    monkeypatch.undo()
    # an entry filed under another device name is not this device's either
    document = json.loads(cache_file.read_text())
    document["entries"][0]["key"]["device_name"] = "NVIDIA GeForce RTX 4090"
    cache_file.write_text(json.dumps(document))
    assert verified_properties("cpu", "bf16", widths=SMALL) == set()


def test_an_entry_holds_for_its_row_class_thread_count_only_and_says_so_once(cache_file, caplog, monkeypatch):
    report = verify_kernels("cpu", "fp32", rows=ROWS, widths=SMALL, cache=True)   # class 256..511
    assert report.key["threads"] == str(torch.get_num_threads())
    assert verified_properties("cpu", "fp32", widths=SMALL, rows=511) == set(report.verified)
    with caplog.at_level(logging.WARNING, logger="h3director.dit.kernels"):
        for _ in range(3):
            assert verified_properties("cpu", "fp32", widths=SMALL, rows=2_500) == set()
    said = [r for r in caplog.records if "not for 2,500 rows (class 2,048-4,095)" in r.getMessage()]
    assert len(said) == 1 and "verified for rows 256-511" in said[0].getMessage()
    # another thread count is another key: nothing verified, and the differing field is named once
    caplog.clear()
    with monkeypatch.context() as patch, caplog.at_level(logging.WARNING, logger="h3director.dit.kernels"):
        patch.setattr(torch, "get_num_threads", lambda: 7)
        assert verified_properties("cpu", "fp32", widths=SMALL, rows=ROWS) == set()
        assert verified_properties("cpu", "fp32", widths=SMALL, rows=ROWS) == set()
    assert [r.getMessage() for r in caplog.records if "under another threads" in r.getMessage()] != []
    assert len(caplog.records) == 1
    # a second class is filed beside the first, not over it
    verify_kernels("cpu", "fp32", rows=2_500, widths=SMALL, cache=True, properties=(FFN_ROW_CHUNKS,))
    entries = json.loads(cache_file.read_text())["entries"]
    assert sorted(e["rows"] for e in entries) == [ROWS, 2_500]
    assert verified_properties("cpu", "fp32", widths=SMALL, rows=3_000) == {FFN_ROW_CHUNKS}


def test_exactness_text_names_what_was_verified_where_or_the_measured_difference(cache_file):
    from h3director.dit.kernels import exactness_text

    assert exactness_text((), None).startswith("exact (by construction")
    assert exactness_text((FFN_ROW_CHUNKS,), lookup("cpu", "fp32", widths=SMALL, rows=ROWS)).startswith(
        "unverified: ffn_row_chunks not verified on cpu: ")
    verify_kernels("cpu", "fp32", rows=ROWS, widths=SMALL, cache=True, properties=(FFN_ROW_CHUNKS,))
    text = exactness_text((FFN_ROW_CHUNKS,), lookup("cpu", "fp32", widths=SMALL, rows=ROWS))
    assert text.startswith("exact (verified: ffn_row_chunks at 300 rows, hidden 64, 4x16 heads, FFN 96 "
                           "(row class 256-511), cpu: ")
    assert f"{torch.get_num_threads()} threads, fp32, {cache_file}" in text
    verify_kernels("cpu", "fp32", rows=ROWS, widths=SMALL, cache=True, properties=(FFN_ROW_CHUNKS,),
                   linear=_rows_noise)
    text = exactness_text((FFN_ROW_CHUNKS,), lookup("cpu", "fp32", widths=SMALL, rows=ROWS))
    assert text.startswith("approximate: max difference ") and "measured at 300 rows, hidden 64" in text


@pytest.mark.parametrize("content,problem", [
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe\x00", "not valid JSON"),
    (b'[1, 2]', "is not an 'h3director-kernels' file"),
    (b'{"format": "h3director-kernels", "version": 7, "entries": []}', "version 7"),
    (b'{"format": "h3director-kernels", "version": 2, "entries": {}}', "must be a list"),
    (b'{"format": "h3director-kernels", "version": 1, "entries": []}', "has version 1, expected 2"),
], ids=["json", "utf8", "shape", "version", "entries", "version-1-keys-without-threads"])
def test_corrupt_cache_is_reported_not_trusted(cache_file, content, problem, caplog):
    cache_file.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="h3director.dit.kernels"):
        found = lookup("cpu", "bf16", widths=SMALL)
    assert found.verified == frozenset() and problem in found.problem
    assert problem in caplog.text


def test_cache_entry_with_forged_fields_is_refused(cache_file):
    verify_kernels("cpu", "bf16", rows=ROWS, widths=SMALL, cache=True)
    document = json.loads(cache_file.read_text())
    document["entries"][0]["verified"].append("everything_is_exact")
    cache_file.write_text(json.dumps(document))
    found = lookup("cpu", "bf16", widths=SMALL)
    assert found.verified == frozenset() and "must list kernel properties" in found.problem
    document["entries"][0]["verified"] = [FFN_ROW_CHUNKS]
    document["entries"][0]["failed"] = [FFN_ROW_CHUNKS]
    cache_file.write_text(json.dumps(document))
    assert "both verified and failed" in lookup("cpu", "bf16", widths=SMALL).problem


def test_oversized_cache_is_refused_unread(cache_file):
    verify_kernels("cpu", "bf16", rows=ROWS, widths=SMALL, cache=True)
    document = json.loads(cache_file.read_text())
    document["padding"] = "x" * kernel_cache.MAX_CACHE_BYTES  # otherwise valid
    cache_file.write_text(json.dumps(document))
    found = lookup("cpu", "bf16", widths=SMALL)
    assert found.verified == frozenset() and "limit" in found.problem


def test_verifying_replaces_a_corrupt_cache_and_says_so(cache_file):
    cache_file.write_text("garbage")
    report = verify_kernels("cpu", "bf16", rows=ROWS, widths=SMALL, cache=True)
    assert "not valid JSON" in report.cache_problem
    assert verified_properties("cpu", "bf16", widths=SMALL) == set(report.verified) and report.verified


@pytest.mark.parametrize("kwargs,message", [
    ({"device": "gpu"}, "unknown device"),
    ({"dtype": "int8"}, "unsupported dtype"),
    ({"rows": 0}, "rows must be"),
    ({"head_groups": (3,)}, "head groups must divide"),
    ({"properties": ("fast_math",)}, "unknown kernel properties"),
    ({"row_chunks": (0,)}, "row_chunks must be positive"),
])
def test_bad_arguments_are_refused_before_work(kwargs, message, cache_file):
    arguments = {"device": "cpu", "dtype": "fp32", "rows": ROWS, "widths": SMALL, "cache": True, **kwargs}
    with pytest.raises(InvalidInputError, match=message):
        verify_kernels(**arguments)
    assert not cache_file.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_unavailable_cuda_is_refused():
    with pytest.raises(InvalidInputError, match="CUDA is not available"):
        verify_kernels("cuda", "bf16", rows=ROWS, widths=SMALL)


# ---------------------------------------------------------------------------------------------
# The command


@pytest.fixture
def small_cli(monkeypatch):
    """The command checks at `kernels.H3_WIDTHS` (read when it runs); make those small for the test."""
    monkeypatch.setattr(kernels, "H3_WIDTHS", SMALL)


def test_cli_json_output_and_cache(small_cli, cache_file, capsys):
    assert main(["verify-kernels", "--device", "cpu", "--dtype", "fp32", "--rows", str(ROWS), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["widths"] == {"hidden": 64, "heads": 4, "head_dim": 16, "ffn": 96}
    assert document["verified"] == sorted(KERNEL_PROPERTIES) and document["failed"] == []
    assert set(document["results"]) == set(KERNEL_PROPERTIES)
    assert all(r["passed"] and r["detail"] for r in document["results"].values())
    assert document["cache_path"] == str(cache_file)
    assert verified_properties("cpu", "fp32", widths=SMALL) == set(KERNEL_PROPERTIES)


def test_cli_checks_the_extra_counts_a_node_is_set_to(small_cli, cache_file, capsys):
    assert main(["verify-kernels", "--device", "cpu", "--dtype", "fp32", "--rows", str(ROWS), "--ffn-chunks", "40",
                 "--query-chunks", "5", "--json"]) == 0
    results = json.loads(capsys.readouterr().out)["results"]
    ffn, query = results[FFN_ROW_CHUNKS]["counts"], results[ATTENTION_QUERY_CHUNKS]["counts"]
    # checked, with whichever verdict this CPU's GEMMs give 7-row chunks (40 chunks of 300 rows)
    assert 40 in ffn["passed"] + ffn["failed"] and 5 in query["passed"] + query["failed"]
    assert 40 not in kernels.DEFAULT_ROW_CHUNKS + kernels.ladder_counts(SMALL.heads)[0]    # only because asked


def test_cli_table_reports_a_failing_property_with_exit_code_zero(small_cli, cache_file, capsys, monkeypatch):
    monkeypatch.setattr(F, "linear", _make_rows_noise(F.linear))
    assert main(["verify-kernels", "--device", "cpu", "--dtype", "fp32", "--rows", str(ROWS), "--no-cache"]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in KERNEL_PROPERTIES}
    assert set(lines) == set(KERNEL_PROPERTIES)
    assert "DIFFERS" in lines[FFN_ROW_CHUNKS] and "bit-identical" in lines[ATTENTION_HEAD_GROUPS]
    assert "(not filed)" in out and not cache_file.exists()


def _make_rows_noise(original):
    def linear(x, weight, bias=None):
        return original(x, weight, bias) + x.shape[0] * 1e-2
    return linear


@pytest.mark.parametrize("argv,message", [
    (["--device", "tpu"], "unknown device"),
    (["--device", "cpu", "--dtype", "fp8"], "unsupported dtype"),
    (["--device", "cpu", "--rows", "-5"], "rows must be"),
    (["--device", "cpu", "--ffn-chunks", "1"], "extra FFN row-chunk counts must be integers from 2 to 1024"),
    (["--device", "cpu", "--query-chunks", "2000"], "extra query-chunk counts must be integers from 2 to 1024"),
] + ([] if torch.cuda.is_available() else [(["--device", "cuda:0"], "CUDA is not available")]))
def test_cli_bad_input_exits_nonzero(small_cli, cache_file, capsys, argv, message):
    assert main(["verify-kernels", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("h3director verify-kernels: error:") and message in err
    assert not cache_file.exists()


# ---------------------------------------------------------------------------------------------
# The prepared GPU script


BENCH = Path(__file__).resolve().parents[1] / "bench" / "gpu" / "dit_12gb.py"


def test_gpu_bench_help_works_without_a_gpu():
    run = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and "--card-gb" in run.stdout and "CUDA GPU" in run.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_gpu_bench_says_it_needs_a_gpu(tmp_path):
    run = subprocess.run([sys.executable, str(BENCH), "--out", str(tmp_path / "r.json")], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and "needs a CUDA GPU" in run.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_model_dtype_verify_kernels_cannot_check_has_nothing_verified():
    """The adapters ask `lookup_for_model` (through the handle's `VerificationCache`): an fp8 model is not an
    error, only nothing verified (`verified_properties` itself refuses the dtype)."""
    from h3director.dit.kernels import lookup_for_model
    from h3director.dit.memory import memory_handle

    with pytest.raises(InvalidInputError, match="unsupported dtype"):
        verified_properties("cpu", torch.float8_e4m3fn)
    assert lookup_for_model("cpu", torch.float8_e4m3fn) is None
    handle = memory_handle(ffn_chunks=2, mode="exact only", heads=4, blocks=2)
    plan, report = handle.decide(1024, torch.float8_e4m3fn, "cpu")
    assert plan.ffn_chunks == 1 and report["verified"] and report["kept_stock_unverified"]


def _small_chunks_noise(x, weight):
    """A GEMM that is bit-identical for calls of at least 100 rows and differs below (as this CPU's bf16 GEMM
    does for small row chunks at H3's widths)."""
    out = F.linear(x, weight)
    return out if x.shape[0] >= 100 else out + 1e-2


def test_a_verification_holds_only_for_the_split_counts_it_passed(cache_file):
    """8 FFN row chunks of 300 rows (38 rows each) differ, 2 and 3 pass: a tier at 2 chunks is exact, at 8
    approximate, at a count never checked unverified; "exact only" keeps an FFN split it did not pass stock."""
    from h3director.dit.tiers import DiTMemoryPlan, is_verified, keep_verified

    report = verify_kernels("cpu", "fp32", ROWS, widths=SMALL, properties=(FFN_ROW_CHUNKS,), row_chunks=(2, 3, 8),
                            linear=_small_chunks_noise, cache=True)
    assert report.results[FFN_ROW_CHUNKS].counts() == {"passed": [2, 3], "failed": [8]}
    found = lookup("cpu", "fp32", widths=SMALL, rows=ROWS)
    assert FFN_ROW_CHUNKS in found.verified and found.verified.counts[FFN_ROW_CHUNKS] == {2, 3}
    two, eight, five = (DiTMemoryPlan(ffn_chunks=n) for n in (2, 8, 5))
    assert kernels.exactness_text(two.relies_on, found, two.splits).startswith("exact (verified: ffn_row_chunks")
    assert kernels.exactness_text(eight.relies_on, found, eight.splits).startswith("approximate: max difference 0.01")
    assert kernels.exactness_text(five.relies_on, found, five.splits).startswith(
        "unverified: ffn_row_chunks at 5 splits not checked")
    assert is_verified(two, found.verified) and not is_verified(eight, found.verified)
    assert keep_verified(eight, found.verified)[0] == DiTMemoryPlan()
    assert keep_verified(two, found.verified) == (two, [])


def test_a_cache_entry_without_split_counts_holds_for_the_counts_checked_then():
    entry = {"verified": [FFN_ROW_CHUNKS, QKV_COLUMN_GROUPS], "failed": [], "results": {}}
    verified = kernels.entry_verified(entry, heads=4)
    assert verified.counts[FFN_ROW_CHUNKS] == set(kernels.LEGACY_ROW_CHUNKS)
    assert verified.counts[QKV_COLUMN_GROUPS] == {2, 4}


def test_the_default_verification_checks_every_count_of_the_escalation_ladder():
    ffn, query = kernels.ladder_counts(56)
    assert {4, 14, 28, 56, 112} <= set(ffn) and {4, 16, 64} <= set(query)
    report = verify_kernels("cpu", "fp32", ROWS, widths=SMALL, properties=(FFN_ROW_CHUNKS,))
    ladder_ffn, _ = kernels.ladder_counts(SMALL.heads)
    assert set(ladder_ffn) <= set(report.results[FFN_ROW_CHUNKS].counts()["passed"])


def test_exactness_text_takes_a_lookup_with_a_bare_set_of_names():
    """A `CacheLookup` from another reader (verified: a plain frozenset) holds for any count."""
    from h3director.dit.tiers import DiTMemoryPlan

    key = dict.fromkeys(kernel_cache.KEY_FIELDS, None) | {"device_name": "cpu: test", "dtype": "bf16"}
    entry = {"key": key, "rows": 1024, "widths": {"hidden": 64, "heads": 4, "head_dim": 16, "ffn": 96},
             "verified": [FFN_ROW_CHUNKS], "failed": [], "results": {}}
    found = kernels.CacheLookup(frozenset({FFN_ROW_CHUNKS}), key, "cache.json", entry, None, 1024)
    plan = DiTMemoryPlan(ffn_chunks=40)
    assert kernels.exactness_text(plan.relies_on, found, plan.splits).startswith("exact (verified: ffn_row_chunks")
