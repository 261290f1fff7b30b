"""Which devices a placement may name on this machine, and their `torch.device`s (for the ComfyUI and the
diffusers appliers of `h3director.plan.placement`)."""

from __future__ import annotations

from h3director.errors import InvalidInputError


def available_devices() -> list[str]:
    """The devices a placement may name here: "cpu", then "cuda:0".."cuda:N-1" (`torch.cuda.device_count()`),
    then "mps" where available."""
    import torch

    names = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        names.append("mps")
    return names


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
