"""Other packs' patches on ComfyUI's H3 DiT blocks, as `H3Director DiT Memory` meets them (either order).

ComfyUI lets a pack change a block in two ways: an object patch (`ModelPatcher.add_object_patch` on
`diffusion_model.blocks.N.forward`, `.attn.forward`, `.mlp.forward`, a layer's `forward`, or a module
itself), which `patch_model` sets on the model while it runs; or a block replacement
(`set_model_patch_replace(patch, "dit", "double_block", N)`), which the model's block loop calls instead of
the block. DiT Memory runs a block through its own code (`comfy_dit.run_block`), which does not call the
block's, the attention's or the FFN's `forward`, nor a projection's `forward` when it slices weights, so a
patch there would be skipped. This module finds such patches and says which pack's code runs for which part.

Behaviour (the caller's, `comfy_dit`): the director's tier steps aside for the part another pack patched, in
either order, and reports it:

- part "block" (the block's `forward`, the block object, or a block replacement of another pack): that
  block runs the other pack's code (the model's own block call, or that replacement); no director tier;
- part "attention" (`attn.forward`, the attention module, or any layer under it): that block's attention
  branch is the module call `block.attn(h, ...)` (the patch runs); the director's FFN tier still runs;
- part "ffn" (`mlp.forward`, the MLP module, or any layer under it): the FFN half is the stock one with
  the module call `block.mlp(h)`; the director's attention tier still runs;
- other layers of the block (norms, the modulation projection) are called as modules by the director's
  code too, so their patches run; they are listed with part "called".

A patch on the diffusion model itself (`forward`, `_forward`, `blocks`) may keep the block loop from running
the director's block entries at all; the forward's report says how many blocks the director ran.

Units: block indices are the DiT's block numbers (0-based).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import PurePath

PARTS = ("block", "attention", "ffn", "called")
"""What a patch takes over: the whole block, its attention branch, its FFN half, or a layer the director's
code calls as a module (the patch runs inside the director's tier)."""

MODEL_TARGETS = ("forward", "_forward", "blocks")
"""Attributes of the diffusion model whose patching may bypass the block loop's replacement entries."""

_SUBPARTS = {"attn": "attention", "mlp": "ffn"}


@dataclass(frozen=True)
class ForeignPatch:
    """One patch of another pack. `block`: its block index (None: on the diffusion model itself); `part`: one
    of `PARTS` ("model" for a diffusion-model patch); `target`: where it sits (the object-patch path below
    `diffusion_model.`, or "patches_replace['dit'][('double_block', N)]"); `origin`: whose code it is
    (`origin_of`)."""

    block: int | None
    part: str
    target: str
    origin: str


def pack_of(module_name: str | None) -> str:
    """The pack a Python module belongs to: the folder under ComfyUI's `custom_nodes` it was loaded from;
    "ComfyUI" for ComfyUI's own modules; else the module's top-level name."""
    if not module_name:
        return "unknown"
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None) or module_name
    parts = PurePath(path).parts
    if "custom_nodes" in parts:
        index = len(parts) - 1 - parts[::-1].index("custom_nodes")
        if index + 1 < len(parts):
            return parts[index + 1].removesuffix(".py")
    top = module_name.split(".")[0]
    if top in ("comfy", "comfy_extras", "comfy_api"):
        return "ComfyUI"
    return PurePath(top).name or top


def origin_of(obj) -> str:
    """"<pack>: <module tail>.<qualname>" of a patch (a function, bound method, callable object or module)."""
    fn = getattr(obj, "__func__", obj)
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if module is None or qualname is None or not callable(fn) or isinstance(fn, type):
        module, qualname = type(obj).__module__, type(obj).__qualname__
    tail = PurePath(module).name if "/" in module or "\\" in module else module
    return f"{pack_of(module)}: {tail}.{qualname}"


def is_own_forward(obj) -> bool:
    """Whether `obj` is a module's own class `forward` bound to it: what ComfyUI sets back on a module when it
    removes an object patch of `forward` (it restores the value it read, the bound method), not a patch."""
    owner = getattr(obj, "__self__", None)
    return owner is not None and getattr(obj, "__func__", None) is getattr(type(owner), "forward", None)


