"""ComfyUI entry point: this repository cloned into `ComfyUI/custom_nodes/` is a V3 node pack.

ComfyUI imports this file as a package (by path, under a name made from the folder path) and then
calls `comfy_entrypoint()`, which returns the `ComfyExtension` listing the H3 Director nodes.
`WEB_DIRECTORY` is the folder of the small web extension (live memory panel).

Importing this file is cheap: it binds `h3director` to the package in this folder (see
`_h3_bootstrap.py`; no pip install needed, never two copies under two names) and imports nothing
heavy; diffusers, PyAV and matplotlib are imported by a node when it runs. It defines no
`NODE_CLASS_MAPPINGS`: ComfyUI would then take the V1 path and ignore `comfy_entrypoint`.
This file is not part of the pip package (only `h3director/` is), and pytest never collects it.
"""

import importlib.util as _importlib_util
import os as _os
import sys as _sys

WEB_DIRECTORY = "./h3director/comfy/web"


def _bootstrap():
    name = "_h3director_bootstrap"
    module = _sys.modules.get(name)
    if module is None:
        path = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "_h3_bootstrap.py")
        spec = _importlib_util.spec_from_file_location(name, path)
        module = _importlib_util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _sys.modules[name] = module
    return module.ensure_h3director()


async def comfy_entrypoint():
    """V3 entry point: the `ComfyExtension` with every H3 Director node (ids prefixed `H3Director`)."""
    _bootstrap()
    from h3director.comfy.extension import H3DirectorExtension

    return H3DirectorExtension()


_bootstrap()

__all__ = ["WEB_DIRECTORY", "comfy_entrypoint"]
