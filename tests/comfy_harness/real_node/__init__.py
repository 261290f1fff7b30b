"""Test-only ComfyUI custom node folder: shrinks ComfyUI's H3 VAE classes and adds H3TestSaveTensor.

See `tests/comfy_harness/real_comfy.py`. Copied into a temporary ComfyUI base directory by
`tests/test_comfy_real.py`; never installed with the pack.
"""

import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "h3director_test_real_comfy", os.path.join(os.path.dirname(os.path.realpath(__file__)), "real_comfy.py"))
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
_module.apply_tiny_shapes()
NODE_CLASS_MAPPINGS = _module.NODE_CLASS_MAPPINGS
