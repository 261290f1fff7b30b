"""Apply a device placement (`h3director.plan.placement`) to ComfyUI's MODEL, CLIP and VAE objects.

ComfyUI runs a model on its patcher's `load_device` and parks it on its `offload_device` when it is
unloaded (`comfy.model_patcher.ModelPatcher`); a CLIP carries its patcher as `clip.patcher` (the text
encoder module is `clip.cond_stage_model`, the patcher's model), and a VAE has its own `vae.device` (where
decode runs) beside `vae.patcher`. ComfyUI loads a model onto its load device when a node needs it and,
before that, unloads other models from THAT device until the new one fits
(`comfy.model_management.free_memory(required, device)`): the "phased" policy of the planner when memory is
short, and resident when there is room.

What `place_objects` does, per object (the inputs are never mutated: each result is a clone):

- the same device as now: a clone of the patcher (offload device unchanged);
- "cpu": a clone whose load and offload devices are the CPU (a dynamic patcher is cloned as a plain one,
  whose weights can live on the CPU);
- another accelerator: `ModelPatcher.deepclone_multigpu(new_load_device)`, ComfyUI's own way to give a model
  a second, independent copy of its weights for another device (it reloads them through the loader's
  `cached_patcher_init`); a model whose loader registered none is refused, because sharing one module
  between two load devices would move weights under the other patcher.

ComfyUI's own selector nodes (Select Model / CLIP / VAE Device, `comfy_extras/nodes_multigpu.py`) do the
same per object, and pass an object through unchanged when its device does not exist; here every device is
checked first and a missing one is an error naming the devices this machine has, before anything changes.
Exact by construction: only where the weights live changes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from h3director.errors import InvalidInputError
from h3director.integrations.placement_devices import resolve_device
from h3director.plan.placement import parse_placement


@dataclass(frozen=True)
class Placed:
    """The placed objects (None where no input came) and one report line per component."""

    model: object
    clip: object
    vae: object
    audio_vae: object
    report: str


def _needs_second_copy(patcher, device) -> bool:
    return device.type != "cpu" and patcher.load_device != device


def _retarget(patcher, device):
    """A clone of `patcher` that loads on `device` (see the module docstring)."""
    if device.type == "cpu":
        clone = patcher.clone(disable_dynamic=True) if patcher.is_dynamic() else patcher.clone()
        clone.load_device = device
        clone.offload_device = device
        return clone
    if patcher.load_device == device:
        return patcher.clone()
    clone = patcher.deepclone_multigpu(new_load_device=device)
    if hasattr(clone, "register_load_device"):
        clone.register_load_device(clone.load_device)
    return clone


def _model(model, device):
    import comfy.model_management

    placed = _retarget(model, device)
    cast = comfy.model_management.unet_manual_cast(placed.model_dtype(), device)
    if cast is not None:               # compute in a dtype the device supports, as ComfyUI's loaders do
        placed.set_model_compute_dtype(cast)
    return placed


def _clip(clip, device):
    placed = clip.clone()
    placed.patcher = _retarget(clip.patcher, device)
    placed.cond_stage_model = placed.patcher.model      # a second copy brings its own module
    return placed


def _vae(vae, device):
    placed = copy.copy(vae)                              # ComfyUI's VAE has no clone()
    placed.patcher = _retarget(vae.patcher, device)
    placed.first_stage_model = placed.patcher.model
    placed.device = device
    return placed


def _describe(component: str, obj, requested) -> str:
    if obj is None:
        return f"{component}: not connected" + (f" (placement asked {requested})" if requested else "")
    patcher = obj if component == "dit" else obj.patcher
    where = f"load_device {patcher.load_device}, offload_device {patcher.offload_device}"
    if component in ("video_vae", "audio_vae"):
        where = f"device {obj.device}, " + where
    return f"{component}: {where}" + ("" if requested else " (unchanged: not in the placement)")


def place_objects(placement: str, model=None, clip=None, vae=None, audio_vae=None) -> Placed:
    """Place the given objects by `placement` ("dit=cuda:0,text_encoder=cuda:1,..." as `h3director plan
    --devices` prints; aliases model, clip, vae). Components without an entry, or without an input, are
    left as they are. Raises `InvalidInputError` before anything is changed: a malformed placement, a
    device this machine does not have, or a move to another accelerator for a model whose loader cannot
    make a second copy (no `cached_patcher_init`). Returns `Placed`: the placed clones and one report line
    per component."""
    wanted = parse_placement(placement)
    objects = {"dit": model, "text_encoder": clip, "video_vae": vae, "audio_vae": audio_vae}
    devices = {component: resolve_device(name) for component, name in wanted.items()}
    for component, device in devices.items():
        obj = objects[component]
        if obj is None:
            continue
        patcher = obj if component == "dit" else obj.patcher
        if _needs_second_copy(patcher, device) and getattr(patcher, "cached_patcher_init", None) is None:
            raise InvalidInputError(
                f"{component} cannot move from {patcher.load_device} to {device}: its loader gives no way to "
                "load a second copy (cached_patcher_init); load it with a core loader (UNETLoader, CLIPLoader, "
                "VAELoader, CheckpointLoaderSimple)")
    placed = dict(objects)
    apply = {"dit": _model, "text_encoder": _clip, "video_vae": _vae, "audio_vae": _vae}
    for component, device in devices.items():
        if objects[component] is not None:
            placed[component] = apply[component](objects[component], device)
    lines = [_describe(c, placed[c], wanted.get(c)) for c in ("dit", "text_encoder", "video_vae", "audio_vae")]
    return Placed(placed["dit"], placed["text_encoder"], placed["video_vae"], placed["audio_vae"], "\n".join(lines))


__all__ = ["Placed", "place_objects"]
