"""ComfyUI prestartup hook: apply H3 Director's allocator settings before torch is imported.

ComfyUI runs `custom_nodes/<pack>/prestartup_script.py` early in `main.py`, after it imported
`cuda_malloc.py` (which may have put `backend:cudaMallocAsync` into `PYTORCH_CUDA_ALLOC_CONF`) and
before torch. This script reads the `allocator:` section of `h3_config.yaml` (see
`h3director.comfy.settings` for where it is looked up) and rewrites `PYTORCH_CUDA_ALLOC_CONF` by the
rules in `h3director.comfy.alloc_env`. It never raises: a problem is logged and ComfyUI starts with
the environment it had.
"""

import importlib.util
import logging
import os
import sys

ENV_VAR = "PYTORCH_CUDA_ALLOC_CONF"


def _bootstrap():
    name = "_h3director_bootstrap"
    module = sys.modules.get(name)
    if module is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_h3_bootstrap.py")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return module.ensure_h3director()


def apply_allocator_settings(environ=os.environ) -> str | None:
    """Rewrite `environ[PYTORCH_CUDA_ALLOC_CONF]` from the config; return the new value."""
    _bootstrap()
    from h3director.comfy.alloc_env import merge_alloc_conf
    from h3director.comfy.settings import pack_config

    if "torch" in sys.modules:
        logging.warning("H3 Director: torch is already imported; allocator settings apply from the next start")
    merged = merge_alloc_conf(environ.get(ENV_VAR), pack_config().allocator)
    for note in merged.notes:
        logging.info("H3 Director allocator: %s", note)
    if merged.value is not None and merged.value != environ.get(ENV_VAR):
        environ[ENV_VAR] = merged.value
        logging.info("H3 Director: %s=%s", ENV_VAR, merged.value)
    return merged.value


try:
    apply_allocator_settings()
except Exception as exc:  # a broken config must not stop ComfyUI from starting
    logging.warning("H3 Director prestartup: allocator settings not applied: %s", exc)
