"""The project's one definition of fragmentation.

    fragmentation = 1 - largest_free_run / total_free        (0.0 when nothing is free)

0 means all free memory is one contiguous run (no fragmentation); values near 1 mean the free
memory is scattered in runs far smaller than the total. The slot pool, the native arena and the
reading of PyTorch's CUDA caching allocator all report this number, so they can be compared.
"""

from __future__ import annotations

from collections.abc import Iterable


def fragmentation_of(largest_free_run: int, total_free: int) -> float:
    """``1 - largest_free_run / total_free`` in [0, 1) (0.0 when `total_free` is 0), for allocators that
    report the two numbers directly (the C arena); any unit, the same for both. `ValueError` unless ``0 <=
    largest_free_run <= total_free``."""
    if largest_free_run < 0 or total_free < largest_free_run:
        raise ValueError(f"need 0 <= largest_free_run <= total_free, got {largest_free_run} and {total_free}")
    return 1.0 - largest_free_run / total_free if total_free else 0.0


def fragmentation(free_run_sizes: Iterable[int]) -> float:
    """Fragmentation of a heap whose free runs have the given sizes (any unit, usually bytes).

    Returns a float in [0, 1): ``1 - max(runs) / sum(runs)``, and 0.0 when there is no free memory.
    Zero-sized runs are ignored; negative sizes are a caller bug and raise `ValueError`.
    """
    total = 0
    largest = 0
    for size in free_run_sizes:
        if size < 0:
            raise ValueError(f"free run size must be >= 0, got {size}")
        total += size
        largest = max(largest, size)
    return fragmentation_of(largest, total)


__all__ = ["fragmentation", "fragmentation_of"]
