"""An op and transfer log: host<->device copies, synchronising calls and CPU ops, per phase.

`TransferLog(job_device)` is a `TorchDispatchMode`: while it is active (``with log:``) every ATen op
that this thread dispatches passes through it, and it counts, per phase (the innermost
``log.phase(name)`` or module-level ``transfers.phase(name)``, else what ``phase_of()`` returns, else
``"-"``):

- ``h2d`` / ``d2h`` / ``d2d``: copies between the CPU and another device, or between two non-CPU
  devices (``aten._to_copy``, ``aten.copy_``, ``aten._copy_from``...), with the bytes of the copied
  tensor (elements x element size). ``.to()``, ``.cpu()``, ``.cuda()`` and ``tensor.copy_(other)`` all
  arrive here; a ``.to()`` to the device a tensor is already on is not an op and is not counted.
- ``sync`` (bytes: the input the host waits for): calls that make the host wait for the device when their input lives on an accelerator:
  ``_local_scalar_dense`` (``.item()``, ``bool(t)``, ``int(t)``, ``float(t)``; ``item`` itself under
  ``torch.inference_mode``, where it is not decomposed before this mode sees it), ``nonzero``,
  ``masked_select``, ``unique`` variants, ``repeat_interleave`` without ``output_size``, boolean-mask
  indexing (``t[mask]``), ``equal``, ``is_nonzero``. They are recorded on any device, with the device
  in the row, so a CPU rehearsal shows where a GPU run would wait; a ``d2h`` copy also waits.
  ``.tolist()`` and ``.numpy()`` do not go through the dispatcher and are not seen.
- ``cpu_op``: ops whose tensors are all on the CPU while ``job_device`` is not the CPU (a layer left
  on the CPU, a tensor made without ``device=``). Bytes are those of the op's tensor outputs.
- ``cpu_fallback``: PyTorch's own warning that an operator "is not currently supported on the MPS
  backend and will fall back to run on the CPU" (recorded with the op it names). The fallback kernel
  runs below the dispatcher, so a dispatch mode sees the op with MPS tensors and cannot tell; PyTorch
  prints that warning once per process, so this row says that fallbacks happen, not how often.
  While the log is active that warning is shown every time it is raised (not once per place) and
  recorded in the current phase instead of printed; other warnings are shown as before.

A dispatch mode is per thread: ops of other threads are not counted. Counting costs one Python call
per op (a few microseconds), so this is a diagnosis tool, not something to leave on.

Bytes are bytes; counts are op calls. `table()` lists each phase's worst offenders by bytes, then count.
"""

from __future__ import annotations

import contextlib
import re
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from h3director.errors import InvalidInputError
from h3director.units import format_size

KINDS = ("h2d", "d2h", "d2d", "sync", "cpu_op", "cpu_fallback")
COPY_OPS = frozenset({"aten::_to_copy", "aten::copy_", "aten::_copy_from", "aten::_copy_from_and_resize",
                      "aten::to", "aten::copy"})
SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::masked_select", "aten::_unique",
                      "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive", "aten::equal",
                      "aten::is_nonzero", "aten::argwhere"})
FALLBACK_WARNING = re.compile(r"operator '([^']+)' is not currently supported on the (\w+) backend and will fall "
                              r"back to run on the CPU")
_IGNORED = frozenset({"aten::detach", "aten::alias", "aten::view", "aten::_unsafe_view", "aten::t",
                      "aten::lift_fresh", "aten::set_"})


@dataclass(frozen=True)
class OpRow:
    """One (phase, kind, op, device) line of the log: how often and how many bytes."""

    phase: str
    kind: str
    op: str
    device: str
    count: int
    bytes: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


_local = threading.local()


def active_logs() -> list[TransferLog]:
    """The logs active on this thread, outermost first."""
    return list(getattr(_local, "logs", ()))


@contextlib.contextmanager
def phase(name: str) -> Iterator[None]:
    """Count what runs inside under ``name`` in every log active on this thread (no-op without one)."""
    with contextlib.ExitStack() as stack:
        for log in active_logs():
            stack.enter_context(log.phase(name))
        yield


