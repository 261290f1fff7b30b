"""Which quantised linear layouts the DiT tiers chunk, how, and how exact that is.

The tiers use a linear layer in two ways (`h3director.dit.tiers`):

- *rows*: the FFN runs fc1 and fc2 on a range of input rows at a time (the whole weight each time);
- *weight rows*: a head group projects q, k and v from a range of the qkv weight's output rows (the whole
  input each time).

For a quantised layer both are the same arithmetic as the whole call only when the layout's kernel
computes an output row from that input row alone, and an output column from that weight row alone, with
the same scales. `LAYOUTS` records, per layout (the names ComfyUI's `quant_ops.QUANT_ALGOS` maps its
formats to) and per kernel path, what the layout's arithmetic gives:

- `native`: the layout's own kernel (ComfyUI runs it where the device has the compute: int8 layouts
  always, fp8 / nvfp4 / mxfp8 on GPUs that have them; comfy_kitchen's eager backend runs the same
  layout ops on the CPU);
- `emulated`: the layer dequantises its whole weight and runs a float GEMM (ComfyUI's path for a format
  the device cannot compute, `_full_precision_mm`); this project's GGUF layers always run this way.

Exactness classes (as `h3director.dit.tiers.Exactness`):

- "exact by construction": activations are quantised per row, the products are accumulated in int32
  (exact, so the result does not depend on how many rows or columns the call has), and the rescale is
  per element: TensorWise INT8 without rotation, for rows and for weight rows;
- "exact where verified": a float GEMM (or a float rotation of the input before the integer GEMM) whose
  bits can depend on its M or N; the tier is exact where that GEMM is invariant to the row / column count,
  which the same kernel properties as the unquantised tiers cover (`ffn_row_chunks`, `qkv_column_groups`)
  and the quantised exactness bench measures per layout. On the native path nothing verifies the layout's
  kernel at the shapes that run (verify-kernels checks float GEMMs), so the report calls those layers
  approximate and points at the measured difference (`report_text`);
- not chunked: a rule field is None and `reason` says why; the layer keeps its stock call.

Activation scales: a per-tensor scale the layer stores (`input_scale`) is the same for every chunk; fp8's
quantiser uses 1.0 when there is none (still one scale for every chunk). NVFP4 without `input_scale`
computes its per-tensor scale from the whole input on each call, so rows cannot be chunked (a chunk only
holds its rows); weight rows can, because a head group's projection reads the whole input, which is
quantised once and shared by every group. Per-row scales (INT8, int4 activations, MXFP8 / NVFP4 block
scales along K) are row-independent.

Weight rows: NVFP4 and MXFP8 keep their block scales in 128-row swizzled tiles, so a weight-row range
must start on a multiple of `row_group` rows (and end on one, or at the last row), on either path (the
emulated path dequantises the slice of the quantised weight, not the whole weight). A head-group split
whose boundaries are not is refused (`check_weight_row_groups`) before the forward.

A layout not in `LAYOUTS` is never guessed at: the layer keeps its stock call and the report names it.
"""

from __future__ import annotations

from dataclasses import dataclass

from h3director.dit.tiers import FFN_ROW_CHUNKS, QKV_COLUMN_GROUPS, Exactness
from h3director.errors import InvalidInputError
from h3director.plan.quantised_bytes import CALLS, EMULATED, NATIVE

PATHS = (NATIVE, EMULATED)
ROWS = "rows"
WEIGHT_ROWS = "weight_rows"

SWIZZLE_ROWS = 128
"""Rows per tile of the swizzled block-scale layout NVFP4 and MXFP8 weights use (cuBLAS's blocked layout)."""


