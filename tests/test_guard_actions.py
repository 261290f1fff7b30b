"""The Memory Guard node's actions on a DiT forward (ComfyUI stand-ins from `fixtures/comfy_harness`):
stop_and_clear unloads models, empties caches and raises the [Director Safety] error; reduce_batch
retries with more DiT chunks (DiT Memory handle installed) or a split batch, equal output; the
node refuses fallback_to_cpu. Memory is read by an injected reader (the guard's documented hook), the
forward is a real torch module."""

from __future__ import annotations

import pytest
import torch
from comfy_harness.loader import install_stubs

from h3director.core.guard import MemoryGuard, MemoryLimitExceeded
from h3director.errors import InvalidInputError

install_stubs()


class Forward:
    """The diffusion model's forward as ComfyUI's wrapper executor calls it: `executor(x, t, context, options)`."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(8, 8)
        self.batches: list[int] = []

    def __call__(self, x, timestep, context, transformer_options):
        self.batches.append(x.shape[0])
        with torch.no_grad():
            return self.layer(x.flatten(1)[:, :8]) + timestep.view(-1, 1) + context.mean((1, 2)).view(-1, 1)


def _inputs(batch: int):
    x = torch.randn(batch, 2, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    context = torch.randn(batch, 3, 8, generator=torch.Generator().manual_seed(2))
    return x, torch.arange(batch, dtype=torch.float32), context, {"cond_or_uncond": list(range(batch))}


def _guard(action: str, budget: int) -> MemoryGuard:
    return MemoryGuard(budget, device="cpu", action=action, device_reader=lambda device: 0,
                       cache_clearer=lambda device: None)


def test_stop_and_clear_unloads_models_and_raises_the_safety_message():
    import comfy.model_management as mm

    from h3director.comfy.nodes_guard import make_guard_wrapper

    mm.calls.clear()
    forward = Forward()
    wrapper = make_guard_wrapper(_guard("stop_and_clear", 100), cost_model=lambda plan, rows, dtype: 1000)
    with pytest.raises(MemoryLimitExceeded, match=r"^\[Director Safety\] CPU memory limit exceeded .* on cpu") as info:
        wrapper(forward, *_inputs(2))
    assert "models unloaded and caches emptied" in str(info.value)
    assert ("unload_all_models",) in mm.calls and ("soft_empty_cache",) in mm.calls
    assert forward.batches == []   # refused before running


def test_reduce_batch_splits_the_latent_batch_with_equal_output():
    from h3director.comfy.nodes_guard import make_guard_wrapper

    forward = Forward()
    full = forward(*_inputs(4))
    guard = _guard("reduce_batch", 250)
    # rows = packed tokens of x (4 x 1 x 2 x 2 = 16) + context rows (3): 19 for the batch, 10 for half of it
    wrapper = make_guard_wrapper(guard, cost_model=lambda plan, rows, dtype: rows * 20)
    out = wrapper(forward, *_inputs(4))
    assert torch.equal(out, full)
    assert forward.batches == [4, 2, 2]
    assert [event.action for event in guard.events] == ["reduce_batch"]
    assert "batch in 2 parts" in guard.events[0].phase


def test_reduce_batch_escalates_the_dit_memory_tier_when_installed():
    from h3director.comfy.nodes_guard import make_guard_wrapper
    from h3director.dit.memory import memory_handle
    from h3director.integrations import comfy_dit

    handle = memory_handle(mode="fixed", heads=4, blocks=2)
    forward = Forward()
    x, t, context, options = _inputs(2)
    # the block patches `comfy_dit.install` puts in the MODEL's transformer options (`dit_memory_of` finds them)
    patches = {(comfy_dit.PATCH_BLOCK, i): comfy_dit._BlockPatch(handle, comfy_dit._Forwards(), i) for i in range(2)}
    options["patches_replace"] = {comfy_dit.PATCH_NAME: patches}
    assert comfy_dit.dit_memory_of(options) is handle
    guard = _guard("reduce_batch", 300)
    wrapper = make_guard_wrapper(guard, cost_model=lambda plan, rows, dtype: 1000 // (plan.ffn_chunks * plan.head_chunks))
    out = wrapper(forward, x, t, context, options)
    assert torch.equal(out, forward(x, t, context, options))
    assert handle.floor.ffn_chunks == 4 and forward.batches[0] == 2   # chunks, not a split batch
    assert "4 FFN row chunks" in guard.events[0].phase


def test_reduce_batch_stops_when_nothing_cheaper_fits():
    import comfy.model_management as mm

    from h3director.comfy.nodes_guard import make_guard_wrapper

    mm.calls.clear()
    wrapper = make_guard_wrapper(_guard("reduce_batch", 10), cost_model=lambda plan, rows, dtype: 1000)
    with pytest.raises(MemoryLimitExceeded, match="no cheaper execution fits"):
        wrapper(Forward(), *_inputs(1))
    assert ("unload_all_models",) in mm.calls


def test_an_out_of_memory_error_in_the_forward_gets_the_action():
    from h3director.comfy.nodes_guard import make_guard_wrapper

    def failing(x, *args):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    wrapper = make_guard_wrapper(_guard("stop_and_clear", 10**9), cost_model=lambda plan, rows, dtype: 1)
    with pytest.raises(MemoryLimitExceeded, match="out of memory: CUDA out of memory"):
        wrapper(failing, *_inputs(1))


def test_node_refuses_fallback_to_cpu_and_offers_only_what_a_dit_forward_supports(monkeypatch):
    from h3director.comfy import settings
    from h3director.comfy.nodes_guard import ACTIONS, MemoryGuardNode
    from h3director.core.config import validate_config

    assert "fallback_to_cpu" not in ACTIONS
    config = validate_config({"memory_safety": {"action_on_exceed": "fallback_to_cpu"}}, env={})
    monkeypatch.setattr(settings, "pack_config", lambda: config)

    class Patcher:
        load_device = torch.device("cpu")

    with pytest.raises(InvalidInputError, match="not supported for DiT forwards"):
        MemoryGuardNode.execute(Patcher(), "from config", 1.0)


def test_the_safety_message_names_the_setting_that_would_have_fit():
    """The cheapest DiT Memory tier whose activations fit the room left, as the node and inputs that apply it."""
    from h3director.comfy.nodes_guard import make_guard_wrapper

    wrapper = make_guard_wrapper(_guard("stop_and_clear", 300),
                                 cost_model=lambda plan, rows, dtype: 1000 // (plan.ffn_chunks * plan.head_chunks))
    with pytest.raises(MemoryLimitExceeded) as info:
        wrapper(Forward(), *_inputs(2))
    # 1000 // 4 = 250 fits the 300 left (1000 // 2 = 500 does not): the lifetime tier with 4 FFN row chunks
    assert str(info.value).endswith("would have fit: node H3DirectorDiTMemory: mode='fixed', head_chunks=1, "
                                    "ffn_chunks=4 (4 FFN row chunks: 250 B of activations within the 300 B left)")
    assert info.value.would_fit.startswith("node H3DirectorDiTMemory")


def test_when_no_chunking_fits_the_message_names_the_blocks_to_offload():
    """A model whose blocks are real modules: the fewest blocks to offload (plus the two streaming buffers the
    planner keeps on the device) to make room for the most chunked tier's activations."""
    from h3director.comfy.nodes_guard import make_guard_wrapper

    forward = Forward()
    model = torch.nn.Module()
    model.blocks = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(10))   # 288 B of float32 per block
    forward.class_obj = model
    guard = MemoryGuard(1100, device="cpu", action="stop_and_clear", device_reader=lambda device: 1000,
                        cache_clearer=lambda device: None)
    wrapper = make_guard_wrapper(guard, cost_model=lambda plan, rows, dtype: 1000)
    with pytest.raises(MemoryLimitExceeded) as info:
        wrapper(forward, *_inputs(1))
    # room 100 B, need 1000 B: ceil(900 / 288) = 4 blocks freed, + 2 streaming buffers = 6 offloaded
    assert "would have fit: node H3DirectorBlockSwap: blocks_offloaded=6 with node H3DirectorDiTMemory" in \
        str(info.value)
