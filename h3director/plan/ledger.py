"""A byte ledger: replay a sequence of tensor allocations and frees, keep the peak.

The planner's estimators describe a forward pass as the allocations its code performs, in order
(`alloc`), and the moments tensors die (`free`). The ledger's `peak` is the most bytes live at
once: the same quantity `LiveBytesTracker` measures on a real run.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ByteLedger:
    """Live bytes by name; `peak` is the maximum of `live` ever reached. Sizes in bytes."""

    live: int = 0
    peak: int = 0
    _held: dict[str, int] = field(default_factory=dict)

    def alloc(self, name: str, nbytes: int | float) -> None:
        """A tensor `name` of `nbytes` bytes comes to life (a name may only be live once)."""
        if name in self._held:
            raise ValueError(f"ledger: {name!r} is already live")
        nbytes = int(nbytes)
        self._held[name] = nbytes
        self.live += nbytes
        self.peak = max(self.peak, self.live)

    def free(self, *names: str) -> None:
        """The named tensors die."""
        for name in names:
            self.live -= self._held.pop(name)

    def transient(self, nbytes: int | float) -> None:
        """A tensor that lives only for one step (allocated and freed at once): raises the peak only."""
        self.peak = max(self.peak, self.live + int(nbytes))

    def reset_peak(self) -> None:
        """Start a new peak measurement from what is live now."""
        self.peak = self.live

    def rename(self, old: str, new: str) -> None:
        """The tensor `old` lives on under the name `new` (a variable rebinding)."""
        if new in self._held:
            raise ValueError(f"ledger: {new!r} is already live")
        self._held[new] = self._held.pop(old)

    def holds(self, name: str) -> bool:
        return name in self._held


class Bindings:
    """Python variables over a `ByteLedger`: a tensor dies when no variable refers to it any more.

    `bind(var, tensor)` rebinds `var` (None unbinds); the tensor it referred to before is freed
    when no other variable refers to it, as CPython's reference counting would.
    """

    def __init__(self, ledger: ByteLedger) -> None:
        self.ledger = ledger
        self.vars: dict[str, str] = {}

    def bind(self, var: str, tensor: str | None) -> None:
        old = self.vars.pop(var, None)
        if tensor is not None:
            self.vars[var] = tensor
        if old is not None and old not in self.vars.values():
            self.ledger.free(old)


__all__ = ["Bindings", "ByteLedger"]
