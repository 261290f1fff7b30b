"""The budget of this machine (`--device auto`): free accelerator memory, available host RAM and, for CUDA,
the device's compute capability (`torch.cuda.get_device_capability`).

CUDA: `torch.cuda.mem_get_info` (free bytes: what this process can still get; under
`cudaMallocAsync` the allocator's own counters read 0, the driver's numbers do not). MPS: unified
memory, so the device and the host share `torch.mps.recommended_max_memory()`. CPU only: the
device is the host; the budget is psutil's available RAM.
"""

from __future__ import annotations

from h3director.plan.recommend import Budget


def detect_budget(device: str = "auto", *, host_bytes: int | None = None) -> tuple[Budget, str]:
    """(Budget, one line saying what was read). `device`: "auto", "cuda[:n]", "mps" or "cpu". `host_bytes`:
    host RAM to plan with (bytes; None: psutil's available memory). `InvalidInputError` for a CUDA device
    on a machine without one."""
    import psutil
    import torch

    host = int(host_bytes if host_bytes is not None else psutil.virtual_memory().available)
    wanted = device.lower()
    if wanted in ("auto", "cuda") or wanted.startswith("cuda:"):
        if torch.cuda.is_available():
            index = int(wanted.split(":")[1]) if ":" in wanted else torch.cuda.current_device()
            free, total = torch.cuda.mem_get_info(index)
            name = torch.cuda.get_device_name(index)
            capability = tuple(torch.cuda.get_device_capability(index))
            return (Budget(device_bytes=int(free), host_bytes=host, device="cuda", compute_capability=capability),
                    f"cuda:{index} {name} (compute capability {capability[0]}.{capability[1]}): "
                    f"{free / 2**30:.1f} GiB free of {total / 2**30:.1f} GiB; host RAM {host / 2**30:.1f} GiB available")
        if wanted != "auto":
            from h3director.errors import InvalidInputError

            raise InvalidInputError(f"--device {device}: no CUDA device is available here")
    if wanted in ("auto", "mps") and getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        limit = int(torch.mps.recommended_max_memory())
        return (Budget(device_bytes=limit, host_bytes=host, device="mps"),
                f"mps: unified memory, {limit / 2**30:.1f} GiB recommended maximum; planned as one memory")
    why = "--device cpu" if wanted == "cpu" else "no CUDA or MPS device"
    return (Budget(device_bytes=host, host_bytes=host, device="cpu"),
            f"{why}: planning a CPU run in host RAM ({host / 2**30:.1f} GiB available)")


__all__ = ["detect_budget"]
