"""DiT memory tiers in ComfyUI's real H3 model code: exact against the stock block, installed through the
real `ModelPatcher` hooks (`patches_replace["dit"]` + `DIFFUSION_MODEL` wrapper), finding other packs' patches,
refusing bad input.

The checks run in a fresh Python (`fixtures/comfy_harness/dit_worker.py`) because the pack's other tests
put stand-in `comfy` modules on sys.path. ComfyUI is `COMFYUI_DIR` (tests/conftest.py points it at the
vendored `.comfy/ComfyUI` that scripts/setup_comfyui.sh prepares) run by `COMFYUI_PYTHON` (default: this
Python); without one the tests skip with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "fixtures" / "comfy_harness" / "dit_worker.py"
PLANS = ["lifetime", "head_chunks2", "head_chunks4", "ffn_chunks3", "ffn_chunks7", "head_chunks2-ffn_chunks4",
         "head_chunks2-query_chunks3", "head_chunks4-query_chunks2-ffn_chunks5"]
CHECKS = ([f"exact/{dtype}/{rows}/{plan}" for dtype in ("float32", "bfloat16") for rows in ("plain", "mask")
           for plan in PLANS]
          + ["weights/plain-and-cast-paths-both-covered", "lora/add_patches-applies-through-tier",
             "lora/lowvram-weight-function-applies", "attention/override-still-acts",
             "attention/container-consumer-gets-containers", "quantised/unsliceable-ops-kept-stock-and-reported",
             "install/foreign-patches-found-not-refused", "install/reinstall-replaces-own-patches", "refuse/bad-input",
             "install/original-untouched-clone-keeps-tier", "node/installs-reports-and-refuses",
             "node/visits-each-module-once",
             "capacity/auto-escalates-and-refuses", "weights/released-when-a-projection-raises"])


from comfy_harness.vendored import h3_comfyui_root as comfyui_root  # noqa: E402
from comfy_harness.vendored import why_no_h3_comfyui as skip_reason  # noqa: E402
from comfy_harness.worker_checks import worker_tests  # noqa: E402

ROOT = comfyui_root()
pytestmark = [pytest.mark.comfyui, pytest.mark.skipif(ROOT is None, reason=skip_reason() if ROOT is None else "")]


# an empty kernel cache: nothing counts as verified, whatever verify-kernels wrote on this machine
results, test_worker_ran_every_check, test_check = worker_tests(
    WORKER, "H3DIT-RESULTS", CHECKS, lambda tmp: [ROOT], timeout=600, env=lambda tmp: {"H3_KERNEL_CACHE": str(tmp / "kernels.json")})
