"""What `h3director doctor` reports: the torch build, devices, allocator, native core, config, NVML, the NVIDIA
driver and CUDA versions (with the seed's driver floors and known-bad pairing, `h3director.core.driver_gate`),
and concrete warnings. Plain data (`Environment.to_dict`), so the ComfyUI panel can show the same.

Collecting reads devices through `h3director.core.devices`; for CUDA it calls ``mem_get_info``,
which creates a CUDA context in the calling process (a few hundred MiB): call it from a
diagnostic process, not in the middle of a job.
"""

from __future__ import annotations

import os
import platform
import sys
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from h3director import __version__
from h3director.core import devices
from h3director.core.driver_gate import DriverInfo, collect_driver_info
from h3director.errors import ConfigError, install_command
from h3director.units import format_size

OPTIONAL_PACKAGES = ("diffusers", "av", "gguf", "safetensors", "matplotlib", "nvidia-ml-py", "comfyui")
ALLOC_CONF_VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
#: A whole 362-frame video at 1344x768 as float32 (h3-facts: 4.18 GiB); below this much free RAM a
#: float32 tensor sink cannot hold a long H3 video.
LONG_VIDEO_F32_BYTES = 362 * 1344 * 768 * 3 * 4


@dataclass
class DeviceInfo:
    """One device as `doctor` shows it: `device` ("cpu", "cuda:0", ...), its `name`, `total_bytes` and
    `free_bytes` (bytes; None where unknown) and a `note`."""

    device: str
    name: str
    total_bytes: int | None
    free_bytes: int | None
    note: str = ""


@dataclass
class Environment:
    """What `collect()` found about this machine and install, for `h3director doctor` (`to_dict` for
    `--json`): versions, build, devices, allocator, native core, config (path, level, features, problems),
    NVML, optional packages, the NVIDIA driver gate, and the `warnings` to act on."""

    h3director: str
    python: str
    platform: str
    torch: str
    build: str  # "CUDA 12.8", "ROCm 6.3", "MPS", "CPU"
    devices: list[DeviceInfo]
    allocator_backend: str | None
    alloc_conf: dict[str, str]
    native_core: str
    config_path: str
    config_level: int | None
    features: list[str]
    config_problems: list[str]
    nvml: str
    packages: dict[str, str | None]
    warnings: list[str] = field(default_factory=list)
    level_effects: list[str] = field(default_factory=list)  # what the memory level does, one line each
    driver: DriverInfo | None = None  # NVIDIA driver / CUDA versions and their gate (h3director.core.driver_gate)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _torch_build(torch) -> str:
    if getattr(torch.version, "hip", None):
        return f"ROCm {torch.version.hip}"
    if torch.version.cuda:
        return f"CUDA {torch.version.cuda}"
    if torch.backends.mps.is_built():
        return "MPS"
    return "CPU"


#: Where bench/native.py writes its results in a checkout (a pip install has no bench/: "not measured").
NATIVE_RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "native.json"