@dataclass(frozen=True)
class LayoutRule:
    """What one layout's kernel path allows. `rows` / `weight_rows`: the exactness class of chunking that
    way (None: not chunkable, see `reason`); `activation`: how the input is quantised; `row_group`: weight
    rows are sliced in multiples of this many rows (1: any); `dynamic_tensor_scale`: the input's per-tensor
    scale is computed per call from the whole input when the layer stores no `input_scale`."""

    layout: str
    path: str
    rows: Exactness | None
    weight_rows: Exactness | None
    activation: str
    reason: str
    row_group: int = 1
    dynamic_tensor_scale: bool = False

    def exactness(self, use: str) -> Exactness | None:
        return self.rows if use == ROWS else self.weight_rows

    def relies_on(self, use: str) -> tuple[str, ...]:
        """The kernel properties the chunked call's exactness rests on (empty when by construction)."""
        if self.exactness(use) != Exactness.WHERE_VERIFIED:
            return ()
        return (FFN_ROW_CHUNKS,) if use == ROWS else (QKV_COLUMN_GROUPS,)


_EMULATED_REASON = ("the layout op dequantises the weight (a weight-row slice: those rows) and runs one float "
                    "GEMM: the unquantised tiers' arithmetic on the same dequantised values")
_W = Exactness.WHERE_VERIFIED
_C = Exactness.BY_CONSTRUCTION


def _native(layout: str, rows, weight_rows, activation: str, reason: str, **kw) -> LayoutRule:
    # whether the kernel scales its input from the whole input is a fact of the call (plan.quantised_bytes)
    return LayoutRule(layout, NATIVE, rows, weight_rows, activation, reason,
                      dynamic_tensor_scale=CALLS[(layout, NATIVE)].dynamic_tensor_scale, **kw)


LAYOUTS: dict[tuple[str, str], LayoutRule] = {}
for _rule in (
    _native("TensorWiseINT8Layout", _C, _C, "int8 per row (dynamic)",
            "int8 activations quantised per row, int32 accumulation, per-element rescale by the row's and the "
            "weight's scale (scalar or per output row)"),
    _native("TensorWiseINT8Layout+convrot", _W, _C, "Hadamard rotation (float GEMM) then int8 per row",
            "the input is rotated by a float GEMM before the per-row int8 quantiser (rows: where that GEMM is "
            "row-count invariant); weight rows: int32 accumulation per output column, per-row weight scales"),
    _native("TensorCoreConvRotW4A4Layout", _W, _W, "Hadamard rotation (float GEMM) then int4 per row",
            "rotation by a float GEMM, per-row int4 activations, per-output-row weight scales; the int4 GEMM "
            "path is not established as exact in M or N, so both are measured"),
    _native("AsymW4A8Int8Layout", _W, _W, "Hadamard rotation (float GEMM) then int8 per row",
            "int4 weight groups expanded to int8 per output row, then the rotated int8 kernel; rows rest on the "
            "rotation GEMM, weight rows on per-row group scales"),
    *(_native(fp8, _W, _W, "fp8 per tensor (input_scale, else 1.0: static)",
              "fp8 scaled GEMM with float accumulation; one per-tensor input scale for every chunk")
      for fp8 in ("TensorCoreFP8E4M3Layout", "TensorCoreFP8E5M2Layout")),
    _native("TensorCoreNVFP4Layout", _W, _W, "fp4 per 16-block along K, times a per-tensor scale",
            "fp4 scaled GEMM with float accumulation; block scales per row; weight block scales in "
            f"{SWIZZLE_ROWS}-row swizzled tiles", row_group=SWIZZLE_ROWS),
    _native("TensorCoreMXFP8Layout", _W, _W, "fp8 per 32-block along K (e8m0), no tensor scale",
            "mxfp8 scaled GEMM with float accumulation; block scales per row; weight block scales in "
            f"{SWIZZLE_ROWS}-row swizzled tiles", row_group=SWIZZLE_ROWS),
):
    LAYOUTS[(_rule.layout, NATIVE)] = _rule
    LAYOUTS[(_rule.layout, EMULATED)] = LayoutRule(_rule.layout, EMULATED, _W, _W, "none (weight dequantised)",
                                                   _EMULATED_REASON, row_group=_rule.row_group)
LAYOUTS[("GGUF", EMULATED)] = LayoutRule("GGUF", EMULATED, _W, _W, "none (weight dequantised)",
                                         "dequantised once per block, then the unquantised tiers' arithmetic")


