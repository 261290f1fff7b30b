"""The two chunking drivers every framework adapter runs its block through.

Both drivers own only the iteration order; the framework adapter supplies the arithmetic as callables
written in its framework's own ops (so LoRA patches, quantised weights and attention overrides act as in
the stock block). Keeping the loops here means ComfyUI's and diffusers' blocks chunk identically and the
planner's ledger (`h3director.plan.activations`) replays one iteration order.

- `grouped_attention`: for each head group, `project(h0, h1)` makes that group's q, k, v (normalised
  and rotated); `attend_into(qkv, h0, h1, a, b)` attends query rows `a:b` of the group over all keys and
  writes the result into the caller's preallocated output. The group's q, k, v die before the next group
  is projected. Exactness: see `DiTMemoryPlan` (head groups and query chunks are "exact where verified").
- `chunked_rows`: `apply(a, b)` runs once per row range, in order; the FFN adapter uses it for norm,
  modulation, fc1, SwiGLU, fc2 and the gated residual of rows `a:b`, written back in place. Every op in
  that chain is row-wise, so a row's result depends only on that row ("exact where verified" for the
  GEMMs' invariance to their row count).
- `thread_cut_rows`: on the CPU, the rows of a row chunk whose elementwise activation must be recomputed
  segment by segment to get the bits of one call over all rows (`h3director.dit.thread_split`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from h3director.dit.ranges import head_ranges, row_ranges
from h3director.dit.thread_split import batch_rows_to_redo
from h3director.dit.tiers import QUERY_ALIGN, DiTMemoryPlan


def grouped_attention(plan: DiTMemoryPlan, heads: int, rows: int,
                      project: Callable[[int, int], Any],
                      attend_into: Callable[[Any, int, int, int, int], None]) -> None:
    """Run attention head group by head group (and query chunk by query chunk) into the caller's output.

    `rows` is the packed sequence length; query chunks start on multiples of `QUERY_ALIGN` rows.
    `project` must return a fresh object per group (typically a `(q, k, v)` tuple) that nothing else
    keeps, so the group's tensors are freed as soon as the driver drops it."""
    for h0, h1 in head_ranges(heads, plan.head_chunks):
        qkv = project(h0, h1)
        for a, b in row_ranges(rows, plan.query_chunks, QUERY_ALIGN):
            attend_into(qkv, h0, h1, a, b)
        del qkv


def chunked_rows(rows: int, chunks: int, apply: Callable[[int, int], None]) -> None:
    """Call `apply(a, b)` for each of `chunks` contiguous row ranges covering `0..rows`, in order."""
    for a, b in row_ranges(rows, chunks):
        apply(a, b)


def thread_cut_rows(device: Any, start: int, stop: int, total: int, width: int,
                    batch: int = 1) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """For an elementwise activation over rows `start:stop` of a `[batch, total, width]` operand (rows not
    contiguous with each other, as the SwiGLU gate): `(batch index, chunk-local row, column segments of the
    call over all rows)` for each row the adapter must recompute one segment per call so that every element
    takes the code path it takes in the stock call. Empty off the CPU (GPU elementwise kernels run one
    element-wise function whatever the launch split; `verify-kernels` checks that there) and for one chunk.
    Uses `torch.get_num_threads()`, the threads the stock call would use."""
    import torch

    if getattr(device, "type", str(device).partition(":")[0]) != "cpu" or (start, stop) == (0, total):
        return []
    return batch_rows_to_redo(start, stop, total, width, torch.get_num_threads(), batch)


def swiglu_rows(swiglu: Callable[[Any], Any], h, start: int, stop: int, total: int):
    """`swiglu(h)` for fc1's output `h` of rows `start:stop` (of `total`; `[rows, 2 x width]`, gate half
    first), with the rows `thread_cut_rows` names recomputed one stock segment per call through the same
    `swiglu` (on the segment's gate and up columns, concatenated), so every element gets the bits of one
    call over all rows."""
    import torch

    out = swiglu(h)
    width = out.shape[-1]
    for _, row, spans in thread_cut_rows(h.device, start, stop, total, width):
        source = h[row]
        for c0, c1 in spans:
            out[row, c0:c1] = swiglu(torch.cat((source[c0:c1], source[width + c0:width + c1])))
    return out


__all__ = ["chunked_rows", "grouped_attention", "swiglu_rows", "thread_cut_rows"]
