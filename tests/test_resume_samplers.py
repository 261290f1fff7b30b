"""Which of ComfyUI's samplers the Resumable Sampler offers, and that every other one is refused by name.

The sampler list is read from the vendored ComfyUI's `comfy/samplers.py` (`KSAMPLER_NAMES`, `SAMPLER_NAMES`)
without importing it; skipped where no vendored ComfyUI is present.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from h3director.errors import InvalidInputError
from h3director.integrations.comfy_resume import REFUSED, RESUMABLE, resumable_method


def _comfy_sampler_names() -> list[str]:
    root = os.environ.get("COMFYUI_DIR")
    path = Path(root) / "comfy" / "samplers.py" if root else None
    if path is None or not path.is_file():
        pytest.skip("no ComfyUI checkout (COMFYUI_DIR) to read the sampler list from")
    names: list[str] = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "KSAMPLER_NAMES" for t in node.targets):
            names += ast.literal_eval(node.value)
    return names + ["ddim", "uni_pc", "uni_pc_bh2"]   # SAMPLER_NAMES = KSAMPLER_NAMES + these


def test_every_comfyui_sampler_is_resumable_or_refused_with_a_reason():
    names = _comfy_sampler_names()
    assert set(RESUMABLE) <= set(names)
    for name in names:
        if name in RESUMABLE:
            assert resumable_method(name).name == name
            continue
        with pytest.raises(InvalidInputError) as refused:
            resumable_method(name)
        message = str(refused.value)
        assert f"sampler {name!r} cannot be resumed exactly" in message
        assert REFUSED.get(name, "not verified to resume bit-identically") in message
        assert "euler, euler_ancestral, dpmpp_2m" in message


def test_unknown_sampler_is_refused():
    with pytest.raises(InvalidInputError, match="not verified to resume bit-identically"):
        resumable_method("my_custom_sampler")
