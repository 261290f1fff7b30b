"""Apply a device placement (`h3director.plan.placement`) to a diffusers MiniMax H3 pipeline's components.

diffusers' H3 integration is the modular `MiniMaxH3ModularPipeline`. Its blocks keep every pipeline tensor
(latents, packed positions, text embeddings, schedulers' grids) on `pipe._execution_device`, which is the
device of its first model component (the text encoder when one is loaded), and hand those tensors to each
model: `text_encoder.model(...)` (the Qwen3-VL stack, called as a submodule), `transformer(...)` (or
`transformer_ref`), `vae.encode` / `vae.decode`, `audio_vae.encode` / `audio_vae.decode`.

`apply_placement(pipe, placement)` moves each component named in the placement to its device
(`module.to(device)`) and makes each call meet its inputs there:

- forward calls (the transformer, the text encoder's stack) get accelerate's `AlignDevicesHook(execution_device,
  io_same_device=True)`, the hook diffusers' and accelerate's device maps use: inputs are moved to the module's
  device and outputs back to the device the inputs came from;
- the VAEs' `encode` / `decode` are methods, not `forward`, which that hook does not see (diffusers'
  `apply_forward_hook` only fires the hook's `pre_forward(module)` and drops the moved arguments), so they are
  wrapped on the instance to move their tensor arguments and results the same way (accelerate's
  `send_to_device`).

Per denoising step that moves the transformer's inputs and outputs (packed latents, text embeddings: megabytes
for H3) between the execution device and the DiT's device. Components stay loaded where they were put: a
`Placement` planned with the "phased" policy (components unloaded after their phase) is refused. Exact by
construction: only where tensors live changes. `remove_placement(pipe)` takes the hooks and wrappers off
(the components stay where they are).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from h3director.errors import InvalidInputError
from h3director.integrations.placement_devices import resolve_device
from h3director.plan.placement import COMPONENTS, parse_placement

# The pipeline attribute(s) that hold each planner component, first present wins.
PIPELINE_ATTRIBUTES = {"dit": ("transformer", "transformer_ref"), "text_encoder": ("text_encoder",),
                       "video_vae": ("vae",), "audio_vae": ("audio_vae",)}
ALIGNED_METHODS = ("encode", "decode")
_ORIGINAL = "_h3director_original"
_OURS = "_h3director_placement"         # set on the hooks apply_placement adds


def _wanted(placement) -> dict[str, str]:
    """{component: device name} from a placement string, a {component: device} mapping or a `Placement`."""
    if hasattr(placement, "policy") and hasattr(placement, "spec"):
        if placement.policy != "resident":
            raise InvalidInputError(
                f"this placement is planned with the {placement.policy!r} policy (components unloaded after their "
                "phase), but a diffusers pipeline keeps its components loaded: plan with --placement-policy resident")
        return parse_placement(placement.spec())
    if isinstance(placement, Mapping):
        return parse_placement(",".join(f"{k}={v}" for k, v in placement.items()))
    return parse_placement(placement)


def _component(pipe, component: str):
    """(attribute name, module) of `component` in `pipe`, or (None, None) when the pipeline has none loaded."""
    for name in PIPELINE_ATTRIBUTES[component]:
        module = getattr(pipe, name, None)
        if module is not None:
            return name, module
    return None, None


def _moved(value, device):
    from accelerate.utils import send_to_device

    if isinstance(value, Mapping) and hasattr(value, "__setitem__") and hasattr(value, "to_tuple"):
        for key in list(value.keys()):       # a diffusers/transformers output class: move its fields in place
            value[key] = send_to_device(value[key], device)
        return value
    return send_to_device(value, device)


def _align_method(module, name: str, device) -> None:
    """Shadow `module.<name>` with a call that runs it with its tensor arguments on `device` and returns its
    result on the device the first tensor argument came from."""
    from accelerate.utils import find_device

    current = getattr(module, name)
    original = getattr(current, _ORIGINAL, current)

    @functools.wraps(original)
    def aligned(*args, **kwargs):
        source = find_device([args, kwargs])
        result = original(*_moved(args, device), **_moved(kwargs, device))
        return result if source is None else _moved(result, source)

    setattr(aligned, _ORIGINAL, original)
    setattr(module, name, aligned)


def _group_onload_device(module):
    """The device diffusers' group offload onloads `module` on (its `.to()` then leaves it there), or None."""
    import torch

    if module is None or not isinstance(module, torch.nn.Module):
        return None
    try:
        from diffusers.hooks.group_offloading import _get_group_onload_device

        device = torch.device(_get_group_onload_device(module))
    except (ImportError, ValueError):
        return None
    if device.type == "cuda" and device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    return device


