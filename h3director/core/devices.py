"""Memory of one device or of the host, read the same way everywhere.

All sizes are bytes; ``None`` means "this backend cannot tell", never 0. Timestamps are
``time.time()`` seconds (the wall clock, so samples from several processes line up).

What each backend reports:

- ``cpu``: the process (RSS, peak RSS) and the system (available, total) via psutil.
- CUDA, native caching allocator: ``allocated`` = live tensors (``memory_allocated``),
  ``reserved`` = held by the cache (``memory_reserved``), ``peak`` = ``max_memory_allocated``,
  ``free``/``total`` = ``mem_get_info`` (device-wide, all processes).
- CUDA under ``backend:cudaMallocAsync``: the caching allocator's reserved counter is not
  maintained (``memory_reserved()`` can read 0 while GiBs are held by the driver's pool), so
  ``reserved`` falls back to ``total - free`` from ``mem_get_info`` (device-wide: it also counts
  the CUDA context and other processes) and `DeviceSample.reserved_is_estimate` is True.
- MPS: ``allocated`` = ``torch.mps.current_allocated_memory`` (live tensors), ``reserved`` =
  ``driver_allocated_memory`` (what Metal holds for the process, cache included), ``total`` =
  ``recommended_max_memory`` (the working-set limit Metal recommends); no peak, no free.
- NVML (``pynvml`` from nvidia-ml-py), when present: device used/total without creating a CUDA
  context, and per-process GPU memory (PIDs as the driver sees them: inside a container they may
  be host PIDs that do not match ``os.getpid()``).

Sampling never initialises CUDA: before the process's first CUDA call, a CUDA device is read
through NVML only (a ``mem_get_info`` would create a context of a few hundred MiB).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

import psutil

from h3director.errors import InvalidInputError


@dataclass
class DeviceSample:
    """Memory of one device at one moment. Bytes; None = not available on this backend."""

    device: str
    backend: str  # "cpu", "cuda", "cuda-async" (cudaMallocAsync), "cuda-nvml" (no context yet), "mps"
    allocated_bytes: int | None
    reserved_bytes: int | None
    peak_allocated_bytes: int | None
    free_bytes: int | None
    total_bytes: int | None
    timestamp: float
    reserved_is_estimate: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class HostSample:
    """This process and the system's RAM at one moment (bytes)."""

    rss_bytes: int
    peak_rss_bytes: int | None
    available_bytes: int
    total_bytes: int
    timestamp: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Host


def linux_rss_and_peak(pid: int | str) -> tuple[int, int] | None:
    """``(VmRSS, VmHWM)`` in bytes from one read of /proc/<pid>/status (Linux), or None.

    VmHWM is the peak resident set of the current program image; the kernel reports kB (KiB).
    """
    rss = hwm = None
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1]) * 1024
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if rss is None or hwm is None:  # a zombie or kernel thread has no memory lines
        return None
    return rss, hwm


def peak_rss_bytes(pid: int | None = None) -> int | None:
    """Peak resident set size (bytes) of process ``pid`` (this process when None), or None if unknown.

    Linux: ``VmHWM`` from /proc, which starts afresh at exec. ``getrusage``'s ``ru_maxrss`` is not
    used there because it survives fork+exec: a child started by a 2 GiB parent reports >= 2 GiB.
    macOS: ``ru_maxrss`` (bytes; this process only). Windows: psutil's ``peak_wset``.
    """
    if sys.platform.startswith("linux"):
        found = linux_rss_and_peak("self" if pid is None else pid)
        return None if found is None else found[1]
    try:
        process = psutil.Process(pid)
        info = process.memory_info()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    if hasattr(info, "peak_wset"):  # Windows
        return int(info.peak_wset)
    if pid is None or pid == os.getpid():
        return ru_maxrss_bytes()
    return None


def ru_maxrss_bytes(children: bool = False) -> int | None:
    """``getrusage(...).ru_maxrss`` in bytes (macOS reports bytes, Linux KiB), or None without `resource`.

    ``children=False``: this process; ``children=True``: the largest waited-for child (RUSAGE_CHILDREN).
    """
    try:
        import resource
    except ImportError:  # Windows
        return None
    maxrss = resource.getrusage(resource.RUSAGE_CHILDREN if children else resource.RUSAGE_SELF).ru_maxrss
    return int(maxrss if sys.platform == "darwin" else maxrss * 1024)


_PROCESS_LOCK = threading.Lock()
_PROCESS: psutil.Process | None = None


