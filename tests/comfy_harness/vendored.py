"""The vendored ComfyUI that `scripts/setup_comfyui.sh` (run by `scripts/setup.sh`) prepares in `.comfy/`.

`use_prepared_comfyui()` sets `COMFYUI_DIR` to `.comfy/ComfyUI` and `COMFYUI_PYTHON` to
`.comfy/venv/bin/python` when `COMFYUI_DIR` is unset and the set-up finished (`.comfy/ready`).
A `COMFYUI_DIR` given by the caller always wins (with its own `COMFYUI_PYTHON`, or the running
Python). `why_unavailable()` says why there is no ComfyUI, for skip messages.
Only the standard library is imported here.
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
