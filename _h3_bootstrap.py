"""Find the `h3director` package inside this repository folder for ComfyUI (no pip install needed).

ComfyUI loads a custom node folder by file path (`importlib.util.spec_from_file_location` on its
`__init__.py`, under a module name made from the folder path) and runs `prestartup_script.py` the
same way. Neither puts the folder on `sys.path`. This module binds the ONE name `h3director` to the
package in this folder, so that node code, routes and the prestartup script all share one copy:

- if `h3director` is already imported, that module is used as it is (a warning says so when it is
  another copy than this folder's: two copies of one package would mean two monitors, two stores);
- else, if a pip install of `h3director` points at this same folder (editable install), it is used;
- else the package is loaded from `<this folder>/h3director` by path, under the name `h3director`,
  without adding the repository root to `sys.path` (which would expose `tests`, `bench`, ...).

Only the standard library is imported here.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import types

PACKAGE = "h3director"
REPO_ROOT = os.path.dirname(os.path.abspath(__file__))
PACKAGE_DIR = os.path.join(REPO_ROOT, PACKAGE)


def _inside(path: str | None, folder: str) -> bool:
    if not path:
        return False
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def ensure_h3director() -> types.ModuleType:
    """Return the `h3director` package, importing this folder's copy if none is imported yet."""
    module = sys.modules.get(PACKAGE)
    if module is not None:
        if not _inside(getattr(module, "__file__", None), PACKAGE_DIR):
            logging.warning("H3 Director: using the already imported %s from %s, not %s",
                            PACKAGE, getattr(module, "__file__", "?"), PACKAGE_DIR)
        return module
    found = importlib.util.find_spec(PACKAGE)
    if found is not None and _inside(found.origin, PACKAGE_DIR):
        return importlib.import_module(PACKAGE)
    spec = importlib.util.spec_from_file_location(
        PACKAGE, os.path.join(PACKAGE_DIR, "__init__.py"), submodule_search_locations=[PACKAGE_DIR]
    )
    if spec is None or spec.loader is None:
        raise ImportError(f"H3 Director: cannot load the package from {PACKAGE_DIR}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PACKAGE]
        raise
    if found is not None:
        logging.info("H3 Director: loaded %s from %s (another copy is installed at %s)",
                     PACKAGE, PACKAGE_DIR, found.origin)
    return module
