"""spandrel upscale models (what ComfyUI's UPSCALE_MODEL holds, and what `h3director upscale` loads) as `UpscaleModel`s.

`load_upscale_model(path)` loads a `.pth`/`.safetensors` file with `spandrel.ModelLoader` (imported here, lazily: it
needs torchvision) and checks it is an image-to-image upscaler; `from_descriptor(descriptor)` wraps a loaded
`spandrel.ImageModelDescriptor` (ComfyUI's UPSCALE_MODEL is one). Seams: architectures in `EXACT_ARCHITECTURES` are
purely convolutional (verified: tiled = untiled up to float rounding, tests/test_upscale_spandrel.py and
bench/upscale_seams.py); their receptive field is derived from their layers. Every other architecture (windowed
attention, channel attention with global pooling, ...) is treated as not exact and gets the feathered blend.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch

from h3director.errors import InvalidInputError, missing_package
from h3director.video.upscale import UpscaleModel
from h3director.video.upscale_field import derive_field

EXACT_ARCHITECTURES = frozenset({"ESRGAN", "Compact", "PLKSR"})
"""spandrel architecture ids whose every operation is a local convolution, pointwise or nearest resampling:
ESRGAN/RRDB (also the pixel-unshuffle x1/x2 variants), RealESRGAN Compact (SRVGGNetCompact) and PLKSR (large-kernel
convolutions; spandrel gives RealPLKSR the same id, but its GroupNorm stops the derivation, so it is not exact)."""
def install_hint() -> str:
    """Why spandrel could not be imported and the command that installs it where this runs."""
    return missing_package("loading upscale models", "spandrel (which needs torchvision)", "upscale") \
        + " (in an environment whose torch has a matching torchvision)"


def import_spandrel():
    """The `spandrel` module, or an `InvalidInputError` that says how to install it."""
    try:
        import spandrel
    except ImportError as exc:
        raise InvalidInputError(f"{install_hint()} ({exc})") from None
    return spandrel


def check_upscaler(descriptor, what: str) -> None:
    """Refuse anything but a 3-channel in, 3-channel out image model with an integer scale >= 1."""
    spandrel = import_spandrel()
    if not isinstance(descriptor, spandrel.ImageModelDescriptor):
        raise InvalidInputError(f"{what} is a {type(descriptor).__name__}, not an image-to-image upscale model "
                                "(spandrel ImageModelDescriptor)")
    if int(descriptor.scale) < 1 or descriptor.input_channels != 3 or descriptor.output_channels != 3:
        raise InvalidInputError(
            f"{what} ({descriptor.architecture.name}) is not an RGB upscaler: scale {descriptor.scale}, "
            f"{descriptor.input_channels} input and {descriptor.output_channels} output channels "
            "(expected scale >= 1, 3 and 3)")


def _wrap(descriptor) -> UpscaleModel:
    """A plain `UpscaleModel` of `descriptor` where its weights are (no field derivation): a float32 reference."""
    params = next(descriptor.model.parameters(), None)
    return UpscaleModel(descriptor, int(descriptor.scale), name=descriptor.architecture.name,
                        device=params.device if params is not None else torch.device("cpu"),
                        dtype=params.dtype if params is not None else torch.float32)


def from_descriptor(descriptor, *, device: torch.device | str | None = None,
                    dtype: torch.dtype | None = None) -> UpscaleModel:
    """An `UpscaleModel` calling the spandrel descriptor (which clamps to [0, 1] and pads to its size rule).

    With a `dtype` other than the weights' own, the model that runs is a copy in that dtype (on `device`) and the
    caller's descriptor is left as it is, kept as the `reference` the run measures its difference against (so
    ComfyUI's loaded UPSCALE_MODEL is never changed; host or device holds both while the run lasts). Refused
    (`InvalidInputError`) before any frame: a dtype spandrel marks the architecture as not supporting
    (``supports_half`` / ``supports_bfloat16``), a device without it, a model that does not run in it
    (`h3director.video.upscale.check_dtype_runs`)."""
    from h3director.video.upscale import check_dtype_runs
    from h3director.video.upscale_stages import dtype_name, dtype_refusal

    check_upscaler(descriptor, "the model")
    first = next(descriptor.model.parameters(), None)
    reference = None
    if dtype is not None and first is not None and dtype != first.dtype:
        reason = dtype_refusal(device if device is not None else first.device, dtype)
        if reason is not None:
            raise InvalidInputError(f"--dtype {dtype_name(dtype)}: {reason}; use --dtype fp32")
        supported = {torch.float16: descriptor.supports_half, torch.bfloat16: descriptor.supports_bfloat16}
        if not supported.get(dtype, True):
            raise InvalidInputError(f"--dtype {dtype_name(dtype)}: spandrel marks {descriptor.architecture.name} as "
                                    f"not supporting {dtype_name(dtype)}; use --dtype fp32")
        reference = _wrap(descriptor.eval())
        descriptor = copy.deepcopy(descriptor)
    if device is not None or dtype is not None:
        descriptor.to(device=device, dtype=dtype)
    descriptor.eval()
    arch = descriptor.architecture.id
    alignment = max(1, int(descriptor.size_requirements.multiple_of))
    params = next(descriptor.model.parameters(), None)
    run_device = params.device if params is not None else torch.device("cpu")
    run_dtype = params.dtype if params is not None else torch.float32
    check_dtype_runs(descriptor, descriptor.architecture.name, run_device, run_dtype,
                     max(16, alignment * 4, int(descriptor.size_requirements.minimum)))
    exact = arch in EXACT_ARCHITECTURES
    radius = None
    if exact:
        probe = max(32, alignment * 8, int(descriptor.size_requirements.minimum))
        info = derive_field(descriptor.model, device=run_device, dtype=run_dtype, probe_size=probe)
        radius, alignment = info.radius, max(alignment, info.alignment)
        exact = info.convolutional
    return UpscaleModel(descriptor, int(descriptor.scale), radius, exact, f"{descriptor.architecture.name} "
                        f"{descriptor.scale}x", alignment, run_device, run_dtype, descriptor.model,
                        reference=reference)


def load_upscale_model(path: str | os.PathLike, *, device: torch.device | str = "cpu",
                       dtype: torch.dtype | None = None) -> UpscaleModel:
    """Load `path` (.pth, .pt, .ckpt or .safetensors) with spandrel and wrap it, run on `device` in `dtype` (None:
    the file's; another dtype keeps a float32 reference on the CPU, see `from_descriptor`); bad files are
    `InvalidInputError`."""
    source = Path(path)
    if not source.is_file():
        raise InvalidInputError(f"{source}: no such model file")
    spandrel = import_spandrel()
    try:
        descriptor = spandrel.ModelLoader(device=torch.device("cpu" if dtype is not None else device)
                                          ).load_from_file(str(source))
    except spandrel.UnsupportedModelError:
        raise InvalidInputError(f"{source}: not a model architecture spandrel knows (not an upscaler?)") from None
    except Exception as exc:  # noqa: BLE001 - spandrel and torch raise many kinds for a malformed file
        raise InvalidInputError(f"{source}: cannot load the model ({type(exc).__name__}: {exc})") from None
    check_upscaler(descriptor, str(source))
    return from_descriptor(descriptor, device=device, dtype=dtype)


__all__ = ["from_descriptor", "load_upscale_model"]
