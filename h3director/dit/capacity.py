"""The check before each DiT forward: will the tier about to run fit what the device can give?

`CapacityCheck(cost_model, device, budget_bytes=None, margin=0.10)`:

- need = (`cost_model(plan, rows, dtype)` x `calibration` + `resident_bytes`) x (1 + `margin`), in bytes.
  The cost model prices the forward's activations at a tier (`ledger_cost_model`: the planner's
  per-block ledgers, `h3director.plan.activations`); `resident_bytes` is what the caller says must
  still fit beside them (buffers the forward will allocate that the model does not price);
  `calibration` starts at 1.0 and only rises (`observe`).
- have = what the device can give now: CUDA free memory (`mem_get_info`) plus, with PyTorch's caching
  allocator, the cached-but-unused bytes (`memory_reserved - memory_allocated`); under
  `cudaMallocAsync`, where `memory_reserved` is not maintained, free memory plus only the reserved
  counter's slack when it is real (the live tensors, `memory_allocated`, are what is in use, never the
  estimate); the CPU: available system RAM; MPS: the recommended working set minus what the driver
  holds; under the caching allocator with `torch.cuda.set_per_process_memory_fraction`, at most
  fraction x total less the live tensors. Plus `reclaimable_bytes` the caller passes (weights ComfyUI's Dynamic VRAM would evict for
  activations). With `budget_bytes`, have = min(budget - in use now, the device's have) + reclaimable,
  where "in use" is live tensors on an accelerator and the process RSS on the CPU.
- `choose(rows, dtype, floor, mode, verified)` walks `escalation_ladder(heads, rows)` from `floor`
  (the floor, then every ladder tier at least as chunked as it) and returns the first that fits.
  `mode`: "auto" (any tier), "exact only" (tiers whose `relies_on` is within `verified`, the kernel
  properties `verify-kernels` passed on this device), "fixed" (only `floor`). Raises `BudgetError`
  "[Director Safety] GPU memory limit exceeded ..." ("CPU" on the CPU) only when no allowed tier fits,
  naming need, have, the smallest need of any tier and the setting that would work.

Exactness: the check picks tiers; it changes no arithmetic. The tiers' own classes are in `tiers`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from h3director.dit.tiers import STOCK, DiTMemoryPlan, escalation_from, escalation_ladder
from h3director.errors import BudgetError, InvalidInputError
from h3director.plan.activations import DiTCostModel, DiTShape
from h3director.units import format_size

MODES = ("auto", "exact only", "fixed")
"""The DiT memory modes, the one list every adapter and node uses: "auto" (any tier from the floor up), "exact
only" (through verified tiers only), "fixed" (the floor only)."""
DEFAULT_MARGIN = 0.10

CostModel = Callable[[DiTMemoryPlan, int, Any], int]
DeviceReader = Callable[[Any], Any]   # device -> h3director.core.devices.DeviceSample


@dataclass(frozen=True)
class CapacityDecision:
    """What `choose` picked: the tier, its need and the device's have (bytes), whether every kernel
    property the tier relies on is verified on this device, and whether it is above the floor."""

    plan: DiTMemoryPlan
    need_bytes: int
    have_bytes: int
    verified_exact: bool
    escalated: bool


def check_mode(mode: str) -> str:
    """`mode` when it is one of `MODES`; `InvalidInputError` naming them otherwise."""
    if mode not in MODES:
        raise InvalidInputError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    return mode


def ledger_cost_model(shape: DiTShape | None = None, framework: str = "diffusers", attention: str = "flash",
                      device: Any = None, linears: Any = None) -> DiTCostModel:
    """A cost model from the planner's ledgers for `framework` ("diffusers" or "comfy"); `shape` default:
    the released H3 DiT. Norms are priced fused (one output each) except for diffusers on the CPU: there
    PyTorch's `rms_norm` is composite (float32 temporaries) under `torch.no_grad()`, which diffusers
    pipelines use, and fused under `torch.inference_mode()`, which ComfyUI's executor uses. `linears`: the
    blocks' quantised linears as the tiers run them (`plan.quantised_bytes.BlockLinears`, ComfyUI)."""
    fused = device is None or _kind(device) != "cpu" or framework == "comfy"
    return DiTCostModel(shape or DiTShape(), framework, attention, fused_norms=fused, linears=linears)


def default_capacity(shape: DiTShape | None, framework: str, device: Any, budget_bytes: int | None = None,
                     attention: str = "flash", linears: Any = None) -> CapacityCheck:
    """The capacity check an adapter uses when the caller gives none: `ledger_cost_model(shape, framework,
    attention, device, linears)` on `device` (`shape` None: the released H3 DiT; `linears`: the blocks'
    quantised linears, `plan.quantised_bytes.BlockLinears`), capped by `budget_bytes` (bytes; None = what the
    device can give), with the default margin."""
    return CapacityCheck(ledger_cost_model(shape, framework, attention, device, linears), device,
                         budget_bytes=budget_bytes)


