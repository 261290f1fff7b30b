"""The per-prompt memory ledger in a REAL ComfyUI (vendored, --cpu), read from `/h3director/stats`.

One server for the module, started with `--cache-lru 64` so that ComfyUI's output cache keeps the outputs of
earlier prompts (its default RAM-pressure cache lets them go when the machine's RAM is short). Test nodes
(`fixtures/comfy_harness/ledger_real_node`): `H3TestLeak` appends 64 MiB to a module-level list on every run;
`H3TestBigOutput` returns a new 40 MiB tensor that ComfyUI caches. A new seed each prompt makes ComfyUI run
them again.

Checks: the leak is reported by the third prompt of its workflow, its growth per prompt within 10% of 64 MiB,
its largest new tensor held by the test module's `LEAKED` list and named as node H3TestLeak, logged once
over five prompts; the caching workflow grows host RSS by about 40 MiB a prompt for 20 prompts, all of it in
ComfyUI's output cache, and is never reported.
"""

from __future__ import annotations

import json

import pytest
from comfy_harness.server import HARNESS, comfyui_server, http_get, prepare_base, submit
from comfy_harness.vendored import real_comfyui_marks

from h3director.units import MiB

pytestmark = real_comfyui_marks()
LEAK_MIB = 64
CACHED_MIB = 40


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-ledger"), [],
                        {"h3director_ledger_test_nodes": HARNESS / "ledger_real_node"})
    with comfyui_server(base, extra_args=["--cache-lru", "64"]) as server:
        yield server


def _run(comfy, workflow: dict) -> None:
    entry = submit(comfy, workflow)
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]


def _ledger(comfy) -> dict:
    status, body = http_get(f"{comfy['url']}/h3director/stats?samples=1")
    assert status == 200, body[:2000]
    ledger = json.loads(body)["ledger"]
    assert ledger is not None, "the ledger is off or not installed:\n" + comfy["log"].read_text()[-3000:]
    return ledger


def _leak_workflow(seed: int) -> dict:
    return {"1": {"class_type": "H3TestLeak", "inputs": {"seed": seed, "mib": LEAK_MIB}}}


def _cache_workflow(seed: int) -> dict:
    return {"1": {"class_type": "H3TestBigOutput", "inputs": {"seed": seed, "mib": CACHED_MIB}},
            "2": {"class_type": "H3TestBlobSink", "inputs": {"blob": ["1", 0]}}}


def test_a_leaking_node_is_reported_within_three_prompts_with_its_growth(comfy):
    for seed in range(3):
        _run(comfy, _leak_workflow(seed))
    ledger = _ledger(comfy)
    key = ledger["jobs"][-1]["key"]
    leaks = [leak for leak in ledger["leaks"] if leak["key"] == key]
    assert [leak["series"] for leak in leaks] == ["host"], json.dumps(ledger["jobs"][-3:], default=str)[:4000]
    leak = leaks[0]
    assert leak["jobs"] == 3 and leak["active"] and "H3TestLeak" in leak["label"]
    assert abs(leak["growth_per_job_bytes"] - LEAK_MIB * MiB) <= 0.1 * LEAK_MIB * MiB, leak["steps"]
    top = leak["suspects"][0]
    assert top["bytes"] == LEAK_MIB * MiB and top["device"] == "cpu" and top["dtype"] == "uint8"
    assert top["owner_kind"] == "module" and "LEAKED[" in top["owner"] and top["node"] == "H3TestLeak"

    for seed in range(3, 5):
        _run(comfy, _leak_workflow(seed))
    (leak,) = [leak for leak in _ledger(comfy)["leaks"] if leak["key"] == key]
    assert leak["jobs"] == 5 and leak["active"]
    assert abs(leak["growth_per_job_bytes"] - LEAK_MIB * MiB) <= 0.1 * LEAK_MIB * MiB, leak["steps"]
    logged = [line for line in comfy["log"].read_text().splitlines() if "memory ledger: leak" in line]
    assert len(logged) == 1 and "LEAKED[" in logged[0] and "per prompt over 3 prompts" in logged[0], logged


def test_a_workflow_that_caches_on_purpose_is_never_reported(comfy):
    for seed in range(20):
        _run(comfy, _cache_workflow(seed))
        ledger = _ledger(comfy)
        key = ledger["jobs"][-1]["key"]
        assert not [leak for leak in ledger["leaks"] if leak["key"] == key], json.dumps(ledger["leaks"])[:3000]
    jobs = [job for job in ledger["jobs"] if job["key"] == key]
    first, last = jobs[0]["end"], jobs[-1]["end"]
    # ComfyUI kept every prompt's 40 MiB output, and the process grew by about as much: without the
    # accounting of the output cache, this growth would be a leak
    assert last["kept_groups"]["output_cache"]["cpu"] >= 20 * CACHED_MIB * MiB
    assert last["kept_details"]["output_cache_entries"] >= 40
    grown = last["host_rss_bytes"] - first["host_rss_bytes"]
    assert grown >= 0.9 * (len(jobs) - 1) * CACHED_MIB * MiB, grown
    assert all(job["status"] == "success" for job in jobs)
