"""FirstFitHeap: the plain baseline allocator that SlotPool is measured against.

A heap of ``capacity_bytes`` managed with the classic first-fit rule: an allocation of ``n`` bytes
(rounded up to ``alignment``) takes the lowest-addressed free run that holds it, splitting off the
rest; a free returns the range and merges it with free neighbours. It only keeps offsets (no memory):
`bench/fragmentation.py` replays traces through it. Fragmentation uses the project's one definition.

Invariants: free runs are sorted by offset, disjoint and never adjacent (always coalesced); free
bytes + allocated bytes == capacity.
"""

from __future__ import annotations

import bisect

from h3director.errors import InvalidInputError
from h3director.fragmentation import fragmentation


class FirstFitHeap:
    """Offsets in ``[0, capacity_bytes)`` handed out first-fit, in multiples of ``alignment`` bytes."""

    def __init__(self, capacity_bytes: int, alignment: int = 512) -> None:
        if alignment <= 0:
            raise InvalidInputError(f"alignment must be positive, got {alignment}")
        if capacity_bytes < alignment:
            raise InvalidInputError(f"capacity {capacity_bytes} B is smaller than the alignment {alignment} B")
        self.alignment = alignment
        self.capacity_bytes = capacity_bytes - capacity_bytes % alignment
        self._starts: list[int] = [0]                  # free run starts, sorted
        self._sizes: dict[int, int] = {0: self.capacity_bytes}
        self._allocated: dict[int, int] = {}           # offset -> size

    def allocate(self, nbytes: int) -> int | None:
        """Offset of a new allocation of ``nbytes`` (>= 1 byte is taken), or None when no free run fits."""
        size = max(self.alignment, -(-nbytes // self.alignment) * self.alignment)
        for index, start in enumerate(self._starts):
            run = self._sizes[start]
            if run < size:
                continue
            del self._sizes[start]
            if run == size:
                del self._starts[index]
            else:
                self._starts[index] = start + size
                self._sizes[start + size] = run - size
            self._allocated[start] = size
            return start
        return None

    def free(self, offset: int) -> None:
        size = self._allocated.pop(offset, None)
        if size is None:
            raise InvalidInputError(f"offset {offset} is not an allocation of this heap")
        index = bisect.bisect_left(self._starts, offset)
        end = offset + size
        if index < len(self._starts) and self._starts[index] == end:      # merge with the run after
            size += self._sizes.pop(end)
            del self._starts[index]
        if index > 0:                                                        # merge with the run before
            before = self._starts[index - 1]
            if before + self._sizes[before] == offset:
                self._sizes[before] += size
                return
        self._starts.insert(index, offset)
        self._sizes[offset] = size

    def free_runs(self) -> list[tuple[int, int]]:
        """Free runs as ``(offset, bytes)``, sorted by offset."""
        return [(start, self._sizes[start]) for start in self._starts]

    @property
    def allocated_bytes(self) -> int:
        return sum(self._allocated.values())

    @property
    def free_bytes(self) -> int:
        return sum(self._sizes.values())

    def fragmentation(self) -> float:
        return fragmentation(self._sizes.values())


__all__ = ["FirstFitHeap"]
