"""SharedTensorStore: tensors produced once (text embeddings, timestep embeddings) and read by many.

Conventions
-----------
- ``put(key, tensor, owner)`` stores the producer's tensor itself (no copy) with one reference held
  by ``owner``. ``get(key, owner=...)`` returns a view of it and, when ``owner`` is given, adds a
  reference for that owner; ``release(key, owner)`` drops one, and the entry leaves memory when no
  reference is left (it stays on the disk tier, if there is one). An entry read back from the disk
  tier stays in memory only once an owner takes a reference to it (or the read asks to ``keep`` it).
- One physical copy: every view is over the stored tensor's storage (same ``data_ptr``), so any
  number of consumers of one key hold its bytes once.
- Views are read-only by contract: PyTorch has no read-only tensors, so writes are detected instead.
  A named consumer (``owner`` or ``reader``) gets a view of its own: a tensor over the same storage
  with its own version counter (``tensor._version``, which every in-place op on it or on a view of
  it bumps), kept by the store and handed out again on that consumer's next read. An unnamed read
  gets a plain view, which shares the stored tensor's counter. The store checks the counters on
  each access to the key and raises `SharedTensorMutatedError` naming the consumer whose view was
  written (or the producer, for the stored tensor's own counter) and every consumer holding views.
  In debug mode a blake2b checksum of the bytes is checked too, which also catches writes that
  bypass the counters (``.data``, numpy views, foreign kernels). Each write is reported once: an
  entry the disk tier holds leaves memory (its next read loads the bytes as they were put), any
  other entry stays as written and its counters are re-armed.
- Inference tensors (made under ``torch.inference_mode``, as ComfyUI runs its nodes) track no version
  counter, so ``put`` stores a normal copy of one (made with inference mode off) instead of the
  tensor itself, and entries read from the disk tier are created with inference mode off.
- A key is bound to its producer, dtype and shape: putting the same key from another owner or with
  another dtype/shape raises `SharedKeyConflictError` unless ``replace=True``; the same owner putting
  an equal tensor again is a no-op.
- Accounting (bytes): ``bytes_held`` is what the entries in memory occupy; ``bytes_saved`` counts,
  for each ``get`` served from memory or disk, the bytes a consumer did not have to produce again.
- Memory budget: with ``memory_budget_bytes``, the entries in memory hold at most that many bytes.
  After each put (and each disk hit kept in memory) the least recently used entries (by last put or
  get) leave memory until the rest fits: with a disk tier they are written there first if they are
  not there already ("spilled") and come back on the next hit; without one they are dropped, and each drop
  is logged at WARNING with the key, its bytes and the budget (the consumer that comes for it will recompute
  it; `dropped` counts them).
  A spilled entry keeps no references (``release`` of it returns 0); its producer becomes
  ``"disk"`` when it comes back. ``spills`` counts entries that left memory for the budget.
- ``debug=True`` logs every read and write with owner ids on the ``h3director.shared_store`` logger.
- All methods are thread-safe (one re-entrant lock around the entries and counters).
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import threading
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from h3director.core.disk_tier import DiskTier
from h3director.errors import H3DirectorError, InvalidInputError

log = logging.getLogger("h3director.shared_store")

DISK_OWNER = "disk"


class SharedKeyConflictError(H3DirectorError):
    """A key is already bound to another producer, dtype or shape."""


class SharedTensorMutatedError(H3DirectorError):
    """A shared tensor was modified in place after it was put."""


@dataclass(frozen=True)
class StoreStats:
    """Bytes and counts of a `SharedTensorStore`."""

    entries: int
    bytes_held: int
    bytes_saved: int
    hits: int
    misses: int
    disk_hits: int
    mutations_detected: int
    references: int
    spills: int = 0                      # entries moved out of memory to keep within the budget
    memory_budget_bytes: int | None = None


@dataclass
class _Entry:
    tensor: torch.Tensor
    producer: str
    version: int
    checksum: bytes | None
    holders: Counter = field(default_factory=Counter)
    readers: list[str] = field(default_factory=list)
    views: dict[str, list] = field(default_factory=dict)   # consumer -> [its own view, version last checked]

    @property
    def nbytes(self) -> int:
        return self.tensor.numel() * self.tensor.element_size()


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's raw bytes in C order (copied to the CPU)."""
    return tensor.detach().to("cpu").contiguous().view(torch.uint8).flatten().numpy().tobytes()


def _tensor_digest(tensor: torch.Tensor) -> bytes:
    return hashlib.blake2b(_tensor_bytes(tensor), digest_size=16).digest()


