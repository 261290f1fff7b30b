"""`h3director.dit.capacity.CapacityCheck`: need from the planner's ledgers, have from the device reader.

The device reader here is a FAKE: a function with the interface of `h3director.core.devices.sample_device`
(device -> `DeviceSample`) returning fixed numbers, so "have" is known exactly on a CPU-only machine. The
cost model is the real one (`ledger_cost_model`: the planner's per-block ledgers at the released width).
"""

from __future__ import annotations

import pytest

from h3director.core.devices import DeviceSample
from h3director.dit.capacity import (
    CapacityCheck,
    device_have_bytes,
    ledger_cost_model,
)
from h3director.dit.tiers import (
    ATTENTION_HEAD_GROUPS,
    FFN_ROW_CHUNKS,
    LIFETIME_ONLY,
    QKV_COLUMN_GROUPS,
    STOCK,
    DiTMemoryPlan,
)
from h3director.errors import BudgetError, InvalidInputError
from h3director.units import GiB

ROWS = 110_000          # 1344x768, 362 frames


def fake_reader(free: int, allocated: int = 0, reserved: int | None = None, backend: str = "cuda",
                estimate: bool = False, total: int = 24 * GiB):
    def read(device):
        return DeviceSample(str(device), backend, allocated, allocated if reserved is None else reserved, allocated,
                            free, total, 0.0, reserved_is_estimate=estimate)
    return read


def check(free: int, **kwargs) -> CapacityCheck:
    model = ledger_cost_model(framework="comfy")
    return CapacityCheck(model, "cuda:0", margin=0.10, reader=fake_reader(free), **kwargs)


def need(plan, framework="comfy", rows=ROWS, margin=0.10, calibration=1.0):
    return int(ledger_cost_model(framework=framework)(plan, rows, "bf16") * calibration * (1 + margin))


def test_floor_that_fits_is_kept():
    capacity = check(free=64 * GiB)
    decision = capacity.choose(ROWS, "bf16", LIFETIME_ONLY, "auto", set())
    assert decision.plan == LIFETIME_ONLY and not decision.escalated and decision.verified_exact
    assert decision.need_bytes == need(LIFETIME_ONLY)
    assert decision.have_bytes == 64 * GiB


def test_escalates_to_the_first_tier_that_fits():
    have = need(DiTMemoryPlan(head_chunks=4, ffn_chunks=8)) + 1
    capacity = check(free=have)
    decision = capacity.choose(ROWS, "bf16", LIFETIME_ONLY, "auto", set())
    assert decision.escalated and decision.need_bytes <= have
    assert decision.plan.head_chunks >= 2           # FFN chunks alone do not get there
    assert not decision.verified_exact              # nothing verified
    # every tier tried before it needed more than the device has
    for plan in capacity.candidates(LIFETIME_ONLY, ROWS, "auto"):
        if plan == decision.plan:
            break
        assert capacity.need_bytes(plan, ROWS, "bf16") > have


def test_floor_is_respected_when_escalating():
    capacity = check(free=need(DiTMemoryPlan(head_chunks=8, ffn_chunks=16)) + 1)
    decision = capacity.choose(ROWS, "bf16", DiTMemoryPlan(head_chunks=8, ffn_chunks=4), "auto", set())
    assert decision.plan.head_chunks >= 8 and decision.plan.ffn_chunks >= 4


def test_exact_only_skips_tiers_not_verified():
    have = need(DiTMemoryPlan(ffn_chunks=2)) + 1
    # only FFN row chunks verified: head groups are off limits, FFN chunks are fine
    capacity = check(free=have)
    decision = capacity.choose(ROWS, "bf16", LIFETIME_ONLY, "exact only", {FFN_ROW_CHUNKS})
    assert decision.plan.head_chunks == 1 and decision.plan.ffn_chunks > 1 and decision.verified_exact
    # nothing verified: only lifetime frees may run, and they do not fit -> refused, naming verify-kernels
    with pytest.raises(BudgetError) as refused:
        capacity.choose(ROWS, "bf16", LIFETIME_ONLY, "exact only", set())
    assert "verify-kernels" in str(refused.value)
    # head groups verified too: allowed
    tight = check(free=need(DiTMemoryPlan(head_chunks=4, ffn_chunks=8)) + 1)
    decision = tight.choose(ROWS, "bf16", LIFETIME_ONLY, "exact only",
                            {FFN_ROW_CHUNKS, QKV_COLUMN_GROUPS, ATTENTION_HEAD_GROUPS})
    assert decision.plan.head_chunks > 1 and decision.verified_exact


def test_exact_only_escalates_only_through_split_counts_that_were_verified():
    """Head groups verified at 4 groups only and FFN row chunks at 8 (`Verified` counts, as `kernels.lookup` gives
    them): the tier with 7 groups and 14 FFN chunks is not exact, so "exact only" refuses where a bare set of names
    would run it, and "auto" runs it reported unverified."""
    from h3director.dit.tiers import Verified

    names = {FFN_ROW_CHUNKS, QKV_COLUMN_GROUPS, ATTENTION_HEAD_GROUPS}
    seven = DiTMemoryPlan(head_chunks=7, ffn_chunks=14)
    have = need(seven) + 1
    assert need(DiTMemoryPlan(head_chunks=4, ffn_chunks=8)) > have
    capacity = check(free=have)
    assert capacity.choose(ROWS, "bf16", LIFETIME_ONLY, "exact only", names).plan == seven
    four = Verified(names, {QKV_COLUMN_GROUPS: [4], ATTENTION_HEAD_GROUPS: [4], FFN_ROW_CHUNKS: [8]})
    with pytest.raises(BudgetError) as refused:
        capacity.choose(ROWS, "bf16", LIFETIME_ONLY, "exact only", four)
    assert "not verified at its split counts" in str(refused.value)
    decision = capacity.choose(ROWS, "bf16", LIFETIME_ONLY, "auto", four)
    assert decision.plan == seven and not decision.verified_exact
    assert check(free=64 * GiB).choose(ROWS, "bf16", DiTMemoryPlan(head_chunks=4, ffn_chunks=8), "exact only",
                                       four).verified_exact


