"""`h3director.dit.thread_split` and `blocks.swiglu_rows`: which rows of a row chunk an elementwise op
computes on another code path than the call over all rows, and the recompute that gives the stock bits.

The arithmetic is checked against a brute-force model of PyTorch's elementwise loop (every element's
(thread range, row) segment); the recompute against real `F.silu` calls on this CPU at 1, 2 and 3 threads,
at widths and row counts where plain chunking differs (the test proves that it does, so it can fail).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from h3director.dit.blocks import swiglu_rows
from h3director.dit.ranges import row_ranges
from h3director.dit.thread_split import GRAIN_SIZE, rows_to_redo, thread_cuts
from h3director.errors import InvalidInputError


def _segments(numel: int, width: int, threads: int) -> list[tuple[int, int]]:
    """Brute force: the (start, stop) element segments of one call (thread range x row)."""
    starts = [0, *thread_cuts(numel, threads), numel]
    segments = []
    for lo, hi in zip(starts[:-1], starts[1:], strict=True):
        at = lo
        while at < hi:
            stop = min(hi, (at // width + 1) * width)
            segments.append((at, stop))
            at = stop
    return segments


def test_thread_cuts_follow_parallel_for():
    assert thread_cuts(GRAIN_SIZE, 8) == []              # at the grain: one serial range
    assert thread_cuts(GRAIN_SIZE + 1, 8) == [16385]     # two ranges of ceil(32769 / 2)
    assert thread_cuts(10 ** 6, 1) == []
    assert thread_cuts(100_000, 3) == [33334, 66668]
    with pytest.raises(InvalidInputError):
        thread_cuts(10, 0)


@pytest.mark.parametrize("total,width,threads", [(2581, 96, 2), (8960, 96, 3), (2500, 14336, 3), (700, 160, 5)])
def test_rows_to_redo_are_exactly_the_rows_segmented_differently(total, width, threads):
    whole = {s for s in _segments(total * width, width, threads)}
    for chunks in (2, 3, 7):
        for a, b in row_ranges(total, chunks):
            local = {(s + a * width, e + a * width) for s, e in _segments((b - a) * width, width, threads)}
            differing = sorted({s // width - a for s, e in local ^ whole if a * width <= s < b * width})
            redo = rows_to_redo(a, b, total, width, threads)
            assert [row for row, _ in redo] == differing
            for row, spans in redo:
                r = row + a
                assert [(r * width + c0, r * width + c1) for c0, c1 in spans] == sorted(
                    s for s in whole if r * width <= s[0] < (r + 1) * width)


def test_rows_to_redo_refuses_rows_wider_than_the_grain():
    with pytest.raises(InvalidInputError, match="grain"):
        rows_to_redo(0, 10, 20, GRAIN_SIZE + 1, 2)
    assert rows_to_redo(0, 20, 20, GRAIN_SIZE + 1, 2) == []   # one chunk: nothing to redo


def _swiglu(h):
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_swiglu_rows_give_the_stock_bits_where_plain_chunks_do_not(threads):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        naive_differs = False
        for rows, width in ((2581, 96), (2581, 160)):
            h = torch.randn(rows, 2 * width, generator=torch.Generator().manual_seed(rows))
            reference = _swiglu(h)
            for chunks in (2, 3, 7):
                ranges = row_ranges(rows, chunks)
                naive = torch.cat([_swiglu(h[a:b]) for a, b in ranges])
                ours = torch.cat([swiglu_rows(_swiglu, h[a:b], a, b, rows) for a, b in ranges])
                naive_differs |= not torch.equal(reference, naive)
                assert torch.equal(reference, ours), (rows, width, chunks)
        # one thread: one range, no cuts, plain chunks already exact; more threads: the cuts show
        assert naive_differs == (threads > 1)
    finally:
        torch.set_num_threads(before)


def test_batched_operand_recompute_gives_the_stock_bits():
    """diffusers' gate is `[batch, rows, width]`: the stock call walks batch x rows rows, each chunk's call
    batch x chunk rows; the recompute covers the rows of every batch item."""
    from h3director.dit.blocks import thread_cut_rows

    before = torch.get_num_threads()
    torch.set_num_threads(3)   # with 2 threads and 2 items every cut falls on a row boundary
    try:
        rows, width = 1291, 100
        projected = torch.randn(2, rows, 2 * width, generator=torch.Generator().manual_seed(7))
        value, gate = projected.chunk(2, dim=-1)
        reference = F.silu(gate)
        naive_differs = False
        for chunks in (2, 3, 7):
            naive, ours = torch.empty_like(reference), torch.empty_like(reference)
            for a, b in row_ranges(rows, chunks):
                naive[:, a:b] = F.silu(gate[:, a:b])
                part = F.silu(gate[:, a:b])
                for item, row, spans in thread_cut_rows(gate.device, a, b, rows, width, batch=2):
                    for c0, c1 in spans:
                        part[item, row, c0:c1] = F.silu(gate[item, a + row, c0:c1])
                ours[:, a:b] = part
            naive_differs |= not torch.equal(reference, naive)
            assert torch.equal(reference, ours), chunks
        assert naive_differs
    finally:
        torch.set_num_threads(before)