def _feed(hasher, value) -> None:
    """Hash ``value`` with its type, so ``1``, ``1.0``, ``"1"`` and ``b"1"`` differ."""
    if isinstance(value, torch.Tensor):
        hasher.update(f"T{value.dtype}{tuple(value.shape)}".encode())
        hasher.update(_tensor_bytes(value))
    elif isinstance(value, bool) or value is None:
        hasher.update(f"B{value}".encode())
    elif isinstance(value, int):
        hasher.update(f"I{value}".encode())
    elif isinstance(value, float):
        hasher.update(b"F" + struct.pack("<d", value))
    elif isinstance(value, str):
        encoded = value.encode()
        hasher.update(b"S" + struct.pack("<Q", len(encoded)) + encoded)
    elif isinstance(value, (bytes, bytearray)):
        hasher.update(b"Y" + struct.pack("<Q", len(value)) + bytes(value))
    elif isinstance(value, Mapping):
        hasher.update(b"M" + struct.pack("<Q", len(value)))
        for k in sorted(value, key=repr):
            _feed(hasher, k)
            _feed(hasher, value[k])
    elif isinstance(value, Sequence):
        hasher.update(b"L" + struct.pack("<Q", len(value)))
        for item in value:
            _feed(hasher, item)
    else:
        raise InvalidInputError(
            f"content_key cannot hash a {type(value).__name__}; use tensors, numbers, strings, bytes, lists or dicts"
        )


def content_key(*inputs, model_fingerprint: str) -> str:
    """A 64-hex-digit blake2b key of ``inputs`` (tensors by dtype, shape and bytes) and the model fingerprint.

    Use it for conditioning outputs: the same prompt through the same text-encoder weights gives the
    same key; any change of input, dtype, shape or ``model_fingerprint`` gives another.
    """
    if not isinstance(model_fingerprint, str) or not model_fingerprint:
        raise InvalidInputError(f"model_fingerprint must be a non-empty string, got {model_fingerprint!r}")
    hasher = hashlib.blake2b(digest_size=32, person=b"h3dir-content")
    _feed(hasher, model_fingerprint)
    _feed(hasher, list(inputs))
    return hasher.hexdigest()


