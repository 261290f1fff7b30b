"""The per-prompt memory ledger in ComfyUI: memory at the start and end of every prompt, what ComfyUI keeps
on purpose, and leaks (`h3director.core.ledger.MemoryLedger` with ComfyUI's holdings as the kept memory).

Hook. ComfyUI's public cache-provider API (`comfy_api.latest.Caching.register_provider` with a
`CacheProvider`) calls the provider's ``on_prompt_start(prompt_id)`` and ``on_prompt_end(prompt_id)`` in the
prompt worker thread around every prompt (`execution.PromptExecutor.execute_async`; the end from its
``finally``, so failed and interrupted prompts end too). `install` registers one provider, `LedgerHook`, that
uses only those two calls: its ``should_cache`` answers False, so ComfyUI never stores into it nor looks up
from it (ComfyUI still hashes each node's cache key on a miss or a store, as it does whenever a provider is
registered). No ComfyUI code is patched, and the start comes before ComfyUI prunes its caches for the
prompt, the end after the last node ran.

What ComfyUI keeps on purpose (`kept_memory`), counted as tensor storage bytes per device:

- ``models``: the models in `comfy.model_management.current_loaded_models` (each model patcher: the module's
  parameters and buffers, weight backups); ``details["models"]`` lists each with its class, device,
  ``loaded_bytes`` (`LoadedModel.model_loaded_memory`) and ``size_bytes`` (`model_memory`);
- ``output_cache``: the outputs of executed nodes ComfyUI caches between prompts
  (`PromptExecutor.caches.outputs`, its entries and sub-caches); the executor is a local of ComfyUI's prompt
  worker, found once with ``gc.get_referrers(execution.PromptExecutor)`` (one pass over the heap, at the first
  prompt) and then held by a weak reference.

Node instances in ComfyUI's object cache are not counted: what a node stores on itself from prompt to prompt
is the node's doing, and growth there is what the ledger must find.

Workflows. Prompts of the same workflow share a key: a hash of the graph (node ids, class types, links and
the names of literal inputs); literal values (seeds, texts, sizes) do not change it, so re-running a
workflow with a new seed continues its series. Leaks are named by that key and a label
(``prompt <id>: <class types>``); a suspect's ``node`` names the node classes defined in the module that holds
it (or the node class that holds it).
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import threading
import weakref
from typing import Any

from h3director.core.ledger import KeptMemory, LeakRule, MemoryLedger
from h3director.core.tensor_owners import Owner
from h3director.units import MiB

LOGGER = logging.getLogger("h3director.ledger")
STATS_PROMPTS = 10  # prompts of the ledger in /h3director/stats
LABEL_CLASSES = 4  # class types named in a prompt's label

_lock = threading.Lock()
_ledger: MemoryLedger | None = None
_hook: Any = None
_executor: weakref.ref | None = None
_reported_errors: set[str] = set()
_prompt_classes: set[str] = set()  # the class types of the prompt that ran last


def workflow_key(prompt: dict[str, Any]) -> str:
    """12 hex digits naming the graph of an API prompt: node ids, class types, links, literal input names."""
    graph = []
    for node_id in sorted(prompt, key=str):
        node = prompt[node_id] if isinstance(prompt[node_id], dict) else {}
        inputs = node.get("inputs") if isinstance(node.get("inputs"), dict) else {}
        wiring = sorted((name, [str(value[0]), value[1]] if _is_link(value) else None) for name, value in inputs.items())
        graph.append([str(node_id), node.get("class_type"), wiring])
    return hashlib.sha256(json.dumps(graph, sort_keys=True, default=str).encode()).hexdigest()[:12]


def _is_link(value: Any) -> bool:
    return isinstance(value, list) and len(value) == 2 and isinstance(value[0], (str, int)) and isinstance(value[1], int)


def prompt_label(prompt_id: str, prompt: dict[str, Any] | None) -> str:
    """``prompt <first 8 of the id>: <class types>`` (the first few, in node order)."""
    classes = list(dict.fromkeys(str(node.get("class_type")) for node in (prompt or {}).values() if isinstance(node, dict)))
    more = f" +{len(classes) - LABEL_CLASSES}" if len(classes) > LABEL_CLASSES else ""
    return f"prompt {str(prompt_id)[:8]}: {', '.join(classes[:LABEL_CLASSES])}{more}"


# --- what ComfyUI keeps on purpose -------------------------------------------------------------------


def prompt_executor() -> Any:
    """ComfyUI's `execution.PromptExecutor` (the prompt worker's), or None before it exists / outside ComfyUI."""
    global _executor
    executor = _executor() if _executor is not None else None
    if executor is not None:
        return executor
    try:
        import execution
    except ImportError:
        return None
    found = [obj for obj in gc.get_referrers(execution.PromptExecutor) if isinstance(obj, execution.PromptExecutor)]
    if not found:
        return None
    _executor = weakref.ref(found[0])
    return found[0]


def output_cache_entries(cache: Any) -> list[Any]:
    """The entries of one of ComfyUI's output caches and its sub-caches (none for its null cache)."""
    entries = list(getattr(cache, "cache", {}).values())
    for subcache in list(getattr(cache, "subcaches", {}).values()):
        entries += output_cache_entries(subcache)
    return entries


