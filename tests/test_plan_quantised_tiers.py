"""The planner prices the quantised DiT tiers: how each weights format's linears run (`plan.quantised_tiers`),
what their calls add to sampling, and which tiers the registry offers for them (the real-ComfyUI check that
the planned calls are what the DiT node reads off loaded layers: tests/test_dit_quant_comfy.py)."""

from __future__ import annotations

import pytest

from h3director.dit import quantised
from h3director.errors import InvalidInputError
from h3director.plan import capabilities as caps
from h3director.plan.estimate import PlanRequest, estimate
from h3director.plan.quantised_tiers import LAYOUTS, format_tiers, kernel_paths, tiers_for
from h3director.plan.recommend import Budget, chunkings, recommend
from h3director.units import GiB

REQUEST = PlanRequest(1344, 768, 124)


def sampling(**changes) -> int:
    plan = estimate(PlanRequest(**{**REQUEST.__dict__, **changes}))
    return next(p.working_bytes for p in plan.phases if p.name == "sampling")


@pytest.mark.parametrize("target", caps.TARGETS)
def test_every_offered_quantised_format_has_its_layers_named(target):
    for fmt in caps.dit_formats(target):
        if fmt in ("bf16", "fp16", "fp32"):
            assert LAYOUTS[target].get(fmt) is None
        else:
            assert LAYOUTS[target][fmt], f"{fmt} loads in {target} but the planner does not know its layers"


@pytest.mark.parametrize("fmt", sorted(f for f, layout in LAYOUTS["comfyui"].items() if "Layout" in layout))
@pytest.mark.parametrize("path", quantised.PATHS)
def test_the_planners_chunking_is_the_dit_decision_for_a_layer_without_input_scale(fmt, path):
    layout = LAYOUTS["comfyui"][fmt]
    tiers = format_tiers(fmt, "comfyui", path)
    _, qkv = quantised.decide(layout, path, quantised.WEIGHT_ROWS)
    _, ffn = quantised.decide(layout, path, quantised.ROWS, static_scale=False)
    assert qkv is None and tiers.ffn_chunks == (ffn is None)       # every planned layout slices weight rows
    assert bool(tiers.kept) == (ffn is not None)


def test_quantised_calls_are_priced_and_chunking_cuts_them():
    for tier in ((1, 1), (4, 8)):
        heads, ffn = tier
        bf16 = sampling(head_chunks=heads, ffn_chunks=ffn)
        cuda = sampling(weights="int8", head_chunks=heads, ffn_chunks=ffn)
        cpu = sampling(weights="int8", head_chunks=heads, ffn_chunks=ffn, device="cpu")
        assert cpu > cuda > bf16           # comfy_kitchen's eager int32 accumulator > an int8 copy of the input
    stock = sampling(weights="int8", device="cpu") - sampling()
    chunked = sampling(weights="int8", device="cpu", head_chunks=4, ffn_chunks=8) - sampling(head_chunks=4,
                                                                                             ffn_chunks=8)
    assert chunked < stock / 2             # the accumulator is rows x 2 ffn: FFN chunks cut it
    # the rotation's float copy of the input costs int8_convrot more than int8
    assert sampling(weights="int8_convrot", head_chunks=4, ffn_chunks=8) > sampling(weights="int8", head_chunks=4,
                                                                                      ffn_chunks=8)


def test_the_plan_names_the_layout_and_path_it_priced():
    notes = estimate(PlanRequest(1344, 768, 124, weights="int8", head_chunks=4, ffn_chunks=8)).notes
    assert any("TensorWiseINT8Layout (native)" in n and "MiB to sampling" in n for n in notes)
    assert not any("Layout" in n for n in estimate(REQUEST).notes)


def test_nvfp4_path_follows_the_compute_capability_and_unknown_prices_the_costlier():
    assert kernel_paths("nvfp4", "comfyui", "cuda", (12, 0)) == (quantised.NATIVE,)
    assert kernel_paths("nvfp4", "comfyui", "cuda", (8, 9)) == (quantised.EMULATED,)
    assert kernel_paths("nvfp4", "comfyui", "cpu", None) == (quantised.EMULATED,)
    assert kernel_paths("int8", "comfyui", "cuda", (7, 5)) == (quantised.NATIVE,)
    assert kernel_paths("fp8_scaled", "comfyui", "cuda", (8, 9)) == (quantised.NATIVE,)
    assert kernel_paths("fp8_scaled", "comfyui", "cuda", (8, 6)) == (quantised.EMULATED,)
    known = [sampling(weights="nvfp4", compute_capability=cc) for cc in ((12, 0), (8, 9))]
    assert sampling(weights="nvfp4") == max(known)
    unknown = estimate(PlanRequest(1344, 768, 124, weights="nvfp4")).notes
    assert any("compute capability is not known" in n for n in unknown)


def test_ffn_chunks_are_offered_only_where_they_act():
    assert tiers_for("int8", "comfyui").ffn_chunks and tiers_for("q4_k_m", "diffusers").ffn_chunks
    nvfp4 = tiers_for("nvfp4", "comfyui")
    assert not nvfp4.ffn_chunks and any("input_scale" in line for line in nvfp4.kept)
    assert all(ffn == 1 for _, ffn in chunkings(56, "nvfp4", "comfyui"))
    assert any(heads > 1 for heads, _ in chunkings(56, "nvfp4", "comfyui"))       # head groups still act
    assert any(ffn > 1 for _, ffn in chunkings(56, "int8", "comfyui"))
    request = PlanRequest(1344, 768, 124, weights="nvfp4", head_chunks=4, ffn_chunks=8)
    with pytest.raises(InvalidInputError, match="ffn_chunks=8 does not act on nvfp4.*input_scale"):
        caps.applied_settings(request, "comfyui")


def test_a_tight_budget_gets_nvfp4_head_groups_and_no_ffn_chunks():
    advice = recommend(PlanRequest(1344, 768, 362), Budget(16 * GiB, 64 * GiB, compute_capability=(12, 0)),
                       formats=["nvfp4"])
    assert advice.request.weights == "nvfp4" and advice.request.ffn_chunks == 1
    assert advice.request.compute_capability == (12, 0) and advice.request.target == "comfyui"
    assert any("TensorCoreNVFP4Layout (native)" in n for n in advice.to_dict()["notes"])
    how = [a.text for a in advice.applied() if a.capability == "dit.chunking"]
    assert all("TensorCoreNVFP4Layout" in text for text in how)


def test_quantised_formats_load_only_where_a_loader_reads_them():
    for fmt in ("fp8_scaled", "int8", "int8_convrot", "nvfp4"):
        assert fmt in caps.dit_formats("comfyui") and fmt not in caps.dit_formats("diffusers")
        with pytest.raises(InvalidInputError, match="no loader for target diffusers"):
            recommend(REQUEST, Budget(80 * GiB, 64 * GiB), formats=[fmt], target="diffusers")


@pytest.mark.parametrize("bad", [(8,), (8, 9, 0), (-1, 0), ("8", "9"), [8, 9], (8.0, 9), (True, 0)])
def test_a_bad_compute_capability_is_refused_before_pricing(bad):
    with pytest.raises(InvalidInputError, match="compute_capability"):
        estimate(PlanRequest(1344, 768, 124, compute_capability=bad))


def test_a_bad_device_or_target_is_refused():
    with pytest.raises(InvalidInputError, match="device"):
        estimate(PlanRequest(1344, 768, 124, device="tpu"))
    with pytest.raises(InvalidInputError, match="target"):
        estimate(PlanRequest(1344, 768, 124, target="invokeai"))