def copy_kind(source: torch.device, target: torch.device) -> str | None:
    """``"h2d"``, ``"d2h"``, ``"d2d"`` for a copy from ``source`` to ``target``; None when both are one device."""
    if source == target or (source.type == target.type == "cpu"):
        return None
    if source.type == "cpu":
        return "h2d"
    if target.type == "cpu":
        return "d2h"
    return "d2d"


def _tensors(tree) -> list[torch.Tensor]:
    return [x for x in tree_flatten(tree)[0] if isinstance(x, torch.Tensor)]


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class TransferLog(TorchDispatchMode):
    """Counts copies, synchronising calls and CPU ops of this thread while active (see the module doc).

    ``job_device`` is the device the job is meant to run on (``"cuda"``, ``"mps"``, ...; ``"meta"`` in
    tests, standing in for an accelerator on a CPU-only machine). ``phase_of`` names the phase when no
    ``phase()`` block is open (the ComfyUI pack passes the executing node). Re-entering a log that is
    already active raises `InvalidInputError`.
    """

    def __init__(self, job_device: str | torch.device = "cpu", *, phase_of: Callable[[], str | None] | None = None):
        super().__init__()
        try:
            self.job_device = torch.device(job_device)
        except (RuntimeError, TypeError) as error:
            raise InvalidInputError(f"job device {job_device!r} is not a torch device: {error}") from None
        self._phase_of = phase_of
        self._phases: list[str] = []
        self._rows: dict[tuple[str, str, str, str], list[int]] = {}
        self._lock = threading.Lock()
        self._warnings: contextlib.AbstractContextManager | None = None
        self._caught: list[warnings.WarningMessage] = []
        self.fallback_warnings: list[str] = []
        self._active = False

    # -- phases ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Count what runs inside under ``name``."""
        self._phases.append(str(name))
        try:
            yield
        finally:
            self._phases.pop()

    def _current_phase(self) -> str:
        if self._phases:
            return self._phases[-1]
        if self._phase_of is not None:
            try:
                name = self._phase_of()
            except Exception:  # noqa: BLE001 - a naming callback must never break the job
                name = None
            if name:
                return str(name)
        return "-"

    def _add(self, kind: str, op: str, device: torch.device | str, nbytes: int) -> None:
        key = (self._current_phase(), kind, op, str(device))
        with self._lock:
            row = self._rows.setdefault(key, [0, 0])
            row[0] += 1
            row[1] += nbytes

    # -- the dispatch hook ----------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self._record(func, args, kwargs, out)
        except Exception:  # noqa: BLE001 - bookkeeping never changes the op's result
            pass
        return out

    def _record(self, func, args, kwargs, out) -> None:
        name = func._schema.name
        if name in _IGNORED:
            return
        inputs = _tensors((args, kwargs))
        outputs = _tensors(out)
        if name in COPY_OPS:
            if name in ("aten::_to_copy", "aten::to") and inputs and outputs:
                source, target = inputs[0], outputs[0]
            elif len(inputs) >= 2:          # copy_(self=target, src=source) and friends
                source, target = inputs[1], inputs[0]
            else:
                source = target = None
            if source is not None:
                kind = copy_kind(source.device, target.device)
                if kind is not None:
                    self._add(kind, name, f"{source.device}->{target.device}", _nbytes(source))
                    return
        if name in SYNC_OPS or self._is_mask_index(name, args, kwargs):
            device = inputs[0].device if inputs else "-"
            self._add("sync", name, device, _nbytes(inputs[0]) if inputs else 0)
            return
        if self.job_device.type != "cpu" and (inputs or outputs):
            if all(t.device.type == "cpu" for t in inputs + outputs):
                self._add("cpu_op", name, "cpu", sum(_nbytes(t) for t in outputs))

    @staticmethod
    def _is_mask_index(name: str, args, kwargs) -> bool:
        if name not in ("aten::index", "aten::index_put_", "aten::index_put", "aten::repeat_interleave"):
            return False
        if name == "aten::repeat_interleave":
            return kwargs.get("output_size") is None and not (len(args) > 3 and args[3] is not None)
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())

    # -- context manager: the mode plus PyTorch's fallback warning --------------------------------
    def __enter__(self):
        if self._active:
            raise InvalidInputError("this TransferLog is already active; use one log per `with` block")
        self._active = True
        self._warnings = warnings.catch_warnings()     # restores the filters and showwarning on exit
        self._warnings.__enter__()
        warnings.filterwarnings("always", message=r".*will fall back to run on the CPU")
        shown = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            if not self.warning_seen(str(message)):
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = showwarning
        _local.logs = [*active_logs(), self]
        return super().__enter__()

    def __exit__(self, exc_type, exc, tb):
        try:
            return super().__exit__(exc_type, exc, tb)
        finally:
            self._warnings.__exit__(None, None, None)
            self._warnings = None
            self._active = False
            _local.logs = [log for log in active_logs() if log is not self]

    def warning_seen(self, message: str) -> bool:
        """Record ``message`` in the current phase if it is PyTorch's CPU-fallback warning; True if it was."""
        match = FALLBACK_WARNING.search(message)
        if match:
            self.fallback_warnings.append(message)
            self._add("cpu_fallback", match.group(1), match.group(2).lower(), 0)
        return match is not None

    # -- results --------------------------------------------------------------------------------
    def rows(self) -> list[OpRow]:
        """Every counted line, worst first within each phase (bytes, then count), phases in first-seen order."""
        with self._lock:
            items = [OpRow(*key, *value) for key, value in self._rows.items()]
        order = {phase: i for i, phase in enumerate(dict.fromkeys(row.phase for row in items))}
        return sorted(items, key=lambda r: (order[r.phase], -r.bytes, -r.count, r.kind, r.op))

    def totals(self) -> dict[str, dict[str, int]]:
        """``{kind: {"count", "bytes"}}`` over all phases."""
        result = {kind: {"count": 0, "bytes": 0} for kind in KINDS}
        for row in self.rows():
            result[row.kind]["count"] += row.count
            result[row.kind]["bytes"] += row.bytes
        return result

    def to_dict(self) -> dict[str, Any]:
        return {"job_device": str(self.job_device), "totals": self.totals(),
                "rows": [row.to_dict() for row in self.rows()], "fallback_warnings": list(self.fallback_warnings)}

    def table(self, top: int = 8) -> str:
        """Per phase, its ``top`` worst lines (bytes, then count) as a fixed-width text table."""
        return format_table(self.to_dict(), top=top)


