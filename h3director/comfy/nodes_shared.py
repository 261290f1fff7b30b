"""H3Director Shared Write / Shared Read: reuse conditioning by key through the shared tensor store.

ComfyUI CONDITIONING is a list of ``[tensor, dict]`` pairs whose dicts hold tensors, numbers,
strings and lists/dicts of those (e.g. H3's `minimax_keyframes`). It is flattened into tensors
(stored in `SharedTensorStore`, which spills to its disk tier under ComfyUI's temp folder) plus a
JSON skeleton saying where each tensor goes (stored as a uint8 tensor under ``<key>-skeleton``),
so a read rebuilds the same structure. Writing a key that holds different content raises the
store's conflict error, shown on the node in the UI; `replace` overwrites on purpose.

One physical copy: a read hands out read-only views of the store's tensors (no clone), so any number
of Shared Read nodes (and the Shared Write's own output) hold one copy of the conditioning's bytes.
Each reading node gets views of its own (named ``comfy-node-<id>``): a node downstream that writes
into one in place is reported by the store's `SharedTensorMutatedError` naming that reading node, on
the next access to the key (the next read of it in this or a later prompt). ComfyUI runs nodes under
``torch.inference_mode``, whose tensors have no version counter, so the store keeps a normal copy of
the writer's input (`SharedTensorStore.put`): the writer's upstream output and the store's copy are
two copies, every reader after that shares the store's.

The nodes use the store only where the configuration asks for it: memory level 3 and
``shared_memory_enabled`` (``features().cross_node_shared_memory``); otherwise they refuse with a
message naming the switch. The store keeps at most ``shared_memory_budget_mb`` in memory, the least
recently used entries spilled to its disk tier.
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any

import torch
from comfy_api.latest import io

from h3director.errors import InvalidInputError

SKELETON = "skeleton"
KEY_RE = re.compile(r"^[A-Za-z0-9_]{1,100}$")  # store keys become disk-tier file names
_store_lock = threading.Lock()
_store = None


def shared_store():
    """The process-wide `SharedTensorStore`: disk tier in ComfyUI's temp folder, memory budget
    ``shared_memory_budget_mb`` and debug checks from the config."""
    global _store
    with _store_lock:
        if _store is None:
            from h3director.comfy import runtime
            from h3director.comfy.settings import pack_config
            from h3director.core.shared_store import SharedTensorStore

            config = pack_config()
            _store = SharedTensorStore(disk_dir=runtime.temp_directory() / "h3director_shared",
                                       debug=config.features().debug_shared_memory,
                                       memory_budget_bytes=config.shared_memory_budget_bytes)
        return _store


def existing_store():
    """The store if a node has made it, else None (the stats route reads this; it never creates one)."""
    return _store


def require_shared_memory() -> None:
    """Refuse unless the configuration turns the shared store on for the nodes."""
    from h3director.comfy.settings import pack_config

    config = pack_config()
    if config.features().cross_node_shared_memory:
        return
    why = ("shared_memory_enabled is false" if config.memory_optimization_level >= 3
           else f"memory_optimization_level is {config.memory_optimization_level}")
    raise InvalidInputError(f"the shared store is off ({why}): Shared Write/Read need memory_optimization_level 3 "
                            "and shared_memory_enabled: true in h3_config.yaml (restart ComfyUI after editing)")


def flatten(value: Any, tensors: list[torch.Tensor], path: str = "conditioning") -> Any:
    """JSON skeleton of `value` with each tensor replaced by ``{"#tensor": index}`` (appended to `tensors`)."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return {"#tensor": len(tensors) - 1}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        items = [flatten(v, tensors, f"{path}[{i}]") for i, v in enumerate(value)]
        return {"#tuple": items} if isinstance(value, tuple) else items
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise InvalidInputError(f"{path}: only string keys can be shared, got {list(value)!r}")
        return {"#dict": {k: flatten(v, tensors, f"{path}.{k}") for k, v in value.items()}}
    raise InvalidInputError(f"{path}: a {type(value).__name__} cannot be shared (tensors, numbers, strings, "
                            "lists and dicts only)")