def _kind(device: Any) -> str:
    return str(device).partition(":")[0]


def _read_device(device: Any):
    from h3director.core.devices import sample_device

    return sample_device(device)


def device_have_bytes(sample) -> int:
    """Bytes the device can give to new tensors now, from a `DeviceSample` (see the module docstring)."""
    free = int(sample.free_bytes or 0)
    allocated = sample.allocated_bytes
    reserved = sample.reserved_bytes
    if sample.backend == "cuda":
        return free + max(int(reserved or 0) - int(allocated or 0), 0)
    if sample.backend == "cuda-async":
        if sample.reserved_is_estimate:   # device-wide used: says nothing about this pool's slack
            return free
        return free + max(int(reserved or 0) - int(allocated or 0), 0)
    return free


def cuda_process_cap(device: Any) -> float | None:
    """The fraction of a CUDA device's memory this process may hold
    (`torch.cuda.set_per_process_memory_fraction`), or None when there is no cap (1.0, or not CUDA). Only the
    caching allocator enforces it; under cudaMallocAsync it is not read."""
    if _kind(device) != "cuda":
        return None
    import torch

    from h3director.core.devices import cuda_allocator_backend

    if cuda_allocator_backend() != "native":
        return None
    fraction = float(torch.cuda.get_per_process_memory_fraction(torch.device(device)))
    return fraction if fraction < 1.0 else None


def memory_kind(device: Any) -> str:
    """"CPU" for the CPU, "GPU" for an accelerator (as the Memory Guard's messages say)."""
    return "CPU" if _kind(device) == "cpu" else "GPU"


