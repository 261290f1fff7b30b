"""A heatmap PNG of a `SlotPool` and the numbers behind it.

One cell per slot, in address order, row by row: green = held by a lease, yellow = free. Memory the
pool could not serve (live fallback allocations from the framework allocator) is drawn after the pool
as red cells, one per started slot's worth of bytes, so the picture shows what the pool did not hold.
matplotlib is imported only when a PNG is written.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from h3director.core.atomic_file import atomic_path
from h3director.core.pool import SlotPool
from h3director.errors import missing_package
from h3director.units import format_size

FREE, LEASED, FALLBACK, EMPTY = 0, 1, 2, 3
COLORS = {FREE: "#f2d13b", LEASED: "#2ca02c", FALLBACK: "#d62728", EMPTY: "#ffffff"}


@dataclass(frozen=True)
class PoolHeatmap:
    """Cell states (``FREE``/``LEASED``/``FALLBACK``/``EMPTY`` padding) in rows, plus the pool's numbers."""

    rows: tuple[tuple[int, ...], ...]
    slot_bytes: int
    leased_slots: int
    free_slots: int
    fallback_cells: int
    fallback_bytes: int
    fragmentation: float
    free_runs: tuple[tuple[int, int], ...]   # (first slot, slots)

    def summary(self) -> str:
        return (
            f"{self.leased_slots} slots leased, {self.free_slots} free "
            f"(slot {format_size(self.slot_bytes)}), fragmentation {self.fragmentation:.1%}, "
            f"fallback {format_size(self.fallback_bytes)} in {self.fallback_cells} slot-sized cells"
        )


def pool_heatmap(pool: SlotPool, *, columns: int | None = None) -> PoolHeatmap:
    """The cells of the heatmap (no plotting). ``columns`` defaults to about the square root of the cells."""
    runs = pool.free_runs()
    stats = pool.stats()
    cells = [LEASED] * pool.slot_count
    for start, length in runs:
        cells[start:start + length] = [FREE] * length
    fallback_cells = math.ceil(stats.fallback_live_bytes / pool.slot_bytes)
    cells += [FALLBACK] * fallback_cells
    columns = columns or max(1, math.ceil(math.sqrt(len(cells))))
    cells += [EMPTY] * ((-len(cells)) % columns)
    rows = tuple(tuple(cells[i:i + columns]) for i in range(0, len(cells), columns))
    free_slots = sum(length for _, length in runs)
    return PoolHeatmap(
        rows=rows,
        slot_bytes=pool.slot_bytes,
        leased_slots=pool.slot_count - free_slots,
        free_slots=free_slots,
        fallback_cells=fallback_cells,
        fallback_bytes=stats.fallback_live_bytes,
        fragmentation=stats.fragmentation,
        free_runs=tuple(runs),
    )


def save_pool_heatmap(pool: SlotPool, path: str | os.PathLike, *, columns: int | None = None) -> PoolHeatmap:
    """Write the heatmap PNG to ``path`` (temporary name, then rename) and return its numbers. Needs
    matplotlib (the `plot` extra): `ImportError` naming the install command without it."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.colors import ListedColormap
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(missing_package("the pool heatmap", "matplotlib", "plot")) from exc

    heatmap = pool_heatmap(pool, columns=columns)
    path = Path(path)
    cmap = ListedColormap([COLORS[FREE], COLORS[LEASED], COLORS[FALLBACK], COLORS[EMPTY]])
    height = max(2.0, 0.25 * len(heatmap.rows) + 1.5)
    fig = Figure(figsize=(8, height))          # no pyplot: the caller's backend and figures are left alone
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.imshow(heatmap.rows, cmap=cmap, vmin=0, vmax=3, interpolation="nearest", aspect="auto")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(heatmap.summary(), fontsize=8)
    ax.legend(
        handles=[Patch(color=COLORS[LEASED], label="leased"), Patch(color=COLORS[FREE], label="free"),
                 Patch(color=COLORS[FALLBACK], label="fallback (outside the pool)")],
        loc="upper center", bbox_to_anchor=(0.5, -0.02), ncol=3, fontsize=8,
    )
    with atomic_path(path) as temporary:
        fig.savefig(temporary, format="png", dpi=100, bbox_inches="tight")
    return heatmap


__all__ = ["COLORS", "EMPTY", "FALLBACK", "FREE", "LEASED", "PoolHeatmap", "pool_heatmap",
           "save_pool_heatmap"]
