"""Load the repository as ComfyUI loads a custom node folder (`nodes.py` `load_custom_node`).

ComfyUI: ``spec_from_file_location(<folder path with "." replaced by "_x_">, <folder>/__init__.py)``,
``module_from_spec``, ``sys.modules[name] = module``, ``exec_module``; then, for a V3 pack (no
`NODE_CLASS_MAPPINGS`), ``await comfy_entrypoint()``, ``await extension.on_load()``,
``await extension.get_node_list()`` and ``node_cls.GET_SCHEMA()`` for each node. The stand-in
modules in `stubs/` (comfy_api, folder_paths, comfy.*) are put on `sys.path` first.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

STUBS = Path(__file__).resolve().parent / "stubs"
REPO = Path(__file__).resolve().parents[2]


def install_stubs() -> None:
    if str(STUBS) not in sys.path:
        sys.path.insert(0, str(STUBS))


def load_pack(folder: Path = REPO):
    """Import `folder/__init__.py` the way ComfyUI does; return `(module, extension, node classes)`."""
    install_stubs()
    name = str(folder).replace(".", "_x_")
    spec = importlib.util.spec_from_file_location(name, str(folder / "__init__.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    if getattr(module, "NODE_CLASS_MAPPINGS", None) is not None:
        raise AssertionError("the pack defines NODE_CLASS_MAPPINGS: ComfyUI would ignore comfy_entrypoint")

    async def entry():
        extension = await module.comfy_entrypoint()
        await extension.on_load()
        return extension, await extension.get_node_list()

    extension, nodes = asyncio.run(entry())
    return module, extension, nodes
