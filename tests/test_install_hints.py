"""What a clone needs installed, and the one message for a missing optional package.

- requirements.txt (what ComfyUI-Manager, or `<ComfyUI python> -m pip install -r`, installs for a clone) lists
  every third-party package that the node pack's code imports, unless ComfyUI itself provides it or the import
  is optional by design; its versions equal pyproject.toml's.
- `errors.EXTRA_REQUIREMENTS` equals pyproject.toml's extras.
- `errors.install_command` / `missing_package`: outside ComfyUI the extra (`pip install 'h3director[gguf]'`);
  inside ComfyUI (its `folder_paths` and `comfy` modules imported) ComfyUI's own interpreter and the pack's
  requirements file. The same message from a real ComfyUI server: tests/test_comfy_real_clone.py.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from h3director import errors

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "h3director"
#: Import name -> distribution name, for the imports whose names differ.
DISTRIBUTIONS = {"cv2": "opencv-python-headless", "yaml": "pyyaml", "PIL": "pillow", "pynvml": "nvidia-ml-py"}
#: What ComfyUI itself provides to every custom node (its own modules and its essential requirements).
COMFYUI_PROVIDES = {"comfy", "comfy_api", "comfy_execution", "folder_paths", "server", "execution", "nodes", "torch", "numpy", "PIL",
                    "aiohttp"}
#: Imported only where the pack runs without them: the diffusers adapters (library use), NVML (the monitor reads
#: torch without it; doctor says "not installed" and the command), and the farm and CLI, which ComfyUI never runs.
NOT_FOR_THE_NODES = {"diffusers", "transformers", "accelerate", "pynvml", "ray", "rich", "tqdm"}
LIBRARY_ONLY_FOLDERS = {"farm", "commands"}
LIBRARY_ONLY_FILES = {"cli.py", "__main__.py"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement.strip(), maxsplit=1)[0].lower()


def _requirements_txt() -> dict[str, str]:
    lines = [line.strip() for line in (REPO / "requirements.txt").read_text().splitlines()]
    return {_name(line): line for line in lines if line and not line.startswith("#")}


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11's tomllib")
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _third_party_imports() -> dict[str, list[str]]:
    """Top-level third-party modules imported anywhere in the code a ComfyUI process can run -> files."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in LIBRARY_ONLY_FOLDERS or str(relative) in LIBRARY_ONLY_FILES:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "h3director" and top not in sys.stdlib_module_names:
                    found.setdefault(top, []).append(str(relative))
    return found


def test_requirements_txt_brings_every_package_the_nodes_import():
    imports = _third_party_imports()
    assert {"gguf", "av", "matplotlib", "cv2", "spandrel"} <= set(imports)   # the scan sees the optional ones
    listed = _requirements_txt()
    missing = {module: files[:3] for module, files in imports.items()
               if module not in COMFYUI_PROVIDES | NOT_FOR_THE_NODES
               and DISTRIBUTIONS.get(module, module).lower() not in listed}
    assert not missing, f"imported by the pack but not in requirements.txt: {missing}"


def test_requirements_txt_versions_equal_pyproject():
    project = _pyproject()
    declared = {_name(r): r for r in project["dependencies"]}
    for extra in errors.EXTRA_REQUIREMENTS.values():
        declared.update({_name(r): r for r in extra})
    for name, line in _requirements_txt().items():
        assert declared.get(name) == line, f"requirements.txt has {line!r}, pyproject.toml {declared.get(name)!r}"


def test_extra_table_equals_pyproject_extras():
    extras = _pyproject()["optional-dependencies"]
    for extra, requirements in errors.EXTRA_REQUIREMENTS.items():
        assert tuple(extras[extra]) == requirements, extra
    plain = {name for name, reqs in extras.items() if not any(r.startswith("h3director[") for r in reqs)}
    assert plain - {"diffusers"} == set(errors.EXTRA_REQUIREMENTS)


@pytest.fixture
def outside_comfyui(monkeypatch):
    monkeypatch.delitem(sys.modules, "folder_paths", raising=False)
    monkeypatch.delitem(sys.modules, "comfy", raising=False)


@pytest.fixture
def inside_comfyui(monkeypatch):
    """Only the presence of ComfyUI's top-level modules is read; empty modules stand for them."""
    monkeypatch.setitem(sys.modules, "folder_paths", types.ModuleType("folder_paths"))
    monkeypatch.setitem(sys.modules, "comfy", types.ModuleType("comfy"))


def test_outside_comfyui_the_message_names_the_extra(outside_comfyui):
    assert not errors.running_in_comfyui()
    assert errors.missing_package("reading GGUF files", "the 'gguf' package", "gguf") == \
        "reading GGUF files needs the 'gguf' package: pip install 'h3director[gguf]'"


def test_inside_comfyui_the_message_names_comfyuis_interpreter_and_the_pack_requirements(inside_comfyui):
    assert errors.running_in_comfyui()
    command = errors.install_command("gguf")
    assert command.startswith(f'"{sys.executable}" -m pip install "gguf>=0.10"'), command
    assert f'-r "{REPO / "requirements.txt"}"' in command and "h3director[" not in command
    assert errors.install_command("farm").startswith(f'"{sys.executable}" -m pip install "ray[client]>=2.40" "rich>=13"')
    with pytest.raises(KeyError):
        errors.install_command("no-such-extra")


def test_a_real_missing_import_raises_the_message(tmp_path):
    """A fresh Python where `gguf` cannot be imported: opening a GGUF file names the extra to install."""
    (tmp_path / "gguf").mkdir()
    (tmp_path / "gguf" / "__init__.py").write_text("raise ImportError(\"No module named 'gguf'\", name='gguf')\n")
    (tmp_path / "x.gguf").write_bytes(b"GGUF")
    code = ("from h3director.weights.gguf_file import open_gguf\n"
            "try:\n    open_gguf(r'%s')\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
            % (tmp_path / "x.gguf"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": f"{tmp_path}:{REPO}", "PATH": "/usr/bin:/bin"}).stdout
    assert out.strip() == ("InvalidInputError reading GGUF files needs the 'gguf' package: "
                           "pip install 'h3director[gguf]'"), out
