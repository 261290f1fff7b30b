"""Splitting rows and heads into chunks: the one place chunk boundaries are decided.

Conventions: ranges are half-open `(start, stop)` pairs that cover `0..total` in order, none empty.
"""

from __future__ import annotations

from h3director.errors import InvalidInputError


def row_ranges(total: int, chunks: int, align: int = 1) -> list[tuple[int, int]]:
    """Split `total` rows into at most `chunks` contiguous ranges whose starts are multiples of `align`.

    Every range but the last has the same length (a multiple of `align`); fewer ranges come back when
    `total` is too short to give each one `align` rows. `chunks=1` gives `[(0, total)]`.
    """
    if total < 0:
        raise InvalidInputError(f"row count must be >= 0, got {total}")
    if chunks < 1:
        raise InvalidInputError(f"chunk count must be >= 1, got {chunks}")
    if align < 1:
        raise InvalidInputError(f"alignment must be >= 1, got {align}")
    if total == 0:
        return []
    step = -(-total // chunks)
    step = -(-step // align) * align
    return [(start, min(start + step, total)) for start in range(0, total, step)]


def head_ranges(heads: int, groups: int) -> list[tuple[int, int]]:
    """Split `heads` attention heads into `groups` equal groups; `groups` must divide `heads`."""
    if groups < 1 or heads % groups:
        valid = [g for g in range(1, heads + 1) if heads % g == 0]
        raise InvalidInputError(f"head groups must divide the {heads} heads: got {groups}, valid: {valid}")
    size = heads // groups
    return [(start, start + size) for start in range(0, heads, size)]


def divisors(n: int) -> list[int]:
    """The divisors of `n` in increasing order (the valid head-group counts for `n` heads)."""
    return [d for d in range(1, n + 1) if n % d == 0]


__all__ = ["divisors", "head_ranges", "row_ranges"]
