"""Where PyTorch's CPU elementwise kernels split work among threads, and which rows of a row chunk an
elementwise op therefore computes on another code path than one call over all rows would.

Why it matters: the SiLU inside H3's SwiGLU is one of PyTorch's CPU elementwise kernels. Such a kernel
(`TensorIteratorBase::for_each` + `cpu_kernel_vec`, `aten/src/ATen/native/cpu/Loops.h`) runs over a
``[rows, width]`` operand whose rows are not contiguous with each other (the gate half of fc1's output,
row stride 2 x width) like this:

1. with ``numel = rows x width``: one range ``[0, numel)`` when ``numel <= GRAIN_SIZE`` (32,768) or
   one thread; otherwise ``used = min(threads, ceil(numel / GRAIN_SIZE))`` ranges of
   ``ceil(numel / used)`` elements (`at::parallel_for`, OpenMP backend: `ParallelOpenMP.h`);
2. inside its range each thread walks the rows: one *segment* per row, partial at the range's ends;
3. per segment, a vectorised body in steps of 2 x `Vectorized::size()` elements from the segment's start,
   then a scalar tail (`basic_loop`), whose `std::exp` need not give the vectorised exp's bits.

So an element's bits depend on where the thread ranges of *its call* cut its row. A row-chunked FFN makes
one call per chunk, with other cut points than the stock call over all rows, and a few elements near the
cuts come out one ulp apart (measured: docs/DIT.md, "FFN row chunks and CPU threads"). Every row that no
cut crosses is one whole-row segment in both calls: same path for every element, same bits.

`rows_to_redo` names the rows of a chunk whose cuts differ, with the whole call's segments for each. An
adapter recomputes exactly those segments with one call each (every segment is at most one row, so a
row no wider than `GRAIN_SIZE` is one serial range: vectorised body from the segment's start, scalar
tail, as in the whole call). The result is then the stock bits element for element ("exact where
verified": it relies on the kernel structure above, which `h3director.dit.kernels` checks by running
the activation itself at the row counts and thread count that run). Pure arithmetic; no torch import.
"""

from __future__ import annotations

from h3director.errors import InvalidInputError

GRAIN_SIZE = 32768
"""`at::internal::GRAIN_SIZE`: elementwise kernels over at most this many elements run on one thread."""


def thread_cuts(numel: int, threads: int, grain: int = GRAIN_SIZE) -> list[int]:
    """Start offsets (in elements, excluding 0) of the thread ranges an elementwise kernel over `numel`
    elements uses with `threads` threads (see the module docstring, step 1)."""
    if numel < 0 or threads < 1 or grain < 1:
        raise InvalidInputError(f"need numel >= 0, threads >= 1, grain >= 1; got {numel}, {threads}, {grain}")
    if numel <= grain or threads == 1:
        return []
    used = min(threads, -(-numel // grain))
    size = -(-numel // used)
    return list(range(size, numel, size))


def _cuts_by_row(rows: int, width: int, threads: int, grain: int) -> dict[int, tuple[int, ...]]:
    """Columns where the thread cuts of one call over `rows` rows of `width` elements fall inside a row,
    by row; a cut on a row boundary splits no row and is left out."""
    by_row: dict[int, list[int]] = {}
    for cut in thread_cuts(rows * width, threads, grain):
        row, column = divmod(cut, width)
        if column:
            by_row.setdefault(row, []).append(column)
    return {row: tuple(columns) for row, columns in by_row.items()}


def batch_rows_to_redo(start: int, stop: int, total: int, width: int, threads: int, batch: int = 1,
                       grain: int = GRAIN_SIZE) -> list[tuple[int, int, list[tuple[int, int]]]]:
    """`rows_to_redo` for a ``[batch, total, width]`` operand (the stock call walks ``batch x total`` rows,
    the chunk's call ``batch x (stop - start)``, batch-major): ``(batch index, row - start, segments)``."""
    if not 0 <= start < stop <= total or width < 1 or batch < 1:
        raise InvalidInputError(f"need 0 <= start < stop <= total, width >= 1, batch >= 1; got {start}, {stop}, "
                                f"{total}, {width}, {batch}")
    if (start, stop) == (0, total):
        return []
    if width > grain:
        raise InvalidInputError(f"rows of {width} elements exceed the {grain}-element grain: a one-row recompute "
                                "would be split among threads too")
    rows = stop - start
    whole = _cuts_by_row(batch * total, width, threads, grain)
    chunk = _cuts_by_row(batch * rows, width, threads, grain)
    candidates = {(row // total, row % total - start) for row in whole if start <= row % total < stop}
    candidates |= {(row // rows, row % rows) for row in chunk}
    redo = []
    for b, local in sorted(candidates):
        cuts = whole.get(b * total + start + local, ())
        if cuts == chunk.get(b * rows + local, ()):
            continue
        edges = [0, *cuts, width]
        redo.append((b, local, list(zip(edges[:-1], edges[1:], strict=True))))
    return redo


def rows_to_redo(start: int, stop: int, total: int, width: int, threads: int,
                 grain: int = GRAIN_SIZE) -> list[tuple[int, list[tuple[int, int]]]]:
    """Rows of the chunk ``start:stop`` (of `total` rows, `width` elements each) that a call over the chunk
    segments differently from a call over all rows, as ``(row - start, [(c0, c1), ...])``: the row's
    column segments in the call over all rows, to be recomputed one call each.

    Empty when the chunk is all the rows or no thread cut crosses a row differently. Raises
    `InvalidInputError` when `width` exceeds `grain` (a one-row redo would itself be split among threads)."""
    return [(row, spans) for _, row, spans in batch_rows_to_redo(start, stop, total, width, threads, 1, grain)]


__all__ = ["GRAIN_SIZE", "batch_rows_to_redo", "rows_to_redo", "thread_cuts"]