def kept_memory() -> KeptMemory:
    """What ComfyUI keeps on purpose now (see the module docstring)."""
    import comfy.model_management as mm

    models, described = [], []
    for loaded in list(mm.current_loaded_models):
        patcher = loaded.model
        if patcher is None:  # its model was freed; ComfyUI drops the entry at its next cleanup
            continue
        models.append(patcher)
        described.append({"name": type(getattr(patcher, "model", patcher)).__name__, "device": str(loaded.device),
                          "loaded_bytes": int(loaded.model_loaded_memory()), "size_bytes": int(loaded.model_memory())})
    executor = prompt_executor()
    caches = getattr(executor, "caches", None)
    entries = output_cache_entries(caches.outputs) if caches is not None else []
    return KeptMemory({"models": models, "output_cache": entries},
                      {"models": described, "output_cache_entries": len(entries),
                       "pinned_bytes": int(getattr(mm, "TOTAL_PINNED_MEMORY", 0))})


def node_of(owner: Owner) -> str | None:
    """The ComfyUI node classes an `Owner` belongs to: the node class that is the owner, or those defined in
    the owner's module, narrowed to the ones the last prompt ran when it ran any (comma-separated, at most
    five), or None."""
    try:
        import nodes
    except ImportError:
        return None
    mapping = dict(nodes.NODE_CLASS_MAPPINGS)
    if owner.kind == "object":
        named = [name for name, cls in mapping.items() if f"{cls.__module__}.{cls.__qualname__}" == owner.name]
        if named:
            return ", ".join(sorted(named))
    if not owner.module:
        return None
    named = sorted(name for name, cls in mapping.items()
                   if getattr(cls, "__module__", "") == owner.module or getattr(cls, "__module__", "").startswith(owner.module + "."))
    in_prompt = [name for name in named if name in _prompt_classes]
    return ", ".join((in_prompt or named)[:5]) or None


# --- the hook ----------------------------------------------------------------------------------------


def make_ledger(config, devices: list[str]) -> MemoryLedger:
    """The ledger with the pack config's leak rule (``monitor.leak_prompts``, ``monitor.leak_min_growth_mb``)."""
    rule = LeakRule(jobs=config.monitor.leak_prompts, min_growth_bytes=config.monitor.leak_min_growth_mb * MiB)
    return MemoryLedger(devices, rule, kept=kept_memory, name_node=node_of, unit="prompt", logger=LOGGER)


def _report_once(where: str, error: Exception) -> None:
    key = f"{where}:{type(error).__name__}"
    if key not in _reported_errors:
        _reported_errors.add(key)
        LOGGER.warning("H3 Director memory ledger: %s failed (%s: %s); the ledger skips it", where, type(error).__name__,
                       error, exc_info=error)


def on_prompt_start(prompt_id: str) -> None:
    """Begin a ledger job for ``prompt_id`` (keyed by its workflow)."""
    from h3director.comfy.runtime import running_prompt

    ledger = _ledger
    if ledger is None:
        return
    global _prompt_classes
    prompt = running_prompt(prompt_id)
    key = workflow_key(prompt) if prompt else f"prompt-{prompt_id}"
    _prompt_classes = {str(node.get("class_type")) for node in (prompt or {}).values() if isinstance(node, dict)}
    ledger.begin(key, prompt_label(prompt_id, prompt))


def on_prompt_end(prompt_id: str) -> None:
    """End the ledger job (status from ComfyUI's executor: ``success`` or ``error``)."""
    ledger = _ledger
    if ledger is None:
        return
    executor = prompt_executor()
    success = getattr(executor, "success", None)
    ledger.end("unknown" if success is None else "success" if success else "error")


def _hook_class():
    from comfy_api.latest import Caching

    class LedgerHook(Caching.CacheProvider):
        """A `CacheProvider` used only for its prompt start and end calls (it never caches anything)."""

        async def on_lookup(self, context):
            return None

        async def on_store(self, context, value):
            return None

        def should_cache(self, context, value=None) -> bool:
            return False

        def on_prompt_start(self, prompt_id: str) -> None:
            try:
                on_prompt_start(prompt_id)
            except Exception as error:  # the ledger must never disturb a prompt
                _report_once("the prompt start reading", error)

        def on_prompt_end(self, prompt_id: str) -> None:
            try:
                on_prompt_end(prompt_id)
            except Exception as error:
                _report_once("the prompt end reading", error)

    return LedgerHook


async def install(config) -> bool:
    """Create the ledger and register its hook with ComfyUI when ``monitor.prompt_ledger`` is on (once per
    process). Returns True when the ledger is installed."""
    global _ledger, _hook
    from comfy_api.latest import Caching

    from h3director.comfy.live import default_devices

    if not config.monitor.prompt_ledger:
        return False
    with _lock:
        if _hook is not None:
            return True
        _ledger = make_ledger(config, default_devices())
        _hook = _hook_class()()
    await Caching().register_provider(_hook)
    return True


def ledger_payload(config, prompts: int = STATS_PROMPTS) -> dict[str, Any] | None:
    """What `/h3director/stats` shows as ``ledger``: `MemoryLedger.to_dict` with the last ``prompts`` prompts,
    or None when ``monitor.prompt_ledger`` is off or the ledger is not installed (outside ComfyUI)."""
    ledger = _ledger
    if not config.monitor.prompt_ledger or ledger is None:
        return None
    return ledger.to_dict(jobs=prompts)


__all__ = ["install", "ledger_payload", "make_ledger", "prompt_label", "workflow_key"]
