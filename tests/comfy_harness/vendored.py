"""The vendored ComfyUI that `scripts/setup_comfyui.sh` (run by `scripts/setup.sh`) prepares in `.comfy/`.

`use_prepared_comfyui()` sets `COMFYUI_DIR` to `.comfy/ComfyUI` and `COMFYUI_PYTHON` to
`.comfy/venv/bin/python` when `COMFYUI_DIR` is unset and the set-up finished (`.comfy/ready`).
A `COMFYUI_DIR` given by the caller always wins (with its own `COMFYUI_PYTHON`, or the running
Python). `why_unavailable()` says why there is no ComfyUI, for skip messages; `real_comfyui_marks()` is the
`pytestmark` of the modules that run it. Only the standard library is imported at module level.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STATE = REPO / ".comfy"


def use_prepared_comfyui() -> None:
    if os.environ.get("COMFYUI_DIR") or not (STATE / "ready").is_file():
        return
    os.environ["COMFYUI_DIR"] = str(STATE / "ComfyUI")
    os.environ["COMFYUI_PYTHON"] = str(STATE / "venv" / "bin" / "python")


def why_unavailable() -> str:
    unavailable = STATE / "unavailable"
    if unavailable.is_file():
        return unavailable.read_text().strip()
    return ("COMFYUI_DIR is unset and .comfy/ComfyUI is not prepared: run `bash scripts/setup.sh` "
            "(needs ../shared/vendor/comfyui-783545f.tar.gz) or set COMFYUI_DIR (and COMFYUI_PYTHON)")


def real_comfyui_marks() -> list:
    """`pytestmark` of a test module that runs the real ComfyUI: marked comfyui and slow, skipped (saying
    why) when `COMFYUI_DIR` is unset (tests/conftest.py sets it to the prepared .comfy/ComfyUI)."""
    import pytest  # here, so the benches that use this module need only the standard library

    return [pytest.mark.comfyui, pytest.mark.slow,
            pytest.mark.skipif(not os.environ.get("COMFYUI_DIR"), reason=why_unavailable())]


def h3_comfyui_root() -> Path | None:
    """`COMFYUI_DIR` when it holds a ComfyUI with MiniMax H3 support (`comfy/ldm/minimax/model.py`), else None."""
    root = os.environ.get("COMFYUI_DIR")
    if root and (Path(root) / "comfy" / "ldm" / "minimax" / "model.py").is_file():
        return Path(root)
    return None


def why_no_h3_comfyui() -> str:
    """The skip reason when `h3_comfyui_root()` is None."""
    if os.environ.get("COMFYUI_DIR"):
        return f"COMFYUI_DIR={os.environ['COMFYUI_DIR']} has no comfy/ldm/minimax/model.py (no H3 support)"
    return why_unavailable()
