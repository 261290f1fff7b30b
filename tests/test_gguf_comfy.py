"""GGUF H3 DiT in ComfyUI's real model code: `torch.equal` to the stock loader on the dequantised tensors
(Q8_0, Q4_0, Q5_1, Q4_K; float32 and bfloat16; unpruned and curve form), LoRA on the fly (full load and lowvram),
composition with the DiT Memory node, the per-layer dequant peak, the node, and refusals.

The checks run in a fresh Python (`fixtures/comfy_harness/gguf_worker.py`), as tests/test_dit_comfy.py does.
ComfyUI is `COMFYUI_DIR` (the vendored `.comfy/ComfyUI` by default); the worker's Python is
`COMFYUI_PYTHON` when that one has `gguf`, else this Python. Without ComfyUI the tests skip with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "fixtures" / "comfy_harness" / "gguf_worker.py"
CHECKS = [f"exact/{q}/{d}" for q in ("Q8_0", "Q4_0", "Q5_1", "Q4_K") for d in ("float32", "bfloat16")] + [
    "exact/curve-form-Q8_0", "convert/Q6_K", "convert/Q5_K", "convert/Q4_K_M", "accepts/wan-label-and-prefix", "refuse/architecture-truncated-missing",
    "lora/full-load-on-the-fly", "lora/lowvram-weight-function", "compose/dit-memory-node",
    "memory/per-layer-dequant-peak", "memory/quantised-weights-view-the-map", "node/lists-loads-refuses"]


from comfy_harness.vendored import h3_comfyui_root as comfyui_root  # noqa: E402
from comfy_harness.vendored import why_no_h3_comfyui as skip_reason  # noqa: E402
from comfy_harness.worker_checks import python_with, worker_tests  # noqa: E402

ROOT = comfyui_root()
pytestmark = [pytest.mark.comfyui, pytest.mark.skipif(ROOT is None, reason=skip_reason() if ROOT is None else "")]


results, test_worker_ran_every_check, test_check = worker_tests(
    WORKER, "H3GGUF-RESULTS", CHECKS, lambda tmp: [ROOT, tmp], timeout=900, python=lambda: python_with("gguf"))
