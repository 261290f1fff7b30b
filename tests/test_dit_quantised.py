"""The quantised-layout decisions (`h3director.dit.quantised`) and their pricing in the block ledger
(`h3director.plan.quantised_bytes` through `plan.activations`): no ComfyUI needed (the ComfyUI side is
tests/test_dit_quant_comfy.py)."""

from __future__ import annotations

import pytest

from h3director.dit import quantised
from h3director.dit.tiers import Exactness
from h3director.errors import InvalidInputError
from h3director.plan.activations import DiTShape, dit_block_peak_bytes, dit_block_section_peaks
from h3director.plan.quantised_bytes import CALLS, BlockLinears, call_for

# the layouts ComfyUI's quant_ops.QUANT_ALGOS maps its formats to (the vendored tree), plus int8 with rotation
COMFY_LAYOUTS = ("TensorCoreFP8E4M3Layout", "TensorCoreFP8E5M2Layout", "TensorCoreNVFP4Layout", "TensorCoreMXFP8Layout",
                 "TensorWiseINT8Layout", "TensorWiseINT8Layout+convrot", "TensorCoreConvRotW4A4Layout",
                 "AsymW4A8Int8Layout")


@pytest.mark.parametrize("layout", COMFY_LAYOUTS)
@pytest.mark.parametrize("path", quantised.PATHS)
def test_every_comfy_layout_has_a_rule_on_both_paths(layout, path):
    rule = quantised.rule_for(layout, path)
    assert rule is not None and rule.reason
    for use in (quantised.ROWS, quantised.WEIGHT_ROWS):
        assert rule.exactness(use) in (Exactness.BY_CONSTRUCTION, Exactness.WHERE_VERIFIED, None)


def test_only_plain_int8_is_exact_by_construction_in_rows():
    by_construction = {key for key, rule in quantised.LAYOUTS.items() if rule.rows == Exactness.BY_CONSTRUCTION}
    assert by_construction == {("TensorWiseINT8Layout", quantised.NATIVE)}
    assert quantised.rule_for("TensorWiseINT8Layout", quantised.EMULATED).rows == Exactness.WHERE_VERIFIED
    # the rotation is a float GEMM over the rows; the weight-row side stays integer
    rotated = quantised.rule_for("TensorWiseINT8Layout+convrot", quantised.NATIVE)
    assert (rotated.rows, rotated.weight_rows) == (Exactness.WHERE_VERIFIED, Exactness.BY_CONSTRUCTION)


def test_unknown_layout_is_kept_and_named_never_guessed():
    rule, reason = quantised.decide("SomeoneElsesW3A5Layout", quantised.NATIVE, quantised.ROWS)
    assert rule is None and "SomeoneElsesW3A5Layout" in reason and "not guessed" in reason


def test_dynamic_activation_scale_keeps_rows_whole_but_not_weight_rows():
    layout = "TensorCoreNVFP4Layout"
    rule, reason = quantised.decide(layout, quantised.NATIVE, quantised.ROWS, static_scale=False)
    assert reason is not None and "input_scale" in reason and layout in reason
    assert quantised.decide(layout, quantised.NATIVE, quantised.ROWS, static_scale=True)[1] is None
    assert quantised.decide(layout, quantised.NATIVE, quantised.WEIGHT_ROWS, static_scale=False)[1] is None
    # fp8's quantiser uses 1.0 without an input_scale: one scale for every chunk
    assert quantised.decide("TensorCoreFP8E4M3Layout", quantised.NATIVE, quantised.ROWS, static_scale=False)[1] is None


def test_row_group_refusal_names_the_layout():
    # H3: 56 heads x 128 rows: every head split lands on the 128-row tiles
    for chunks in (1, 2, 4, 7, 8, 14, 28, 56):
        quantised.check_weight_row_groups("TensorCoreNVFP4Layout", quantised.NATIVE, 56, 128, chunks)
    with pytest.raises(InvalidInputError, match="TensorCoreMXFP8Layout.*128"):
        quantised.check_weight_row_groups("TensorCoreMXFP8Layout", quantised.EMULATED, 4, 64, 4)
    quantised.check_weight_row_groups("TensorCoreMXFP8Layout", quantised.NATIVE, 4, 64, 2)   # 128 rows: fine
    quantised.check_weight_row_groups("TensorWiseINT8Layout", quantised.NATIVE, 4, 64, 4)    # no row group


def test_priced_layouts_are_layouts_the_director_chunks():
    assert set(CALLS) <= set(quantised.LAYOUTS)


SHAPE = DiTShape()            # the released H3 DiT
ROWS = 8192


def block(plan, linears=None, device="cpu"):
    return dit_block_peak_bytes(SHAPE, ROWS, "bf16", framework="comfy", head_chunks=plan[0], ffn_chunks=plan[1],
                                lifetime=True, linears=linears)


def test_ledger_prices_the_int8_kernel_and_what_chunking_saves_of_it():
    int8 = call_for("TensorWiseINT8Layout", "native", 2)
    cpu = BlockLinears(qkv=int8, fc1=int8, fc2=int8, device="cpu")
    cuda = BlockLinears(qkv=int8, fc1=int8, fc2=int8, device="cuda")
    for plan in ((1, 1), (4, 8)):
        assert block(plan, cpu) > block(plan, cuda) >= block(plan)    # eager accumulator > int8 copy >= nothing
    # fc1's eager accumulator is rows x 2 ffn x (4 + 2) bytes: FFN chunks cut it, so chunking saves more
    assert block((1, 1), cpu) - block((4, 8), cpu) > block((1, 1)) - block((4, 8))


def test_ledger_prices_layers_kept_whole_as_whole():
    int8 = call_for("TensorWiseINT8Layout", "native", 2)
    kept_ffn = BlockLinears(qkv=int8, fc1=int8, fc2=int8, ffn_chunked=False, device="cpu")
    chunked = BlockLinears(qkv=int8, fc1=int8, fc2=int8, device="cpu")
    assert block((4, 8), kept_ffn) == block((4, 1), kept_ffn) > block((4, 8), chunked)
    whole_qkv = BlockLinears(qkv=int8, qkv_sliced=False, device="cpu")
    assert block((4, 1), whole_qkv) > block((4, 1), BlockLinears(qkv=int8, device="cpu"))


def test_gguf_weights_dequantised_once_per_block_are_held():
    gguf = call_for("GGUF", "emulated", 2)
    held = BlockLinears(qkv=gguf, fc1=gguf, fc2=gguf, device="cuda")

    def sections(linears):
        return dit_block_section_peaks(SHAPE, ROWS, "bf16", framework="comfy", head_chunks=4, ffn_chunks=8,
                                       lifetime=True, linears=linears)
    plain, gguf_peaks = sections(None), sections(held)
    # the FFN weights sit under the FFN half's peak; the plain half's peak may fall where they are not yet
    # made (its first op), at most one residual-sized tensor higher. The attention half's peak is its
    # norm's (float32 temporaries), before the qkv weight exists: only some of it shows there.
    weights = 3 * SHAPE.ffn * SHAPE.hidden * 2
    assert weights - ROWS * SHAPE.hidden * 2 <= gguf_peaks["ffn"] - plain["ffn"] <= weights
    assert 0 < gguf_peaks["attention"] - plain["attention"] <= 3 * SHAPE.inner * SHAPE.hidden * 2