def test_fixed_mode_checks_only_the_given_tier():
    plan = DiTMemoryPlan(ffn_chunks=2)
    roomy = check(free=need(plan) + 1)
    assert roomy.choose(ROWS, "bf16", plan, "fixed", set()).plan == plan
    tight = check(free=need(plan) - 1)
    with pytest.raises(BudgetError) as refused:
        tight.choose(ROWS, "bf16", plan, "fixed", set())
    message = str(refused.value)
    assert "head_chunks" in message and "mode auto" in message


def test_refusal_names_need_have_smallest_tier_and_device_kind():
    capacity = check(free=1 * GiB)
    with pytest.raises(BudgetError) as refused:
        capacity.choose(ROWS, "bf16", LIFETIME_ONLY, "auto", set())
    message = str(refused.value)
    assert message.startswith("[Director Safety] GPU memory limit exceeded on cuda:0")
    assert "needs" in message and "can give 1.00 GiB" in message and "smallest tier" in message
    assert "no tier fits" in message
    on_cpu = CapacityCheck(ledger_cost_model(framework="comfy", device="cpu"), "cpu", reader=fake_reader(GiB, backend="cpu"))
    with pytest.raises(BudgetError, match=r"^\[Director Safety\] CPU memory limit exceeded on cpu"):
        on_cpu.choose(ROWS, "bf16", LIFETIME_ONLY, "auto", set())


def test_calibration_only_rises():
    capacity = check(free=64 * GiB)
    predicted = capacity.cost_model(LIFETIME_ONLY, ROWS, "bf16")
    capacity.choose(ROWS, "bf16", LIFETIME_ONLY, "auto", set())
    assert capacity.observe(ROWS, LIFETIME_ONLY, predicted // 2) == 1.0
    assert capacity.observe(ROWS, LIFETIME_ONLY, int(predicted * 1.25)) == pytest.approx(1.25, rel=1e-6)
    assert capacity.observe(ROWS, LIFETIME_ONLY, predicted) == pytest.approx(1.25, rel=1e-6)
    assert capacity.need_bytes(LIFETIME_ONLY, ROWS, "bf16") == need(LIFETIME_ONLY, calibration=capacity.calibration)


def test_have_counts_allocator_cache_budget_and_reclaimable_weights():
    # native caching allocator: free + cached-but-unused
    assert device_have_bytes(fake_reader(10 * GiB, allocated=4 * GiB, reserved=6 * GiB)("cuda")) == 12 * GiB
    # cudaMallocAsync with no reserved counter: the device-wide estimate is not this pool's slack
    sample = fake_reader(10 * GiB, allocated=4 * GiB, reserved=14 * GiB, backend="cuda-async", estimate=True)("cuda")
    assert device_have_bytes(sample) == 10 * GiB
    budgeted = CapacityCheck(ledger_cost_model(), "cuda", budget_bytes=12 * GiB, reclaimable_bytes=3 * GiB,
                             reader=fake_reader(40 * GiB, allocated=5 * GiB))
    assert budgeted.have_bytes() == (12 - 5 + 3) * GiB


def test_stock_floor_escalates_through_the_whole_ladder():
    capacity = check(free=need(DiTMemoryPlan(ffn_chunks=2)) + 1)
    decision = capacity.choose(ROWS, "bf16", STOCK, "auto", set())
    assert not decision.plan.is_stock and decision.escalated


def test_bad_input_is_refused():
    with pytest.raises(InvalidInputError, match="mode"):
        check(free=GiB).choose(ROWS, "bf16", LIFETIME_ONLY, "fast", set())
    with pytest.raises(InvalidInputError, match="divide"):
        check(free=GiB).choose(ROWS, "bf16", DiTMemoryPlan(head_chunks=5), "auto", set())
    with pytest.raises(InvalidInputError, match="budget_bytes"):
        CapacityCheck(ledger_cost_model(), "cuda", budget_bytes=0)
    with pytest.raises(InvalidInputError, match="heads"):
        CapacityCheck(lambda plan, rows, dtype: 0, "cuda")


def test_a_per_process_memory_fraction_caps_what_the_check_may_use():
    """Under `torch.cuda.set_per_process_memory_fraction` the caching allocator holds at most fraction x total,
    whatever the device reports free: the check's have is that cap less the live tensors (a stand-in cap reader
    mirrors `cuda_process_cap`, which needs a CUDA device)."""
    from h3director.dit.capacity import cuda_process_cap

    reader = fake_reader(60 * GiB, allocated=4 * GiB, total=80 * GiB)
    uncapped = CapacityCheck(ledger_cost_model(), "cuda:0", reader=reader)
    capped = CapacityCheck(ledger_cost_model(), "cuda:0", reader=reader, process_cap_reader=lambda device: 0.125)
    assert uncapped.have_bytes() == 60 * GiB
    assert capped.have_bytes() == 10 * GiB - 4 * GiB
    assert cuda_process_cap("cpu") is None
