"""Per-device A/B checks of the kernel properties the chunked DiT tiers rely on (`verify-kernels`).

A chunked tier regroups the same arithmetic (`DiTMemoryPlan.relies_on`); it is bit-identical to the
stock block only where the kernels give every output element the same bits whatever the call's other
rows, columns or heads. That depends on the device, the library and its version, so it is checked here,
with `torch.equal`, on random inputs (fixed seed) at H3's real layer widths (`H3_WIDTHS`):

- `FFN_ROW_CHUNKS`: the fc1 GEMM (hidden -> 2 x ffn) and the fc2 GEMM (ffn -> hidden) over all rows vs
  the same GEMM per chunk of rows (several chunk counts, uneven ones included: `ranges.row_ranges`), the
  SwiGLU (`silu(gate) * up`) over fc1's whole output vs per chunk the way the adapters run it
  (`blocks.swiglu_rows`: rows the CPU thread ranges cut differently recomputed per stock segment), and
  the block's RMSNorm (hidden wide) the same way, under no_grad and under inference_mode;
- `QKV_COLUMN_GROUPS`: the fused QKV GEMM (hidden -> 3 x heads x head_dim) over all output columns vs
  one GEMM per head group and per q/k/v over that group's weight rows (every head-group count a tier
  can use: the divisors of `heads`), plus one variant that also splits the rows;
- `QKV_SEPARATE_COLUMN_GROUPS`: the same for one of three separate GEMMs (hidden -> heads x head_dim), the
  layout diffusers projects q, k, v in unless fused (a plan reads it through `lookup_for_layout`);
- `ATTENTION_HEAD_GROUPS`: `scaled_dot_product_attention` over all heads vs per head group;
- `ATTENTION_QUERY_CHUNKS`: attention over all query rows vs per block of query rows aligned to
  `QUERY_ALIGN`, over all heads and inside one-head groups (the ladder's query tiers use those).

Tensors have the layouts the adapters pass (row-major activations ``[rows, features]``, weights
``[out, in]``, attention inputs ``[1, heads, rows, head_dim]`` views of ``[rows, heads, head_dim]``);
chunked results are written into a preallocated output, as the adapters do, and compared whole.

A pass holds for the checked row counts (`rows`, and the chunk sizes derived from it): GEMM libraries
choose kernels by shape, so a check at 1,024 rows is evidence, not proof, for 110,000 rows. Results are
filed in the kernel cache (`h3director.dit.kernel_cache`) under the device, library versions, dtype, CPU
thread count and the row class of `rows` (`kernel_cache.row_class`); `verified_properties(..., rows=N)`
is what `exact only` mode consults for a forward of N packed rows: an entry for another row class, device
or library version is not used (logged once), and `exactness_text` is the sentence the run reports carry.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from h3director.core.devices import parse_device
from h3director.dit import kernel_cache
from h3director.dit.blocks import swiglu_rows
from h3director.dit.ranges import divisors, head_ranges, row_ranges
from h3director.dit.tiers import (
    ATTENTION_HEAD_GROUPS,
    ATTENTION_QUERY_CHUNKS,
    FFN_ROW_CHUNKS,
    KERNEL_PROPERTIES,
    QKV_COLUMN_GROUPS,
    QKV_SEPARATE_COLUMN_GROUPS,
    QUERY_ALIGN,
    Verified,
    escalation_ladder,
    for_qkv_layout,
)
from h3director.errors import InvalidInputError

log = logging.getLogger(__name__)

DTYPES = ("bf16", "fp16", "fp32")
DEFAULT_ROWS = {"cpu": 1024, "cuda": 8192, "mps": 4096}
"""Rows checked when the caller gives none: modest on a CPU, closer to a real sequence on a GPU."""
DEFAULT_ROW_CHUNKS = tuple(range(2, 17))
DEFAULT_QUERY_CHUNKS = (2, 3, 8)
"""Counts checked besides the escalation ladder's own (`ladder_counts`): a verification holds only for the split
counts it checked (GEMM kernels are chosen by shape: 8 FFN row chunks bit-identical says nothing of 112), so every
FFN row-chunk count a node is likely to be set to (2 to 16) is checked."""
LEGACY_ROW_CHUNKS = (2, 3, 8, 16)
LEGACY_QUERY_CHUNKS = (2, 3, 8)
"""What a cache entry written before entries recorded their split counts was checked at (the defaults then;
head groups: every divisor of the heads)."""
MAX_ROWS = 1 << 20
MAX_SPLITS = 1024
"""The most row or query chunks an extra count may ask for (the DiT Memory node's `ffn_chunks` maximum)."""


def ladder_counts(heads: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The FFN row-chunk and query-chunk counts (above 1) of `tiers.escalation_ladder(heads)`."""
    ladder = escalation_ladder(heads)
    return (tuple(sorted({p.ffn_chunks for p in ladder if p.ffn_chunks > 1})),
            tuple(sorted({p.query_chunks for p in ladder if p.query_chunks > 1})))


@dataclass(frozen=True)
class KernelWidths:
    """Layer widths of the checked ops. Defaults: H3's DiT (hidden 5376, 56 heads x 128, SwiGLU FFN 14336:
    fc1 is hidden -> 2 x ffn = 28672, fc2 ffn -> hidden, fused QKV hidden -> 3 x 7168)."""

    hidden: int = 5376
    heads: int = 56
    head_dim: int = 128
    ffn: int = 14336

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidInputError(f"kernel width {name} must be a positive integer, got {value!r}")

    @property
    def inner(self) -> int:
        """Attention width: heads x head_dim (7168 for H3)."""
        return self.heads * self.head_dim

    @classmethod
    def of(cls, shape: Any) -> KernelWidths:
        """The widths of a model shape (`h3director.plan.activations.DiTShape` or anything with `hidden`,
        `heads`, `head_dim` and `ffn`)."""
        return cls(hidden=int(shape.hidden), heads=int(shape.heads), head_dim=int(shape.head_dim), ffn=int(shape.ffn))


H3_WIDTHS = KernelWidths()

Linear = Callable[[Any, Any], Any]
Attention = Callable[[Any, Any, Any], Any]


@dataclass
class VariantResult:
    """One A/B comparison: `label` names the split; `max_abs_diff` is None when the outputs are equal;
    `count` is the split count a tier would use for it (head groups, query chunks or FFN row chunks)."""

    label: str
    equal: bool
    max_abs_diff: float | None
    calls: int
    count: int | None = None


@dataclass
class PropertyResult:
    """The checks of one kernel property. `passed` only when every variant was bit-identical.
    `shapes` gives the full (unsplit) operands as lists; `seconds` is the wall time of all variants."""

    name: str
    passed: bool
    variants: list[VariantResult]
    shapes: dict[str, list[int]]
    seconds: float
    aliases: dict[int, int] = field(default_factory=dict)

    def counts(self) -> dict[str, list[int]]:
        """{"passed": split counts whose every variant was bit-identical, "failed": the others}; a count in
        `aliases` (it cuts the checked rows into the same ranges as the count it maps to, which was checked)
        shares that count's verdict."""
        failed = {v.count for v in self.variants if v.count is not None and not v.equal}
        passed = {v.count for v in self.variants if v.count is not None} - failed
        for alias, checked in self.aliases.items():
            (failed if checked in failed else passed if checked in passed else set()).add(alias)
        return {"passed": sorted(passed), "failed": sorted(failed)}

    @property
    def max_abs_diff(self) -> float | None:
        """Largest absolute difference over the failed variants (None when all were equal)."""
        diffs = [v.max_abs_diff for v in self.variants if v.max_abs_diff is not None]
        return max(diffs) if diffs else None

    def detail(self) -> str:
        """One line for the table: what was compared, and what differed."""
        shapes = ", ".join(f"{name} {'x'.join(map(str, shape))}" for name, shape in self.shapes.items())
        if self.passed:
            return f"{len(self.variants)} splits bit-identical ({shapes})"
        failed = [v for v in self.variants if not v.equal]
        return (f"{len(failed)}/{len(self.variants)} splits differ, max |diff| {self.max_abs_diff:.3g}: "
                + ", ".join(v.label for v in failed[:4]) + (", ..." if len(failed) > 4 else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "max_abs_diff": self.max_abs_diff,
                "detail": self.detail(), "counts": self.counts(), "shapes": self.shapes,
                "seconds": round(self.seconds, 4),
                "variants": [asdict(v) for v in self.variants]}


@dataclass
class KernelReport:
    """What `verify_kernels` found on one device at one dtype. `key` is the cache key of this run
    (device name, torch, CUDA/cuBLAS versions, dtype); `cache_problem` reports an unreadable cache
    file that was replaced, `cache_path` where the result was filed (None: not written)."""

    device: str
    dtype: str
    rows: int
    widths: KernelWidths
    seed: int
    key: dict[str, str | None]
    results: dict[str, PropertyResult]
    date: str
    cache_path: str | None = None
    cache_problem: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def verified(self) -> frozenset[str]:
        return frozenset(name for name, result in self.results.items() if result.passed)

    @property
    def failed(self) -> frozenset[str]:
        return frozenset(name for name, result in self.results.items() if not result.passed)

    def to_dict(self) -> dict[str, Any]:
        return {"device": self.device, "dtype": self.dtype, "rows": self.rows, "widths": asdict(self.widths),
                "seed": self.seed, "key": self.key, "date": self.date,
                "verified": sorted(self.verified), "failed": sorted(self.failed),
                "results": {name: result.to_dict() for name, result in self.results.items()},
                "cache_path": self.cache_path, "cache_problem": self.cache_problem, "notes": self.notes}

    def cache_entry(self) -> dict[str, Any]:
        return {"key": self.key, "widths": asdict(self.widths), "rows": self.rows, "date": self.date,
                "verified": sorted(self.verified), "failed": sorted(self.failed),
                "results": {name: {"passed": r.passed, "max_abs_diff": r.max_abs_diff, "detail": r.detail(),
                                   "counts": r.counts()}
                            for name, r in self.results.items()}}


# ---------------------------------------------------------------------------------------------
# Arguments


def parse_dtype(dtype: Any) -> tuple[str, Any]:
    """``"bf16"`` / ``"fp16"`` / ``"fp32"`` (or the torch dtype) -> ``(name, torch.dtype)``."""
    import torch

    table = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
    if isinstance(dtype, torch.dtype):
        for name, value in table.items():
            if value == dtype:
                return name, value
    elif isinstance(dtype, str) and dtype.lower() in table:
        return dtype.lower(), table[dtype.lower()]
    raise InvalidInputError(f"unsupported dtype {dtype!r}: expected one of {list(DTYPES)}")


def resolve_device(device: Any) -> str:
    """Validate ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"``, a ``torch.device``) against this
    machine; ``"cuda"`` becomes ``"cuda:<current>"``. Refuses unknown or unavailable devices."""
    import torch

    kind, index = parse_device(device)
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise InvalidInputError(f"device {str(device)!r} requested but CUDA is not available "
                                    f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if index is None else index
        if index >= count:
            raise InvalidInputError(f"device cuda:{index} does not exist: this machine has {count} CUDA device(s)")
        return f"cuda:{index}"
    if kind == "mps" and not torch.backends.mps.is_available():
        raise InvalidInputError(f"device {str(device)!r} requested but MPS is not available")
    return kind


def default_device() -> str:
    """The first CUDA device when there is one, else MPS when available, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return f"cuda:{torch.cuda.current_device()}"
    if torch.backends.mps.is_available():
        return "mps"
    return "cpu"


# ---------------------------------------------------------------------------------------------
# Checks


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize(device)
    elif device == "mps":
        torch.mps.synchronize()


@contextlib.contextmanager
def _timer(device: str, seconds: list[float]) -> Iterator[None]:
    _sync(device)
    start = time.perf_counter()
    yield
    _sync(device)
    seconds.append(time.perf_counter() - start)


def _compare(label: str, reference, chunked, calls: int, count: int | None = None) -> VariantResult:
    import torch

    if torch.equal(reference, chunked):
        return VariantResult(label, True, None, calls, count)
    diff = (reference.float() - chunked.float()).abs()
    worst = float(diff.nan_to_num(nan=float("inf")).max())
    return VariantResult(label, False, worst, calls, count)


class _Inputs:
    """Random tensors from one seeded generator on the device (nothing is made on the host first)."""

    def __init__(self, device: str, dtype, seed: int) -> None:
        import torch

        self.torch = torch
        self.device = device
        self.dtype = dtype
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def normal(self, *shape: int, scale: float = 1.0):
        tensor = self.torch.randn(*shape, generator=self.generator, device=self.device, dtype=self.dtype)
        return tensor.mul_(scale) if scale != 1.0 else tensor


def _distinct_splits(rows: int, counts: tuple[int, ...], align: int) -> list[int]:
    """The chunk counts of ``counts`` that split ``rows`` (aligned to ``align``) into at least two ranges,
    one per distinct set of ranges (8 chunks of 300 rows aligned to 128 are the same 3 as 3 chunks)."""
    seen, kept = set(), []
    for count in counts:
        ranges = tuple(row_ranges(rows, count, align)) if count <= rows else ()
        if len(ranges) >= 2 and ranges not in seen:
            seen.add(ranges)
            kept.append(count)
    return kept


def _same_ranges(rows: int, counts: tuple[int, ...], align: int) -> dict[int, int]:
    """{count: the earlier count of ``counts`` that cuts ``rows`` (aligned to ``align``) into the same ranges}:
    the counts `_distinct_splits` leaves out, each with the one checked in its place."""
    seen: dict[tuple, int] = {}
    aliases = {}
    for count in counts:
        ranges = tuple(row_ranges(rows, count, align)) if count <= rows else ()
        if len(ranges) < 2:
            continue
        if ranges in seen:
            aliases[count] = seen[ranges]
        else:
            seen[ranges] = count
    return aliases


def _row_chunked(linear: Linear, x, weight, chunks: int, out) -> int:
    ranges = row_ranges(x.shape[0], chunks)
    for a, b in ranges:
        out[a:b] = linear(x[a:b], weight)
    return len(ranges)


def _swiglu(h):
    """ComfyUI's `_swiglu_eager` (diffusers' SwiGLU runs the same two elementwise ops)."""
    import torch.nn.functional as F

    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate).mul_(up)


def _check_swiglu_rows(fc1_out, rows: int, row_chunks: tuple[int, ...]) -> list[VariantResult]:
    """SwiGLU over all rows of fc1's output vs per row chunk through `blocks.swiglu_rows`."""
    import torch

    reference = _swiglu(fc1_out)
    out = torch.empty_like(reference)
    variants = []
    for chunks in _distinct_splits(rows, row_chunks, 1):
        ranges = row_ranges(rows, chunks)
        for a, b in ranges:
            out[a:b] = swiglu_rows(_swiglu, fc1_out[a:b], a, b, rows)
        variants.append(_compare(f"swiglu {len(ranges)} row chunks", reference, out, len(ranges), chunks))
    return variants


def check_ffn_row_chunks(inputs: _Inputs, rows: int, widths: KernelWidths, row_chunks: tuple[int, ...],
                         linear: Linear) -> tuple[list[VariantResult], dict[str, list[int]]]:
    """fc1 and fc2 over all rows vs per row chunk. Weights are scaled by 1/sqrt(fan-in), as initialised
    layers are, so outputs stay in range in every dtype."""
    torch = inputs.torch
    variants: list[VariantResult] = []
    shapes: dict[str, list[int]] = {}
    for name, fan_in, fan_out in (("fc1", widths.hidden, 2 * widths.ffn), ("fc2", widths.ffn, widths.hidden)):
        x = inputs.normal(rows, fan_in)
        weight = inputs.normal(fan_out, fan_in, scale=fan_in ** -0.5)
        shapes[f"{name} x"] = [rows, fan_in]
        shapes[f"{name} weight"] = [fan_out, fan_in]
        reference = linear(x, weight)
        out = torch.empty_like(reference)
        for chunks in _distinct_splits(rows, row_chunks, 1):
            calls = _row_chunked(linear, x, weight, chunks, out)
            variants.append(_compare(f"{name} {calls} row chunks", reference, out, calls, chunks))
        del x, weight, out
        if name == "fc1":  # the SwiGLU over fc1's real output, as the adapters chunk it
            variants += _check_swiglu_rows(reference, rows, row_chunks)
            shapes["swiglu input"] = list(reference.shape)
        del reference
    # the row-chunked tiers also run the block's first RMSNorm per range of rows (diffusers' adapter);
    # PyTorch's CPU rms_norm is composite under no_grad and one fused kernel under inference_mode: check both
    x = inputs.normal(rows, widths.hidden)
    scale = inputs.normal(widths.hidden)
    shapes["rms_norm x"] = [rows, widths.hidden]
    for mode_name, mode in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
        with mode():
            reference = torch.nn.functional.rms_norm(x, (widths.hidden,), scale, 1e-5)
            out = torch.empty_like(reference)
            for chunks in _distinct_splits(rows, row_chunks, 1):
                ranges = row_ranges(rows, chunks)
                for a, b in ranges:
                    out[a:b] = torch.nn.functional.rms_norm(x[a:b], (widths.hidden,), scale, 1e-5)
                variants.append(_compare(f"rms_norm ({mode_name}) {len(ranges)} row chunks", reference, out,
                                         len(ranges), chunks))
    return variants, shapes


def check_qkv_column_groups(inputs: _Inputs, rows: int, widths: KernelWidths, head_groups: tuple[int, ...],
                            linear: Linear, parts: int = 3) -> tuple[list[VariantResult], dict[str, list[int]]]:
    """The q, k, v projection over all its output columns vs, per head group, one GEMM over the group's weight
    rows of each part, written into the matching output columns. `parts`: 3 for the fused QKV GEMM (hidden ->
    3 x inner, `QKV_COLUMN_GROUPS`), 1 for one of the separate q, k, v GEMMs (hidden -> inner, all three the same
    shape: `QKV_SEPARATE_COLUMN_GROUPS`). The last variant also splits the rows in 3 (the largest head-group
    count)."""
    torch = inputs.torch
    inner, d = widths.inner, widths.head_dim
    x = inputs.normal(rows, widths.hidden)
    weight = inputs.normal(parts * inner, widths.hidden, scale=widths.hidden ** -0.5)
    reference = linear(x, weight)
    out = torch.empty_like(reference)
    variants = []
    plans = [(groups, 1) for groups in head_groups]
    if head_groups and rows >= 3:
        plans.append((head_groups[-1], 3))
    for groups, row_chunks in plans:
        calls = 0
        for h0, h1 in head_ranges(widths.heads, groups):
            for part in range(parts):
                c0, c1 = part * inner + h0 * d, part * inner + h1 * d
                calls += _row_chunked(linear, x, weight[c0:c1], row_chunks, out[:, c0:c1])
        label = ("" if parts == 3 else "q, k, v each: ") + f"{groups} head groups" + (
            f" x {row_chunks} row chunks" if row_chunks > 1 else "")
        # the row-split variant is no tier's split (tiers project every row at once): it names no count
        variants.append(_compare(label, reference, out, calls, groups if row_chunks == 1 else None))
    return variants, {"x": [rows, widths.hidden], "weight": [parts * inner, widths.hidden]}


def _attention_inputs(inputs: _Inputs, rows: int, widths: KernelWidths):
    """q, k, v as the adapters hold them: ``[rows, heads, head_dim]``, passed as ``[1, heads, rows, head_dim]``
    transposed views."""
    return tuple(inputs.normal(rows, widths.heads, widths.head_dim) for _ in range(3))


def _as_batch(t):
    return t.transpose(0, 1).unsqueeze(0)


def check_attention_head_groups(inputs: _Inputs, rows: int, widths: KernelWidths, head_groups: tuple[int, ...],
                                attention: Attention) -> tuple[list[VariantResult], dict[str, list[int]]]:
    """Attention over all heads vs one call per head group, each written into its heads of one output."""
    torch = inputs.torch
    q, k, v = _attention_inputs(inputs, rows, widths)
    reference = attention(_as_batch(q), _as_batch(k), _as_batch(v))
    out = torch.empty_like(reference)
    variants = []
    for groups in head_groups:
        ranges = head_ranges(widths.heads, groups)
        for h0, h1 in ranges:
            out[:, h0:h1] = attention(_as_batch(q[:, h0:h1]), _as_batch(k[:, h0:h1]), _as_batch(v[:, h0:h1]))
        variants.append(_compare(f"{groups} head groups", reference, out, len(ranges), groups))
    return variants, {"q, k, v": [1, widths.heads, rows, widths.head_dim]}


def check_attention_query_chunks(inputs: _Inputs, rows: int, widths: KernelWidths, query_chunks: tuple[int, ...],
                                 attention: Attention) -> tuple[list[VariantResult], dict[str, list[int]]]:
    """Attention over all query rows vs per `QUERY_ALIGN`-aligned block of query rows over all keys:
    over all heads at once, and inside one-head groups."""
    torch = inputs.torch
    q, k, v = _attention_inputs(inputs, rows, widths)
    reference = attention(_as_batch(q), _as_batch(k), _as_batch(v))
    out = torch.empty_like(reference)
    variants = []
    for chunks in _distinct_splits(rows, query_chunks, QUERY_ALIGN):
        ranges = row_ranges(rows, chunks, QUERY_ALIGN)
        for groups in (1, widths.heads):
            calls = 0
            for h0, h1 in head_ranges(widths.heads, groups):
                kb, vb = _as_batch(k[:, h0:h1]), _as_batch(v[:, h0:h1])
                for a, b in ranges:
                    out[:, h0:h1, a:b] = attention(_as_batch(q[a:b, h0:h1]), kb, vb)
                    calls += 1
            where = "all heads" if groups == 1 else "1-head groups"
            variants.append(_compare(f"{len(ranges)} query chunks, {where}", reference, out, calls, chunks))
    return variants, {"q, k, v": [1, widths.heads, rows, widths.head_dim]}


def verify_kernels(device: Any = None, dtype: Any = "bf16", rows: int | None = None, *,
                   widths: KernelWidths | None = None, seed: int = 0,
                   properties: tuple[str, ...] = KERNEL_PROPERTIES,
                   row_chunks: tuple[int, ...] | None = None,
                   head_groups: tuple[int, ...] | None = None,
                   query_chunks: tuple[int, ...] | None = None,
                   extra_row_chunks: tuple[int, ...] = (), extra_query_chunks: tuple[int, ...] = (),
                   linear: Linear | None = None, attention: Attention | None = None,
                   cache: bool | str | Any = False) -> KernelReport:
    """Check each kernel property on ``device`` at ``dtype`` with ``rows`` packed rows (default
    `DEFAULT_ROWS` for the device kind) at ``widths`` (default `H3_WIDTHS`) and return the report.

    ``head_groups`` defaults to every head-group count a tier can use (the divisors of ``widths.heads``
    above 1), ``row_chunks`` and ``query_chunks`` to `DEFAULT_ROW_CHUNKS` / `DEFAULT_QUERY_CHUNKS` and every
    count of the escalation ladder (`ladder_counts`); ``extra_row_chunks`` / ``extra_query_chunks`` are
    checked besides those (the counts a node is set to outside the ladder); the cache entry records which counts
    passed, and a tier counts as verified only at those. ``linear(x, weight)`` and ``attention(q, k, v)`` default to ``torch.nn.functional.linear``
    and ``scaled_dot_product_attention``; tests pass others. ``cache``: False writes nothing, True
    files the result in the default cache (`kernel_cache.default_cache_path`), a path files it there.
    All arguments are checked before any tensor is made."""
    import torch
    import torch.nn.functional as F

    device = resolve_device(default_device() if device is None else device)
    dtype_name, torch_dtype = parse_dtype(dtype)
    widths = H3_WIDTHS if widths is None else widths
    if not isinstance(widths, KernelWidths):
        raise InvalidInputError(f"widths must be a KernelWidths, got {type(widths).__name__}")
    if rows is None:
        rows = DEFAULT_ROWS[parse_device(device)[0]]
    if not isinstance(rows, int) or isinstance(rows, bool) or not 1 <= rows <= MAX_ROWS:
        raise InvalidInputError(f"rows must be an integer in [1, {MAX_ROWS}], got {rows!r}")
    unknown = [name for name in properties if name not in KERNEL_PROPERTIES]
    if unknown or not properties:
        raise InvalidInputError(f"unknown kernel properties {unknown}: expected a subset of {list(KERNEL_PROPERTIES)}")
    if head_groups is None:
        head_groups = tuple(g for g in divisors(widths.heads) if g > 1)
    ladder_ffn, ladder_query = ladder_counts(widths.heads)
    if row_chunks is None:
        row_chunks = (*DEFAULT_ROW_CHUNKS, *ladder_ffn)
    if query_chunks is None:
        query_chunks = (*DEFAULT_QUERY_CHUNKS, *ladder_query)
    for what, counts in (("extra FFN row-chunk counts", extra_row_chunks),
                         ("extra query-chunk counts", extra_query_chunks)):
        if any(not isinstance(c, int) or isinstance(c, bool) or not 1 < c <= MAX_SPLITS for c in counts):
            raise InvalidInputError(f"{what} must be integers from 2 to {MAX_SPLITS}, got {list(counts)}")
    row_chunks = tuple(sorted({*row_chunks, *extra_row_chunks}))
    query_chunks = tuple(sorted({*query_chunks, *extra_query_chunks}))
    for groups in head_groups:
        head_ranges(widths.heads, groups)  # refuses a count that does not divide the heads
    for name, counts in (("row_chunks", row_chunks), ("query_chunks", query_chunks)):
        if any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in counts):
            raise InvalidInputError(f"{name} must be positive integers, got {counts!r}")
    linear = F.linear if linear is None else linear
    attention = F.scaled_dot_product_attention if attention is None else attention

    key = kernel_cache.environment_key(device, dtype_name)
    checks = {
        FFN_ROW_CHUNKS: lambda i: check_ffn_row_chunks(i, rows, widths, row_chunks, linear),
        QKV_COLUMN_GROUPS: lambda i: check_qkv_column_groups(i, rows, widths, head_groups, linear),
        QKV_SEPARATE_COLUMN_GROUPS: lambda i: check_qkv_column_groups(i, rows, widths, head_groups, linear, parts=1),
        ATTENTION_HEAD_GROUPS: lambda i: check_attention_head_groups(i, rows, widths, head_groups, attention),
        ATTENTION_QUERY_CHUNKS: lambda i: check_attention_query_chunks(i, rows, widths, query_chunks, attention),
    }
    results: dict[str, PropertyResult] = {}
    with torch.inference_mode():
        for name in KERNEL_PROPERTIES:
            if name not in properties:
                continue
            inputs = _Inputs(device, torch_dtype, seed)
            seconds: list[float] = []
            with _timer(device, seconds):
                variants, shapes = checks[name](inputs)
            aliases = {FFN_ROW_CHUNKS: lambda: _same_ranges(rows, row_chunks, 1),
                       ATTENTION_QUERY_CHUNKS: lambda: _same_ranges(rows, query_chunks, QUERY_ALIGN)}
            results[name] = PropertyResult(name, bool(variants) and all(v.equal for v in variants),
                                           variants, shapes, seconds[0],
                                           aliases[name]() if name in aliases else {})
            del inputs
    report = KernelReport(device, dtype_name, rows, widths, seed, key, results,
                          datetime.now(timezone.utc).isoformat(timespec="seconds"))
    for name, result in results.items():
        if not result.variants:
            report.notes.append(f"{name}: no split fits {rows} rows; not verified")
    if cache is not False:
        path = kernel_cache.default_cache_path() if cache is True else cache
        before = kernel_cache.write_entry(report.cache_entry(), path)
        report.cache_path = str(before.path)
        report.cache_problem = before.problem
    return report


# ---------------------------------------------------------------------------------------------
# Reading the cache


@dataclass(frozen=True)
class CacheLookup:
    """What the cache says for one device, dtype and row class in this process. `verified`: the properties
    verified, with the split counts each passed at (`tiers.Verified`); `problem`: an unreadable cache file
    (nothing trusted); `entry`: the matching record, None when there is none; `rows`: the packed rows asked
    about (None: any row class)."""

    verified: frozenset[str]
    key: dict[str, str | None]
    path: str
    entry: dict[str, Any] | None
    problem: str | None
    rows: int | None = None


_SAID: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _SAID:
        _SAID.add(message)
        log.warning("%s", message)


def _unused_entries_note(entries: list[dict[str, Any]], key: dict, widths: dict, rows: int | None) -> str | None:
    """Why the cache's entries for this device do not apply (another row class, library version, thread
    count, dtype or widths), or None when it has none for this device."""
    same_device = [e for e in entries if e["key"].get("device_name") == key.get("device_name")]
    if not same_device:
        return None
    if rows is not None:
        classes = sorted({kernel_cache.row_class(e["rows"]) for e in same_device
                          if e["key"] == key and e["widths"] == widths})
        if classes:
            have = ", ".join(f"{lo:,}-{hi:,}" for lo, hi in classes)
            lo, hi = kernel_cache.row_class(rows)
            return (f"kernel cache {key['device_name']} {key['dtype']}: verified for rows {have}, not for {rows:,} "
                    f"rows (class {lo:,}-{hi:,}); not used: run `h3director verify-kernels --rows {rows}`")
    differing = sorted({field for e in same_device for field in kernel_cache.KEY_FIELDS
                        if e["key"].get(field) != key.get(field)} | (
        {"widths"} if any(e["widths"] != widths for e in same_device) else set()))
    return (f"kernel cache has entries for {key['device_name']} under another {', '.join(differing)}; not used "
            f"(this process: {', '.join(f'{f} {key.get(f)}' for f in differing if f in key)})")


def entry_verified(entry: dict[str, Any] | None, heads: int) -> Verified:
    """The properties a cache entry verified, each with the split counts it passed at (`tiers.Verified`). An entry
    written before entries recorded their counts passed at the defaults of then (`LEGACY_ROW_CHUNKS`,
    `LEGACY_QUERY_CHUNKS`, every divisor of `heads`)."""
    if entry is None:
        return Verified()
    results = entry.get("results") or {}
    names, counts = set(), {}
    for name in KERNEL_PROPERTIES:
        recorded = (results.get(name) or {}).get("counts")
        if isinstance(recorded, dict):
            passed = [c for c in recorded.get("passed") or () if isinstance(c, int) and not isinstance(c, bool)]
            if passed:
                names.add(name)
                counts[name] = passed
        elif name in entry["verified"]:
            names.add(name)
            counts[name] = {FFN_ROW_CHUNKS: LEGACY_ROW_CHUNKS, ATTENTION_QUERY_CHUNKS: LEGACY_QUERY_CHUNKS}.get(
                name, tuple(g for g in divisors(heads) if g > 1))
    return Verified(names, counts)


def lookup(device: Any, dtype: Any, path: Any = None, widths: KernelWidths | None = None,
           rows: int | None = None) -> CacheLookup:
    """The cached verification for ``device`` and ``dtype`` under this process's torch/CUDA/cuBLAS
    versions and thread count, at ``widths`` (default `H3_WIDTHS`), for the row class of ``rows`` (None:
    any row class, for display). A corrupt or oversized cache file is logged and trusted for nothing; an
    entry for this device that does not apply (another row class or versions) is logged once."""
    device = resolve_device(device)
    dtype_name, _ = parse_dtype(dtype)
    key = kernel_cache.environment_key(device, dtype_name)
    read = kernel_cache.read_cache(path)
    widths = H3_WIDTHS if widths is None else widths
    if read.problem:
        _say_once(f"{read.problem}; no kernel property counts as verified")
    entry = kernel_cache.find_entry(read.entries, key, asdict(widths), rows)
    if entry is None:
        note = _unused_entries_note(read.entries, key, asdict(widths), rows)
        if note:
            _say_once(note)
    verified = entry_verified(entry, widths.heads)
    return CacheLookup(verified, key, str(read.path), entry, read.problem, rows)


def verified_properties(device: Any, dtype: Any, path: Any = None, widths: KernelWidths | None = None,
                        rows: int | None = None) -> set[str]:
    """The kernel properties verified on ``device`` at ``dtype`` with the running library versions and
    thread count, for the row class of ``rows`` (names from `h3director.dit.tiers.KERNEL_PROPERTIES`);
    empty when nothing matching is cached."""
    return set(lookup(device, dtype, path, widths, rows).verified)


def lookup_for_model(device: Any, dtype: Any, widths: KernelWidths | None = None,
                     rows: int | None = None) -> CacheLookup | None:
    """`lookup` for a model about to run ``rows`` packed rows (what the DiT adapters ask, through
    `h3director.dit.memory.VerificationCache`), or None where `verify-kernels` cannot check the device or
    dtype (fp8 weights, say): then nothing is verified, which leaves "exact only" the tiers exact by
    construction."""
    try:
        return lookup(device, dtype, widths=widths, rows=rows)
    except InvalidInputError as error:
        log.info("no kernel verification for %s %s: %s", device, dtype, error)
        return None


def lookup_for_layout(found: CacheLookup | None, layout: str) -> CacheLookup | None:
    """`found` as a model whose q, k, v projection has `layout` (`tiers.QKV_LAYOUTS`) reads it: on a "separate"
    model, `QKV_COLUMN_GROUPS` (what a plan relies on) is verified, measured and reported from the entry's
    `QKV_SEPARATE_COLUMN_GROUPS` check (an entry without one leaves it unverified); "fused" returns `found`."""
    verified = for_qkv_layout(found.verified if found is not None else (), layout)
    if found is None or layout == "fused":
        return found
    entry = found.entry
    if entry is not None:
        def as_read(names: list[str]) -> list[str]:
            return sorted({QKV_COLUMN_GROUPS if n == QKV_SEPARATE_COLUMN_GROUPS else n
                           for n in names if n != QKV_COLUMN_GROUPS})

        results = {n: r for n, r in (entry.get("results") or {}).items() if n != QKV_COLUMN_GROUPS}
        if QKV_SEPARATE_COLUMN_GROUPS in results:
            results[QKV_COLUMN_GROUPS] = results.pop(QKV_SEPARATE_COLUMN_GROUPS)
        entry = {**entry, "results": results, "verified": as_read(entry["verified"]),
                 "failed": as_read(entry["failed"])}
    return replace(found, verified=verified, entry=entry)


def exactness_text(relies_on: tuple[str, ...] | list[str], found: CacheLookup | None,
                   splits: dict[str, int] | None = None) -> str:
    """The sentence a run report carries about a tier relying on ``relies_on`` (kernel properties):

    - "exact (by construction: only lifetimes change)" when it relies on none;
    - "exact (verified: <properties> at <rows> rows (row class ..), <device>, torch <v>, <n> threads, <dtype>,
      <cache file>)" when the matching cache entry verified them all;
    - "approximate: max difference <x> measured at <rows> rows, <widths> (<property>: <detail>)" when the
      entry measured a difference;
    - "unverified: ..." (no entry for this device, versions and row class, or one that did not check the
      tier's split count) otherwise.

    ``splits`` (`DiTMemoryPlan.splits`: the tier's count per property) makes a property count as verified only
    at a count the entry passed (`entry_verified`), and as approximate only at one it measured differing;
    without it, any count (for display)."""
    needs = sorted(set(relies_on))
    if not needs:
        return "exact (by construction: only lifetimes change)"
    entry = found.entry if found is not None else None
    if entry is None:
        where = ""
        if found is not None:
            where = f" on {found.key.get('device_name')} ({found.key.get('dtype')})"
            if found.rows is not None:
                lo, hi = kernel_cache.row_class(found.rows)
                where += f" for {found.rows:,} rows (class {lo:,}-{hi:,})"
        return f"unverified: {', '.join(needs)} not verified{where}; run `h3director verify-kernels`"
    key, rows = entry["key"], entry["rows"]
    lo, hi = kernel_cache.row_class(rows)
    widths = entry["widths"]
    shape = (f"{rows:,} rows, hidden {widths.get('hidden')}, {widths.get('heads')}x{widths.get('head_dim')} heads, "
             f"FFN {widths.get('ffn')}")
    results = entry.get("results", {})
    if splits is None:
        failed = [name for name in needs if name in entry["failed"]]
        missing = [name for name in needs if name not in entry["verified"]]
    else:
        verified = found.verified if found is not None else Verified()
        counts = getattr(verified, "counts", {})    # a bare set of names (another reader): any count
        covered = {name for name in needs if name in verified
                   and (name not in counts or splits.get(name) in counts[name])}

        def measured_failing(name: str) -> bool:
            recorded = (results.get(name) or {}).get("counts")
            if isinstance(recorded, dict):
                return splits.get(name) in (recorded.get("failed") or ())
            return name in entry["failed"]

        failed = [name for name in needs if name not in covered and measured_failing(name)]
        missing = [name for name in needs if name not in covered and name not in failed]
    if failed:
        worst = max((results.get(n, {}).get("max_abs_diff") or 0.0) for n in failed)
        detail = "; ".join(f"{n}: {results.get(n, {}).get('detail', 'differs')}" for n in failed)
        return f"approximate: max difference {worst:.3g} measured at {shape}, {key.get('dtype')} ({detail})"
    if missing:
        at = "" if splits is None else " at " + ", ".join(f"{splits[n]} splits" for n in missing)
        return (f"unverified: {', '.join(missing)}{at} not checked at {shape}; run `h3director verify-kernels` "
                "(it checks the escalation ladder's counts)")
    threads = f", {key['threads']} threads" if key.get("threads") else ""
    return (f"exact (verified: {', '.join(needs)} at {shape} (row class {lo:,}-{hi:,}), {key.get('device_name')}, "
            f"torch {key.get('torch')}{threads}, {key.get('dtype')}, {found.path})")


__all__ = ["H3_WIDTHS", "CacheLookup", "KernelReport", "KernelWidths", "PropertyResult", "VariantResult",
           "entry_verified", "exactness_text", "ladder_counts", "lookup", "lookup_for_layout", "lookup_for_model",
           "verified_properties", "verify_kernels"]
