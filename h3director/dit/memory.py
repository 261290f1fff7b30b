"""The DiT memory decision for one installed model: which tier each forward runs, and why.

Both framework adapters (`integrations.comfy_dit.install`, behind the DiT Memory node, and
`integrations.diffusers_dit.apply_memory_plan`) make one `DiTMemoryHandle` with `memory_handle(...)` before
they patch anything, call `handle.decide(rows, dtype, device)` before each forward, run the tier it returns
and file what ran with `handle.record(...)`. The choice rests on `tiers` (floor, escalation), `capacity`
(modes, the capacity check) and `kernels` (verification, through a `VerificationCache` per model and shape
class). The Memory Guard node reaches the handle through `comfy_dit.dit_memory_of` and asks it
(`escalation`, `escalate_floor`). Exactness: the handle picks tiers; it changes no arithmetic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import astuple, dataclass, field
from typing import Any

from h3director.dit import kernel_cache, kernels
from h3director.dit.capacity import check_mode
from h3director.dit.kernels import CacheLookup, KernelWidths
from h3director.dit.tiers import (
    DiTMemoryPlan,
    Verified,
    at_least_as_chunked,
    escalation_from,
    is_verified,
    keep_verified,
    verified_parts,
)
from h3director.errors import InvalidInputError
from h3director.units import GiB

log = logging.getLogger(__name__)

def _cache_file_stamp() -> tuple:
    """(path, inode, size, modification time) of the kernel cache file: one `stat`, no read."""
    path = kernel_cache.default_cache_path()
    try:
        stat = path.stat()
    except OSError:
        return (str(path), None, None, None)
    return (str(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)


def _library_versions() -> tuple:
    """torch, CUDA and HIP versions and CPU threads (cuBLAS/oneDNN are fixed for a process: read on a miss)."""
    import torch

    return (torch.__version__, torch.version.cuda, getattr(torch.version, "hip", None), torch.get_num_threads())


class VerificationCache:
    """The kernel cache's verdict (`kernels.lookup_for_model`) per model and shape class, remembered.

    `lookup(device, dtype, widths, rows)` is keyed by (device, dtype, widths, the row class of `rows`
    (`kernel_cache.row_class`; None: any class, for display only), library versions and CPU threads, the
    kernel cache file's stamp). A miss reads the cache file and the environment key (the CPU model from
    /proc/cpuinfo, the loaded cuBLAS version); a hit reads nothing but one `stat` of the file. A verdict
    remembered for one row class is never returned for another: that class is looked up in the file and gets
    its own entry, or none (then nothing counts as verified for it).

    `reader(device, dtype, widths=..., rows=...)` (default `kernels.lookup_for_model`) is what a miss calls.
    """

    def __init__(self, reader: Callable[..., CacheLookup | None] | None = None) -> None:
        self.reader = reader or kernels.lookup_for_model
        self.misses = 0
        self._found: dict[tuple, CacheLookup | None] = {}

    @staticmethod
    def key(device: Any, dtype: Any, widths: KernelWidths | None, rows: int | None) -> tuple:
        """The key a lookup is remembered under (see the class docstring)."""
        shape_class = kernel_cache.row_class(rows) if rows is not None else None
        return (str(device), str(dtype), astuple(widths) if widths is not None else None, shape_class,
                _library_versions(), _cache_file_stamp())

    def lookup(self, device: Any, dtype: Any, widths: KernelWidths | None = None,
               rows: int | None = None) -> CacheLookup | None:
        """The verdict for a forward of `rows` packed rows at `widths` (None: H3's) on `device` at `dtype`;
        None where `verify-kernels` cannot check the device or dtype."""
        key = self.key(device, dtype, widths, rows)
        if key not in self._found:
            self.misses += 1
            self._found[key] = self.reader(device, dtype, widths=widths, rows=rows)
        return self._found[key]


@dataclass(eq=False)
class DiTMemoryHandle:
    """One DiT memory installation on one model: its settings, the tier the last forward ran, and its report.

    - `floor`: the tier forwards start from; `mode` (one of `capacity.MODES`); `heads`, `blocks` (the model's);
      `widths` (`KernelWidths` the verification is looked up at; None: H3's); `budget_bytes` (None: the device);
    - `capacity`: the capacity check (`CapacityCheck`, or any object with its `choose`), None in "fixed"
      mode without a budget on diffusers; `own_capacity`: True when the adapter built it from the defaults;
    - `plan`: the tier the current (or last) forward runs (the floor before any);
    - `last_report` (None before the first forward): rows, mode, device, tier (`describe()`), plan
      (`as_dict()`), exactness (the class), exactness_detail (`kernels.exactness_text`), verified (every
      property the tier relies on passed `verify-kernels` for this device, dtype, threads and row class),
      unverified, kept_stock_unverified ("exact only": floor techniques run stock), need_bytes / have_bytes /
      escalated (when a capacity check ran), forward (its number), and what the adapter adds (ComfyUI:
      kept_stock (layers that kept their stock call, with the reason), quantised (quantised layers run chunked:
      layout, kernel path, activation quantisation, exactness class), reclaimable_bytes, foreign_patches / runs /
      skipped / director_blocks (other packs' patches on the blocks, `integrations.comfy_dit_foreign`),
      measured_peak_bytes and calibration on CUDA);
    - `quantised`: one line per quantised linear of the blocks, what the tiers do with it (chunked, or kept
      stock with the reason; the adapter fills it: ComfyUI's `comfy_quant.block_decisions`);
    - `qkv_layout`: returns how the model projects q, k and v now (`tiers.QKV_LAYOUTS`; None: "fused", ComfyUI's
      `qkv_proj`): the verification is read for that layout (`kernels.lookup_for_layout`);
    - `foreign_at_install`: other packs' patches the adapter found at install (ComfyUI); `notify`: called with
      the text when a forward finds other packs' patches changed (the ComfyUI node shows it);
    - `reports`: forwards recorded; `block_calls`: blocks run under a tier (ComfyUI); `remove()`: uninstall
      (diffusers; a ComfyUI installation lives on its MODEL clone).
    """

    floor: DiTMemoryPlan
    mode: str
    heads: int
    blocks: int
    budget_bytes: int | None = None
    capacity: Any = None
    widths: KernelWidths | None = None
    own_capacity: bool = False
    plan: DiTMemoryPlan | None = None
    last_report: dict | None = None
    reports: int = 0
    block_calls: int = 0
    removed: bool = False
    quantised: list[str] = field(default_factory=list)
    verification: VerificationCache = field(default_factory=VerificationCache, repr=False)
    uninstall: Callable[[], None] | None = field(default=None, repr=False)
    foreign_at_install: list = field(default_factory=list)
    notify: Callable[[str], None] | None = field(default=None, repr=False)
    qkv_layout: Callable[[], str] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.plan is None:
            self.plan = self.floor

    def lookup(self, device: Any, dtype: Any, rows: int | None = None) -> CacheLookup | None:
        """The verification for a forward of `rows` packed rows (None: any row class, for display) at `dtype` on
        `device`, read for the model's q, k, v layout."""
        found = self.verification.lookup(device, dtype, self.widths, rows)
        return kernels.lookup_for_layout(found, self.qkv_layout() if self.qkv_layout is not None else "fused")

    # -- each forward --------------------------------------------------------------------------------
    def decide(self, rows: int | None, dtype: Any, device: Any) -> tuple[DiTMemoryPlan, dict]:
        """The tier a forward of `rows` packed rows (None: unknown; then nothing counts as verified and a
        capacity check is refused) at `dtype` on `device` runs, and the start of its report; sets `plan`.

        The floor must fit `rows`; in "exact only" it first drops every technique not verified for this row
        class (`tiers.keep_verified`); with a capacity check, `capacity.choose` picks from it. Raises
        `InvalidInputError` (a floor that does not fit, no rows for a capacity check) or `BudgetError`
        (no allowed tier fits)."""
        found = self.lookup(device, dtype, rows) if rows is not None else None
        verified = found.verified if found is not None else Verified()
        report: dict[str, Any] = {"rows": rows, "mode": self.mode, "device": str(device)}
        self.floor.check_fits(self.heads, rows)
        floor = self.floor
        if self.mode == "exact only":
            floor, notes = keep_verified(floor, verified)
            report["kept_stock_unverified"] = notes
        plan = floor
        if self.capacity is not None:
            if rows is None:
                raise InvalidInputError("the capacity check needs the packed sequence length of the forward")
            decision = self.capacity.choose(rows=rows, dtype=dtype, floor=floor, mode=self.mode, verified=verified)
            plan = decision.plan
            plan.check_fits(self.heads, rows)
            report.update(need_bytes=int(decision.need_bytes), have_bytes=int(decision.have_bytes),
                          escalated=bool(decision.escalated))
        report.update(tier=plan.describe(), plan=plan.as_dict(), exactness=plan.exactness.value,
                      verified=is_verified(plan, verified),
                      unverified=sorted(set(plan.relies_on) - verified_parts(plan, verified)),
                      exactness_detail=kernels.exactness_text(plan.relies_on, found, plan.splits))
        self.plan = plan
        return plan, report

    def record(self, report: dict, plan: DiTMemoryPlan | None = None, measured_peak_bytes: int | None = None,
               dtype: Any = None) -> dict:
        """File `report` (from `decide`, with what the adapter adds) as `last_report` and number it. With
        `measured_peak_bytes` (bytes above what was allocated before the forward), the capacity check's
        calibration observes it for `plan` (default: `self.plan`) at `dtype`. Logs the tier when it or the
        rows changed since the last forward. Returns the report."""
        if measured_peak_bytes is not None:
            report["measured_peak_bytes"] = int(measured_peak_bytes)
            if callable(getattr(self.capacity, "observe", None)):
                report["calibration"] = self.capacity.observe(report["rows"], plan or self.plan,
                                                              int(measured_peak_bytes), dtype)
        last = self.last_report or {}
        if report["tier"] != last.get("tier") or report["rows"] != last.get("rows"):
            log.info("H3 Director DiT memory: %s (%s; %s) for %s rows%s", report["tier"], report["exactness"],
                     report["exactness_detail"], report["rows"],
                     "".join(f"; {note}" for note in (*report.get("kept_stock_unverified", ()),
                                                      *(f"kept stock: {k}" for k in report.get("kept_stock", ())),
                                                      *report.get("quantised", ()))))
        self.reports += 1
        report["forward"] = self.reports
        self.last_report = report
        return report

    # -- asked by the Memory Guard -------------------------------------------------------------------
    def escalation(self, rows: int) -> list[DiTMemoryPlan]:
        """The tiers above the floor for a forward of `rows` packed rows, cheapest to run first
        (`tiers.escalation_from`)."""
        return escalation_from(self.floor, self.heads, rows)

    def escalate_floor(self, plan: DiTMemoryPlan) -> None:
        """Start later forwards from `plan`, a tier at least as chunked as the floor that fits the heads
        (`InvalidInputError` otherwise): what the Memory Guard's reduce_batch does after the floor did not fit."""
        plan.check_fits(self.heads)
        if not at_least_as_chunked(plan, self.floor):
            raise InvalidInputError(f"cannot lower the DiT memory floor from {self.floor.describe()} to "
                                    f"{plan.describe()}: a new floor must be at least as chunked")
        self.floor = plan

    # -- reporting -----------------------------------------------------------------------------------
    def summary(self, device: Any, dtype: Any) -> str:
        """The DiT Memory node's text: settings, exactness class, and what `verify-kernels` has cached for
        `device` and `dtype` (any row class; which parts run exact is decided per forward, for its row class)."""
        floor = self.floor
        found = self.lookup(device, dtype)
        lines = [f"H3Director DiT Memory on {self.blocks} blocks ({self.heads} heads), mode {self.mode}",
                 f"settings: {floor.describe()} ({floor.exactness.value})",
                 "budget: " + (f"{self.budget_bytes / GiB:.2f} GiB" if self.budget_bytes else "the device's")]
        if not floor.relies_on:
            lines.append("exactness: exact by construction (only lifetimes change)")
        else:
            cached = (kernels.exactness_text(floor.relies_on, found, floor.splits) if found is not None and found.entry
                      else "nothing")
            lines.append(f"exactness: decided per forward for its packed-row class; cached here: {cached}")
            if self.mode == "exact only":
                lines.append("'exact only' runs a technique only where verify-kernels verified it for the forward's "
                             "row class on this device; otherwise that part keeps the stock op (logged)")
        if self.quantised:
            lines.append("quantised layers (per block):")
            lines.extend(f"  {line}" for line in self.quantised)
        lines.append("the tier each forward runs is logged as 'H3 Director DiT memory: ...'")
        return "\n".join(lines)

    def remove(self) -> None:
        """Uninstall (diffusers: the stock processors and forwards come back); a second call does nothing."""
        if self.removed:
            return
        if self.uninstall is not None:
            self.uninstall()
        self.removed = True


def memory_handle(head_chunks: int = 1, ffn_chunks: int = 1, query_chunks: int = 1, *, mode: str, heads: int,
                  blocks: int, budget_bytes: int | None = None, capacity: Any = None,
                  widths: KernelWidths | None = None) -> DiTMemoryHandle:
    """Every check of the DiT memory settings, then the handle; an adapter calls this before it patches
    anything, so a refused call leaves nothing installed.

    `head_chunks` (a divisor of `heads`), `ffn_chunks`, `query_chunks`: counts >= 1 (the floor tier);
    `mode`: one of `capacity.MODES`; `budget_bytes`: bytes > 0, or None for the device; `capacity`: None, or
    an object with `choose(rows, dtype, floor, mode, verified)` (then give the budget to it, not here);
    `blocks`: the model's block count; `widths`: the model's `KernelWidths`. Raises `InvalidInputError`."""
    floor = DiTMemoryPlan(head_chunks=head_chunks, ffn_chunks=ffn_chunks, query_chunks=query_chunks)
    check_mode(mode)
    if budget_bytes is not None and budget_bytes <= 0:
        raise InvalidInputError(f"budget_bytes must be > 0 (or None for the device), got {budget_bytes}")
    if capacity is not None and not callable(getattr(capacity, "choose", None)):
        raise InvalidInputError(f"capacity must have a choose(rows, dtype, floor, mode, verified) method; got "
                                f"{type(capacity).__name__}")
    if capacity is not None and budget_bytes is not None:
        raise InvalidInputError("give budget_bytes to the CapacityCheck you pass (capacity=CapacityCheck(..., "
                                "budget_bytes=...)), not as well")
    floor.check_fits(heads)
    return DiTMemoryHandle(floor=floor, mode=mode, heads=heads, blocks=blocks, budget_bytes=budget_bytes,
                           capacity=capacity, widths=widths)


__all__ = ["DiTMemoryHandle", "VerificationCache", "memory_handle"]
