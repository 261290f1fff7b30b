"""Shared pytest set-up: tests run on the CPU, deterministic, with small thread counts."""

import os

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("OMP_NUM_THREADS", "2")

# Real-ComfyUI tests: unless COMFYUI_DIR is set, use the vendored ComfyUI that scripts/setup.sh prepared
# in .comfy/ (sets COMFYUI_DIR and COMFYUI_PYTHON; see fixtures/comfy_harness/vendored.py).
from comfy_harness.vendored import use_prepared_comfyui  # noqa: E402

use_prepared_comfyui()

# The machines that run the suite are small and shared: a property test's speed says nothing about
# its correctness, so no per-example deadline and no "too slow" health check.
settings.register_profile("h3director", deadline=None, suppress_health_check=[HealthCheck.too_slow],
                          print_blob=True)
settings.load_profile("h3director")


@pytest.fixture(autouse=True)
def _seed_torch():
    import torch

    torch.manual_seed(0)
    yield


# Small random-initialised configs of the real diffusers VAEs (h3director.commands.demo_vaes), built
# once per session. Tests that change a model setting (tiling, slicing) must restore it.
@pytest.fixture(scope="session")
def tiny_h3():
    from h3director.commands.demo_vaes import tiny_h3_vae

    return tiny_h3_vae(seed=0)


@pytest.fixture(scope="session")
def tiny_wan():
    from tiny_vaes import tiny_wan_vae

    return tiny_wan_vae(seed=0)


@pytest.fixture(scope="session")
def tiny_h3_audio():
    from h3director.commands.demo_vaes import tiny_h3_audio_vae

    return tiny_h3_audio_vae(seed=0)


@pytest.fixture()
def output_dir(tmp_path, monkeypatch):
    """ComfyUI's output and temp folders pointed at `tmp_path` (for the node tests; `folder_paths` is the
    stand-in the test module installed, imported here only when the fixture is used)."""
    import folder_paths

    monkeypatch.setattr(folder_paths, "output_directory", str(tmp_path / "output"))
    monkeypatch.setattr(folder_paths, "temp_directory", str(tmp_path / "temp"))
    (tmp_path / "output").mkdir()
    return tmp_path / "output"
