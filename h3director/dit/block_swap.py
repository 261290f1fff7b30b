"""Block swap: N of a DiT's blocks kept in host RAM, each copied onto the compute device just before it runs.

Exactness: exact by construction. Only placement changes: an offloaded block runs on a bit copy of the very
tensors it held when it was offloaded (for a framework that patches weights, such as ComfyUI's LoRA, the
patched ones), so a forward gives the same bits as with every block resident.

`BlockSwap(blocks, offloaded, device)` is plain torch; the framework adapters
(`h3director.integrations.comfy_blockswap`, `h3director.integrations.diffusers_offload`) call it around each
forward and each offloaded block:

- `sync()`: the offloaded blocks' eligible tensors (parameters and buffers of plain tensor type; the
  adapter's `eligible` filter may narrow that) are given a host copy (pinned memory when the device is CUDA)
  and the module's tensor is pointed at it (`tensor.data = host`); the device copy is dropped. Idempotent:
  tensors already backed by their host copy are kept; tensors the framework replaced or moved since are
  taken again. Returns the bytes that left the device.
- `begin_forward()`: starts copying the first offloaded block (prefetch).
- `before_block(i)`: makes block i resident: waits for its prefetch (CUDA: the compute stream waits on the
  copy's event) or copies it now, points the module's tensors at the device copies, then starts the copy of
  the next offloaded block, so at most two offloaded blocks are on the device at once (one computing, one
  arriving; the planner's `stream_buffers`).
- `after_block(i)`: points block i's tensors back at their host copies; the device copies are freed once the
  compute stream is done with them (`record_stream`).
- `restore()`: the offloaded blocks' tensors back on the device as ordinary tensors (bytes returned).

Prefetch: on CUDA, with `use_stream`, the copies run on one side stream (`torch.cuda.Stream`) from pinned
memory (`non_blocking=True`) while the compute stream runs the current block. Without a stream (CPU, or
`use_stream=False` on CUDA) the same copies are made synchronously at the same points, so the bookkeeping
and the residency bound are the same; on the CPU the "device copy" is a fresh CPU tensor (no memory is
saved there; the mechanism and its counts are what runs).

Which blocks: `offloaded_indices(total, count)` spreads them evenly, ending at the last block, so each
offloaded block's copy overlaps the compute of the resident blocks before it.

Tensor subclasses (quantised tensor wrappers) are left where they are and counted in `kept_in_place`.
Units: bytes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from h3director.errors import InvalidInputError

EXACTNESS = "exact by construction"


def check_count(count: int, total: int, what: str = "the model") -> int:
    """`count` as an int when 0 <= count <= total; `InvalidInputError` naming `total` otherwise."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidInputError(f"blocks_offloaded must be an integer, got {count!r}")
    if not 0 <= count <= total:
        raise InvalidInputError(f"blocks_offloaded={count} is out of range: {what} has {total} DiT blocks "
                                f"(0 to {total} can be offloaded)")
    return count


