"""Tensor bytes held by given objects, and the live tensors of the process that are new since a census.

Two questions a memory ledger asks:

- `held_tensor_bytes(objects)`: how many bytes of tensor storage do these objects keep alive, per device?
  Walks tensors, ``torch.nn.Module`` parameters and buffers, dicts, lists, tuples, sets, and other objects'
  ``__dict__`` (up to ``max_depth`` levels and ``max_objects`` objects, so a walk has a bounded cost). Each
  storage counts once (keyed by device and data pointer), however many tensors view it, so bytes kept by
  two holders are not counted twice. Devices are named as `torch.device` prints them with an index for
  accelerators: ``"cpu"``, ``"cuda:0"``, ``"mps"``.
- `TensorCensus`: a snapshot of every live tensor the garbage collector tracks (``gc.get_objects()``,
  weak references only, so taking it keeps nothing alive). `TensorCensus.new_since(older)` lists the
  storages alive now that no tensor of the older census still holds, largest first. A scan visits every
  tracked Python object: it costs about a second per few million objects, so callers take one only when
  they suspect a leak.
"""

from __future__ import annotations

import gc
import types
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

_ATOMS = (str, bytes, bytearray, int, float, complex, bool, type(None), memoryview, range)
_SKIPPED = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
            types.FrameType, types.CodeType, types.GeneratorType, types.CoroutineType, weakref.ref)


def device_name(device: torch.device) -> str:
    """``"cpu"``, ``"cuda:0"``, ``"mps"``: accelerators with their index (0 when torch leaves it out)."""
    if device.type in ("cpu", "mps", "meta"):
        return device.type
    return f"{device.type}:{0 if device.index is None else device.index}"


def storage_key(tensor: torch.Tensor) -> tuple[str, int, int] | None:
    """``(device, data pointer, storage bytes)`` of the storage behind ``tensor``; None for tensors without
    one (sparse, meta, nested, or zero bytes)."""
    try:
        storage = tensor.untyped_storage()
        nbytes = int(storage.nbytes())
        pointer = int(storage.data_ptr())
    except (RuntimeError, NotImplementedError, TypeError):
        return None
    if nbytes == 0 or pointer == 0 or tensor.device.type == "meta":
        return None
    return device_name(tensor.device), pointer, nbytes


@dataclass
class HeldBytes:
    """What `held_tensor_bytes` found: ``by_device`` bytes per device, ``storages`` distinct storages,
    ``truncated`` True when the walk stopped at ``max_objects`` (then the bytes are a lower bound)."""

    by_device: dict[str, int]
    storages: int
    truncated: bool

    @property
    def total(self) -> int:
        return sum(self.by_device.values())


class StorageSet:
    """Storages counted so far (by device and data pointer), so that several walks can share one."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, int]] = set()

    def add(self, tensor: torch.Tensor, into: dict[str, int]) -> int:
        """Count ``tensor``'s storage into ``into[device]`` unless it was counted; returns the bytes added."""
        key = storage_key(tensor)
        if key is None or key[:2] in self.seen:
            return 0
        self.seen.add(key[:2])
        into[key[0]] = into.get(key[0], 0) + key[2]
        return key[2]


def held_tensor_bytes(objects: Iterable[Any], *, max_depth: int = 8, max_objects: int = 200_000,
                      storages: StorageSet | None = None) -> HeldBytes:
    """Bytes of tensor storage reachable from ``objects``, per device (see the module docstring).

    ``max_depth``: container levels followed below each object (a module's parameters count as one level).
    ``max_objects``: objects visited at most. ``storages``: a `StorageSet` shared with earlier walks, whose
    storages are then not counted again (the result holds only the storages new to this walk).
    """
    seen_storages = storages if storages is not None else StorageSet()
    before = len(seen_storages.seen)
    by_device: dict[str, int] = {}
    visited: set[int] = set()
    stack: list[tuple[Any, int]] = [(obj, 0) for obj in objects]
    truncated = False
    while stack:
        obj, depth = stack.pop()
        if isinstance(obj, _ATOMS) or isinstance(obj, _SKIPPED) or id(obj) in visited:
            continue
        if len(visited) >= max_objects:
            truncated = True
            break
        visited.add(id(obj))
        if isinstance(obj, torch.Tensor):
            seen_storages.add(obj, by_device)
            continue
        if isinstance(obj, torch.nn.Module):
            for tensor in (*obj.parameters(), *obj.buffers()):
                seen_storages.add(tensor, by_device)
            children: Iterable[Any] = (value for name, value in vars(obj).items()
                                       if name not in ("_parameters", "_buffers", "_modules"))
        elif depth >= max_depth:
            continue
        elif isinstance(obj, dict):
            children = obj.values()
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = obj
        else:
            try:
                children = vars(obj).values()
            except TypeError:  # no __dict__ (slots, C objects): nothing we can follow
                continue
        stack.extend((child, depth + 1) for child in children)
    return HeldBytes(by_device, len(seen_storages.seen) - before, truncated)


@dataclass(frozen=True)
class NewStorage:
    """A storage alive now that no tensor of the older census held: its bytes, device, and one tensor
    (a weak reference: it may die before it is looked at) with its shape and dtype."""

    nbytes: int
    device: str
    shape: tuple[int, ...]
    dtype: str
    tensor: weakref.ref


class TensorCensus:
    """The live tensors of this process at one moment, as weak references (see the module docstring)."""

    def __init__(self, refs: list[weakref.ref]):
        self._refs = refs

    @classmethod
    def take(cls) -> TensorCensus:
        """Scan ``gc.get_objects()`` for tensors (cost: one pass over every tracked object)."""
        refs = []
        objects = gc.get_objects()
        try:
            for obj in objects:
                if issubclass(type(obj), torch.Tensor):  # type(): no __class__ lookup (a lazy module's would warn)
                    try:
                        refs.append(weakref.ref(obj))
                    except TypeError:  # a tensor subclass without weak reference support
                        continue
        finally:
            del objects
        return cls(refs)

    def __len__(self) -> int:
        return len(self._refs)

    def live_storages(self) -> set[tuple[str, int]]:
        """``(device, data pointer)`` of the storages the census's tensors that are still alive hold."""
        keys = set()
        for ref in self._refs:
            tensor = ref()
            if tensor is not None:
                key = storage_key(tensor)
                if key is not None:
                    keys.add(key[:2])
        return keys

    def new_since(self, older: TensorCensus, limit: int = 10) -> list[NewStorage]:
        """The ``limit`` largest storages held by this census's tensors and by none of ``older``'s tensors
        that are still alive (an address freed and reused counts as new), largest first."""
        old = older.live_storages()
        found: dict[tuple[str, int], NewStorage] = {}
        for ref in self._refs:
            tensor = ref()
            if tensor is None:
                continue
            key = storage_key(tensor)
            if key is None or key[:2] in old:
                continue
            known = found.get(key[:2])
            # keep the tensor that spans the most of the storage (the base rather than a small view)
            if known is None or tensor.numel() * tensor.element_size() > _spanned(known):
                found[key[:2]] = NewStorage(key[2], key[0], tuple(tensor.shape), str(tensor.dtype).removeprefix("torch."),
                                            ref)
        return sorted(found.values(), key=lambda item: item.nbytes, reverse=True)[:limit]


def _spanned(item: NewStorage) -> int:
    tensor = item.tensor()
    return 0 if tensor is None else tensor.numel() * tensor.element_size()


__all__ = ["HeldBytes", "NewStorage", "StorageSet", "TensorCensus", "held_tensor_bytes"]