def native_fallback_cost(results: Path | None = None) -> str:
    """How much slower the numpy fallback measured than the C library on the decode's frame packing, as one
    phrase citing the results file (written by `bench/native.py`, with its date and machine), or
    "not measured (no <path>)" when the file is absent or unreadable. `results`: default `NATIVE_RESULTS`."""
    import json

    path = Path(results) if results is not None else NATIVE_RESULTS
    try:
        data = json.loads(path.read_text())
        pack = data["pack_frames"]
        ratio = float(pack["fallback_over_c"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"not measured (no usable {path})"
    shape = "x".join(str(n) for n in pack.get("shape", []))
    machine = data.get("machine")
    if isinstance(machine, dict):    # bench/_results.py's record: platform, processor count, ...
        machine = f"{machine.get('processor') or machine.get('platform', '?')}, {machine.get('cpus', '?')} CPUs"
    where = ", ".join(str(v) for v in (data.get("date"), machine) if v)
    return (f"frame packing (decode to uint8/MP4) measured {ratio:.1f}x the C library's time"
            f"{f' on float32 {shape}' if shape else ''} ({path.name}: {where})")


def native_core_line() -> str:
    """One line on the native core (doctor's row, the decode node's report): the C library in use and whether
    this process built it on first use, or the numpy fallback, why (forced by ``H3_NATIVE=numpy``, no compiler,
    build failed) and its measured cost (`native_fallback_cost`). Loads (and on first use builds) the library."""
    try:
        from h3director.native import _loader
    except ImportError:
        return "not built"
    forced = os.environ.get("H3_NATIVE", "").strip().lower() == "numpy"
    try:
        state = _loader.status()
    except Exception as exc:  # noqa: BLE001 - a broken build must show up here, not crash doctor
        return f"error: {type(exc).__name__}: {exc}"
    if state.backend == "c" and not forced:
        how = "built on first use" if state.built_now else "loaded"
        return f"C library (h3_core) {how}: {state.library}"
    if forced:
        why = ("C library built, forced off by H3_NATIVE=numpy" if state.backend == "c"
               else f"forced by H3_NATIVE=numpy; the C library is not usable either: {state.reason}")
    else:
        why = state.reason
    return f"numpy fallback ({why}); cost: {native_fallback_cost()}"


def _packages() -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for name in OPTIONAL_PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def _mps_int8_matmul_supported(torch) -> bool:
    try:
        a = torch.ones((32, 32), dtype=torch.int8, device="mps")
        torch._int_mm(a, a)
        return True
    except (NotImplementedError, RuntimeError):
        return False


def _device_list(torch) -> list[DeviceInfo]:
    host = devices.sample_host()
    infos = [DeviceInfo("cpu", platform.processor() or platform.machine(), host.total_bytes, host.available_bytes,
                        "free = system available RAM")]
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            name = torch.cuda.get_device_name(index)
            try:
                free, total = torch.cuda.mem_get_info(index)
                infos.append(DeviceInfo(f"cuda:{index}", name, int(total), int(free)))
            except RuntimeError as exc:
                infos.append(DeviceInfo(f"cuda:{index}", name, None, None, f"unreadable: {exc}"))
    if torch.backends.mps.is_available():
        sample = devices.sample_device("mps")
        infos.append(DeviceInfo("mps", "Apple GPU (unified memory)", sample.total_bytes, sample.free_bytes,
                                "total = recommended_max_memory"))
    return infos


def collect(config_path: str | None = None) -> Environment:
    """The `Environment` of this process and machine, with its warnings derived; `config_path` names the
    config to report (None: the file `load_config` would read). Never raises for a bad config: its problems
    are reported."""
    import torch

    from h3director.core.config import find_config_path, load_config

    warnings: list[str] = []
    config_problems: list[str] = []
    level = None
    features: list[str] = []
    effects: list[str] = []
    config = None
    path = str(find_config_path(config_path))
    try:
        config = load_config(path)  # the file reported as config_path
        level = config.memory_optimization_level
        features = config.features().enabled()
        effects = config.level_effects()
    except ConfigError as exc:
        config_problems = [str(p) for p in getattr(exc, "problems", [])] or [str(exc)]
        # The error's first line names the culprit: the file, or the H3_ variables that broke it.
        warnings.append(f"{str(exc).splitlines()[0]}; run `h3director config check {path}` to see each problem")

    backend = devices.cuda_allocator_backend()
    alloc_conf = {name: os.environ[name] for name in ALLOC_CONF_VARIABLES if name in os.environ}
    nvml = f"not installed ({install_command('nvml')})"
    try:
        import pynvml  # noqa: F401

        nvml = "present" if devices.nvml_available() else "installed, but no NVIDIA driver answers"
    except ImportError:
        pass

    env = Environment(
        h3director=__version__,
        python=sys.version.split()[0],
        platform=platform.platform(),
        torch=torch.__version__,
        build=_torch_build(torch),
        devices=_device_list(torch),
        allocator_backend=backend,
        alloc_conf=alloc_conf,
        native_core=native_core_line(),
        config_path=path,
        config_level=level,
        features=features,
        config_problems=config_problems,
        level_effects=effects,
        nvml=nvml,
        packages=_packages(),
        driver=collect_driver_info(),
    )

    # --- concrete warnings ----------------------------------------------------------------
    if backend == "cudaMallocAsync":
        warnings.append("allocator backend cudaMallocAsync: torch.cuda.memory_reserved() reads 0 and the cache is "
                        "invisible to PyTorch's stats; H3 Director budgets with mem_get_info (device-wide) instead")
    if len({value for value in alloc_conf.values()}) > 1:
        warnings.append("PYTORCH_CUDA_ALLOC_CONF and PYTORCH_ALLOC_CONF are both set, to different values: "
                        + ", ".join(f"{k}={v}" for k, v in alloc_conf.items()))
    if config is not None:
        wanted = config.allocator.to_pytorch_alloc_conf()
        current = next(iter(alloc_conf.values()), None)
        if wanted and wanted != current:
            warnings.append(f"the config asks for allocator settings '{wanted}' but the environment has "
                            f"'{current or 'none'}': export PYTORCH_CUDA_ALLOC_CONF={wanted} before starting Python")
        if level == 0:
            warnings.append("memory_optimization_level is 0: decodes run the model's own whole-video decode (no "
                            "streaming, no pool, no collections) and the shared store is off")
    if torch.backends.mps.is_available() and not _mps_int8_matmul_supported(torch):
        warnings.append("int8 matmul (aten::_int_mm) is not implemented on MPS: int8 checkpoints (e.g. the pruned "
                        "int8_convrot DiT) will not run on this Mac; use bf16/fp16 or GGUF weights")
    warnings.extend(env.driver.warnings)
    if env.build == "CPU" and devices.nvml_available():
        warnings.append("an NVIDIA GPU is present but this torch is a CPU-only build: install a CUDA build of torch")
    gpus = [d for d in env.devices if d.device != "cpu"]
    if not gpus:
        warnings.append("no GPU visible to torch: only CPU runs (tests, tiny configs) are possible")
    cpu = env.devices[0]
    if cpu.free_bytes is not None and cpu.free_bytes < LONG_VIDEO_F32_BYTES * 2:
        warnings.append(
            f"only {format_size(cpu.free_bytes)} of host RAM available: a 362-frame 1344x768 video is "
            f"{format_size(LONG_VIDEO_F32_BYTES)} as float32; decode into a uint8, memmap or video sink"
        )
    if "forced off by H3_NATIVE" in env.native_core:
        warnings.append("native core forced off by H3_NATIVE=numpy: frame packing runs on the numpy fallback "
                        f"(same bytes, slower: {native_fallback_cost()}); unset H3_NATIVE to use the built C library")
    elif env.native_core == "not built" or env.native_core.startswith("numpy"):
        warnings.append("native core not in use: frame packing runs on the numpy fallback (same bytes, slower: "
                        f"{native_fallback_cost()}); install a C compiler (cc, or set CC) and it is built on "
                        "first use")
    env.warnings = warnings
    return env


__all__ = ["DeviceInfo", "Environment", "collect", "native_core_line", "native_fallback_cost"]