def offloaded_indices(total: int, count: int) -> tuple[int, ...]:
    """The `count` blocks of `total` to keep in host RAM: evenly spread, the last block always among them."""
    check_count(count, total)
    return tuple((k + 1) * total // count - 1 for k in range(count))


def _plain(tensor) -> bool:
    return type(tensor) in (torch.Tensor, nn.Parameter) and type(tensor.data) is torch.Tensor \
        and not tensor.is_meta and tensor.numel() > 0


@contextlib.contextmanager
def _like(inference: bool):
    """Make copies under the inference mode of the tensor they replace (a parameter loaded under
    `torch.inference_mode`, as ComfyUI's sampler loads them, only takes inference tensors, and vice versa)."""
    with torch.inference_mode(inference), torch.no_grad():
        yield


def _nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


@dataclass
class _Slot:
    """One tensor of an offloaded block: the module attribute (`module.<name>`, a parameter or buffer
    object, whose identity is kept) and its host copy."""

    module: nn.Module
    name: str
    tensor: torch.Tensor
    host: torch.Tensor
    inference: bool = False  # the tensor was an inference tensor: its copies are made as such too

    def current(self):
        return self.module._parameters.get(self.name, self.module._buffers.get(self.name))

    def backed(self) -> bool:
        """The module still holds our tensor object and it points at our host copy."""
        return self.current() is self.tensor and self.tensor.data_ptr() == self.host.data_ptr()


@dataclass
class SwapStats:
    """Counts over the forwards run so far: block onloads, how many were prefetched, bytes copied to the
    device, and the most offloaded blocks on the device at once (computing + arriving)."""

    forwards: int = 0
    onloads: int = 0
    prefetched: int = 0
    bytes_onloaded: int = 0
    peak_offloaded_on_device: int = 0
    per_block_onloads: dict[int, int] = field(default_factory=dict)


class BlockSwap:
    """Keeps `offloaded` (block indices) of `blocks` in host RAM and streams each in for its turn.

    `device`: the compute device; `host`: where offloaded tensors live ("cpu"); `use_stream`: prefetch on a
    side CUDA stream (ignored where there is none); `eligible(module, name, tensor) -> bool`: which tensors
    of an offloaded block this may move (default: every plain tensor). See the module docstring for the
    call order and the exactness class."""

    def __init__(self, blocks: Sequence[nn.Module], offloaded: Sequence[int], device, *, host="cpu",
                 use_stream: bool = True, eligible: Callable[[nn.Module, str, torch.Tensor], bool] | None = None):
        self.blocks = list(blocks)
        self.offloaded = tuple(sorted(set(int(i) for i in offloaded)))
        for i in self.offloaded:
            if not 0 <= i < len(self.blocks):
                raise InvalidInputError(f"block {i} does not exist: the model has {len(self.blocks)} blocks")
        self.device = torch.device(device)
        self.host = torch.device(host)
        cuda = self.device.type == "cuda" and torch.cuda.is_available()
        self.pinned = cuda and self.host.type == "cpu"
        self.stream = torch.cuda.Stream(device=self.device) if cuda and use_stream else None
        self.prefetch = use_stream
        self.eligible = eligible or (lambda module, name, tensor: True)
        self.stats = SwapStats()
        self.kept_in_place = 0
        self._next = {a: b for a, b in zip(self.offloaded, self.offloaded[1:], strict=False)}
        self._slots: dict[int, list[_Slot]] = {i: [] for i in self.offloaded}
        self._resident: dict[int, list[torch.Tensor]] = {}
        self._arriving: dict[int, tuple[list[torch.Tensor], object]] = {}

    # -- placement ------------------------------------------------------------------------------------
    def _tensors(self, index: int):
        for module in self.blocks[index].modules():
            for store in (module._parameters, module._buffers):
                for name, tensor in store.items():
                    if tensor is not None:
                        yield module, name, tensor

    def _host_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        data = tensor.data
        if data.device == self.host and (data.is_pinned() or not self.pinned) and data.is_contiguous():
            return data  # already a usable host copy: adopt it
        with _like(tensor.is_inference()):
            if self.pinned:
                host = torch.empty(data.shape, dtype=data.dtype, pin_memory=True)
            else:
                host = torch.empty(data.shape, dtype=data.dtype, device=self.host)
            host.copy_(data)
        return host

    def sync(self) -> int:
        """(Re)offload: every eligible tensor of the offloaded blocks is backed by its host copy afterwards.
        Returns the bytes that left `device` (0 on the CPU, where host and device are the same memory)."""
        if self._resident or self._arriving:
            raise RuntimeError("BlockSwap.sync() during a forward")
        moved = 0
        kept = 0
        with torch.no_grad():
            for i in self.offloaded:
                old = {(id(s.module), s.name): s for s in self._slots[i]}
                slots = []
                for module, name, tensor in self._tensors(i):
                    slot = old.get((id(module), name))
                    if slot is not None and slot.tensor is tensor and slot.backed():
                        slots.append(slot)
                        continue
                    if not _plain(tensor):
                        kept += 1
                        continue
                    if not self.eligible(module, name, tensor):
                        continue
                    on_device = tensor.device == self.device and self.device != self.host
                    inference = tensor.is_inference()
                    host = self._host_copy(tensor)
                    tensor.data = host
                    moved += _nbytes(host) if on_device else 0
                    slots.append(_Slot(module, name, tensor, host, inference))
                self._slots[i] = slots
        self.kept_in_place = kept
        return moved

    def restore(self) -> int:
        """Every offloaded tensor back on `device` as an ordinary tensor; forgets the host copies. Returns the
        bytes put back on the device (0 on the CPU)."""
        self.end_forward()
        back = 0
        for i in self.offloaded:
            for slot in self._slots[i]:
                if slot.backed():
                    with _like(slot.inference):
                        slot.tensor.data = slot.host.to(self.device, copy=self.device == self.host)
                    back += _nbytes(slot.host) if self.device != self.host else 0
            self._slots[i] = []
        return back

    def backed_slots(self) -> list[_Slot]:
        """The offloaded tensors still backed by their host copies (module, name, tensor, host)."""
        return [slot for i in self.offloaded for slot in self._slots[i] if slot.backed()]

    def forget(self) -> None:
        """Drop the bookkeeping without moving anything (the framework already put the tensors elsewhere)."""
        self.end_forward()
        self._slots = {i: [] for i in self.offloaded}

    # -- one forward ----------------------------------------------------------------------------------
    def _copy_in(self, index: int) -> tuple[list[torch.Tensor], object]:
        copies = []
        event = None
        context = torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()
        with context:
            for slot in self._slots[index]:
                with _like(slot.inference):
                    dev = torch.empty(slot.host.shape, dtype=slot.host.dtype, device=self.device)
                    dev.copy_(slot.host, non_blocking=self.pinned)
                copies.append(dev)
            if self.stream is not None:
                event = torch.cuda.Event()
                event.record(self.stream)
        self.stats.bytes_onloaded += sum(_nbytes(c) for c in copies)
        return copies, event

    def _note_peak(self) -> None:
        on_device = len(self._resident) + len(self._arriving)
        self.stats.peak_offloaded_on_device = max(self.stats.peak_offloaded_on_device, on_device)

    def _start(self, index: int | None) -> None:
        if index is None or not self.prefetch or index in self._arriving or index in self._resident:
            return
        self._arriving[index] = self._copy_in(index)
        self._note_peak()

    def begin_forward(self) -> None:
        """A forward starts: forget anything a failed forward left, start copying the first offloaded block."""
        self.end_forward()
        self.stats.forwards += 1
        self._start(self.offloaded[0] if self.offloaded else None)

    def before_block(self, index: int) -> None:
        """Block `index` is about to run: make it resident (no-op for a resident block), start the next copy."""
        if index not in self._slots or index in self._resident:
            return
        arriving = self._arriving.pop(index, None)
        if arriving is not None:
            self.stats.prefetched += 1
        copies, event = arriving if arriving is not None else self._copy_in(index)
        if event is not None:
            compute = torch.cuda.current_stream(self.device)
            compute.wait_event(event)
            for copy in copies:
                copy.record_stream(compute)  # freed only after the compute stream has used it
        for slot, copy in zip(self._slots[index], copies, strict=True):
            slot.tensor.data = copy
        self._resident[index] = copies
        self.stats.onloads += 1
        self.stats.per_block_onloads[index] = self.stats.per_block_onloads.get(index, 0) + 1
        self._note_peak()
        self._start(self._next.get(index))

    def after_block(self, index: int) -> None:
        """Block `index` ran: its tensors point at their host copies again; the device copies are released."""
        if self._resident.pop(index, None) is None:
            return
        for slot in self._slots[index]:
            slot.tensor.data = slot.host

    def end_forward(self) -> None:
        """Release whatever is still on the device (the normal path leaves nothing)."""
        for index in list(self._resident):
            self.after_block(index)
        self._arriving.clear()

    # -- what is where --------------------------------------------------------------------------------
    def resident_offloaded(self) -> list[int]:
        """Offloaded blocks whose tensors are on the device now (the one computing)."""
        return sorted(self._resident)

    def placement(self) -> list[dict]:
        """Per block: `index`, `offloaded`, `device_bytes` (tensors the block computes from on the device),
        `host_bytes` (tensors backed by a host copy). Measured from the module's tensors now."""
        rows = []
        for i, _block in enumerate(self.blocks):
            slots = {(id(s.module), s.name): s for s in self._slots.get(i, [])}
            device = host = 0
            for module, name, tensor in self._tensors(i):
                slot = slots.get((id(module), name))
                if (slot is not None and tensor.data_ptr() == slot.host.data_ptr()) or \
                        (self.device != self.host and tensor.device == self.host):
                    host += _nbytes(tensor)
                else:
                    device += _nbytes(tensor)
            rows.append({"index": i, "offloaded": i in self._slots, "device_bytes": device, "host_bytes": host})
        return rows

    def describe(self) -> str:
        where = ("pinned host RAM, prefetched on a side CUDA stream" if self.stream is not None else
                 "pinned host RAM, copied synchronously" if self.pinned else
                 f"{self.host} memory, copied synchronously (no stream on {self.device})")
        return (f"{len(self.offloaded)} of {len(self.blocks)} DiT blocks offloaded "
                f"(blocks {list(self.offloaded)}) in {where}; {EXACTNESS}")


__all__ = ["EXACTNESS", "BlockSwap", "SwapStats", "check_count", "offloaded_indices"]