def format_table(log: dict[str, Any], top: int = 8) -> str:
    """The text table of a `TransferLog.to_dict()` `log` (also as read back from JSON): the worst `top`
    rows per phase, then the totals and PyTorch's fallback warnings. `InvalidInputError` for `top` < 1."""
    if top < 1:
        raise InvalidInputError(f"top must be at least 1, got {top}")
    rows = log.get("rows") or []
    lines = [f"op and transfer log (job device {log.get('job_device', '?')}); worst {top} per phase"]
    if not rows:
        return "\n".join(lines + ["  nothing recorded: no copies, synchronising calls or CPU ops"])
    lines.append(f"  {'phase':<24} {'kind':<12} {'op':<30} {'device':<14} {'count':>8} {'bytes':>11}")
    shown: dict[str, int] = {}
    for row in rows:
        if shown.get(row["phase"], 0) >= top:
            continue
        shown[row["phase"]] = shown.get(row["phase"], 0) + 1
        lines.append(f"  {row['phase'][:24]:<24} {row['kind']:<12} {row['op'][:30]:<30} {row['device'][:14]:<14} "
                     f"{row['count']:>8} {format_size(row['bytes']):>11}")
    totals = log.get("totals") or {}
    summary = ", ".join(f"{kind} {v['count']} ({format_size(v['bytes'])})" for kind, v in totals.items() if v["count"])
    lines.append(f"  totals: {summary}")
    for message in log.get("fallback_warnings") or []:
        lines.append(f"  PyTorch: {message.strip()[:160]}")
    return "\n".join(lines)


__all__ = ["OpRow", "TransferLog", "copy_kind", "format_table", "phase"]
