"""Recommendations fit their own estimate and a measured run of the real DiT, prefer exact settings, choose
the least costly setting that fits, and refuse budgets that fit nothing."""

import dataclasses
import math

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


def _sampling(plan):
    return next(p for p in plan.phases if p.name == "sampling")


def test_a_24gb_card_offloads_and_says_why():
    budget = Budget(24 * GiB, 64 * GiB)
    advice = recommend(PlanRequest(1344, 768, 124), budget)
    r = advice.request
    assert r.weights != "bf16" or r.offload_blocks > 0
    assert estimate(r).peak_device_bytes <= budget.device_usable
    # the fewest offloaded blocks: one block fewer on the device no longer fits
    assert r.offload_blocks > 0
    fewer = _sampling(estimate(dataclasses.replace(r, offload_blocks=r.offload_blocks - 1)))
    assert not budget.phase_fits(fewer)
    # the reason quotes the bf16 need: 61.73 GiB of weights (every matrix of the released DiT, float32 where the
    # release keeps float32) + the ledger's activations for 512 + 414 + 37 x 1008 rows
    bf16 = _sampling(estimate(PlanRequest(1344, 768, 124)))
    assert f"{bf16.weights_bytes / GiB:.2f} GiB weights" == "61.73 GiB weights"
    assert any(f"fully resident needs {bf16.device_bytes / GiB:.2f} GiB" in reason for reason in advice.rejected)


# A small config of the real H3 VAE (as `h3director.commands.demo_vaes.tiny_h3_vae`), so the DiT's phase is the
# largest and the budget below is decided by it.
SMALL_VAE = dict(block_out_channels=(8,) * 6, layers_per_block=1, norm_num_groups=4, decoder_num_layers=2,
                 decoder_num_attention_heads=2, decoder_attention_head_dim=16, decoder_num_register_tokens=4,
                 decoder_ffn_mult=2)


def test_a_tight_recommendation_holds_on_a_measured_forward_of_the_real_dit():
    """Independent check: the real diffusers DiT (small config, bf16, CPU) is run on the packed sequence the plan
    describes, its parameter bytes and its forward's peak live tensor bytes measured (`LiveBytesTracker`), and
    compared with a plan made for a budget the unchunked, resident DiT just fits."""
    import torch
    from diffusers import MiniMaxH3Transformer3DModel
    from plan_calibration_cases import DIT_A, dit_case

    request = PlanRequest(128, 128, 362, dit_config=DIT_A, vae_config=SMALL_VAE, audio=False, text_tokens=64,
                          fused_norms=False)                       # the CPU runs the composite RMSNorm
    need = _sampling(estimate(request)).device_bytes
    budget = Budget(math.ceil(need / 0.9) + 2, 64 * GiB, reserve_bytes=0)   # 10% margin; usable = the need
    assert 0 <= budget.device_usable - need <= 3
    advice = recommend(request, budget, formats=["bf16"])
    r, geo = advice.request, advice.estimate.geometry
    assert (r.weights, r.head_chunks, r.ffn_chunks, r.offload_blocks) == ("bf16", 1, 1, 0)
    # 362 frames = 22 encoder clips -> 22 x 5 - 3 = 107 latent frames of (128 / 32)^2 = 16 tokens; 64 text rows;
    # round(362 / 24 x 40) = 603 audio latents, 2 rows each (sampled even with no audio output)
    assert (geo.text_rows, geo.audio_rows, geo.cond_rows, geo.video_tokens) == (64, 2 * 603, 0, 107 * 16)

    model = MiniMaxH3Transformer3DModel(**DIT_A).to(torch.bfloat16)
    for name in ("proj_in", "audio_proj_in", "time_embedder", "proj_out", "audio_proj_out"):
        getattr(model, name).float()                               # as the release ships them
    measured_weights = sum(p.numel() * p.element_size() for p in model.parameters())
    measured_forward, _ = dit_case(DIT_A, geo.text_rows, geo.audio_rows, geo.video_tokens, torch.bfloat16)()
    latents = 3 * 4 * (24 * 107 * (128 // 16) ** 2 + 2 * 32 * 603)   # float32 video + stereo audio latents,
    #                                                                  velocity, step (not measured)

    sampling = _sampling(advice.estimate)
    assert sampling.weights_bytes == measured_weights
    assert abs(sampling.working_bytes - latents - measured_forward) <= 0.01 * measured_forward
    assert measured_weights + measured_forward + latents <= budget.device_bytes   # the run fits the card


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
