"""Who holds a tensor, as far as Python can see: the chain of referrers up to a module, a function or an object.

`find_owners(tensors)` climbs ``gc.get_referrers`` from each tensor, level by level (all tensors share one
heap scan per level, so the cost is ``max_levels`` passes over the tracked objects), and describes the
first holder that has a name:

- a module global: ``Owner(kind="module", name="pkg.mod", path="LEAKED[3]")`` (the tensor is item 3 of the
  list the module's global ``LEAKED`` names);
- an object's attribute: ``Owner(kind="object", name="pkg.mod.Holder", path=".items[0]")``, and, when a
  module global holds that object, ``holder`` names it (``"pkg.mod.CACHE"``);
- a function's closure or defaults: ``Owner(kind="function", name="pkg.mod.make.<locals>.step")``.

Containers (dicts, lists, tuples, sets), tensors that view the tensor, and cells are climbed through
and add to ``path``; frames (running code's locals) are not owners and are skipped. A tensor whose chain
reaches no named holder within ``max_levels`` gets ``Owner(kind="unknown", path=...)`` with what was seen.
"""

from __future__ import annotations

import gc
import re
import sys
import types
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

_CONTAINERS = (dict, list, tuple, set, frozenset)
_OWN_DICT = "<__dict__>"  # the step from an object to its own attribute dict
_NOT_OWNERS = (types.FrameType, types.GeneratorType, types.CoroutineType, types.AsyncGeneratorType)


@dataclass(frozen=True)
class Owner:
    """A named holder of a tensor. ``kind``: "module", "object", "function" or "unknown"; ``name``: the
    module's name, the object's class (``module.QualName``) or the function's; ``module``: the module it is
    defined in; ``path``: how the tensor hangs from it; ``holder``: the module global that holds an owning
    object, when found."""

    kind: str
    name: str
    module: str | None
    path: str
    holder: str | None = None

    def describe(self) -> str:
        if self.kind == "module":
            return f"module {self.name}: {self.path}"
        where = f" (held by {self.holder})" if self.holder else ""
        if self.kind == "object":
            return f"{self.name}{self.path}{where}"
        if self.kind == "function":
            return f"function {self.name} (closure or defaults)"
        return "no named holder (a local variable of running code, or a C object)"


def _step(holder: Any, target: Any) -> str | None:
    """How ``holder`` refers to ``target`` (``[key]``, ``[3]``, ``.attr``), "" when it cannot say, None when
    it does not refer to it at all."""
    if isinstance(holder, dict):
        for key, value in holder.items():
            if value is target:
                return f"[{key!r}]"
        return None
    if isinstance(holder, (list, tuple)):
        for index, value in enumerate(holder):
            if value is target:
                return f"[{index}]"
        return None
    if not any(referent is target for referent in gc.get_referents(holder)):
        return None
    if isinstance(holder, (set, frozenset)):
        return "{...}"
    try:
        attributes = vars(holder)
    except TypeError:
        attributes = {}
    if attributes is target:
        return _OWN_DICT
    for name, value in attributes.items():
        if value is target:
            return f".{name}"
    if isinstance(holder, torch.Tensor):
        return "._base"
    return ""


def _module_dicts() -> dict[int, str]:
    names: dict[int, str] = {}
    for name, module in list(sys.modules.items()):
        if module is not None and not name.startswith("__mp_"):  # multiprocessing's alias of __main__
            names.setdefault(id(vars(module)), name)
    return names


def _global_name(module_dict: dict, target: Any) -> str:
    for key, value in module_dict.items():
        if value is target:
            return str(key)
    return "?"


@dataclass(slots=True)
class _Climb:
    """One path being climbed: the tensor it started from, the object reached, how the tensor (or the
    object owner found below, ``found``) hangs from it."""

    target_index: int
    obj: Any
    path: str
    found: Owner | None = None


def find_owners(tensors: Sequence[torch.Tensor], *, max_levels: int = 6, max_width: int = 8) -> list[Owner]:
    """One `Owner` per tensor, in order (see the module docstring). ``max_width`` referrers are followed per
    tensor and level."""
    module_dicts = _module_dicts()
    owners: list[Owner | None] = [None] * len(tensors)
    partial: list[Owner | None] = [None] * len(tensors)
    frontier = [_Climb(i, tensor, "") for i, tensor in enumerate(tensors)]
    ignored = {id(owners), id(partial), id(tensors), id(module_dicts)}
    for _level in range(max_levels):
        if not frontier:
            break
        objects = [climb.obj for climb in frontier]
        ignored |= {id(objects), id(frontier)}
        referrers = gc.get_referrers(*objects)
        ignored.add(id(referrers))
        next_frontier: list[_Climb] = []
        width = [0] * len(tensors)
        for climb in frontier:
            index = climb.target_index
            for holder in referrers:
                if owners[index] is not None or width[index] >= max_width:
                    break
                if id(holder) in ignored or isinstance(holder, _NOT_OWNERS) or isinstance(holder, _Climb):
                    continue
                step = _step(holder, climb.obj)
                if step is None:
                    continue
                width[index] += 1
                owner, follow = _classify(holder, step, climb, module_dicts)
                if owner is not None:
                    owners[index] = owner
                elif follow is not None:
                    next_frontier.append(follow)
                    if follow.found is not None and partial[index] is None:
                        partial[index] = follow.found
        del referrers, objects
        frontier = [climb for climb in next_frontier if owners[climb.target_index] is None]
    return [owner or partial[i] or Owner("unknown", "", None, "") for i, owner in enumerate(owners)]


def _classify(holder: Any, step: str, climb: _Climb, module_dicts: dict[int, str]) -> tuple[Owner | None, _Climb | None]:
    """What ``holder`` is for this climb: the final `Owner` (a module global, a function), or the climb to
    continue above it (through a container, or from the object owner it is: the climb then looks for the
    module global that holds it, and the object is the answer when there is none)."""
    if step == _OWN_DICT:  # ['name'] of an object's __dict__ reads .name
        step, path = "", re.sub(r"^\['([^']*)'\]", r".\1", climb.path)
        climb = _Climb(climb.target_index, climb.obj, path, climb.found)
    if isinstance(holder, dict) and id(holder) in module_dicts:
        module = module_dicts[id(holder)]
        name = _global_name(holder, climb.obj)
        if climb.found is not None:
            found = climb.found
            return Owner(found.kind, found.name, found.module, found.path, holder=f"{module}.{name}{climb.path}"), None
        return Owner("module", module, module, f"{name}{climb.path}"), None
    if isinstance(holder, types.FunctionType):
        if climb.found is not None:
            found = climb.found
            return Owner(found.kind, found.name, found.module, found.path,
                         holder=f"{holder.__module__}.{holder.__qualname__}"), None
        return Owner("function", f"{holder.__module__}.{holder.__qualname__}", holder.__module__, ""), None
    if isinstance(holder, (*_CONTAINERS, torch.Tensor, types.CellType, types.ModuleType)) or climb.found is not None:
        return None, _Climb(climb.target_index, holder, step + climb.path, climb.found)
    cls = type(holder)
    owner = Owner("object", f"{cls.__module__}.{cls.__qualname__}", cls.__module__, step + climb.path)
    return None, _Climb(climb.target_index, holder, "", owner)


__all__ = ["Owner", "find_owners"]