def _this_process() -> psutil.Process:
    # One psutil.Process per PID, re-created after fork (psutil caches per-object state).
    global _PROCESS
    with _PROCESS_LOCK:
        if _PROCESS is None or _PROCESS.pid != os.getpid():
            _PROCESS = psutil.Process()
        return _PROCESS


def reset_peak_rss() -> bool:
    """Reset this process's peak-RSS mark (`VmHWM`) to its current RSS, so `peak_rss_bytes()` measures
    one phase exactly (Linux >= 4.0: writes 5 to /proc/self/clear_refs). False where that is impossible.
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def process_rss_bytes() -> int:
    """Resident set size of this process (bytes): one cheap read, for frequent sampling."""
    return int(_this_process().memory_info().rss)


def sample_host() -> HostSample:
    """RSS and peak RSS of this process, available and total RAM of the system."""
    rss = process_rss_bytes()
    peak = peak_rss_bytes()
    vm = psutil.virtual_memory()
    # ru_maxrss is rounded to pages and updated lazily: never report a peak below the current RSS.
    return HostSample(rss_bytes=rss, peak_rss_bytes=None if peak is None else max(peak, rss),
                      available_bytes=int(vm.available),
                      total_bytes=int(vm.total), timestamp=time.time())


# ---------------------------------------------------------------------------------------------
# NVML


@functools.lru_cache(maxsize=1)
def _nvml():
    """The initialised pynvml module, or None when NVML (library or driver) is absent."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # pynvml.NVMLError_LibraryNotFound, _DriverNotLoaded, ...: no NVIDIA driver here
        return None
    return pynvml


def nvml_module():
    """The initialised `pynvml` module (nvidia-ml-py), or None when it is not installed or no NVIDIA driver
    answers."""
    return _nvml()


def nvml_available() -> bool:
    """True when nvidia-ml-py is installed and an NVIDIA driver answers."""
    return _nvml() is not None


def _nvml_handle(index: int):
    """NVML handle for CUDA device ``index``.

    CUDA numbers devices after CUDA_VISIBLE_DEVICES; NVML numbers all of them. Once CUDA is
    initialised the PCI bus id matches them exactly; before, CUDA_VISIBLE_DEVICES is read (indices or
    UUIDs) so that looking does not initialise CUDA.
    """
    nvml = _nvml()
    if nvml is None:
        return None
    try:
        import torch

        if torch.cuda.is_initialized():
            props = torch.cuda.get_device_properties(index)
            bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
            return nvml.nvmlDeviceGetHandleByPciBusId(bus_id)
    except Exception:  # older torch without pci_* properties, or a bus id NVML does not know
        pass
    visible = [item.strip() for item in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if item.strip()]
    try:
        if index < len(visible):
            chosen = visible[index]
            if chosen.isdigit():
                return nvml.nvmlDeviceGetHandleByIndex(int(chosen))
            return nvml.nvmlDeviceGetHandleByUUID(chosen)
        return nvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None


def nvml_device_memory(index: int = 0) -> tuple[int, int] | None:
    """``(used_bytes, total_bytes)`` of CUDA device ``index`` as the driver sees it, or None."""
    handle = _nvml_handle(index)
    if handle is None:
        return None
    info = _nvml().nvmlDeviceGetMemoryInfo(handle)
    return int(info.used), int(info.total)


def nvml_process_gpu_bytes(index: int | None = None) -> dict[int, int] | None:
    """GPU memory per PID (bytes) on device ``index`` (all devices when None), or None without NVML.

    Sums compute and graphics contexts; a PID whose usage the driver hides (``usedGpuMemory`` is
    None, e.g. under some virtualisation) is left out.
    """
    nvml = _nvml()
    if nvml is None:
        return None
    if index is None:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    else:
        handle = _nvml_handle(index)
        handles = [handle] if handle is not None else []
    usage: dict[int, int] = {}
    for handle in handles:
        seen: set[int] = set()
        for query in (nvml.nvmlDeviceGetComputeRunningProcesses, nvml.nvmlDeviceGetGraphicsRunningProcesses):
            try:
                processes = query(handle)
            except Exception:  # not supported on this GPU/driver
                continue
            for process in processes:
                used = getattr(process, "usedGpuMemory", None)
                if used is None or process.pid in seen:  # a PID can be listed as both compute and graphics
                    continue
                seen.add(process.pid)
                usage[process.pid] = usage.get(process.pid, 0) + int(used)
    return usage


# ---------------------------------------------------------------------------------------------
# Devices


