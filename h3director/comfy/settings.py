"""The configuration the ComfyUI pack runs with, found the way a ComfyUI user expects.

Search order: `$H3_CONFIG` when set, else `h3_config.yaml` in the node pack folder (the repository
root, next to `prestartup_script.py`), else `h3director.core.config.load_config`'s own search
(`./h3_config.yaml`, then the packaged default). `H3_...` environment overrides apply in every case.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

PACK_ROOT = Path(__file__).resolve().parents[2]
PACK_CONFIG = PACK_ROOT / "h3_config.yaml"


def config_path(env: dict[str, str] | None = None) -> Path | None:
    """The explicit file to load, or None to let `load_config` search."""
    env = os.environ if env is None else env
    if env.get("H3_CONFIG"):
        return None
    return PACK_CONFIG if PACK_CONFIG.is_file() else None


@lru_cache(maxsize=1)
def pack_config():
    """The `H3Config` for this ComfyUI process (read once; restart ComfyUI after editing the file)."""
    from h3director.core.config import load_config

    return load_config(config_path())


__all__ = ["pack_config"]
