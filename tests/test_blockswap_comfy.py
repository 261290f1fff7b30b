"""H3Director Block Swap in ComfyUI's real H3 model code: output bit-identical to every block resident (fp32, bf16),
resident blocks counted per block call, bytes per block against the planner, composed with DiT Memory (either
order), LoRA (patched weights move), the GGUF loader, the stock MODEL running after the clone, bad counts refused.

The checks run in a fresh Python (`fixtures/comfy_harness/blockswap_worker.py`) because the pack's other tests put
stand-in `comfy` modules on sys.path; the Python is `COMFYUI_PYTHON` when it has `gguf`, else this one (as
tests/test_gguf_comfy.py). Without a ComfyUI checkout the tests skip with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "fixtures" / "comfy_harness" / "blockswap_worker.py"
CHECKS = ([f"exact/{dtype}/offload{n}" for dtype in ("float32", "bfloat16") for n in (0, 1, 2, 5)]
          + ["compose/dit-memory-either-order", "lora/patched-weights-are-what-moves",
             "bytes/per-block-vs-planner-within-10pct", "detach/stock-model-runs-after-the-clone",
             "compose/gguf-quantised-bytes-move", "refuse/bad-counts-before-loading", "node/installs-and-reports"])

from comfy_harness.vendored import h3_comfyui_root as comfyui_root  # noqa: E402
from comfy_harness.vendored import why_no_h3_comfyui as skip_reason  # noqa: E402
from comfy_harness.worker_checks import python_with, worker_tests  # noqa: E402

ROOT = comfyui_root()
pytestmark = [pytest.mark.comfyui, pytest.mark.skipif(ROOT is None, reason=skip_reason() if ROOT is None else "")]


results, test_worker_ran_every_check, test_check = worker_tests(
    WORKER, "H3SWAP-RESULTS", CHECKS, lambda tmp: [ROOT, tmp], timeout=600, python=lambda: python_with("gguf"))
