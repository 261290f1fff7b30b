"""Exception hierarchy shared by every layer.

Every refusal H3 Director makes derives from `H3DirectorError`, so a caller (the CLI, a ComfyUI
node) can show the message as it is, without a traceback. Messages say what was expected and
what came.
"""


class H3DirectorError(Exception):
    """Base class of every error H3 Director raises on purpose."""


class InvalidInputError(H3DirectorError, ValueError):
    """An input (tensor, file, argument) is malformed; raised before any expensive work starts."""


class ConfigError(H3DirectorError, ValueError):
    """`h3_config.yaml` or an `H3_...` environment override is invalid."""


class BudgetError(H3DirectorError):
    """A job cannot fit the configured memory budget; the message names the setting that would fix it."""


# ----------------------------------------------------------------------------------- missing packages

#: What each optional extra of pyproject.toml installs (tests/test_install_hints.py keeps this table equal to
#: pyproject.toml's `optional-dependencies` and the pack's requirements.txt).
EXTRA_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "video": ("av>=12",),
    "plot": ("matplotlib>=3.7",),
    "gguf": ("gguf>=0.10",),
    "nvml": ("nvidia-ml-py>=12",),
    "flow": ("opencv-python-headless>=4.8",),
    "farm": ("ray[client]>=2.40", "rich>=13"),
    "upscale": ("spandrel>=0.4", "pillow>=10"),
}


def running_in_comfyui() -> bool:
    """True when this process is a ComfyUI server (or its test stand-in): ComfyUI's own top-level modules
    `folder_paths` and `comfy` are already imported. Only `sys.modules` is read; nothing is imported."""
    import sys

    return "folder_paths" in sys.modules and "comfy" in sys.modules


def pack_requirements_file():
    """The node pack's requirements.txt (a `pathlib.Path`) when this `h3director` is the folder of a cloned pack
    (`<pack>/h3director/` beside `<pack>/requirements.txt`), else None (e.g. a pip install)."""
    from pathlib import Path

    pack = Path(__file__).resolve().parent.parent
    candidate = pack / "requirements.txt"
    return candidate if candidate.is_file() and (pack / "_h3_bootstrap.py").is_file() else None


def install_command(extra: str) -> str:
    """The command that installs the optional extra `extra` (a key of `EXTRA_REQUIREMENTS`) where this runs.

    Inside ComfyUI: ComfyUI's own interpreter, ``"<sys.executable>" -m pip install "gguf>=0.10"``, plus the pack's
    requirements file when this is a cloned pack (a bare `pip` may belong to another Python). Elsewhere (library,
    CLI): ``pip install 'h3director[<extra>]'``. Raises KeyError for an unknown extra."""
    import sys

    requirements = EXTRA_REQUIREMENTS[extra]
    if not running_in_comfyui():
        return f"pip install 'h3director[{extra}]'"
    python = f'"{sys.executable}" -m pip install'
    command = f"{python} " + " ".join(f'"{r}"' for r in requirements)
    pack_file = pack_requirements_file()
    if pack_file is not None:
        command += f' (or everything the pack needs: {python} -r "{pack_file}")'
    return command + ", then restart ComfyUI"


def missing_package(purpose: str, package: str, extra: str) -> str:
    """The one message for an optional package that is not installed: ``"<purpose> needs <package>: <command>"``,
    the command from `install_command(extra)` (e.g. ``missing_package("reading GGUF files", "the 'gguf' package",
    "gguf")``)."""
    return f"{purpose} needs {package}: {install_command(extra)}"


__all__ = ["EXTRA_REQUIREMENTS", "BudgetError", "ConfigError", "H3DirectorError", "InvalidInputError",
           "install_command", "missing_package", "running_in_comfyui"]
