"""The per-job memory ledger (h3director.core.ledger) on real tensors and the real process RSS.

Each job allocates real CPU tensors (ones: every page touched, so resident) and either leaks them into a
module-level list, keeps them in a cache the caller declares as kept on purpose, or drops them as cyclic
garbage; the ledger must report exactly the first, with its growth within 10% and its holder named.
"""

from __future__ import annotations

import gc
import json
import logging

import pytest
import torch

from h3director.core.held_tensors import StorageSet, TensorCensus, held_tensor_bytes
from h3director.core.ledger import HOST, KeptMemory, LeakRule, MemoryLedger
from h3director.core.tensor_owners import find_owners
from h3director.errors import InvalidInputError
from h3director.units import MiB

LEAKED: list[torch.Tensor] = []
STEP = 32 * MiB


def _block(nbytes: int = STEP) -> torch.Tensor:
    return torch.ones(nbytes, dtype=torch.uint8)


class Holder:
    def __init__(self):
        self.items = []


HELD = Holder()


@pytest.fixture(autouse=True)
def _empty_module_state():
    LEAKED.clear()
    HELD.items.clear()
    yield
    LEAKED.clear()
    HELD.items.clear()


def test_held_bytes_count_each_storage_once_per_device():
    base = torch.zeros(1000, dtype=torch.float32)
    module = torch.nn.Linear(10, 20)
    objects = [{"a": base, "view": base[10:20]}, [base, (module,)], Holder()]
    held = held_tensor_bytes(objects)
    expected = 4000 + sum(p.numel() * 4 for p in module.parameters())
    assert held.by_device == {"cpu": expected} and held.storages == 3 and not held.truncated
    shared = StorageSet()
    held_tensor_bytes([base], storages=shared)
    assert held_tensor_bytes(objects, storages=shared).by_device == {"cpu": expected - 4000}


def test_census_lists_new_storages_largest_first():
    keep = [_block(1 * MiB)]
    before = TensorCensus.take()
    keep += [_block(3 * MiB), _block(2 * MiB), keep[0][:100]]  # a view of an old storage is not new
    new = TensorCensus.take().new_since(before)
    assert [item.nbytes for item in new[:2]] == [3 * MiB, 2 * MiB]
    assert all(item.nbytes != 1 * MiB for item in new)


def test_owners_name_module_globals_objects_and_functions():
    LEAKED.append(_block(1024))
    HELD.items.append(_block(2048))
    inner = _block(512)

    def closure():
        return inner

    owners = find_owners([LEAKED[0], HELD.items[0], inner])
    assert owners[0].kind == "module" and owners[0].name == __name__ and owners[0].path == "LEAKED[0]"
    assert owners[1].kind == "object" and owners[1].name == f"{__name__}.Holder" and owners[1].path == ".items[0]"
    assert owners[1].holder == f"{__name__}.HELD"
    assert owners[2].kind == "function" and owners[2].name.endswith("closure")
    assert closure() is inner


def test_a_leak_is_reported_within_three_jobs_with_its_growth_and_holder(caplog):
    ledger = MemoryLedger(rule=LeakRule(jobs=3, min_growth_bytes=8 * MiB), name_node=lambda owner: "LeakyStep")
    caplog.set_level(logging.WARNING, logger="h3director.ledger")
    for i in range(5):
        with ledger.job("render", label=f"job {i}"):
            scratch = _block()          # freed at the end: not a leak
            LEAKED.append(_block())     # kept by a module global: the leak
            del scratch
        if i == 2:
            assert len(ledger.leaks) == 1, [r.steps for r in ledger.records]
    (leak,) = ledger.leaks
    assert not ledger.records[0].collected and all(r.collected for r in ledger.records[1:])  # job 0: baseline only
    assert leak.series == HOST and leak.key == "render" and leak.active and leak.first_job == 0
    assert len(leak.steps) == 4
    assert abs(leak.growth_per_job_bytes - STEP) <= 0.1 * STEP, leak.steps
    top = leak.suspects[0]
    assert top["bytes"] == STEP and top["device"] == "cpu" and top["dtype"] == "uint8"
    assert top["owner_kind"] == "module" and top["module"] == __name__ and top["owner"].startswith(f"module {__name__}: LEAKED[")
    assert top["node"] == "LeakyStep"
    lines = [r for r in caplog.records if "leak" in r.getMessage()]
    assert len(lines) == 1 and "LEAKED[" in lines[0].getMessage() and "per job over 3 jobs" in lines[0].getMessage()


