"""DiT memory tiers on ComfyUI's quantised layers, in ComfyUI's real H3 model code: stock vs tiers torch.equal
where the layout's chunking is reported exact, kept layouts named with their reason, refusals before the forward.

The layers are real ComfyUI quantised `Linear`s: weights quantised by each layout and loaded by ComfyUI's loader
from `comfy_quant` metadata (`fixtures/comfy_harness/quant_layers.py`); the checks run in a fresh Python
(`fixtures/comfy_harness/dit_quant_worker.py`), as tests/test_dit_comfy.py's do.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "fixtures" / "comfy_harness" / "dit_quant_worker.py"
CONFIGS = ["int8_tensorwise", "int8_convrot", "float8_e4m3fn-emulated", "float8_e4m3fn-native",
           "float8_e5m2-native-input_scale", "nvfp4-emulated", "nvfp4-native-input_scale", "mxfp8-native",
           "convrot_w4a4", "asym_w4a8_int8"]
CHECKS = ([f"exact/{c}" for c in CONFIGS]
          + ["kept/nvfp4-dynamic-activation-scale-ffn-whole-named", "kept/unknown-layout-stock-and-named",
             "refuse/row-group-of-the-layout-named", "refuse/row-group-before-the-forward",
             "plan/formats-priced-as-the-loaded-layers", "exact-only/unverified-native-kernels-kept-stock"])

from comfy_harness.vendored import h3_comfyui_root as comfyui_root  # noqa: E402
from comfy_harness.vendored import why_no_h3_comfyui as skip_reason  # noqa: E402
from comfy_harness.worker_checks import worker_tests  # noqa: E402

ROOT = comfyui_root()
pytestmark = [pytest.mark.comfyui, pytest.mark.skipif(ROOT is None, reason=skip_reason() if ROOT is None else "")]


# an empty kernel cache: nothing counts as verified, decisions come from the layout table
results, test_worker_ran_every_check, test_check = worker_tests(
    WORKER, "H3DITQ-RESULTS", CHECKS, lambda tmp: [ROOT], timeout=1500, env=lambda tmp: {"H3_KERNEL_CACHE": str(tmp / "kernels.json")})
