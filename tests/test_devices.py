"""Device and host memory sampling: the host path always, CUDA/MPS/NVML where present."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

from h3director.core import devices
from h3director.errors import InvalidInputError
from h3director.units import MiB

TOLERANCE = 0.15  # RSS moves with the allocator and the interpreter; a known buffer must show within 15 %


def test_host_sample_sees_a_touched_buffer():
    before = devices.sample_host()
    buffer = np.ones(200 * MiB, dtype=np.uint8)  # np.ones writes every page, so it is resident
    during = devices.sample_host()
    del buffer
    grown = during.rss_bytes - before.rss_bytes
    assert abs(grown - 200 * MiB) <= TOLERANCE * 200 * MiB, grown / MiB
    assert during.peak_rss_bytes >= during.rss_bytes
    assert 0 < during.available_bytes <= during.total_bytes
    assert during.timestamp >= before.timestamp


def test_peak_rss_survives_freeing_and_is_in_bytes():
    # In a fresh interpreter: allocate 300 MiB, free it, then the peak must still show it while RSS does not.
    code = (
        "import json, numpy as np\n"
        "from h3director.core.devices import sample_host\n"
        "base = sample_host().rss_bytes\n"
        "a = np.ones(300 * 1024**2, dtype=np.uint8); del a\n"
        "s = sample_host()\n"
        "print(json.dumps({'base': base, 'rss': s.rss_bytes, 'peak': s.peak_rss_bytes}))\n"
    )
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert abs((out["peak"] - out["base"]) - 300 * MiB) <= TOLERANCE * 300 * MiB, out
    assert out["rss"] < out["base"] + 50 * MiB, out  # numpy returned the pages (munmap)


def test_sample_device_cpu_is_the_host_view():
    sample = devices.sample_device("cpu")
    host = devices.sample_host()
    assert sample.device == "cpu" and sample.backend == "cpu"
    assert sample.allocated_bytes == sample.reserved_bytes
    assert abs(sample.allocated_bytes - host.rss_bytes) < 64 * MiB
    assert sample.total_bytes == host.total_bytes
    assert devices.sample_device(torch.device("cpu")).device == "cpu"
    assert devices.device_used_bytes("cpu") > 0
    assert set(sample.to_dict()) >= {"allocated_bytes", "reserved_bytes", "peak_allocated_bytes", "free_bytes"}


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cuda:-1", "tpu:0", ""])
def test_unknown_devices_are_refused(bad):
    with pytest.raises(InvalidInputError, match="expected 'cpu', 'mps', 'cuda' or 'cuda:N'"):
        devices.sample_device(bad)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_cuda_requested_without_cuda_is_a_clear_error():
    with pytest.raises(InvalidInputError, match="torch.cuda.is_available"):
        devices.sample_device("cuda:0")
    assert devices.cuda_allocator_backend() is None


@pytest.mark.skipif(torch.backends.mps.is_available(), reason="checks the refusal on a machine without MPS")
def test_mps_requested_without_mps_is_a_clear_error():
    with pytest.raises(InvalidInputError, match="mps"):
        devices.sample_device("mps")


def test_available_devices_lists_cpu_first():
    listed = devices.available_devices()
    assert listed[0] == "cpu"
    assert all(name == "mps" or name.startswith("cuda:") for name in listed[1:])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_sample_tracks_a_known_tensor():
    torch.cuda.init()
    before = devices.sample_device("cuda:0")
    tensor = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda:0")
    during = devices.sample_device("cuda:0")
    assert during.allocated_bytes - before.allocated_bytes >= 256 * MiB
    assert during.reserved_bytes >= during.allocated_bytes
    assert during.peak_allocated_bytes >= during.allocated_bytes
    assert during.free_bytes < during.total_bytes
    assert devices.device_used_bytes("cuda:0") >= 256 * MiB
    if devices.cuda_allocator_backend() == "cudaMallocAsync":
        assert during.backend == "cuda-async"
    del tensor


@pytest.mark.gpu
@pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs an Apple GPU (MPS)")
def test_mps_sample_tracks_a_known_tensor():
    before = devices.sample_device("mps")
    tensor = torch.ones(64 * MiB, dtype=torch.uint8, device="mps")
    torch.mps.synchronize()
    during = devices.sample_device("mps")
    assert during.allocated_bytes - before.allocated_bytes >= 64 * MiB
    assert during.reserved_bytes >= during.allocated_bytes
    assert during.total_bytes == torch.mps.recommended_max_memory()
    del tensor


@pytest.mark.skipif(not devices.nvml_available(), reason="needs NVML (an NVIDIA driver)")
def test_nvml_device_memory_and_processes():
    used, total = devices.nvml_device_memory(0)
    assert 0 <= used <= total
    usage = devices.nvml_process_gpu_bytes()
    assert isinstance(usage, dict) and all(value >= 0 for value in usage.values())


@pytest.mark.skipif(devices.nvml_available(), reason="checks the behaviour without NVML")
def test_without_nvml_gpu_numbers_are_none_not_zero():
    assert devices.nvml_device_memory(0) is None
    assert devices.nvml_process_gpu_bytes() is None


@pytest.mark.gpu
@pytest.mark.skipif(not (devices.nvml_available() and torch.cuda.is_available()), reason="needs NVML and CUDA")
def test_nvml_numbers_agree_with_cuda_and_see_a_known_allocation():
    import os

    torch.cuda.init()
    free, total = torch.cuda.mem_get_info(0)
    used, nvml_total = devices.nvml_device_memory(0)
    assert abs(nvml_total - total) <= 0.01 * total               # the same card through two APIs
    assert abs(used - (total - free)) <= 512 * MiB + 0.02 * total  # other processes may move a little between reads
    tensor = torch.empty(256 * MiB, dtype=torch.uint8, device="cuda:0")
    torch.cuda.synchronize()
    usage = devices.nvml_process_gpu_bytes(0)
    if not usage:
        pytest.skip("the driver lists no per-process usage here (containers, vGPU)")
    assert sum(usage.values()) >= 256 * MiB
    if os.getpid() in usage:                                     # PIDs match outside a PID namespace
        assert usage[os.getpid()] >= 256 * MiB
    assert devices.nvml_device_memory(0)[0] - used >= 200 * MiB       # the driver's count grew with it too
    del tensor


@pytest.mark.gpu
@pytest.mark.skipif(not (devices.nvml_available() and torch.cuda.is_available()), reason="needs NVML and CUDA")
def test_a_cuda_sample_before_cuda_starts_reads_nvml_and_creates_no_context():
    code = ("import json, torch\n"
            "from h3director.core import devices\n"
            "s = devices.sample_device('cuda:0')\n"
            "used, total = devices.nvml_device_memory(0)\n"
            "print(json.dumps({'backend': s.backend, 'free': s.free_bytes, 'total': s.total_bytes, 'used': used,\n"
            "                  'nvml_total': total, 'initialized': torch.cuda.is_initialized()}))\n")
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert out["backend"] == "cuda-nvml" and out["initialized"] is False
    assert out["total"] == out["nvml_total"]
    assert abs(out["free"] - (out["nvml_total"] - out["used"])) <= 256 * MiB


class _Process:
    def __init__(self, pid, used):
        self.pid, self.usedGpuMemory = pid, used


class _NVMLStandIn:
    """Stands in for the NVIDIA driver's library (pynvml) on a machine without one: two devices with known
    memory and process lists, answering the calls `h3director.core.devices` makes."""

    def __init__(self):
        self.memory = {0: (3 * MiB, 80 * 1024 * MiB), 1: (5 * MiB, 24 * 1024 * MiB)}
        self.uuids = {"GPU-aaaa": 0, "GPU-bbbb": 1}
        self.compute = {0: [_Process(100, 10 * MiB), _Process(200, 20 * MiB), _Process(300, None)],
                        1: [_Process(100, 7 * MiB)]}
        self.graphics = {0: [_Process(100, 10 * MiB), _Process(400, 4 * MiB)], 1: None}

    def nvmlDeviceGetCount(self):
        return len(self.memory)

    def nvmlDeviceGetHandleByIndex(self, index):
        if index not in self.memory:
            raise RuntimeError("NVML_ERROR_INVALID_ARGUMENT")
        return index

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self.uuids[uuid]

    def nvmlDeviceGetMemoryInfo(self, handle):
        used, total = self.memory[handle]
        return type("Memory", (), {"used": used, "total": total, "free": total - used})()

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return self.compute[handle]

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        if self.graphics[handle] is None:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return self.graphics[handle]


@pytest.fixture()
def nvml_stand_in(monkeypatch):
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        pytest.skip("with CUDA started, handles follow the real PCI bus ids")
    stand_in = _NVMLStandIn()
    monkeypatch.setattr(devices, "_nvml", lambda: stand_in)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return stand_in


def test_nvml_device_memory_maps_cuda_indices_through_cuda_visible_devices(nvml_stand_in, monkeypatch):
    assert devices.nvml_device_memory(0) == (3 * MiB, 80 * 1024 * MiB)
    assert devices.nvml_device_memory(1) == (5 * MiB, 24 * 1024 * MiB)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")                 # CUDA's device 0 is NVML's device 1
    assert devices.nvml_device_memory(0) == (5 * MiB, 24 * 1024 * MiB)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-bbbb,GPU-aaaa")
    assert devices.nvml_device_memory(1) == (3 * MiB, 80 * 1024 * MiB)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert devices.nvml_device_memory(3) is None                    # no such device: None, not an exception


def test_nvml_process_bytes_count_each_context_once_and_skip_hidden_ones(nvml_stand_in):
    # device 0: PID 100 is listed as compute and graphics (one context: 10 MiB), PID 300's usage is hidden;
    # device 1: PID 100 again (a second context: +7 MiB), and no graphics query
    assert devices.nvml_process_gpu_bytes(0) == {100: 10 * MiB, 200: 20 * MiB, 400: 4 * MiB}
    assert devices.nvml_process_gpu_bytes(1) == {100: 7 * MiB}
    assert devices.nvml_process_gpu_bytes() == {100: 17 * MiB, 200: 20 * MiB, 400: 4 * MiB}


def test_a_process_trees_gpu_bytes_sum_nvml_over_its_pids(nvml_stand_in):
    import os

    from h3director.core.monitor import ProcessTree

    nvml_stand_in.compute[0].append(_Process(os.getpid(), 64 * MiB))
    tree = ProcessTree(os.getpid())
    tree.rss_bytes()                                                # lists the tree's live PIDs
    assert tree.gpu_bytes() == float(64 * MiB)                      # only this tree's PIDs, none of the others