def part_of(path: str) -> str:
    """The part a patch at `path` (relative to a block: "" or "forward" the block, "attn.forward",
    "mlp.fc1", "norm2.forward", ...) takes over."""
    if path in ("", "forward"):
        return "block"
    return _SUBPARTS.get(path.split(".")[0], "called")


def _block_path(name: str) -> tuple[int, str] | None:
    """(N, rest) of an object-patch key "diffusion_model.blocks.N[.rest]"; None for any other key."""
    prefix = "diffusion_model.blocks."
    if not name.startswith(prefix):
        return None
    index, _, rest = name[len(prefix):].partition(".")
    return (int(index), rest) if index.isdigit() else None


def _replace_entries(transformer_options: dict, patch_name: str, patch_block: str) -> dict:
    replaced = (transformer_options or {}).get("patches_replace", {}).get(patch_name, {})
    return {key[1]: entry for key, entry in replaced.items()
            if isinstance(key, tuple) and len(key) == 2 and key[0] == patch_block}


def unwrap(entry, own: tuple[type, ...]):
    """The first entry in a chain of this project's block entries (`own` types, each holding the entry it
    wraps in `inner`) that is not one of them, or None when the chain ends in ours."""
    seen = 0
    while isinstance(entry, own) and seen < 16:
        entry = getattr(entry, "inner", None)
        seen += 1
    return entry


def scan_patcher(model_patcher, patch_name: str, patch_block: str, own: tuple[type, ...]) -> list[ForeignPatch]:
    """Other packs' patches registered on `model_patcher` (before anything is loaded): object patches under
    `diffusion_model.blocks`, or on the diffusion model's `MODEL_TARGETS`, and block replacements that are
    not this project's (`own`: the types of our own entries; one holding another pack's entry in `inner`
    counts as that pack's)."""
    found = []
    for name, obj in sorted(getattr(model_patcher, "object_patches", {}).items()):
        if is_own_forward(obj):
            continue
        located = _block_path(name)
        if located is not None:
            index, rest = located
            found.append(ForeignPatch(index, part_of(rest), name.removeprefix("diffusion_model."), origin_of(obj)))
        elif name == "diffusion_model" or name.removeprefix("diffusion_model.") in MODEL_TARGETS:
            found.append(ForeignPatch(None, "model", name, origin_of(obj)))
    options = model_patcher.model_options.get("transformer_options", {})
    return found + _foreign_entries(options, patch_name, patch_block, own)


def _foreign_entries(transformer_options: dict, patch_name: str, patch_block: str,
                     own: tuple[type, ...]) -> list[ForeignPatch]:
    """The block replacements in `transformer_options` that are another pack's (an entry of ours holding one in
    `inner` counts as that pack's), by block index."""
    found = []
    for index, entry in sorted(_replace_entries(transformer_options, patch_name, patch_block).items()):
        other = unwrap(entry, own)
        if other is not None:
            found.append(ForeignPatch(index, "block", f"patches_replace['{patch_name}'][('{patch_block}', {index})]",
                                      origin_of(other)))
    return found


def scan_model(diffusion_model, transformer_options: dict, patch_name: str, patch_block: str,
               own: tuple[type, ...]) -> list[ForeignPatch]:
    """Other packs' patches in force for one forward: what `patch_model` set on `diffusion_model` (a `forward`
    in a module's own `__dict__` under a block, or a block / attention / MLP object of another class than
    ComfyUI's), and the block entries of this forward's `transformer_options` that are not ours (`own`)."""
    import comfy.ldm.minimax.model as h3

    found = []
    for name in MODEL_TARGETS[:2]:
        if name in vars(diffusion_model) and not is_own_forward(vars(diffusion_model)[name]):
            found.append(ForeignPatch(None, "model", f"diffusion_model.{name}", origin_of(vars(diffusion_model)[name])))
    expected = {"": h3.DiTBlock, "attn": h3.Attention, "mlp": h3.MLP}
    for index, block in enumerate(diffusion_model.blocks):
        for path, cls in expected.items():
            module = block if not path else getattr(block, path, None)
            if module is not None and type(module) is not cls:
                found.append(ForeignPatch(index, part_of(path), f"blocks.{index}{'.' + path if path else ''}",
                                          origin_of(module)))
        if type(block) is not h3.DiTBlock:
            continue
        for path, module in block.named_modules():
            patched = vars(module).get("forward")
            if patched is not None and not is_own_forward(patched):
                target = ".".join(p for p in (f"blocks.{index}", path, "forward") if p)
                found.append(ForeignPatch(index, part_of(f"{path}.forward" if path else "forward"), target,
                                          origin_of(patched)))
    return found + _foreign_entries(transformer_options, patch_name, patch_block, own)


