"""The plain-torch block swap engine (`h3director.dit.block_swap`) on small modules: which blocks, counts refused,
host-backed placement, residency per block with and without prefetch, re-offloading what a framework moved or
replaced, a failed forward cleaned up by the next, `restore()` / `forget()`. The ComfyUI and diffusers adapters
have their own tests (test_blockswap_comfy.py, test_blockswap_diffusers.py)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from h3director.dit.block_swap import BlockSwap, check_count, offloaded_indices
from h3director.errors import InvalidInputError


def blocks(n: int = 4) -> list[nn.Module]:
    torch.manual_seed(0)
    out = []
    for _ in range(n):
        block = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
        block.register_buffer("scale", torch.randn(8))
        out.append(block)
    return out


def run(swap: BlockSwap, mods: list[nn.Module], x: torch.Tensor, seen: list | None = None) -> torch.Tensor:
    swap.begin_forward()
    try:
        for i, block in enumerate(mods):
            swap.before_block(i)
            if seen is not None:
                seen.append((swap.resident_offloaded(), sorted(swap._arriving)))
            x = block(x) * block.scale
            swap.after_block(i)
    finally:
        swap.end_forward()
    return x


def test_indices_spread_evenly_and_end_at_the_last_block():
    assert offloaded_indices(50, 20)[:4] == (1, 4, 6, 9) and offloaded_indices(50, 20)[-1] == 49
    assert offloaded_indices(50, 1) == (49,) and offloaded_indices(4, 4) == (0, 1, 2, 3)
    assert offloaded_indices(7, 0) == ()
    for total in range(1, 12):
        for count in range(total + 1):
            chosen = offloaded_indices(total, count)
            assert len(set(chosen)) == count and all(0 <= i < total for i in chosen)


@pytest.mark.parametrize("count,message", [(5, "has 4 DiT blocks"), (-1, "out of range"), (2.0, "integer"),
                                           (False, "integer")])
def test_bad_counts_name_the_block_count(count, message):
    with pytest.raises(InvalidInputError, match=message):
        check_count(count, 4, "the model")


@pytest.mark.parametrize("prefetch", [True, False])
def test_one_offloaded_block_on_the_device_while_it_runs_and_the_next_arriving(prefetch):
    mods = blocks()
    x = torch.randn(3, 8)
    want = run(BlockSwap(mods, [], "cpu"), mods, x)
    swap = BlockSwap(mods, [1, 3], "cpu", use_stream=prefetch)
    assert swap.sync() == 0  # CPU: host and device are the same memory, nothing left "the device"
    seen = []
    got = run(swap, mods, x, seen)
    assert torch.equal(got, want)
    if prefetch:
        assert seen == [([], [1]), ([1], [3]), ([], [3]), ([3], [])]
        assert swap.stats.prefetched == 2 and swap.stats.peak_offloaded_on_device == 2
    else:
        assert seen == [([], []), ([1], []), ([], []), ([3], [])]
        assert swap.stats.prefetched == 0 and swap.stats.peak_offloaded_on_device == 1
    assert swap.stats.onloads == 2 and swap.stats.per_block_onloads == {1: 1, 3: 1}
    weight = sum(t.numel() * t.element_size() for t in [*mods[0].parameters(), *mods[0].buffers()])
    assert swap.stats.bytes_onloaded == 2 * weight
    rows = swap.placement()
    assert [(r["device_bytes"], r["host_bytes"]) for r in rows] == [(weight, 0), (0, weight), (weight, 0), (0, weight)]


def test_the_block_computes_from_a_fresh_copy_and_gets_its_host_tensor_back():
    mods = blocks(2)
    swap = BlockSwap(mods, [1], "cpu")
    swap.sync()
    host_ptr = mods[1][0].weight.data_ptr()
    swap.begin_forward()
    swap.before_block(1)
    assert mods[1][0].weight.data_ptr() != host_ptr and swap.resident_offloaded() == [1]
    swap.after_block(1)
    swap.end_forward()
    assert mods[1][0].weight.data_ptr() == host_ptr and swap.resident_offloaded() == []


def test_sync_takes_again_what_a_framework_replaced_or_moved():
    mods = blocks(2)
    swap = BlockSwap(mods, [1], "cpu")
    swap.sync()
    first = {id(s.tensor) for s in swap._slots[1]}
    assert swap.sync() == 0 and {id(s.tensor) for s in swap._slots[1]} == first  # idempotent
    mods[1][0].weight = nn.Parameter(torch.ones(8, 8))        # replaced (a backup restored, say)
    mods[1][1].bias.data = mods[1][1].bias.data.clone()       # moved (`module.to(...)`)
    swap.sync()
    slots = {(s.name, id(s.module)): s for s in swap._slots[1]}
    assert slots[("weight", id(mods[1][0]))].tensor is mods[1][0].weight
    assert all(s.backed() for s in swap._slots[1]) and len(swap._slots[1]) == 5  # weight, bias x2, scale
    x = torch.randn(2, 8)
    assert torch.equal(run(swap, mods, x), run(BlockSwap(mods, [], "cpu"), mods, x))


def test_a_failed_forward_is_cleaned_up_and_sync_refuses_mid_forward():
    mods = blocks(3)
    swap = BlockSwap(mods, [0, 2], "cpu")
    swap.sync()
    swap.begin_forward()
    swap.before_block(0)
    with pytest.raises(RuntimeError, match="during a forward"):
        swap.sync()
    swap.begin_forward()  # the next forward forgets what the failed one left
    assert swap.resident_offloaded() == [] and sorted(swap._arriving) == [0]
    swap.end_forward()
    assert all(s.backed() for s in swap._slots[0] + swap._slots[2])


def test_restore_and_forget():
    mods = blocks(2)
    swap = BlockSwap(mods, [0], "cpu")
    swap.sync()
    ptr = mods[0][0].weight.data_ptr()
    assert swap.restore() == 0
    assert mods[0][0].weight.data_ptr() != ptr and swap._slots[0] == []  # an ordinary copy on the device
    swap.sync()
    swap.forget()
    assert swap._slots[0] == [] and swap.placement()[0]["host_bytes"] == 0


def test_unknown_block_refused():
    with pytest.raises(InvalidInputError, match="block 5 does not exist"):
        BlockSwap(blocks(2), [5], "cpu")