def _forward_target(component: str, module):
    """The module whose forward the H3 blocks call: the text encoder's stack for Qwen3-VL (the blocks call
    `text_encoder.model(...)`), the module itself otherwise."""
    if component == "text_encoder" and hasattr(module, "model"):
        return module.model
    return module


def apply_placement(pipe, placement) -> dict[str, str]:
    """Move `pipe`'s components to the devices of `placement` (a string such as "dit=cuda:0,text_encoder=cuda:1,
    video_vae=cuda:1,audio_vae=cuda:1" from `h3director plan --devices`, a {component: device} mapping, or a
    resident `Placement`) and align their calls (see the module docstring).

    Returns {component: device} for what was placed and "absent" for components the pipeline has not loaded.
    Raises `InvalidInputError` before anything moves: a malformed placement, a device this machine does not have,
    a phased `Placement`, a component carrying an accelerate hook this module did not add, a component group
    offloaded onto another device than its placement (group offload first, on the placement's device, is how a
    plan with offloaded DiT blocks is applied: `.to()` then leaves that component where group offload keeps it)."""
    from accelerate.hooks import AlignDevicesHook, add_hook_to_module

    wanted = _wanted(placement)
    devices = {component: resolve_device(name) for component, name in wanted.items()}
    for component in devices:
        name, module = _component(pipe, component)
        hook = None if module is None else getattr(_forward_target(component, module), "_hf_hook", None)
        if hook is not None and not getattr(hook, _OURS, False):
            raise InvalidInputError(
                f"{name} already carries an accelerate hook ({type(hook).__name__}: CPU offload, a device map or "
                "another placement) that this placement would replace; load it without one to place it")
        onload = _group_onload_device(module)
        if onload is not None and onload != devices[component]:
            raise InvalidInputError(
                f"{name} is group offloaded and group offload onloads it on {onload}, not on {devices[component]} "
                f"as the placement asks: enable group offload with onload_device=\"{devices[component]}\"")
    done: dict[str, str] = {}
    for component in COMPONENTS:
        if component not in devices:
            continue
        _, module = _component(pipe, component)
        if module is None:
            done[component] = "absent"
            continue
        device = devices[component]
        module.to(device)
        hook = AlignDevicesHook(execution_device=device, io_same_device=True)
        setattr(hook, _OURS, True)
        add_hook_to_module(_forward_target(component, module), hook)
        if component in ("video_vae", "audio_vae"):
            for name in ALIGNED_METHODS:
                if hasattr(module, name):
                    _align_method(module, name, device)
        done[component] = str(device)
    return done


def remove_placement(pipe) -> None:
    """Take `apply_placement`'s hooks and method wrappers off `pipe`'s components (they stay on their devices);
    hooks it did not add are left in place."""
    from accelerate.hooks import remove_hook_from_module

    for component in COMPONENTS:
        _, module = _component(pipe, component)
        if module is None:
            continue
        target = _forward_target(component, module)
        if getattr(getattr(target, "_hf_hook", None), _OURS, False):
            remove_hook_from_module(target)
        for name in ALIGNED_METHODS:
            if hasattr(module.__dict__.get(name), _ORIGINAL):
                del module.__dict__[name]


__all__ = ["apply_placement", "remove_placement"]
