"""`h3director doctor`'s environment report: what it says about the native core, a bad config, and the NVIDIA
driver and CUDA versions (NVML stubbed at its real interface: no GPU here)."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch

from h3director import native
from h3director.cli import main as cli_main
from h3director.core import devices, environment
from h3director.core.driver_gate import DriverInfo, driver_warnings, read_driver_info


def _c_library_loads() -> bool:
    try:
        native.implementation("c")
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _c_library_loads(), reason="the C library is not built in this checkout")
def test_a_built_library_forced_off_is_not_reported_as_not_built(monkeypatch):
    monkeypatch.setenv("H3_NATIVE", "numpy")
    line = environment.native_core_line()
    assert "forced off by H3_NATIVE=numpy" in line and "not built" not in line, line
    monkeypatch.delenv("H3_NATIVE")
    assert environment.native_core_line().startswith("C library (h3_core)")


def test_doctor_blames_the_variable_for_an_invalid_environment_override(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no ./h3_config.yaml: the packaged file is used
    monkeypatch.delenv("H3_CONFIG", raising=False)
    monkeypatch.setenv("H3_MEMORY_OPTIMIZATION_LEVEL", "9")
    env = environment.collect()
    [warning] = [w for w in env.warnings if "invalid" in w]
    assert "H3_MEMORY_OPTIMIZATION_LEVEL" in warning, warning
    assert env.config_problems == ["memory_optimization_level: 9 (from H3_MEMORY_OPTIMIZATION_LEVEL) is not allowed; "
                                   "allowed: 0 <= value <= 3"]


# --- NVIDIA driver / CUDA versions (h3director.core.driver_gate) -------------------------------------------------
# No NVIDIA driver here: a stand-in `pynvml` module answers as nvidia-ml-py 13 does on a machine with one (the same
# function names; versions and names as str, the CUDA version as NVML's integer 1000 * major + 10 * minor).


class NVMLError(Exception):
    pass


def _stub_nvml(driver: str, cuda: int, names: list[str], *, fail_init: bool = False) -> types.ModuleType:
    module = types.ModuleType("pynvml")
    calls: list[str] = []

    def nvmlInit():
        calls.append("nvmlInit")
        if fail_init:
            raise NVMLError("NVML Shared Library Not Found")

    module.NVMLError = NVMLError
    module.nvmlInit = nvmlInit
    module.nvmlShutdown = lambda: None
    module.nvmlSystemGetDriverVersion = lambda: driver
    module.nvmlSystemGetCudaDriverVersion = lambda: cuda
    module.nvmlDeviceGetCount = lambda: len(names)
    module.nvmlDeviceGetHandleByIndex = lambda index: ("handle", index)
    module.nvmlDeviceGetName = lambda handle: names[handle[1]]
    module.calls = calls
    return module


@pytest.fixture
def nvml(monkeypatch):
    """Install a stub `pynvml` (see above) for `collect()`; the NVML cache is cleared before and after."""
    def install(*args, **kwargs):
        module = _stub_nvml(*args, **kwargs)
        monkeypatch.setitem(sys.modules, "pynvml", module)
        devices._nvml.cache_clear()
        return module

    yield install
    devices._nvml.cache_clear()


def test_doctor_reports_the_known_bad_driver_and_cuda_pair(nvml, monkeypatch, capsys):
    module = nvml("535.129.03", 12020, ["NVIDIA GeForce RTX 4090"])
    monkeypatch.setattr(torch.version, "cuda", "12.1")  # the CUDA build of torch this pairing needs
    env = environment.collect()
    assert module.calls == ["nvmlInit"]
    driver = env.driver
    assert (driver.status, driver.driver_version, driver.cuda_driver_version, driver.cuda_runtime_version,
            driver.gpus) == ("read", "535.129.03", "12.2", "12.1", ["NVIDIA GeForce RTX 4090"])
    [warning] = [w for w in env.warnings if "known-bad" in w]
    assert "535.129.03 with CUDA runtime 12.1" in warning and "CUDA 12.1.1" in warning and "flicker" in warning
    assert not [w for w in env.warnings if "is below" in w]  # 535.129.03 is above the RTX 40 floor
    assert cli_main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["driver"]["driver_version"] == "535.129.03" and report["driver"]["cuda_driver_version"] == "12.2"
    assert report["driver"]["cuda_runtime_version"] == "12.1" and any("known-bad" in w for w in report["warnings"])
    assert cli_main(["doctor"]) == 0
    text = capsys.readouterr().out
    assert "NVIDIA driver            535.129.03 (supports CUDA 12.2; NVIDIA GeForce RTX 4090)" in text


def test_the_same_driver_with_another_cuda_runtime_is_not_the_bad_pair(nvml, monkeypatch):
    nvml("535.129.03", 12020, ["NVIDIA GeForce RTX 4090"])
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    assert not [w for w in environment.collect().warnings if "known-bad" in w]


@pytest.mark.parametrize(("driver", "gpu", "floor"), [
    ("530.41.03", "NVIDIA GeForce RTX 4090", "535.104.05"),
    ("535.86.10", "NVIDIA GeForce RTX 4070 Ti SUPER", "535.104.05"),
    ("525.60.13", "NVIDIA GeForce RTX 3080", "525.85.02"),
    ("535.104.05", "NVIDIA GeForce RTX 4090", None),
    ("525.85.02", "NVIDIA GeForce RTX 3090 Ti", None),
    ("470.42.01", "NVIDIA H200", None),  # the seed names no floor for other GPUs
])
def test_driver_floor_per_gpu_series(driver, gpu, floor):
    info = read_driver_info(_stub_nvml(driver, 12010, [gpu]), "12.1")
    below = [w for w in info.warnings if "is below" in w]
    if floor is None:
        assert below == []
    else:
        [warning] = below
        assert f"NVIDIA driver {driver} is below {floor}" in warning and gpu in warning


def test_no_driver_says_so_and_warns_nothing(nvml, capsys):
    nvml("535.129.03", 12020, ["NVIDIA GeForce RTX 4090"], fail_init=True)
    env = environment.collect()
    assert env.driver.driver_version is None and env.driver.warnings == []
    assert not [w for w in env.warnings if "driver" in w.lower() and "NVIDIA" in w]
    assert cli_main(["doctor"]) == 0
    assert "NVIDIA driver            none: no NVIDIA driver" in capsys.readouterr().out
    assert driver_warnings(DriverInfo("no NVIDIA driver")) == []


def test_older_pynvml_answers_in_bytes():
    module = _stub_nvml("535.129.03", 12010, ["NVIDIA GeForce RTX 3060"])
    module.nvmlSystemGetDriverVersion = lambda: b"525.60.13"
    module.nvmlDeviceGetName = lambda handle: b"NVIDIA GeForce RTX 3060"
    info = read_driver_info(module, None)
    assert info.driver_version == "525.60.13" and info.gpus == ["NVIDIA GeForce RTX 3060"]
    assert info.cuda_driver_version == "12.1" and len(info.warnings) == 1
