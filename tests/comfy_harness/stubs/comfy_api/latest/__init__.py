"""Test stand-in for ComfyUI's `comfy_api.latest` (V3 node API), used when no ComfyUI is installed.

Mirrors, by name and call signature, the parts of ComfyUI's V3 API the H3 Director pack uses
(ComfyUI master 783545f6, files `comfy_api/latest/__init__.py`, `comfy_api/latest/_io.py`,
`comfy_api/latest/_ui.py`): `ComfyExtension` (async `on_load`, `get_node_list`), `io.ComfyNode`
(`define_schema`, `execute`, `validate_inputs`, `fingerprint_inputs`, `GET_SCHEMA`, `hidden`),
`io.Schema` (fields, `validate`, `finalize`), the input/output types `Int`, `Float`, `String`,
`Boolean`, `Combo`, `Image`, `Latent`, `Vae`, `Model`, `Audio`, `Conditioning`, `Sampler`, `AnyType`,
`Custom(io_type)`, `io.Hidden`, `io.FolderType`, `io.NodeOutput`, `ui.SavedResult`,
`ui.PreviewVideo`. Widget defaults/min/max/options are kept as attributes with the real names so the
contract tests can check them. The real API is exercised by `tests/test_comfy_real.py`.
"""

from . import _io as io
from . import _ui as ui


class ComfyExtension:
    """Mirrors `comfy_api.latest.ComfyExtension`."""

    async def on_load(self) -> None:
        return None

    async def get_node_list(self) -> list:
        raise NotImplementedError


__all__ = ["ComfyExtension", "io", "ui"]