def test_growth_kept_on_purpose_is_not_a_leak_and_would_be_without_the_accounting():
    cache: dict[int, torch.Tensor] = {}
    declared = MemoryLedger(rule=LeakRule(jobs=3, min_growth_bytes=8 * MiB),
                            kept=lambda: KeptMemory({"cache": [cache]}, {"entries": len(cache)}))
    blind = MemoryLedger(rule=LeakRule(jobs=3, min_growth_bytes=8 * MiB))
    for i in range(8):
        declared.begin("cached")
        blind.begin("cached")
        cache[i] = _block()
        declared.end()
        blind.end()
    assert declared.leaks == []
    assert [leak.series for leak in blind.leaks] == [HOST]
    last = declared.records[-1].end
    assert last.kept_bytes["cpu"] == 8 * STEP and last.kept_groups["cache"]["cpu"] == 8 * STEP
    assert last.kept_details == {"entries": 8}


def test_cyclic_garbage_waiting_for_the_collector_is_not_a_leak():
    ledger = MemoryLedger(rule=LeakRule(jobs=3, min_growth_bytes=8 * MiB))
    gc.disable()
    try:
        for _ in range(5):
            with ledger.job("cycles"):
                cycle = [_block()]
                cycle.append(cycle)    # only the collector frees it
                del cycle
    finally:
        gc.enable()
    assert ledger.leaks == []
    assert any(record.collected for record in ledger.records)


def test_jobs_of_other_keys_in_between_neither_hide_nor_fake_a_leak():
    ledger = MemoryLedger(rule=LeakRule(jobs=3, min_growth_bytes=8 * MiB))
    for i in range(4):
        with ledger.job("leaky"):
            LEAKED.append(_block())
        with ledger.job("first-time-cost" if i == 0 else "clean"):
            if i == 0:
                HELD.items.append(_block(2 * STEP))  # a one-time cost of another workflow
    assert [(leak.key, leak.series) for leak in ledger.leaks] == [("leaky", HOST)]
    assert ledger.leaks[0].suspects[0]["owner"].startswith(f"module {__name__}: LEAKED[")


def test_a_leak_that_stops_growing_becomes_inactive():
    ledger = MemoryLedger(rule=LeakRule(jobs=3, min_growth_bytes=8 * MiB))
    for i in range(5):
        with ledger.job("w"):
            if i < 3:
                LEAKED.append(_block())
    (leak,) = ledger.leaks
    assert not leak.active and leak.last_job == 2
    data = ledger.to_dict(jobs=2)
    assert len(data["jobs"]) == 2 and data["leaks"][0]["jobs"] == 3 and data["devices"] == [HOST]
    assert data["jobs"][-1]["end"]["unexplained"][HOST] == data["jobs"][-1]["end"]["host_rss_bytes"]


def test_bad_arguments_are_refused():
    with pytest.raises(InvalidInputError, match="jobs must be an integer >= 2"):
        LeakRule(jobs=1)
    with pytest.raises(InvalidInputError, match="min_growth_bytes"):
        LeakRule(min_growth_bytes=0)
    with pytest.raises(InvalidInputError, match="unknown device"):
        MemoryLedger(devices=("tpu",))
    ledger = MemoryLedger()
    with pytest.raises(InvalidInputError, match="without a job begun"):
        ledger.end()
    with pytest.raises(InvalidInputError, match="non-empty string"):
        ledger.begin("")


def test_workflow_key_follows_the_graph_not_the_literal_values():
    from h3director.comfy.prompt_ledger import prompt_label, workflow_key

    prompt = {"1": {"class_type": "KSampler", "inputs": {"seed": 1, "model": ["2", 0]}},
              "2": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "a.safetensors"}}}
    reseeded = json.loads(json.dumps(prompt))
    reseeded["1"]["inputs"]["seed"] = 2
    reseeded["2"]["inputs"]["ckpt_name"] = "b.safetensors"
    rewired = json.loads(json.dumps(prompt))
    rewired["1"]["inputs"]["model"] = ["3", 0]
    renamed = json.loads(json.dumps(prompt))
    renamed["2"]["class_type"] = "UNETLoader"
    assert workflow_key(prompt) == workflow_key(reseeded)
    assert len({workflow_key(prompt), workflow_key(rewired), workflow_key(renamed)}) == 3
    assert prompt_label("0123456789", prompt) == "prompt 01234567: KSampler, CheckpointLoaderSimple"


def test_the_stats_ledger_is_null_when_the_switch_is_off():
    from h3director.comfy import prompt_ledger
    from h3director.core.config import validate_config

    on, off = validate_config({}), validate_config({"monitor": {"prompt_ledger": False}})
    assert on.monitor.prompt_ledger and on.monitor.leak_prompts == 3 and on.monitor.leak_min_growth_mb == 16
    ledger = prompt_ledger.make_ledger(on, ["cpu"])
    assert ledger.rule == LeakRule(jobs=3, min_growth_bytes=16 * MiB) and ledger.unit == "prompt"
    previous = prompt_ledger._ledger
    prompt_ledger._ledger = ledger
    try:
        assert prompt_ledger.ledger_payload(off) is None
        payload = prompt_ledger.ledger_payload(on)
        assert payload["rule"] == {"jobs": 3, "min_growth_bytes": 16 * MiB} and payload["jobs"] == []
    finally:
        prompt_ledger._ledger = previous