def unflatten(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    """Inverse of `flatten`."""
    if isinstance(skeleton, list):
        return [unflatten(v, tensors) for v in skeleton]
    if isinstance(skeleton, dict):
        if "#tensor" in skeleton:
            return tensors[skeleton["#tensor"]]
        if "#tuple" in skeleton:
            return tuple(unflatten(v, tensors) for v in skeleton["#tuple"])
        return {k: unflatten(v, tensors) for k, v in skeleton["#dict"].items()}
    return skeleton


def _check_key(key: str) -> str:
    key = str(key).strip()
    if not KEY_RE.match(key):
        raise InvalidInputError(f"shared key must be 1-100 letters, digits or '_', got {key!r}")
    return key


def write_shared(key: str, conditioning: Any, owner: str, replace: bool) -> Any:
    """Store `conditioning` under `key` (level 3 only); returns the stored conditioning as `owner`'s
    read-only views (`conditioning` itself when the memory budget did not keep it in memory)."""
    key = _check_key(key)
    require_shared_memory()
    store = shared_store()
    put_conditioning(store, key, conditioning, owner, replace)
    stored = get_conditioning(store, key, reader=owner)
    return conditioning if stored is None else stored


def put_conditioning(store, key: str, conditioning: Any, owner: str, replace: bool) -> int:
    """Flatten `conditioning` into `store` under `key` (no level check); returns the tensors stored."""
    tensors: list[torch.Tensor] = []
    skeleton = json.dumps(flatten(conditioning, tensors)).encode()
    for index, tensor in enumerate(tensors):
        store.put(f"{key}-t{index}", tensor.detach().contiguous(), owner, replace=replace)
    # the skeleton last: a reader that finds it finds every tensor
    store.put(f"{key}-{SKELETON}", torch.frombuffer(bytearray(skeleton), dtype=torch.uint8), owner, replace=replace)
    return len(tensors)


def read_shared(key: str, reader: str | None = None) -> Any:
    """The conditioning a Shared Write stored under `key` (level 3 only), as read-only views of the
    store's tensors (`reader`'s own, see the module docstring); an entry found only on the disk tier is
    brought back into memory. Raises `InvalidInputError` when nothing is stored under `key`,
    `SharedTensorMutatedError` when a view of it was written in place."""
    key = _check_key(key)
    require_shared_memory()
    store = shared_store()
    found = get_conditioning(store, key, keep=True, reader=reader)
    if found is None:
        known = sorted(k[:-len(SKELETON) - 1] for k in store.keys() if k.endswith(f"-{SKELETON}"))
        raise InvalidInputError(f"no conditioning shared under key {key!r}; shared keys: {known or 'none'} "
                                "(run a Shared Write with this key first)")
    return found


def get_conditioning(store, key: str, *, keep: bool = False, reader: str | None = None) -> Any | None:
    """The conditioning under `key` in `store`, or None when there is none. Its tensors are read-only
    views of the store's (one physical copy for every reader; lists and dicts are new per call);
    `reader` names the consumer a write through them is reported as. ``keep`` brings entries found
    only on the disk tier back into memory."""
    raw = store.get(f"{key}-{SKELETON}", keep=keep)
    if raw is None:
        return None
    skeleton = json.loads(raw.cpu().numpy().tobytes().decode())
    tensors = []
    for index in range(_tensor_count(skeleton)):
        tensor = store.get(f"{key}-t{index}", keep=keep, reader=reader)
        if tensor is None:
            raise InvalidInputError(f"shared key {key!r} is incomplete: tensor {index} is missing")
        tensors.append(tensor)
    return unflatten(skeleton, tensors)


def _tensor_count(skeleton: Any) -> int:
    if isinstance(skeleton, list):
        return sum(_tensor_count(v) for v in skeleton)
    if isinstance(skeleton, dict):
        if "#tensor" in skeleton:
            return 1
        return sum(_tensor_count(v) for v in skeleton.values())
    return 0


class SharedWrite(io.ComfyNode):
    """CONDITIONING -> CONDITIONING: stores `conditioning` under `key` (str) in the pack's shared store and
    returns a read-only view of the stored copy. Without `replace`, a key that already holds different
    conditioning raises the store's conflict error; a consumer that writes into a view gets
    SharedTensorMutatedError naming it."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorSharedWrite",
            display_name="H3Director Shared Write",
            category="H3 Director/shared memory",
            description="Stores conditioning under a key for Shared Read nodes (this or later prompts). "
                        "Writing different content to a used key is an error unless `replace` is on. Its output "
                        "and every Shared Read of the key share the stored copy (read-only: a node that writes "
                        "into it in place is reported).",
            inputs=[io.Conditioning.Input("conditioning"), io.String.Input("key", default="prompt"),
                    io.Boolean.Input("replace", default=False)],
            outputs=[io.Conditioning.Output(display_name="conditioning"), io.String.Output(display_name="key")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def execute(cls, conditioning, key, replace) -> io.NodeOutput:
        stored = write_shared(key, conditioning, owner=f"comfy-node-{cls.hidden.unique_id}", replace=replace)
        return io.NodeOutput(stored, _check_key(key))


class SharedRead(io.ComfyNode):
    """`key` (str) -> CONDITIONING: a read-only view of what Shared Write stored under `key` (memory or the disk
    tier), one storage for every reader. Raises InvalidInputError for a key nothing is stored under;
    SharedTensorMutatedError, naming the consumer, when a view was written."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        return io.Schema(
            node_id="H3DirectorSharedRead",
            display_name="H3Director Shared Read",
            category="H3 Director/shared memory",
            description="Reads conditioning a Shared Write node stored under `key` (from memory or the disk tier), "
                        "as read-only views of the stored copy: no copy per reader.",
            inputs=[io.String.Input("key", default="prompt"),
                    io.AnyType.Input("after", optional=True, tooltip="Connect the writer's output to order the read.")],
            outputs=[io.Conditioning.Output(display_name="conditioning")],
            hidden=[io.Hidden.unique_id],
        )

    @classmethod
    def fingerprint_inputs(cls, key, after=None) -> Any:
        return float("nan")  # the store's content can change between prompts

    @classmethod
    def execute(cls, key, after=None) -> io.NodeOutput:
        return io.NodeOutput(read_shared(key, reader=f"comfy-node-{cls.hidden.unique_id}"))


__all__ = ["SharedRead", "SharedWrite", "existing_store", "flatten", "get_conditioning", "put_conditioning",
           "read_shared", "shared_store", "write_shared"]
