"""`scripts/setup_comfyui.sh` without a snapshot, and how the tests find the prepared ComfyUI.

The script runs on a copy of itself in a temporary folder laid out like the repository, so the
real `.comfy/` is never touched. The full preparation (unpack, environment) is what
`tests/test_comfy_real.py` runs on.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from comfy_harness import vendored

REPO = Path(__file__).resolve().parents[1]


def test_setup_without_snapshot_says_so_and_leaves_the_reason_for_the_tests(tmp_path):
    (tmp_path / "scripts").mkdir()
    for name in ("setup_comfyui.sh", "comfyui-requirements.txt"):
        shutil.copy(REPO / "scripts" / name, tmp_path / "scripts" / name)
    missing = tmp_path / "nowhere" / "comfyui.tar.gz"
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "H3_COMFYUI_TARBALL": str(missing)}
    done = subprocess.run(["bash", str(tmp_path / "scripts" / "setup_comfyui.sh")], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert f"no ComfyUI snapshot at {missing}" in done.stdout and "will skip" in done.stdout
    assert f"no ComfyUI snapshot at {missing}" in (tmp_path / ".comfy" / "unavailable").read_text()
    assert not (tmp_path / ".comfy" / "ready").exists() and not (tmp_path / ".comfy" / "venv").exists()


def test_prepared_tree_is_the_default_and_comfyui_dir_wins(tmp_path, monkeypatch):
    monkeypatch.setattr(vendored, "STATE", tmp_path)
    for name in ("COMFYUI_DIR", "COMFYUI_PYTHON"):  # set first, so that teardown restores what was there
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    vendored.use_prepared_comfyui()  # not prepared: nothing set
    assert "COMFYUI_DIR" not in os.environ
    assert "scripts/setup.sh" in vendored.why_unavailable()
    (tmp_path / "unavailable").write_text("no ComfyUI snapshot at /x.tar.gz\n")
    assert vendored.why_unavailable() == "no ComfyUI snapshot at /x.tar.gz"

    (tmp_path / "ready").write_text("")
    vendored.use_prepared_comfyui()
    assert os.environ["COMFYUI_DIR"] == str(tmp_path / "ComfyUI")
    assert os.environ["COMFYUI_PYTHON"] == str(tmp_path / "venv" / "bin" / "python")

    monkeypatch.setenv("COMFYUI_DIR", "/opt/my-comfy")
    monkeypatch.delenv("COMFYUI_PYTHON")
    vendored.use_prepared_comfyui()
    assert os.environ["COMFYUI_DIR"] == "/opt/my-comfy" and "COMFYUI_PYTHON" not in os.environ
