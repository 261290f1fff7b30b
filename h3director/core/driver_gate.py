"""The NVIDIA driver and CUDA versions, checked against the floors and the known-bad pairing the seed names.

What is read (`read_driver_info`): through NVML (nvidia-ml-py's `pynvml`: ``nvmlSystemGetDriverVersion``,
``nvmlSystemGetCudaDriverVersion``, ``nvmlDeviceGetCount`` / ``nvmlDeviceGetHandleByIndex`` /
``nvmlDeviceGetName``) the driver version ("535.129.03"), the newest CUDA version that driver supports ("12.2")
and the GPUs' names; from torch the CUDA runtime it was built with (``torch.version.cuda``, "12.1": major.minor
only, the update level is not visible there) and, where the pip wheel is installed, the CUDA runtime library's
version (``nvidia-cuda-runtime-cu12``, e.g. "12.1.105").

What is checked (`driver_warnings`), from the seed's environment notes: its memory pre-allocation was validated with
CUDA 12.1.1 on drivers >= 535.104.05 (RTX 40 series) and >= 525.85.02 (RTX 30 series): an RTX 40/30 GPU (by NVML
name) on an older driver gets a warning; driver 535.129.03 with CUDA 12.1 is the known-bad pairing (frame flicker in
temporal attention): a warning naming both versions. Without NVML or an NVIDIA driver nothing is warned: the report
says what is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib import metadata

SEED_CUDA = "12.1.1"
"""The CUDA release the seed validated its pre-allocation with."""


@dataclass(frozen=True)
class DriverFloor:
    """The oldest driver the seed validated for GPUs whose NVML name matches `pattern` (`series` for messages)."""

    series: str
    pattern: str
    minimum: str


@dataclass(frozen=True)
class KnownBadPair:
    """A driver version with a CUDA runtime (major.minor) that the seed reports broken, and how it shows."""

    driver: str
    cuda: str
    cuda_release: str
    symptom: str


DRIVER_FLOORS = (DriverFloor("RTX 40", r"\bRTX\s*40\d0", "535.104.05"),
                 DriverFloor("RTX 30", r"\bRTX\s*30\d0", "525.85.02"))
KNOWN_BAD = (KnownBadPair("535.129.03", "12.1", "12.1.1", "frame flicker in temporal attention"),)
CUDART_PACKAGES = ("nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime-cu11", "nvidia-cuda-runtime")


@dataclass
class DriverInfo:
    """The versions as read; None where not readable. `status`: "read", or why nothing could be read."""

    status: str
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    cuda_runtime_version: str | None = None
    cudart_version: str | None = None
    gpus: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def version_tuple(text: str) -> tuple[int, ...]:
    """``"535.104.05"`` -> ``(535, 104, 5)``; non-numeric parts end the tuple."""
    parts = []
    for part in str(text).strip().split("."):
        if not part.isdigit():
            break
        parts.append(int(part))
    return tuple(parts)


def cuda_version_text(value: int) -> str:
    """NVML's CUDA version integer (``1000 * major + 10 * minor``, e.g. 12020) as ``"12.2"``."""
    return f"{value // 1000}.{value % 1000 // 10}"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _cudart_version() -> str | None:
    for name in CUDART_PACKAGES:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def read_driver_info(nvml, cuda_runtime: str | None, cudart: str | None = None) -> DriverInfo:
    """The versions through `nvml` (an initialised `pynvml` module; None: no NVML or no driver) and the CUDA
    runtime torch reports (`cuda_runtime`, None for a CPU build), with the warnings of `driver_warnings`."""
    if nvml is None:
        return DriverInfo("no NVIDIA driver (NVML not installed or no driver answers)",
                          cuda_runtime_version=cuda_runtime, cudart_version=cudart)
    info = DriverInfo("read", cuda_runtime_version=cuda_runtime, cudart_version=cudart)
    try:
        info.driver_version = _text(nvml.nvmlSystemGetDriverVersion())
        info.cuda_driver_version = cuda_version_text(int(nvml.nvmlSystemGetCudaDriverVersion()))
        info.gpus = [_text(nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(index)))
                     for index in range(int(nvml.nvmlDeviceGetCount()))]
    except Exception as exc:  # noqa: BLE001 - pynvml.NVMLError and its many subclasses: report, never crash doctor
        info.status = f"NVML error: {exc}"
    info.warnings = driver_warnings(info)
    return info


def driver_warnings(info: DriverInfo) -> list[str]:
    """Warnings for a driver below the seed's floor for the GPU series and for the known-bad pairing (exact
    versions in each). None without a driver version."""
    if info.driver_version is None:
        return []
    warnings = []
    driver = version_tuple(info.driver_version)
    for floor in DRIVER_FLOORS:
        names = sorted({name for name in info.gpus if re.search(floor.pattern, name)})
        if names and driver < version_tuple(floor.minimum):
            warnings.append(
                f"NVIDIA driver {info.driver_version} is below {floor.minimum}, the oldest driver the seed validated "
                f"its memory pre-allocation on for {floor.series} GPUs ({', '.join(names)}) with CUDA {SEED_CUDA}: "
                f"update the driver to {floor.minimum} or newer")
    runtime = info.cuda_runtime_version
    for bad in KNOWN_BAD:
        if info.driver_version.strip() == bad.driver and runtime is not None \
                and version_tuple(runtime)[:2] == version_tuple(bad.cuda)[:2]:
            library = f", cudart {info.cudart_version}" if info.cudart_version else ""
            warnings.append(
                f"NVIDIA driver {info.driver_version} with CUDA runtime {runtime} (torch's build{library}) is the "
                f"pairing the seed reports as known-bad (driver {bad.driver} with CUDA {bad.cuda_release}: "
                f"{bad.symptom}); change the driver or the CUDA runtime")
    return warnings


def collect_driver_info() -> DriverInfo:
    """`read_driver_info` for this machine: the process's NVML (`h3director.core.devices.nvml_module`) and torch."""
    import torch

    from h3director.core.devices import nvml_module

    return read_driver_info(nvml_module(), torch.version.cuda, _cudart_version())


def driver_lines(info: DriverInfo) -> list[tuple[str, str]]:
    """`doctor`'s (label, value) rows for `info`: the NVIDIA driver (version, CUDA it supports, GPUs) and
    the CUDA runtime torch was built with."""
    if info.driver_version is None:
        return [("NVIDIA driver", f"none: {info.status}"),
                ("CUDA runtime", info.cuda_runtime_version or "none (CPU build of torch)")]
    gpus = ", ".join(info.gpus) or "no GPU listed"
    runtime = info.cuda_runtime_version or "none (CPU build of torch)"
    if info.cudart_version:
        runtime += f" (cudart {info.cudart_version})"
    return [("NVIDIA driver", f"{info.driver_version} (supports CUDA {info.cuda_driver_version}; {gpus})"
             + ("" if info.status == "read" else f" [{info.status}]")),
            ("CUDA runtime", f"{runtime}, as torch was built")]


__all__ = ["DriverFloor", "DriverInfo", "KnownBadPair", "collect_driver_info", "driver_lines",
           "driver_warnings", "read_driver_info"]
