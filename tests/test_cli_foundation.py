"""The foundation commands as a user runs them: the installed `h3director` script in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from h3director.units import MiB

SCRIPT = Path(sys.executable).with_name("h3director")
pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason=f"the console script is not installed next to {sys.executable}")


def h3(*args: str, stdin: str | None = None, cwd: Path | None = None, env: dict | None = None,
       timeout: float = 120) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("H3_")}
    full_env.update(env or {})
    return subprocess.run([str(SCRIPT), *args], input=stdin, capture_output=True, text=True, cwd=cwd,
                          env=full_env, timeout=timeout)


def test_import_stays_light():
    code = ("import sys, h3director, h3director.core.config, h3director.core.monitor, h3director.core.oom, "
            "h3director.core.devices\n"
            "heavy = [m for m in ('matplotlib', 'diffusers', 'comfy') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_doctor_table_and_json(tmp_path):
    table = h3("doctor", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    for row in ("torch", "device cpu", "allocator backend", "PYTORCH_CUDA_ALLOC_CONF", "native core", "memory level",
                "NVML", "warnings"):
        assert row in table.stdout
    data = json.loads(h3("doctor", "--json", cwd=tmp_path).stdout)
    assert data["devices"][0]["device"] == "cpu" and data["devices"][0]["total_bytes"] > 0
    assert data["config_level"] == 2 and "streaming_decode" in data["features"]
    assert data["build"] in ("CPU", "MPS") or data["build"].startswith(("CUDA", "ROCm"))


def test_doctor_reports_this_machines_values(tmp_path):
    import platform

    import psutil
    import torch

    import h3director
    from h3director.core import devices
    from h3director.units import format_size

    data = json.loads(h3("doctor", "--json", cwd=tmp_path).stdout)
    assert data["h3director"] == h3director.__version__
    assert data["python"] == platform.python_version() and data["torch"] == torch.__version__
    if torch.version.cuda:
        assert data["build"] == f"CUDA {torch.version.cuda}"
    elif not torch.version.hip and not torch.backends.mps.is_available():
        assert data["build"] == "CPU"
    cpu = data["devices"][0]
    assert cpu["total_bytes"] == psutil.virtual_memory().total and 0 < cpu["free_bytes"] <= cpu["total_bytes"]
    # no config in the working folder and no $H3_CONFIG: the packaged file, at its default level
    assert data["config_path"] == str(Path(h3director.__file__).parent / "h3_config.yaml")
    assert data["config_level"] == 2 and data["features"][:2] == ["generation_gc", "streaming_decode"]
    assert "pool" not in data["features"]                     # the pool is opt-in (pre_allocated_pool_mb 0)
    assert data["nvml"] == ("present" if devices.nvml_available() else "installed, but no NVIDIA driver answers")
    table = h3("doctor", cwd=tmp_path).stdout
    assert f"device cpu               {cpu['name']}: {format_size(cpu['total_bytes'])} total" in table
    assert "\nmemory level             2\n" in table


def test_doctor_reports_the_allocator_settings_and_the_level_it_was_given(tmp_path):
    env = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "PYTORCH_ALLOC_CONF": "max_split_size_mb:512",
           "H3_MEMORY_OPTIMIZATION_LEVEL": "0"}
    data = json.loads(h3("doctor", "--json", cwd=tmp_path, env=env).stdout)
    assert data["alloc_conf"] == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                                  "PYTORCH_ALLOC_CONF": "max_split_size_mb:512"}
    assert data["config_level"] == 0
    assert not {"pool", "generation_gc", "streaming_decode", "shared_memory"} & set(data["features"])
    assert any("both set, to different values: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, "
               "PYTORCH_ALLOC_CONF=max_split_size_mb:512" in warning for warning in data["warnings"])
    assert any("memory_optimization_level is 0" in warning for warning in data["warnings"])
    table = h3("doctor", cwd=tmp_path, env=env).stdout
    assert "PYTORCH_CUDA_ALLOC_CONF  expandable_segments:True" in table
    assert "PYTORCH_ALLOC_CONF       max_split_size_mb:512" in table


def test_doctor_reports_a_bad_config_instead_of_crashing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("memory_optimization_level: 9\n")
    result = h3("doctor", "--json", env={"H3_CONFIG": str(bad)})
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["config_problems"] and "memory_optimization_level" in data["config_problems"][0]
    assert any("invalid" in warning for warning in data["warnings"])


def test_config_check_ok_and_problems(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("memory_optimization_level: 3\npre_allocated_pool_mb: 4096\n")
    ok = h3("config", "check", str(good))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("OK")
    assert "cross_node_shared_memory   on" in ok.stdout

    bad = tmp_path / "bad.yaml"
    bad.write_text("memory_optimization_level: 4\npre_allocated_pool_mb: 1000\nmonitor:\n  update_interval: 100\n")
    refused = h3("config", "check", str(bad))
    assert refused.returncode == 1
    assert "3 problems" in refused.stdout
    assert "did you mean 'update_interval_ms'" in refused.stdout
    assert "multiple of 1024" in refused.stdout

    env_bad = h3("config", "check", str(good), env={"H3_VIDEO_DECODE__SINK": "gif"})
    assert env_bad.returncode == 1 and "H3_VIDEO_DECODE__SINK" in env_bad.stdout
    assert h3("config", "check", str(good), "--no-env", env={"H3_VIDEO_DECODE__SINK": "gif"}).returncode == 0


def test_config_show_applies_environment(tmp_path):
    shown = h3("config", "show", cwd=tmp_path, env={"H3_MEMORY_OPTIMIZATION_LEVEL": "0"})
    assert shown.returncode == 0, shown.stderr
    assert "memory_optimization_level: 0" in shown.stdout
    assert "H3_MEMORY_OPTIMIZATION_LEVEL=0" in shown.stdout
    data = json.loads(h3("config", "show", "--json", cwd=tmp_path).stdout)
    assert data["config"]["pool_slot_mb"] == 64 and data["source"].endswith("h3_config.yaml")


def test_oom_file_stdin_and_json(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(
        "step 12/30\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
        "23.64 GiB of which 1.10 GiB is free. Including non-PyTorch memory, this process has 22.40 GiB memory in use. "
        "Of the allocated memory 17.90 GiB is allocated by PyTorch, and 4.20 GiB is reserved by PyTorch but "
        "unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n"
    )
    text = h3("oom", str(log))
    assert text.returncode == 0, text.stderr
    assert "line 2: cuda out of memory on cuda:0 -> fragmentation" in text.stdout
    piped = h3("oom", "-", stdin=log.read_text() + "mystery: out of memory\n")
    assert piped.returncode == 1 and "not understood" in piped.stdout
    data = json.loads(h3("oom", "--json", str(log)).stdout)
    assert data["errors"][0]["requested_bytes"] == 2 * 1024**3
    missing = h3("oom", str(tmp_path / "nope.log"))
    assert missing.returncode == 2 and "cannot read log" in missing.stderr


def test_monitor_a_child_that_allocates_a_known_amount(tmp_path):
    out = tmp_path / "report"
    child = ("import time, numpy as np\n"
             "a = np.ones(300 * 1024**2, dtype=np.uint8)\n"
             "time.sleep(1.0)\n"
             "raise SystemExit(3)\n")
    result = h3("monitor", "--interval", "50", "--out", str(out), "--budget", "1GiB", "--", sys.executable, "-c", child)
    assert result.returncode == 3, result.stderr  # the command's own exit code
    report = json.loads((out / "report.json").read_text())
    assert report["series"][:1] == ["tree.rss_bytes"]
    assert report["metadata"]["exit_code"] == 3
    peak = report["peaks"]["tree.rss_bytes"]
    # 300 MiB of touched pages plus the interpreter with numpy (~30-60 MiB)
    assert 300 * MiB <= peak <= 300 * MiB + 90 * MiB, peak / MiB
    hwm = report["metadata"]["largest_process_peak_rss_bytes"]
    if sys.platform.startswith("linux"):
        assert 300 * MiB <= hwm <= 300 * MiB + 90 * MiB
    assert (out / "report.csv").read_text().startswith("t_s,wall,phase,tree.rss_bytes")
    assert (out / "timeline.png").stat().st_size > 10_000


def test_monitor_synthetic_workload_phases_in_order(tmp_path):
    out = tmp_path / "synthetic"
    result = h3("monitor", "--synthetic", "--out", str(out), "--no-plot")
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    peaks = {name: values["host.rss_bytes"] for name, values in report["phase_peaks"].items()}
    assert list(peaks) == ["load", "sample", "decode", "after"]
    assert peaks["after"] < peaks["load"] - 128 * MiB  # everything was released before "after"
    # load holds 2 units, sample 2+1, decode 2+2 (units of 128 MiB): each phase peak is higher by about one unit
    assert 0.75 * 128 * MiB <= peaks["sample"] - peaks["load"] <= 1.25 * 128 * MiB
    assert 0.75 * 128 * MiB <= peaks["decode"] - peaks["sample"] <= 1.25 * 128 * MiB
    assert not (out / "timeline.png").exists()


def test_monitor_refuses_unclear_usage_and_missing_commands(tmp_path):
    neither = h3("monitor", "--out", str(tmp_path))
    assert neither.returncode == 2 and "--synthetic" in neither.stderr
    missing = h3("monitor", "--out", str(tmp_path / "m"), "--", "surely-not-a-command-h3")
    assert missing.returncode == 127 and "cannot run" in missing.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_monitor_reports_a_signal_death_as_128_plus_n(tmp_path):
    killed = h3("monitor", "--interval", "20", "--out", str(tmp_path / "k"), "--no-plot", "--", sys.executable, "-c",
                "import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    assert killed.returncode == 128 + 15
    assert json.loads((tmp_path / "k" / "report.json").read_text())["metadata"]["exit_code"] == 143
