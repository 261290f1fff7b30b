"""Which activation techniques a DiT forward runs, how exact they are, and the order to escalate them.

A `DiTMemoryPlan` is one *tier*. The techniques, with their exactness class:

- `lifetime` (exact by construction): the block frees what the stock code keeps alive; the normalised
  block input dies after the projections that read it, the FFN input after fc1, the modulation table
  after the attention half (where the adapter can copy the FFN's terms out of it), and the value copy the
  stock attention makes for container-consuming backends is skipped where the backend does not consume;
- `head_chunks` > 1 (exact where verified): q, k and v are projected and attended `heads / head_chunks`
  heads at a time into one preallocated output; bit-identical where the projection GEMM is invariant to
  its output-column count and the attention kernel computes heads independently;
- `ffn_chunks` > 1 (exact where verified): norm, modulation, fc1, SwiGLU, fc2 and the gated residual
  run per chunk of rows, in the stock op order; bit-identical where the GEMMs are invariant to their
  row count M (on the CPU the SwiGLU rows whose thread cuts differ are recomputed as the stock call cuts
  them: `h3director.dit.thread_split`);
- `query_chunks` > 1 (exact where verified): each head group's attention runs over blocks of query
  rows aligned to `QUERY_ALIGN` rows; bit-identical where the kernel computes query rows independently.

Which of these are verified on a device is `h3director.dit.kernels`' job; a plan only names the kernel
properties it relies on (`relies_on`).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from h3director.dit.ranges import divisors
from h3director.errors import InvalidInputError

QUERY_ALIGN = 128
"""Query chunks start on multiples of this many rows (the tile height of the fused attention kernels)."""


class Exactness(str, Enum):
    """The exactness classes of shared design.md, as reported in docstrings and run reports."""

    BY_CONSTRUCTION = "exact by construction"
    WHERE_VERIFIED = "exact where verified"
    APPROXIMATE = "approximate"


# Kernel properties a chunked tier relies on; `h3director.dit.kernels` checks each by name.
QKV_COLUMN_GROUPS = "qkv_column_groups"
"""Head groups of the q, k, v projection. A plan names this one property whatever the layout; it is checked on the
fused QKV GEMM (ComfyUI's `qkv_proj`, diffusers after `fuse_qkv_projections`)."""
QKV_SEPARATE_COLUMN_GROUPS = "qkv_separate_column_groups"
"""The same on one GEMM per q, k and v (diffusers' `to_q`, `to_k`, `to_v`): what stands for `QKV_COLUMN_GROUPS`
where the model projects them separately (`for_qkv_layout`)."""
ATTENTION_HEAD_GROUPS = "attention_head_groups"
ATTENTION_QUERY_CHUNKS = "attention_query_chunks"
FFN_ROW_CHUNKS = "ffn_row_chunks"
KERNEL_PROPERTIES = (QKV_COLUMN_GROUPS, QKV_SEPARATE_COLUMN_GROUPS, ATTENTION_HEAD_GROUPS, ATTENTION_QUERY_CHUNKS,
                     FFN_ROW_CHUNKS)
QKV_LAYOUTS = ("fused", "separate")
"""How a model projects q, k and v: one fused GEMM, or one GEMM each."""


@dataclass(frozen=True)
class DiTMemoryPlan:
    """One tier of the DiT's activation techniques. `DiTMemoryPlan()` is the lifetime-only tier;
    `STOCK` runs the framework's own block unchanged."""

    head_chunks: int = 1
    ffn_chunks: int = 1
    query_chunks: int = 1
    lifetime: bool = True

    def __post_init__(self) -> None:
        for name in ("head_chunks", "ffn_chunks", "query_chunks"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInputError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.lifetime and self.chunked:
            raise InvalidInputError("chunked tiers always free by lifetime: lifetime=False is the stock block only")

    @property
    def is_stock(self) -> bool:
        return not self.lifetime

    @property
    def chunked(self) -> bool:
        return self.head_chunks > 1 or self.ffn_chunks > 1 or self.query_chunks > 1

    @property
    def relies_on(self) -> tuple[str, ...]:
        """The kernel properties this tier's exactness depends on (empty: exact by construction)."""
        needs = []
        if self.head_chunks > 1:
            needs += [QKV_COLUMN_GROUPS, ATTENTION_HEAD_GROUPS]
        if self.query_chunks > 1:
            needs.append(ATTENTION_QUERY_CHUNKS)
        if self.ffn_chunks > 1:
            needs.append(FFN_ROW_CHUNKS)
        return tuple(needs)

    @property
    def splits(self) -> dict[str, int]:
        """The split count of each kernel property in `relies_on` (head groups, query chunks, FFN row chunks):
        a verification holds for the counts it checked, not for every count."""
        counts = {QKV_COLUMN_GROUPS: self.head_chunks, ATTENTION_HEAD_GROUPS: self.head_chunks,
                  ATTENTION_QUERY_CHUNKS: self.query_chunks, FFN_ROW_CHUNKS: self.ffn_chunks}
        return {name: counts[name] for name in self.relies_on}

    @property
    def exactness(self) -> Exactness:
        return Exactness.WHERE_VERIFIED if self.relies_on else Exactness.BY_CONSTRUCTION

    def check_fits(self, heads: int, rows: int | None = None) -> None:
        """Refuse a plan the model cannot run: head groups must divide `heads`; chunks must not exceed
        the rows (`rows` is the packed sequence length, when known)."""
        if heads % self.head_chunks:
            raise InvalidInputError(
                f"head_chunks={self.head_chunks} does not divide the model's {heads} heads; use one of {divisors(heads)}")
        if rows is not None:
            if self.ffn_chunks > rows:
                raise InvalidInputError(f"ffn_chunks={self.ffn_chunks} exceeds the {rows} rows of the sequence")
            max_query = max(1, -(-rows // QUERY_ALIGN))
            if self.query_chunks > max_query:
                raise InvalidInputError(
                    f"query_chunks={self.query_chunks} exceeds the {max_query} blocks of {QUERY_ALIGN} query rows "
                    f"in a {rows}-row sequence")

    def describe(self) -> str:
        """Human form, e.g. "4 head groups, 8 FFN row chunks" or "lifetime frees only"."""
        if self.is_stock:
            return "stock block"
        parts = []
        if self.head_chunks > 1:
            parts.append(f"{self.head_chunks} head groups")
        if self.query_chunks > 1:
            parts.append(f"{self.query_chunks} query chunks")
        if self.ffn_chunks > 1:
            parts.append(f"{self.ffn_chunks} FFN row chunks")
        return ", ".join(parts) if parts else "lifetime frees only"

    def as_dict(self) -> dict:
        return {"head_chunks": self.head_chunks, "ffn_chunks": self.ffn_chunks, "query_chunks": self.query_chunks,
                "lifetime": self.lifetime, "exactness": self.exactness.value, "relies_on": list(self.relies_on),
                "describe": self.describe()}


STOCK = DiTMemoryPlan(lifetime=False)
LIFETIME_ONLY = DiTMemoryPlan()


def escalation_ladder(heads: int, rows: int | None = None, max_query_chunks: int = 64) -> list[DiTMemoryPlan]:
    """Tiers in the order a capacity check tries them: each saves more activation memory than the one
    before and costs more calls. Starts at the lifetime-only tier; FFN row chunks come first (the FFN
    holds the block's peak), then head groups with them, then query chunks. Every tier fits `heads`
    (and `rows`, when given)."""
    ladder = [LIFETIME_ONLY]
    head_steps = [g for g in divisors(heads) if g > 1]
    for ffn in (2, 4, 8):
        ladder.append(DiTMemoryPlan(ffn_chunks=ffn))
    for g in head_steps:
        ladder.append(DiTMemoryPlan(head_chunks=g, ffn_chunks=max(8, 2 * g)))
    top = head_steps[-1] if head_steps else 1
    query = 2
    while query <= max_query_chunks:
        ladder.append(DiTMemoryPlan(head_chunks=top, ffn_chunks=max(8, 2 * top), query_chunks=query))
        query *= 2
    fitting = []
    for plan in ladder:
        try:
            plan.check_fits(heads, rows)
        except InvalidInputError:
            continue
        fitting.append(plan)
    return fitting


def at_least_as_chunked(plan: DiTMemoryPlan, floor: DiTMemoryPlan) -> bool:
    """Whether `plan` splits every technique at least as finely as `floor` (any tier is, over `STOCK`): the tiers
    an escalation from `floor` may move to."""
    if floor.is_stock:
        return True
    return (plan.head_chunks >= floor.head_chunks and plan.ffn_chunks >= floor.ffn_chunks
            and plan.query_chunks >= floor.query_chunks)


def escalation_from(floor: DiTMemoryPlan, heads: int, rows: int | None = None) -> list[DiTMemoryPlan]:
    """The tiers above `floor`, cheapest first: every `escalation_ladder(heads, rows)` tier other than `floor`
    that is at least as chunked as it (`at_least_as_chunked`)."""
    return [plan for plan in escalation_ladder(heads, rows) if plan != floor and at_least_as_chunked(plan, floor)]


class Verified(frozenset):
    """Kernel property names verified for one device, dtype and row class, with the split counts each was
    checked at (`counts[name]`: a frozenset of head-group, query-chunk or FFN-row-chunk counts; a name absent
    from `counts` holds for any count). A plain set of names is read as "any count"."""

    counts: dict[str, frozenset[int]]

    def __new__(cls, names=(), counts: dict | None = None):
        made = super().__new__(cls, names)
        made.counts = {name: frozenset(c) for name, c in (counts or {}).items()}
        return made


def for_qkv_layout(verified, layout: str) -> Verified:
    """`verified` (names, or a `Verified` with split counts) as a plan reads it on a model whose q, k, v projection
    has `layout` (one of `QKV_LAYOUTS`): for "separate", `QKV_COLUMN_GROUPS` holds where
    `QKV_SEPARATE_COLUMN_GROUPS` was verified, at its counts; for "fused", as verified."""
    if layout not in QKV_LAYOUTS:
        raise InvalidInputError(f"unknown q, k, v layout {layout!r}: expected one of {list(QKV_LAYOUTS)}")
    names = set(verified)
    counts = dict(getattr(verified, "counts", {}))
    if layout == "separate":
        names.discard(QKV_COLUMN_GROUPS)
        counts.pop(QKV_COLUMN_GROUPS, None)
        if QKV_SEPARATE_COLUMN_GROUPS in names:
            names.add(QKV_COLUMN_GROUPS)
            if QKV_SEPARATE_COLUMN_GROUPS in counts:
                counts[QKV_COLUMN_GROUPS] = counts[QKV_SEPARATE_COLUMN_GROUPS]
    return Verified(names, counts)


def verified_parts(plan: DiTMemoryPlan, verified) -> set[str]:
    """The kernel properties `plan` relies on that `verified` (names, or a `Verified` with split counts) covers
    at the plan's own split counts (`plan.splits`)."""
    counts = getattr(verified, "counts", {})
    return {name for name, count in plan.splits.items()
            if name in verified and (name not in counts or count in counts[name])}


def is_verified(plan: DiTMemoryPlan, verified) -> bool:
    """Whether every kernel property `plan` relies on is verified at its split counts (`verified_parts`)."""
    return set(plan.relies_on) <= verified_parts(plan, verified)


def keep_verified(plan: DiTMemoryPlan, verified: set[str] | frozenset[str]) -> tuple[DiTMemoryPlan, list[str]]:
    """`plan` with every technique whose kernel properties are not all verified at its split count (`verified`:
    names, or a `Verified` with the counts checked) set back to its stock form (head groups, query chunks or FFN
    row chunks to 1), and one note per technique kept stock. What "exact only" runs from."""
    notes = []
    head, query, ffn = plan.head_chunks, plan.query_chunks, plan.ffn_chunks
    covered = verified_parts(plan, verified)
    if head > 1 and not {QKV_COLUMN_GROUPS, ATTENTION_HEAD_GROUPS} <= covered:
        head, query = 1, 1
        notes.append(f"head groups ({plan.head_chunks}) not verified for this shape: stock attention projection")
    if query > 1 and ATTENTION_QUERY_CHUNKS not in covered:
        query = 1
        notes.append(f"query chunks ({plan.query_chunks}) not verified for this shape: one attention call per group")
    if ffn > 1 and FFN_ROW_CHUNKS not in covered:
        ffn = 1
        notes.append(f"FFN row chunks ({plan.ffn_chunks}) not verified for this shape: stock FFN in one chunk")
    if not notes:
        return plan, []
    return DiTMemoryPlan(head_chunks=head, ffn_chunks=ffn, query_chunks=query, lifetime=plan.lifetime), notes


__all__ = ["ATTENTION_HEAD_GROUPS", "ATTENTION_QUERY_CHUNKS", "FFN_ROW_CHUNKS", "KERNEL_PROPERTIES",
           "LIFETIME_ONLY", "QKV_COLUMN_GROUPS", "QKV_LAYOUTS", "QKV_SEPARATE_COLUMN_GROUPS", "QUERY_ALIGN", "STOCK",
           "DiTMemoryPlan", "Exactness", "Verified", "escalation_ladder", "for_qkv_layout", "is_verified",
           "keep_verified", "verified_parts"]