def rule_for(layout: str, path: str) -> LayoutRule | None:
    """The rule for `layout` on kernel `path` (NATIVE / EMULATED); None for a layout the director does not
    know (the caller keeps the layer's stock call and names the layout)."""
    if path not in PATHS:
        raise ValueError(f"path must be one of {PATHS}, got {path!r}")
    return LAYOUTS.get((layout, path))


def decide(layout: str, path: str, use: str, static_scale: bool = True) -> tuple[LayoutRule | None, str | None]:
    """`(rule, None)` when a layer of `layout` on `path` may be chunked for `use` (ROWS / WEIGHT_ROWS);
    `(rule or None, reason)` when it keeps its stock call. `static_scale`: the layer stores an input scale
    (matters only for layouts whose per-tensor activation scale is otherwise computed per call)."""
    rule = rule_for(layout, path)
    if rule is None:
        return None, f"layout {layout} ({path}) is not one the director knows: not guessed"
    if rule.exactness(use) is None:
        return rule, f"{layout} ({path}): {rule.reason}"
    if use == ROWS and rule.dynamic_tensor_scale and not static_scale:
        return rule, (f"{layout} ({path}) without input_scale computes its activation scale from the whole input "
                      "on each call; a row chunk only holds its rows")
    return rule, None


def check_weight_row_groups(layout: str, path: str, heads: int, head_dim: int, head_chunks: int,
                            layer: str = "qkv_proj") -> None:
    """Refuse (`InvalidInputError`, naming the layout) a head split whose q/k/v weight-row ranges would not
    start on the layout's row group: groups of `heads / head_chunks` heads of `head_dim` rows each."""
    rule = rule_for(layout, path)
    if rule is None or rule.row_group == 1 or head_chunks == 1:
        return
    width = (heads // head_chunks) * head_dim
    if width % rule.row_group:
        raise InvalidInputError(
            f"head_chunks={head_chunks} splits {layer} ({layout}, {path} kernel) into weight-row ranges of {width} "
            f"rows; {layout} slices weight rows only in multiples of {rule.row_group} (its block scales are stored "
            f"in {rule.row_group}-row tiles). Use a head_chunks whose group of heads x {head_dim} rows is a "
            f"multiple of {rule.row_group}")


def reported_exactness(rule: LayoutRule, use: str) -> Exactness | None:
    """What a run reports for chunking a layer of `rule` for `use`: the rule's class, except that a native
    kernel's "exact where verified" is reported approximate (verify-kernels checks float GEMMs: nothing verifies
    the layout's own kernel at the shapes that run), and "exact only" keeps such a layer stock."""
    exactness = rule.exactness(use)
    if rule.path == NATIVE and exactness == Exactness.WHERE_VERIFIED:
        return Exactness.APPROXIMATE
    return exactness


def exact_only_reason(rule: LayoutRule, use: str) -> str | None:
    """Why "exact only" keeps a layer of `rule` stock for `use` (its chunked call is reported approximate:
    `reported_exactness`), or None when its chunking is exact by construction or rests on what verify-kernels
    checks."""
    if reported_exactness(rule, use) != Exactness.APPROXIMATE:
        return None
    return f"exact only: {rule.layout}'s {rule.path} kernel is not verified at these shapes"


def report_text(layer: str, rule: LayoutRule, use: str) -> str:
    """One report line for a chunked quantised layer."""
    how = "input rows chunked" if use == ROWS else "weight rows sliced per head group"
    exactness = reported_exactness(rule, use).value
    if exactness == Exactness.APPROXIMATE.value:
        exactness += (": the layout's kernel is not verified at these shapes (verify-kernels checks float GEMMs); "
                      "its measured difference per layout: bench/dit_quantised_exactness.py")
    return (f"{layer} [{rule.layout}, {rule.path} kernel, activations {rule.activation}]: {how} through the "
            f"layout's own op ({exactness})")


__all__ = ["EMULATED", "LAYOUTS", "NATIVE", "PATHS", "ROWS", "SWIZZLE_ROWS", "WEIGHT_ROWS", "LayoutRule",
           "check_weight_row_groups", "decide", "exact_only_reason", "report_text", "reported_exactness", "rule_for"]