def parts_by_block(patches: list[ForeignPatch]) -> dict[int, dict[str, str]]:
    """{block: {part: origin}} of the patches that take a part over ("block", "attention", "ffn")."""
    taken: dict[int, dict[str, str]] = {}
    for patch in patches:
        if patch.block is not None and patch.part in ("block", "attention", "ffn"):
            taken.setdefault(patch.block, {}).setdefault(patch.part, patch.origin)
    return taken


def block_list(indices) -> str:
    """"0-3, 7" for a set of block indices."""
    ordered = sorted(set(indices))
    spans: list[list[int]] = []
    for i in ordered:
        if spans and i == spans[-1][1] + 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _stepped(part: str) -> str:
    return {"block": "the director's tier stepped aside for the whole block",
            "attention": "the director's attention tier (head groups, lifetimes) stepped aside",
            "ffn": "the director's FFN tier (row chunks, lifetimes) stepped aside",
            "called": "called inside the director's tier (it runs)",
            "model": "may bypass the block loop's entries"}[part]


def describe_patches(patches: list[ForeignPatch]) -> list[str]:
    """One line per (origin, part, target kind): whose code, where, on which blocks, and what the director did."""
    groups: dict[tuple[str, str, str], set[int]] = {}
    for patch in patches:
        kind = patch.target if patch.block is None else _generic(patch.target, patch.block)
        groups.setdefault((patch.origin, patch.part, kind), set())
        if patch.block is not None:
            groups[(patch.origin, patch.part, kind)].add(patch.block)
    lines = []
    for (origin, part, kind), blocks in groups.items():
        where = f"blocks {block_list(blocks)}" if blocks else "the diffusion model"
        lines.append(f"{origin} patches {kind} on {where}: {_stepped(part)}")
    return lines


def _generic(target: str, index: int) -> str:
    return target.replace(f"blocks.{index}.", "blocks.N.").replace(f"blocks.{index}", "blocks.N").replace(
        f"', {index})]", "', N)]")


def runs_summary(ran: dict[int, dict[str, str]], blocks: int,
                 taken: dict[int, dict[str, str]] | None = None) -> dict[str, dict[str, list[int]]]:
    """{"attention" | "ffn": {whose code ("H3 Director", "ComfyUI stock block" or an origin): [blocks]}} from the
    per-block record `ran` ({block: {"attention": who, "ffn": who}}) of the director's block entries; a block
    absent from `ran` (its entry did not run) is another pack's where `taken` (`parts_by_block`) gives it one,
    else "not through the director's block entry"."""
    summary: dict[str, dict[str, list[int]]] = {"attention": {}, "ffn": {}}
    for index in range(blocks):
        record = ran.get(index)
        other = (taken or {}).get(index, {}).get("block", "not through the director's block entry")
        for part in ("attention", "ffn"):
            who = record[part] if record is not None else other
            summary[part].setdefault(who, []).append(index)
    return summary


def summary_lines(summary: dict[str, dict[str, list[int]]]) -> list[str]:
    """"attention: H3 Director on blocks 0-3; ComfyUI-KJNodes: ... on blocks 4-7" per part."""
    return [f"{part}: " + "; ".join(f"{who} on blocks {block_list(indices)}" for who, indices in owners.items())
            for part, owners in summary.items()]


__all__ = ["MODEL_TARGETS", "PARTS", "ForeignPatch", "block_list", "describe_patches", "origin_of", "pack_of",
           "is_own_forward", "part_of", "parts_by_block", "runs_summary", "scan_model", "scan_patcher", "summary_lines", "unwrap"]
