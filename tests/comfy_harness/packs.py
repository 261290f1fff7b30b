"""Load a custom node pack's module the way ComfyUI loads a custom node folder (tests and benches).

`load_pack_module(source, custom_nodes, folder, relative)` links `custom_nodes/folder` to the pack at `source`
and imports its file `relative` under a module name made from that path, as `nodes.load_custom_node` names a
folder's module (dots in the path written `_x_`); a file below the folder's `__init__.py` gets the dotted name a
relative import from the pack would give it. The module's `__file__` is then under `custom_nodes/folder`, which
is how H3 Director tells which pack a patch comes from (`comfy_dit_foreign.pack_of`). Standard library only.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def load_pack_module(source: Path, custom_nodes: Path, folder: str, relative: str = "__init__.py"):
    """The module of file `relative` in the pack at `source`, imported from the link `custom_nodes/folder`."""
    custom_nodes.mkdir(parents=True, exist_ok=True)
    link = custom_nodes / folder
    if not link.exists():
        link.symlink_to(Path(source).resolve(), target_is_directory=True)
    base = str(link).replace(".", "_x_")
    suffix = "" if relative == "__init__.py" else "." + relative.removesuffix(".py").replace("/", ".")
    spec = importlib.util.spec_from_file_location(base + suffix, link / relative)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