def parse_device(device: Any) -> tuple[str, int | None]:
    """``"cuda:1"`` / ``torch.device`` -> ``("cuda", 1)``; refuses anything else with the accepted forms."""
    text = str(device)
    kind, _, index = text.partition(":")
    if kind not in ("cpu", "cuda", "mps") or (index and not index.isdigit()):
        raise InvalidInputError(f"unknown device {text!r}: expected 'cpu', 'mps', 'cuda' or 'cuda:N'")
    return kind, (int(index) if index else None)


def cuda_allocator_backend() -> str | None:
    """``"native"`` or ``"cudaMallocAsync"`` (from PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF), None without CUDA."""
    import torch

    if not torch.cuda.is_available():
        return None
    try:
        return torch.cuda.get_allocator_backend()
    except (AttributeError, RuntimeError):  # torch < 2.0
        return "native"


def _sample_cuda(index: int | None) -> DeviceSample:
    import torch

    if not torch.cuda.is_available():
        raise InvalidInputError("device 'cuda' requested but torch.cuda.is_available() is False")
    index = torch.cuda.current_device() if index is None and torch.cuda.is_initialized() else (index or 0)
    name = f"cuda:{index}"
    now = time.time()
    if not torch.cuda.is_initialized():
        # No CUDA context yet: do not create one just to look. NVML sees the device from outside.
        info = nvml_device_memory(index)
        used, total = info if info else (None, None)
        return DeviceSample(name, "cuda-nvml", 0, 0, 0, None if info is None else total - used, total, now)
    free, total = torch.cuda.mem_get_info(index)
    allocated = torch.cuda.memory_allocated(index)
    peak = torch.cuda.max_memory_allocated(index)
    if cuda_allocator_backend() == "cudaMallocAsync":
        reserved = torch.cuda.memory_reserved(index)
        estimate = reserved == 0
        if estimate:
            reserved = max(total - free, allocated)
        return DeviceSample(name, "cuda-async", allocated, reserved, peak, free, total, now, reserved_is_estimate=estimate)
    return DeviceSample(name, "cuda", allocated, torch.cuda.memory_reserved(index), peak, free, total, now)


def _sample_mps() -> DeviceSample:
    import torch

    if not torch.backends.mps.is_available():
        raise InvalidInputError("device 'mps' requested but torch.backends.mps.is_available() is False")
    total = torch.mps.recommended_max_memory()
    driver = torch.mps.driver_allocated_memory()
    return DeviceSample("mps", "mps", torch.mps.current_allocated_memory(), driver, None,
                        max(total - driver, 0), total, time.time())


def sample_device(device: Any) -> DeviceSample:
    """Memory of ``device`` (``"cpu"``, ``"cuda"``, ``"cuda:N"``, ``"mps"`` or a ``torch.device``).

    For ``cpu``: allocated = reserved = process RSS, peak = peak RSS, free = system available.
    """
    kind, index = parse_device(device)
    if kind == "cuda":
        return _sample_cuda(index)
    if kind == "mps":
        return _sample_mps()
    host = sample_host()
    return DeviceSample("cpu", "cpu", host.rss_bytes, host.rss_bytes, host.peak_rss_bytes, host.available_bytes,
                        host.total_bytes, host.timestamp)


def device_used_bytes(device: Any) -> int:
    """The one "used" number to hold against a budget for ``device`` (bytes).

    cpu: process RSS. CUDA native: ``memory_reserved`` (what this process's cache holds, which is what
    other allocations cannot have). CUDA cudaMallocAsync: ``memory_reserved``, or where that reads 0 the
    larger of ``total - free`` (device-wide; conservative, as the pool's reservation is otherwise
    invisible) and ``memory_allocated``. CUDA before the process's first CUDA call: 0.
    MPS: ``driver_allocated_memory``.
    """
    if parse_device(device)[0] == "cpu":  # the RSS alone: no peak, no system-wide read
        return process_rss_bytes()
    sample = sample_device(device)
    used = sample.reserved_bytes if sample.reserved_bytes is not None else sample.allocated_bytes
    return int(used or 0)


def available_devices() -> list[str]:
    """``["cpu", "cuda:0", ...,"mps"]``: every device this process could sample (CUDA is not initialised)."""
    import torch

    devices = ["cpu"]
    if torch.cuda.is_available():
        devices += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        devices.append("mps")
    return devices


__all__ = ["DeviceSample", "HostSample", "available_devices", "cuda_allocator_backend", "device_used_bytes",
           "linux_rss_and_peak", "nvml_available", "nvml_device_memory", "nvml_module",
           "nvml_process_gpu_bytes", "parse_device", "peak_rss_bytes", "process_rss_bytes", "reset_peak_rss",
           "ru_maxrss_bytes", "sample_device", "sample_host"]