class CapacityCheck:
    """Need vs have before each forward (see the module docstring). Sizes in bytes.

    `device`: "cpu", "cuda", "cuda:N", "mps" or a `torch.device`. `reader(device)` returns a
    `h3director.core.devices.DeviceSample` (default: `sample_device`). `heads`: the model's heads
    (default: `cost_model.heads`). `calibration` (>= 1.0) multiplies the cost model; `observe` raises it.
    """

    def __init__(self, cost_model: CostModel, device: Any, budget_bytes: int | None = None,
                 margin: float = DEFAULT_MARGIN, *, resident_bytes: int = 0, reclaimable_bytes: int = 0,
                 heads: int | None = None, reader: DeviceReader | None = None,
                 process_cap_reader: Callable[[Any], float | None] | None = None) -> None:
        if not callable(cost_model):
            raise InvalidInputError(f"cost_model must be callable as cost(plan, rows, dtype), got {cost_model!r}")
        if budget_bytes is not None and budget_bytes <= 0:
            raise InvalidInputError(f"budget_bytes must be > 0 (or None for the device), got {budget_bytes}")
        if not 0 <= margin < 1:
            raise InvalidInputError(f"margin must be a fraction in [0, 1), got {margin}")
        for name, value in (("resident_bytes", resident_bytes), ("reclaimable_bytes", reclaimable_bytes)):
            if value < 0:
                raise InvalidInputError(f"{name} must be >= 0, got {value}")
        heads = heads if heads is not None else getattr(cost_model, "heads", None)
        if not isinstance(heads, int) or heads < 1:
            raise InvalidInputError("the capacity check needs the model's head count: pass heads=, or a cost model "
                                    "with a `heads` attribute")
        self.cost_model = cost_model
        self.device = device
        self.budget_bytes = budget_bytes
        self.margin = margin
        self.resident_bytes = int(resident_bytes)
        self.reclaimable_bytes = int(reclaimable_bytes)
        self.heads = heads
        self.reader = reader or _read_device
        self.process_cap_reader = process_cap_reader or cuda_process_cap
        self.calibration = 1.0
        self.last_decision: CapacityDecision | None = None
        self._dtype: Any = None

    # -- the two sides ------------------------------------------------------------------------------
    def need_bytes(self, plan: DiTMemoryPlan, rows: int, dtype: Any) -> int:
        """Bytes the forward needs at `plan`: cost x calibration + resident, plus the margin."""
        cost = self.cost_model(plan, rows, dtype) * self.calibration + self.resident_bytes
        return int(cost * (1 + self.margin))

    def have_bytes(self) -> int:
        """Bytes the device can give now (see the module docstring), reclaimable weights included."""
        sample = self.reader(self.device)
        have = device_have_bytes(sample)
        cap = self.process_cap_reader(self.device)
        if cap is not None and sample.total_bytes:
            # the caching allocator refuses to hold more than fraction x total: what it may still hand out
            have = min(have, int(cap * sample.total_bytes) - int(sample.allocated_bytes or 0))
        if self.budget_bytes is not None:
            in_use = int(sample.allocated_bytes or 0)       # live tensors; the process RSS on the CPU
            have = min(self.budget_bytes - in_use, have)
        return max(have, 0) + self.reclaimable_bytes

    # -- choosing ------------------------------------------------------------------------------------
    def candidates(self, floor: DiTMemoryPlan, rows: int, mode: str) -> list[DiTMemoryPlan]:
        """The tiers `choose` tries, in order: `floor`, then (unless "fixed") every ladder tier at least
        as chunked as `floor` in each technique."""
        check_mode(mode)
        floor.check_fits(self.heads, rows)
        if mode == "fixed":
            return [floor]
        return [floor, *escalation_from(floor, self.heads, rows)]

    def choose(self, rows: int, dtype: Any, floor: DiTMemoryPlan, mode: str = "auto",
               verified: Iterable[str] = ()) -> CapacityDecision:
        """The first tier from `floor` up that fits (see the module docstring); `BudgetError` if none does."""
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            raise InvalidInputError(f"rows must be an integer >= 1, got {rows!r}")
        verified = set(verified)
        self._dtype = dtype
        tiers = self.candidates(floor, rows, mode)
        allowed = [p for p in tiers if mode != "exact only" or set(p.relies_on) <= verified]
        have = self.have_bytes()
        needs: dict[DiTMemoryPlan, int] = {}
        for plan in allowed:
            needs[plan] = self.need_bytes(plan, rows, dtype)
            if needs[plan] <= have:
                decision = CapacityDecision(plan, needs[plan], have, set(plan.relies_on) <= verified, plan != floor)
                self.last_decision = decision
                return decision
        raise self._refusal(rows, dtype, floor, mode, verified, have, needs)

    def _refusal(self, rows: int, dtype: Any, floor: DiTMemoryPlan, mode: str, verified: set[str], have: int,
                 needs: dict[DiTMemoryPlan, int]) -> BudgetError:
        floor_need = needs.get(floor) or self.need_bytes(floor, rows, dtype)
        ladder = [floor] + [p for p in escalation_ladder(self.heads, rows) if p != floor]
        every = {plan: needs.get(plan) or self.need_bytes(plan, rows, dtype) for plan in ladder}
        smallest = min(every, key=every.get)
        fitting = next((plan for plan in ladder if every[plan] <= have), None)
        where = f" on {self.device}" if self.device is not None else ""
        message = (f"[Director Safety] {memory_kind(self.device)} memory limit exceeded{where}: the DiT forward over "
                   f"{rows:,} packed rows needs {format_size(floor_need)} at {floor.describe()} "
                   f"(mode {mode}), the device can give {format_size(have)}"
                   + (f" (budget {format_size(self.budget_bytes)})" if self.budget_bytes is not None else "")
                   + f"; the smallest tier ({smallest.describe()}) needs {format_size(every[smallest])}")
        if fitting is not None:
            hint = f"; {_setting(fitting)} would fit ({format_size(every[fitting])})"
            if mode == "exact only" and not set(fitting.relies_on) <= verified:
                hint += (f" but relies on {', '.join(sorted(set(fitting.relies_on) - verified))}, not verified on "
                         "this device: run `h3director verify-kernels`, or use mode auto")
            elif mode == "fixed":
                hint += ", or use mode auto"
            message += hint
        else:
            short = every[smallest] - have
            message += (f"; no tier fits: free {format_size(short)} more (unload other models, offload DiT blocks, "
                        "lower the resolution or the frame count)")
        return BudgetError(message)

    # -- calibration ---------------------------------------------------------------------------------
    def observe(self, rows: int, plan: DiTMemoryPlan, measured_peak_bytes: int, dtype: Any = None) -> float:
        """Raise `calibration` when a measured forward peak (bytes above what was allocated before the
        forward) exceeds the cost model's prediction for `plan` at `rows`; never lowers it. `dtype`
        defaults to the dtype of the last `choose` (bf16 before any). Returns the calibration factor."""
        if measured_peak_bytes < 0:
            raise InvalidInputError(f"measured_peak_bytes must be >= 0, got {measured_peak_bytes}")
        dtype = dtype if dtype is not None else (self._dtype if self._dtype is not None else "bf16")
        predicted = self.cost_model(plan, rows, dtype)
        if predicted > 0 and measured_peak_bytes > predicted * self.calibration:
            self.calibration = measured_peak_bytes / predicted
        return self.calibration


def _setting(plan: DiTMemoryPlan) -> str:
    """The node / `apply_memory_plan` settings that run `plan`."""
    if plan == STOCK:
        return "the stock block (no DiT memory node)"
    text = f"mode fixed, head_chunks {plan.head_chunks}, ffn_chunks {plan.ffn_chunks}"
    if plan.query_chunks > 1:
        text += f", query_chunks {plan.query_chunks}"
    return text


__all__ = ["CapacityCheck", "CapacityDecision", "cuda_process_cap", "device_have_bytes", "ledger_cost_model"]