class SharedTensorStore:
    """Keyed, reference-counted tensors shared between owners (see the module docstring).

    ``disk_dir``: a folder for a `DiskTier` (entries persist there and are reloaded on a miss);
    ``disk_tier``: an existing tier instead; ``debug``: checksums and a log line per read and write;
    ``memory_budget_bytes``: at most this many bytes of entries in memory, least recently used spilled
    (None = no limit; see the module docstring).
    """

    def __init__(self, disk_dir: str | os.PathLike | None = None, debug: bool = False, *,
                 disk_tier: DiskTier | None = None, memory_budget_bytes: int | None = None) -> None:
        if disk_dir is not None and disk_tier is not None:
            raise InvalidInputError("give disk_dir or disk_tier, not both")
        if memory_budget_bytes is not None and (isinstance(memory_budget_bytes, bool)
                                                or not isinstance(memory_budget_bytes, int)
                                                or memory_budget_bytes <= 0):
            raise InvalidInputError(f"memory_budget_bytes must be a positive integer or None, got "
                                    f"{memory_budget_bytes!r}")
        self.debug = debug
        self.memory_budget_bytes = memory_budget_bytes
        self.disk = disk_tier if disk_tier is not None else (DiskTier(disk_dir) if disk_dir is not None else None)
        self._lock = threading.RLock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()   # least recently used first
        self._bytes_saved = 0
        self._hits = self._misses = self._disk_hits = self._mutations = self._spills = 0
        self.dropped = 0                 # entries dropped for the budget without a disk tier (logged at WARNING)
        self._dropped_written: set[str] = set()   # keys whose written-to entry left memory for its disk copy

    @classmethod
    def from_config(cls, config, disk_dir: str | os.PathLike | None = None) -> SharedTensorStore | None:
        """The store an `H3Config` asks for (``features().shared_memory``), or None."""
        features = config.features()
        if not features.shared_memory:
            return None
        return cls(disk_dir, debug=features.debug_shared_memory, memory_budget_bytes=config.shared_memory_budget_bytes)

    # ------------------------------------------------------------------ writes

    def put(self, key: str, tensor: torch.Tensor, owner: str, replace: bool = False, *, persist: bool = True) -> None:
        """Share ``tensor`` under ``key`` as produced by ``owner`` (who holds one reference).

        With a disk tier and ``persist``, the tensor is also written there (atomically).
        """
        self._check_args(key, owner)
        if not isinstance(tensor, torch.Tensor):
            raise InvalidInputError(f"put({key!r}) needs a torch.Tensor, got {type(tensor).__name__}")
        checksum = _tensor_digest(tensor) if self.debug else None
        with self._lock:
            current = self._entries.get(key)
            if current is not None and not replace:
                self._verify(key, current)
                if current.producer in (owner, DISK_OWNER) and self._same_tensor(current.tensor, tensor):
                    if current.producer == DISK_OWNER:       # the producer recomputed what the disk had
                        current.producer = owner
                        current.holders[owner] += 1
                    self._entries.move_to_end(key)
                    self._log("put (unchanged)", key, owner)
                    return
                raise SharedKeyConflictError(
                    f"key {key!r} is held by {current.producer!r} as {current.tensor.dtype} "
                    f"{tuple(current.tensor.shape)}; {owner!r} tried to put {tensor.dtype} {tuple(tensor.shape)} "
                    "(pass replace=True to overwrite)"
                )
            if tensor.is_inference():
                with torch.inference_mode(False):
                    tensor = tensor.clone()
            entry = _Entry(tensor.detach(), owner, tensor._version, checksum)
            entry.holders[owner] += 1
            self._entries.pop(key, None)
            self._entries[key] = entry
            self._log("put", key, owner)
        if self.disk is not None and persist:
            self.disk.put(key, tensor, metadata={"producer": owner})
        with self._lock:
            self._enforce_budget()

    def _enforce_budget(self) -> None:
        """Move least recently used entries out of memory until the rest fits the budget (lock held)."""
        if self.memory_budget_bytes is None:
            return
        held = sum(e.nbytes for e in self._entries.values())
        while held > self.memory_budget_bytes and self._entries:
            key, entry = self._entries.popitem(last=False)
            if self.disk is not None and not self.disk.contains(key):
                self.disk.put(key, entry.tensor, metadata={"producer": entry.producer})
            held -= entry.nbytes
            self._spills += 1
            if self.disk is None:
                self.dropped += 1
                log.warning("shared store: dropped %s (%d bytes) to keep within memory_budget_bytes=%d; there is "
                            "no disk tier to spill it to, so its next reader recomputes it", key, entry.nbytes,
                            self.memory_budget_bytes)
            self._log("spill" if self.disk is not None else "drop (over budget, no disk tier)", key, None)

    @staticmethod
    def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
        return a.dtype == b.dtype and a.shape == b.shape and a.device == b.device and bool(torch.equal(a, b))

    # ------------------------------------------------------------------ reads

    def get(self, key: str, owner: str | None = None, *, keep: bool = False,
            reader: str | None = None) -> torch.Tensor | None:
        """A read-only view of the tensor under ``key`` (None if absent); ``owner`` takes a reference.

        ``reader`` names a consumer without taking a reference (a node whose output the graph keeps).
        A named consumer (``owner`` or ``reader``) gets its own view, so a write through it is reported
        with its name (see the module docstring). An entry found only on the disk tier comes back into
        memory when ``owner`` is given or ``keep`` is true (a cache read), else it is read for this call
        only. Raises `SharedTensorMutatedError` when a view of the entry was written since the last check.
        """
        self._check_key(key)
        if owner is not None:
            self._check_owner(owner)
        if reader is not None:
            self._check_owner(reader)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None and self.disk is not None:
                entry = self._load_from_disk(key, keep=owner is not None or keep)
            if entry is None:
                self._misses += 1
                self._log("miss", key, owner)
                return None
            self._verify(key, entry)
            if key in self._entries:
                self._entries.move_to_end(key)
            self._hits += 1
            self._bytes_saved += entry.nbytes
            if owner is not None:
                entry.holders[owner] += 1
            consumer = owner if owner is not None else reader
            if consumer is not None and consumer not in entry.readers:
                entry.readers.append(consumer)
            self._log("get", key, consumer)
            view = self._view_for(entry, consumer)
            self._enforce_budget()
            return view

    @staticmethod
    def _view_for(entry: _Entry, consumer: str | None) -> torch.Tensor:
        """``consumer``'s own view of the entry's storage (made once, then reused), or a plain view."""
        if consumer is None:
            return entry.tensor.view(entry.tensor.shape)
        known = entry.views.get(consumer)
        if known is None:
            stored = entry.tensor
            # A new tensor over the same storage has a version counter of its own (a `.view` would share
            # the stored tensor's); made outside inference mode so that it has one at all.
            with torch.inference_mode(False):
                view = torch.empty(0, dtype=stored.dtype, device=stored.device).set_(
                    stored.untyped_storage(), stored.storage_offset(), stored.shape, stored.stride())
            known = entry.views[consumer] = [view, view._version]
        return known[0]

    def _load_from_disk(self, key: str, *, keep: bool) -> _Entry | None:
        """Read ``key`` from the disk tier; ``keep`` it in memory only if an owner takes a reference."""
        with torch.inference_mode(False):
            stored = self.disk.get(key)
        if stored is None or "tensor" not in stored:
            return None
        tensor = stored["tensor"]
        entry = _Entry(tensor, DISK_OWNER, tensor._version, _tensor_digest(tensor) if self.debug else None)
        if keep:
            self._entries[key] = entry
        self._disk_hits += 1
        return entry

    def release(self, key: str, owner: str) -> int:
        """Drop one of ``owner``'s references to ``key``; returns the references left (0: left memory)."""
        self._check_args(key, owner)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None and self._spilled(key):
                return 0
            if entry is None or entry.holders[owner] <= 0:
                raise InvalidInputError(f"{owner!r} holds no reference to shared key {key!r}")
            self._verify(key, entry)
            entry.holders[owner] -= 1
            if entry.holders[owner] == 0:
                del entry.holders[owner]
            left = sum(entry.holders.values())
            if left == 0:
                del self._entries[key]
            self._log("release", key, owner)
            return left

    def _spilled(self, key: str) -> bool:
        return ((self.memory_budget_bytes is not None or key in self._dropped_written)
                and self.disk is not None and self.disk.contains(key))

    def check(self, key: str | None = None) -> None:
        """Verify one entry in memory (or all) for in-place mutation; raises `SharedTensorMutatedError`."""
        with self._lock:
            if key is None:
                items = list(self._entries.items())
            else:
                items = [(key, self._entries[key])] if key in self._entries else []
            for name, entry in items:
                self._verify(name, entry)

    def _verify(self, key: str, entry: _Entry) -> None:
        writes = [f"by consumer {name!r} (version counter {seen} -> {view._version})"
                  for name, (view, seen) in entry.views.items() if view._version != seen]
        if entry.tensor._version != entry.version:
            writes.append(f"by its producer or an unnamed reader (version counter {entry.version} -> "
                          f"{entry.tensor._version})")
        if not writes and entry.checksum is not None and _tensor_digest(entry.tensor) != entry.checksum:
            writes.append("(checksum changed: a write that bypassed the version counters)")
        if not writes:
            return
        self._mutations += 1
        readers = ", ".join(repr(r) for r in entry.readers) or "no reader yet (the producer itself)"
        message = (
            f"shared tensor {key!r} produced by {entry.producer!r} was modified in place {'; '.join(writes)}; "
            f"owners holding views: {readers}. Shared tensors are read-only: clone before writing."
        )
        log.error(message)
        if self.disk is not None and self._entries.get(key) is entry and self.disk.contains(key):
            # the disk tier holds the bytes as they were put: the next read gets those, not the written ones
            del self._entries[key]
            self._dropped_written.add(key)
            raise SharedTensorMutatedError(message + " The entry left memory; its next read comes from the disk "
                                           "tier as it was written.")
        # Re-arm so the same mutation is reported once, not on every later access.
        entry.version = entry.tensor._version
        for known in entry.views.values():
            known[1] = known[0]._version
        if entry.checksum is not None:
            entry.checksum = _tensor_digest(entry.tensor)
        raise SharedTensorMutatedError(message)

    # ------------------------------------------------------------------ accounting

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def holders(self, key: str) -> dict[str, int]:
        with self._lock:
            entry = self._entries.get(key)
            return dict(entry.holders) if entry else {}

    def stats(self) -> StoreStats:
        with self._lock:
            return StoreStats(
                entries=len(self._entries),
                bytes_held=sum(e.nbytes for e in self._entries.values()),
                bytes_saved=self._bytes_saved,
                hits=self._hits,
                misses=self._misses,
                disk_hits=self._disk_hits,
                mutations_detected=self._mutations,
                references=sum(sum(e.holders.values()) for e in self._entries.values()),
                spills=self._spills,
                memory_budget_bytes=self.memory_budget_bytes,
            )

    # ------------------------------------------------------------------ helpers

    @staticmethod
    def _check_key(key: str) -> None:
        if not isinstance(key, str) or not key:
            raise InvalidInputError(f"shared keys are non-empty strings, got {key!r}")

    @staticmethod
    def _check_owner(owner: str) -> None:
        if not isinstance(owner, str) or not owner:
            raise InvalidInputError(f"owners are non-empty strings, got {owner!r}")

    def _check_args(self, key: str, owner: str) -> None:
        self._check_key(key)
        self._check_owner(owner)

    def _log(self, action: str, key: str, owner: str | None) -> None:
        if self.debug:
            log.info("shared %s key=%s owner=%s thread=%s", action, key, owner, threading.current_thread().name)


__all__ = ["SharedKeyConflictError", "SharedTensorMutatedError", "SharedTensorStore", "StoreStats",
           "content_key"]
