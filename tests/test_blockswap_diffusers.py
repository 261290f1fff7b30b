"""`h3director.integrations.diffusers_offload.apply_block_offload` on the real diffusers `MiniMaxH3Transformer3DModel`
(small random configs, the packed sequence of tests/test_dit_diffusers.py): output `torch.equal` to every block
resident (fp32, bf16), exactly N blocks offloaded and resident blocks counted while each block runs, bytes per
block against the planner's estimate, composition with the DiT memory plan, `remove()`, refusals.

The CPU is the onload device here: the copies are real (a fresh tensor per onload) and the placement is read
from the module's tensors (host-backed or not); no memory is saved on a CPU.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("diffusers")
from test_dit_diffusers import assert_equal, packed_inputs, run, stock_reference, tiny_transformer  # noqa: E402

from h3director.errors import InvalidInputError  # noqa: E402
from h3director.integrations.diffusers_dit import apply_memory_plan  # noqa: E402
from h3director.integrations.diffusers_offload import HOOK_NAME, apply_block_offload  # noqa: E402

LAYERS = 4


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def stock(request):
    dtype = request.param
    model = tiny_transformer(dtype, layers=LAYERS)
    inputs = packed_inputs(dtype)
    return model, inputs, stock_reference(model, inputs)


def probe_residency(model, handle) -> tuple[list, list]:
    """Forward pre-hooks on each block's attention (called inside the block's forward, after the onload):
    the blocks whose weights are all on the device while block i runs."""
    seen, hooks = [], []
    for i, block in enumerate(model.transformer_blocks):
        hooks.append(block.attn.register_forward_pre_hook(
            lambda module, args, i=i: seen.append((i, handle.resident_blocks()))))
    return seen, hooks


@pytest.mark.parametrize("count", [0, 1, 2, LAYERS])
def test_output_equals_all_resident_and_n_blocks_are_offloaded(stock, count):
    model, inputs, want = stock
    handle = apply_block_offload(model, count, onload_device="cpu")
    seen, hooks = probe_residency(model, handle)
    try:
        assert_equal(run(model, inputs), want)
        offloaded = set(handle.offloaded)
        assert len(offloaded) == count and (count == 0 or LAYERS - 1 in offloaded)
        # while block i runs: every resident block plus block i itself when it is an offloaded one
        assert [i for i, _ in seen] == list(range(LAYERS))
        for i, resident in seen:
            assert resident == sorted((set(range(LAYERS)) - offloaded) | ({i} & offloaded))
        # between forwards: exactly the N offloaded blocks are host-backed
        rows = handle.placement()
        assert [r["host_bytes"] > 0 and r["device_bytes"] == 0 for r in rows] == [i in offloaded for i in range(LAYERS)]
        assert handle.stats.onloads == count and handle.stats.prefetched == count
        assert handle.stats.peak_offloaded_on_device == min(count, 2)
        assert_equal(run(model, inputs), want)  # a second forward: same bits, same counts again
        assert handle.stats.onloads == 2 * count
    finally:
        for hook in hooks:
            hook.remove()
        handle.remove()
    assert_equal(run(model, inputs), want)
    assert all(getattr(b, "_diffusers_hook", None) is None for b in model.transformer_blocks)


def test_without_stream_onloads_in_turn(stock):
    model, inputs, want = stock
    handle = apply_block_offload(model, 3, onload_device="cpu", use_stream=False)
    try:
        assert_equal(run(model, inputs), want)
        assert handle.stats.onloads == 3 and handle.stats.prefetched == 0
        assert handle.stats.peak_offloaded_on_device == 1
    finally:
        handle.remove()


@pytest.mark.parametrize("fmt,dtype", [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_bytes_per_block_match_the_planner(fmt, dtype):
    from h3director.plan.estimate import _weight_bytes, model_config_key

    model = tiny_transformer(dtype, layers=LAYERS)
    predicted = _weight_bytes("dit", model_config_key(dict(model.config)), fmt, block=True)
    handle = apply_block_offload(model, 2, onload_device="cpu")
    try:
        rows = handle.placement()
        host = [r["host_bytes"] for r in rows if r["offloaded"]]
        device = [r["device_bytes"] for r in rows if not r["offloaded"]]
        assert len(host) == 2 and len(device) == LAYERS - 2
        for measured in host + device:
            assert abs(measured - predicted) <= 0.10 * predicted, (measured, predicted)
        assert all(r["device_bytes"] == 0 for r in rows if r["offloaded"])
    finally:
        handle.remove()


def test_composes_with_the_dit_memory_plan(stock):
    model, inputs, want = stock
    plan = apply_memory_plan(model, head_chunks=2, ffn_chunks=3)
    handle = apply_block_offload(model, 2, onload_device="cpu")
    try:
        assert_equal(run(model, inputs), want)
        assert handle.stats.onloads == 2 and plan.last_report["tier"] == plan.plan.describe()
    finally:
        handle.remove()
        plan.remove()
    assert_equal(run(model, inputs), want)


def _snapshot(model):
    return [(name, t.device, t.data_ptr()) for name, t in model.state_dict(keep_vars=True).items()]


@pytest.mark.parametrize("count,message", [(LAYERS + 1, f"has {LAYERS} DiT blocks (0 to {LAYERS} can be offloaded)"),
                                           (-1, "out of range"), (1.5, "must be an integer"),
                                           (True, "must be an integer")])
def test_bad_counts_are_refused_before_anything_moves(count, message):
    model = tiny_transformer(torch.float32, layers=LAYERS)
    before = _snapshot(model)
    with pytest.raises(InvalidInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        apply_block_offload(model, count, onload_device="cpu")
    assert _snapshot(model) == before


def test_other_models_and_other_offloads_are_refused():
    with pytest.raises(InvalidInputError, match="transformer_blocks"):
        apply_block_offload(torch.nn.Linear(2, 2), 1, onload_device="cpu")
    model = tiny_transformer(torch.float32, layers=LAYERS)
    handle = apply_block_offload(model, 1, onload_device="cpu")
    with pytest.raises(InvalidInputError, match="already applied"):
        apply_block_offload(model, 2, onload_device="cpu")
    handle.remove()
    assert all(HOOK_NAME not in getattr(b, "_diffusers_hook", type("R", (), {"hooks": {}})).hooks
               for b in model.transformer_blocks)
    model.enable_group_offload(torch.device("cpu"), offload_type="block_level", num_blocks_per_group=1)
    with pytest.raises(InvalidInputError, match="group offloading is already applied"):
        apply_block_offload(model, 1, onload_device="cpu")
