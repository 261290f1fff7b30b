"""MemoryGuard: hold work to a memory budget, before it starts and while it runs.

A guard has a device budget (``max_gpu_memory_mb``; compared with
`h3director.core.devices.device_used_bytes` of its device) and an optional host budget
(``max_host_memory_mb``; compared with the process RSS). Both are bytes internally.

- ``preflight(nbytes, what)``: before large work, checks measured use + ``nbytes`` against the budget;
  if it does not fit it frees caches, measures again, and raises `MemoryLimitExceeded` if it still
  does not fit.
- The watch: while a guarded step runs, a sampler thread reads the device (and host) every
  ``poll_interval_ms`` and once more at the start and end; a step may call ``guard.check()`` between
  pieces of work to stop as soon as the budget is crossed. An out-of-memory error raised by the step
  (what `h3director.core.oom.is_out_of_memory` recognises: ``torch.OutOfMemoryError``, the CPU allocator's
  "can't allocate memory", MPS and CUDA allocation failures) counts as exceeding the budget.
- On exceeding, the configured action runs:
  ``stop_and_clear``: free caches (``gc.collect`` and the device's ``empty_cache``), then raise
  `MemoryLimitExceeded` ("[Director Safety] GPU memory limit exceeded in phase ... on cuda:0 ..."
  naming the phase, the device, the budget and the measured use; "CPU" for a guard on the CPU,
  "host" for the host budget);
  ``reduce_batch``: free caches, call the reducer on the step's ``batch_size`` (default: halve) and
  rerun; below ``min_batch`` it stops as above;
  ``fallback_to_cpu``: free caches and rerun the step with ``device="cpu"`` (host budget only).

Forms: ``guard.run(step, *args, what=..., nbytes=..., **kwargs)``; ``@guard`` or
``@guard.protect(what=..., nbytes=...)`` as a decorator (same rules); ``with guard.watch(what):``
or ``with guard:`` as a context manager. A ``with`` block cannot be rerun, so there every action
stops and clears; use the decorator or `run` for ``reduce_batch`` and ``fallback_to_cpu``.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from h3director.core.oom import is_out_of_memory
from h3director.errors import H3DirectorError, InvalidInputError
from h3director.units import format_size

ACTIONS = ("stop_and_clear", "reduce_batch", "fallback_to_cpu")


class MemoryLimitExceeded(H3DirectorError):
    """Work crossed (or would cross) a memory budget; the message starts with ``[Director Safety]``.

    Attributes: ``phase``, ``memory`` ("GPU", "CPU" for a device budget on the CPU, or "host" for the
    host budget; see `memory_label`), ``budget_bytes``, ``measured_bytes``, ``requested_bytes``
    (preflight only, else 0), ``device`` (the guarded device, "" when not given), ``would_fit`` (the setting
    that would have fit, named by its node and inputs, as the caller priced it; "" when not known), which ends
    the message as "; would have fit: ...".
    """

    def __init__(self, phase: str, memory: str, budget_bytes: int, measured_bytes: int,
                 requested_bytes: int = 0, detail: str = "", device: str = "", would_fit: str = "") -> None:
        self.phase, self.memory, self.device, self.would_fit = phase, memory, device, would_fit
        self.budget_bytes, self.measured_bytes, self.requested_bytes = budget_bytes, measured_bytes, requested_bytes
        use = f"measured use {format_size(measured_bytes)} ({measured_bytes} B)"
        if requested_bytes:
            use += f" + requested {format_size(requested_bytes)} ({requested_bytes} B)"
        message = (
            f"[Director Safety] {memory} memory limit exceeded in phase {phase!r}"
            + (f" on {device}" if device else "") + ": "
            f"budget {format_size(budget_bytes)} ({budget_bytes} B), {use}"
        )
        super().__init__(message + (f"; {detail}" if detail else "") + (f"; would have fit: {would_fit}" if would_fit
                                                                        else ""))


@dataclass(frozen=True)
class GuardEvent:
    """One time the guard acted: ``cause`` is "preflight", "watch" or "oom"; ``action`` what it did."""

    phase: str
    cause: str
    action: str
    memory: str
    measured_bytes: int
    budget_bytes: int | None
    batch_size: int | None
    device: str


def memory_label(device: str | torch.device) -> str:
    """What a device budget is called in messages: "CPU" for the CPU, "GPU" for any accelerator."""
    return "CPU" if torch.device(device).type == "cpu" else "GPU"


def _exceeded(phase: str, device: str, budget_bytes: int, measured_bytes: int, requested_bytes: int = 0,
              detail: str = "") -> MemoryLimitExceeded:
    """`MemoryLimitExceeded` for the device budget of ``device``."""
    return MemoryLimitExceeded(phase, memory_label(device), budget_bytes, measured_bytes, requested_bytes,
                               detail=detail, device=str(device))


class _Exceeded(Exception):
    """Internal: a budget was crossed (carries the exception the guard will raise if it gives up)."""

    def __init__(self, error: MemoryLimitExceeded, cause: str) -> None:
        super().__init__(str(error))
        self.error, self.cause = error, cause


def free_caches(device: str | torch.device) -> None:
    """Run Python's collector and empty the device's allocator cache (CUDA / MPS; nothing more for the CPU).

    The one "free caches" helper: the guard's default cache clearer and the decode's clip retry
    both call it.
    """
    gc.collect()
    kind = torch.device(device).type
    if kind == "cuda" and torch.cuda.is_available():
        torch.cuda.empty_cache()
    elif kind == "mps" and getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        torch.mps.empty_cache()


def _default_device_reader(device: str) -> int:
    from h3director.core.devices import device_used_bytes

    return device_used_bytes(device)


def _default_host_reader() -> int:
    from h3director.core.devices import process_rss_bytes

    return process_rss_bytes()


def _safety_options(config) -> dict[str, Any]:
    """`MemoryGuard` keyword arguments from an `H3Config`'s ``memory_safety`` section."""
    safety = config.memory_safety
    return {"budget_bytes": safety.max_gpu_memory_bytes, "host_budget_bytes": safety.max_host_memory_bytes,
            "action": safety.action_on_exceed, "enabled": safety.enabled}


