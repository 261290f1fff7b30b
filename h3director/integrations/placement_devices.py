"""Which devices a placement may name on this machine, and their `torch.device`s (for the ComfyUI and the
diffusers appliers of `h3director.plan.placement`)."""

from __future__ import annotations

from h3director.core.devices import available_devices
from h3director.errors import InvalidInputError


def resolve_device(name: str):
    """`torch.device` for a placement device name ("cpu", "cuda" = the current CUDA device, "cuda:N", "mps")
    that exists here; `InvalidInputError` naming the available devices otherwise."""
    import torch

    available = available_devices()
    wanted = name
    if name == "cuda" and torch.cuda.is_available():
        wanted = f"cuda:{torch.cuda.current_device()}"
    if wanted not in available:
        raise InvalidInputError(f"device {name} does not exist on this machine: available {', '.join(available)}")
    return torch.device(wanted)


__all__ = ["resolve_device"]
