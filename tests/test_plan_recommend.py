"""Recommendations fit their own estimate, prefer exact settings, and refuse budgets that fit nothing."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from h3director.errors import BudgetError
from h3director.plan.estimate import PlanRequest, estimate
from h3director.plan.recommend import Budget, recommend

GiB = 1024**3
CANVASES = [(1344, 768), (768, 1344), (1024, 1024), (736, 416), (640, 384)]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(canvas=st.sampled_from(CANVASES), n=st.integers(min_value=1, max_value=21),
       vram_gib=st.integers(min_value=4, max_value=141), ram_gib=st.integers(min_value=8, max_value=512),
       fixed=st.sampled_from([None, "int8", "q4_k_m", "bf16"]))
def test_recommendation_always_fits_its_own_prediction(canvas, n, vram_gib, ram_gib, fixed):
    width, height = canvas
    budget = Budget(vram_gib * GiB, ram_gib * GiB)
    try:
        advice = recommend(PlanRequest(width, height, 17 * n + 5), budget, formats=[fixed] if fixed else None)
    except BudgetError as exc:
        assert "nothing fits" in str(exc) or "text encoder" in str(exc)
        return
    again = estimate(advice.request)               # re-estimate from the chosen settings alone
    assert again.peak_device_bytes <= budget.device_usable
    assert again.peak_host_bytes <= budget.host_usable
    if fixed:
        assert advice.request.weights == fixed
    if advice.long_form:
        assert (advice.long_form.chunk_frames - 5) % 17 == 0
        assert advice.long_form.chunk_frames < 17 * n + 5


def test_a_large_budget_keeps_everything_exact_and_resident():
    advice = recommend(PlanRequest(1344, 768, 124), Budget(141 * GiB, 512 * GiB))
    r = advice.request
    assert (r.weights, r.offload_blocks, r.head_chunks, r.ffn_chunks) == ("bf16", 0, 1, 1)
    assert r.text_encoder_device == "gpu" and r.text_encoder_weights == "bf16"
    assert not advice.rejected


def test_a_24gb_card_offloads_and_says_why():
    advice = recommend(PlanRequest(1344, 768, 124), Budget(24 * GiB, 64 * GiB))
    assert advice.request.weights != "bf16" or advice.request.offload_blocks > 0
    assert any("fully resident needs" in reason for reason in advice.rejected)
    assert estimate(advice.request).peak_device_bytes <= Budget(24 * GiB, 64 * GiB).device_usable


def test_long_videos_on_small_cards_are_split_on_the_grid():
    budget = Budget(10 * GiB, 48 * GiB)
    advice = recommend(PlanRequest(1344, 768, 362), budget, formats=["q4_k_m"])
    assert advice.long_form is not None
    lf = advice.long_form
    assert (lf.chunk_frames - 5) % 17 == 0 and lf.overlap_frames == 22
    covered = lf.chunk_frames + (lf.chunks - 1) * (lf.chunk_frames - lf.overlap_frames)
    assert covered >= 362


def test_a_budget_that_fits_nothing_is_refused_with_the_need():
    with pytest.raises(BudgetError, match=r"nothing fits: even a 39-frame chunk .* needs .* usable"):
        recommend(PlanRequest(1344, 768, 124), Budget(3 * GiB, 64 * GiB))


def test_a_device_budget_swallowed_by_the_margin_is_refused():
    with pytest.raises(BudgetError, match="leaves nothing after the 10% margin"):
        recommend(PlanRequest(1344, 768, 124), Budget(512 * 1024**2, 64 * GiB))


def test_a_plain_byte_budget_uses_this_machines_ram_for_the_host():
    import psutil

    request = PlanRequest(736, 416, 124)
    try:
        advice = recommend(request, 141 * GiB)
    except BudgetError:
        return                                    # this machine's RAM cannot hold what the plan needs
    assert advice.budget.host_bytes <= psutil.virtual_memory().total
    assert estimate(advice.request).peak_host_bytes <= advice.budget.host_usable