class _Watch:
    """Samples the budgets from a thread while a block runs; `exceeded` holds the first crossing."""

    def __init__(self, guard: MemoryGuard, phase: str, device: str, device_budget: int | None) -> None:
        self.guard, self.phase, self.device, self.device_budget = guard, phase, device, device_budget
        self.peak_device = 0
        self.peak_host = 0
        self.exceeded: MemoryLimitExceeded | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sample(self) -> None:
        guard = self.guard
        with self._lock:
            if self.device_budget is not None:
                used = int(guard.device_reader(self.device))
                self.peak_device = max(self.peak_device, used)
                if used > self.device_budget and self.exceeded is None:
                    self.exceeded = _exceeded(self.phase, self.device, self.device_budget, used)
            if guard.host_budget_bytes is not None:
                used = int(guard.host_reader())
                self.peak_host = max(self.peak_host, used)
                if used > guard.host_budget_bytes and self.exceeded is None:
                    self.exceeded = MemoryLimitExceeded(self.phase, "host", guard.host_budget_bytes, used)

    def _loop(self) -> None:
        while not self._stop.wait(self.guard.poll_interval_s):
            self.sample()

    def __enter__(self) -> _Watch:
        self.guard._watches.append(self)
        self.sample()
        if self.guard.poll_interval_s > 0:
            self._thread = threading.Thread(target=self._loop, name=f"h3-guard-{self.phase}", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.guard._watches.remove(self)
        if exc_type is None:
            self.sample()


class _BlockWatch:
    """``with guard.watch(phase):``: on a crossing or an OOM, free caches and raise `MemoryLimitExceeded`."""

    def __init__(self, guard: MemoryGuard, phase: str) -> None:
        self.guard, self.phase = guard, phase
        self._watch: _Watch | None = None

    def __enter__(self) -> MemoryGuard:
        self._watch = _Watch(self.guard, self.phase, self.guard.device, self.guard.budget_bytes)
        self._watch.__enter__()
        return self.guard

    def __exit__(self, exc_type, exc, tb) -> bool:
        watch = self._watch
        watch.__exit__(exc_type, exc, tb)
        if exc_type is not None and issubclass(exc_type, _Exceeded):
            self.guard._give_up(exc.error, exc.cause, None, self.guard.device)
        if exc is not None and is_out_of_memory(exc):
            error = self.guard._oom_error(self.phase, self.guard.device, watch)
            self.guard._give_up(error, "oom", None, self.guard.device, cause_exc=exc)
        if exc_type is None and watch.exceeded is not None:
            self.guard._give_up(watch.exceeded, "watch", None, self.guard.device)
        return False


class MemoryGuard:
    """A memory budget for a device (and the host) with an action on exceeding it.

    ``budget_bytes`` may be an `H3Config` instead (its ``memory_safety`` section is read), or None for
    no device budget. ``device_reader(device) -> int`` defaults to
    `h3director.core.devices.device_used_bytes` and ``host_reader() -> int`` to the process RSS; tests
    inject simulated readers with the same signatures. ``reducer(batch_size) -> int`` (default: halve)
    and ``min_batch`` drive ``reduce_batch``. ``cache_clearer(device)`` defaults to `free_caches`.
    """

    def __init__(
        self,
        budget_bytes: int | Any | None = None,
        *,
        host_budget_bytes: int | None = None,
        action: str | None = None,
        device: str | torch.device = "cuda",
        reducer: Callable[[int], int] | None = None,
        min_batch: int = 1,
        poll_interval_ms: float = 50,
        device_reader: Callable[[str], int] | None = None,
        host_reader: Callable[[], int] | None = None,
        cache_clearer: Callable[[str], None] | None = None,
        enabled: bool | None = None,
    ) -> None:
        if budget_bytes is not None and not isinstance(budget_bytes, int):
            # An H3Config: its memory_safety section, with explicit arguments taking precedence.
            safety = _safety_options(budget_bytes)
            budget_bytes = safety["budget_bytes"]
            host_budget_bytes = safety["host_budget_bytes"] if host_budget_bytes is None else host_budget_bytes
            action = safety["action"] if action is None else action
            enabled = safety["enabled"] if enabled is None else enabled
        action = "stop_and_clear" if action is None else action
        enabled = True if enabled is None else enabled
        for name, value in (("budget_bytes", budget_bytes), ("host_budget_bytes", host_budget_bytes)):
            if value is not None and value <= 0:
                raise InvalidInputError(f"{name} must be positive or None, got {value}")
        if action not in ACTIONS:
            raise InvalidInputError(f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
        if min_batch < 1:
            raise InvalidInputError(f"min_batch must be >= 1, got {min_batch}")
        self.budget_bytes = budget_bytes
        self.host_budget_bytes = host_budget_bytes
        self.action = action
        self.device = str(torch.device(device))
        self.reducer = reducer or (lambda batch: batch // 2)
        self.min_batch = min_batch
        self.poll_interval_s = poll_interval_ms / 1000.0
        self.device_reader = device_reader or _default_device_reader
        self.host_reader = host_reader or _default_host_reader
        self.cache_clearer = cache_clearer or free_caches
        self.enabled = enabled
        self.events: list[GuardEvent] = []
        self._watches: list[_Watch] = []
        self._block: _BlockWatch | None = None

    @classmethod
    def from_config(cls, config, device: str | torch.device = "cuda", **kwargs) -> MemoryGuard:
        """The guard an `H3Config`'s ``memory_safety`` section describes (keyword arguments override)."""
        options = _safety_options(config)
        options.update(kwargs)
        return cls(options.pop("budget_bytes"), device=device, **options)

    @property
    def device_type(self) -> str:
        return torch.device(self.device).type

    # ------------------------------------------------------------------ checks

    def preflight(self, nbytes: int, what: str) -> int:
        """Check that ``nbytes`` more fit the device budget; returns the headroom left after them (bytes,
        -1 when there is no device budget).

        Frees caches and re-measures once before refusing; raises `MemoryLimitExceeded` if it does not fit.
        """
        if nbytes < 0:
            raise InvalidInputError(f"preflight of {what!r}: nbytes must be >= 0, got {nbytes}")
        if not self.enabled or self.budget_bytes is None:
            return -1 if self.budget_bytes is None else self.budget_bytes
        used = int(self.device_reader(self.device))
        if used + nbytes > self.budget_bytes:
            self.cache_clearer(self.device)
            used = int(self.device_reader(self.device))
        if used + nbytes > self.budget_bytes:
            raise _exceeded(what, self.device, self.budget_bytes, used, nbytes)
        return self.budget_bytes - used - nbytes

    def limit_error(self, what: str, requested_bytes: int = 0, detail: str = "") -> MemoryLimitExceeded:
        """`MemoryLimitExceeded` for the device budget with the use measured now (for a caller that detected
        the crossing itself, e.g. an out-of-memory error); budget 0 when the guard has none."""
        try:
            measured = int(self.device_reader(self.device))
        except Exception:  # noqa: BLE001 - a failed reading must not hide the error being reported
            measured = 0
        return _exceeded(what, self.device, self.budget_bytes or 0, measured, requested_bytes, detail=detail)

    def check(self) -> None:
        """Sample now from inside a guarded step; stops the step if a budget was crossed."""
        if not self._watches:
            return
        watch = self._watches[-1]
        watch.sample()
        if watch.exceeded is not None:
            raise _Exceeded(watch.exceeded, "watch")

    # ------------------------------------------------------------------ running work

    def run(self, step: Callable[..., Any], *args, what: str = "step",
            nbytes: int | Callable[[int | None], int] | None = None, **kwargs) -> Any:
        """Run ``step(*args, **kwargs)`` under the budget and apply the action on exceeding it.

        ``batch_size`` and ``device`` in ``kwargs`` are the step's own: ``reduce_batch`` lowers
        ``batch_size``, ``fallback_to_cpu`` sets ``device="cpu"``. ``nbytes`` (or ``nbytes(batch_size)``)
        is preflighted before each try.
        """
        if not self.enabled:
            return step(*args, **kwargs)
        batch = kwargs.get("batch_size")
        device = str(kwargs.get("device", self.device))
        if self.action == "reduce_batch" and batch is None:
            raise InvalidInputError(f"reduce_batch needs the step {what!r} to be called with batch_size=")
        while True:
            if batch is not None:
                kwargs["batch_size"] = batch
            if self.action == "fallback_to_cpu":
                kwargs["device"] = device
            try:
                return self._try(step, args, kwargs, what, nbytes, batch, device)
            except _Exceeded as exceeded:
                error, cause, origin = exceeded.error, exceeded.cause, exceeded.__cause__
            self.cache_clearer(device)
            if self.action == "reduce_batch":
                smaller = int(self.reducer(batch))
                if smaller < self.min_batch or smaller >= batch:
                    self._record(what, cause, "stop_and_clear", error, batch, device)
                    raise MemoryLimitExceeded(
                        error.phase, error.memory, error.budget_bytes, error.measured_bytes, error.requested_bytes,
                        detail=f"batch size {batch} cannot be reduced below the floor {self.min_batch}",
                        device=error.device,
                    ) from error
                self._record(what, cause, "reduce_batch", error, batch, device)
                batch = smaller
                continue
            if self.action == "fallback_to_cpu" and torch.device(device).type != "cpu" and error.memory == "GPU":
                self._record(what, cause, "fallback_to_cpu", error, batch, device)
                device = "cpu"
                continue
            self._record(what, cause, "stop_and_clear", error, batch, device)
            raise error from origin

    def _try(self, step, args, kwargs, what, nbytes, batch, device) -> Any:
        on_budget_device = torch.device(device).type == self.device_type
        if nbytes is not None and on_budget_device:
            try:
                self.preflight(nbytes(batch) if callable(nbytes) else nbytes, what)
            except MemoryLimitExceeded as error:
                raise _Exceeded(error, "preflight") from None
        watch = _Watch(self, what, device, self.budget_bytes if on_budget_device else None)
        try:
            with watch:
                result = step(*args, **kwargs)
        except Exception as error:
            if not is_out_of_memory(error):
                raise
            raise _Exceeded(self._oom_error(what, device, watch), "oom") from error
        if watch.exceeded is not None:
            del result
            raise _Exceeded(watch.exceeded, "watch")
        return result

    def _oom_error(self, what: str, device: str, watch: _Watch) -> MemoryLimitExceeded:
        try:
            measured = max(watch.peak_device, int(self.device_reader(device)))
        except Exception:  # noqa: BLE001 - a failed reading must not hide the out-of-memory error
            measured = watch.peak_device
        if self.budget_bytes is None:
            return _exceeded(what, device, 0, measured, detail=f"out of memory on {device} (no budget set)")
        return _exceeded(what, device, self.budget_bytes, measured, detail=f"out of memory on {device}")

    def _give_up(self, error: MemoryLimitExceeded, cause: str, batch: int | None, device: str,
                 cause_exc: BaseException | None = None) -> None:
        self.cache_clearer(device)
        self._record(error.phase, cause, "stop_and_clear", error, batch, device)
        raise error from cause_exc

    def _record(self, what, cause, action, error, batch, device) -> None:
        self.events.append(GuardEvent(what, cause, action, error.memory, error.measured_bytes,
                                      error.budget_bytes, batch, str(device)))

    # ------------------------------------------------------------------ forms

    def watch(self, what: str = "work"):
        """A context manager that watches the block and stops and clears on exceeding (any action)."""
        return _BlockWatch(self, what) if self.enabled else contextlib.nullcontext(self)

    def __enter__(self) -> MemoryGuard:
        self._block = self.watch("guarded block")
        return self._block.__enter__()

    def __exit__(self, exc_type, exc, tb) -> bool:
        block, self._block = self._block, None
        return block.__exit__(exc_type, exc, tb)

    def protect(self, what: str | None = None, nbytes: int | Callable[[int | None], int] | None = None):
        """Decorator form of `run`: ``@guard.protect(what="decode", nbytes=...)``."""
        def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            def wrapper(*args, **kwargs):
                return self.run(fn, *args, what=what or fn.__qualname__, nbytes=nbytes, **kwargs)
            return wrapper
        return decorate

    def __call__(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``@guard`` decorates ``fn`` with `run` under its qualified name."""
        return self.protect()(fn)


__all__ = ["GuardEvent", "MemoryGuard", "MemoryLimitExceeded", "free_caches"]
