"""H3Director DiT Memory and another pack's patches on the same H3 blocks, in a real ComfyUI, both orders.

Whichever node comes first, the director finds the other pack's object patches (`blocks.N.forward`,
`.attn.forward`, `.mlp.forward`) and block replacements, steps its tier aside for the part they patched (their
code runs there: counted), and says so in `last_report` (`foreign_patches`, `runs`, `skipped`), in a log warning
and in the node's text; the output equals the stock model's. The checks run in a fresh Python
(fixtures/comfy_harness/dit_foreign_worker.py; the other pack is fixtures/comfy_harness/foreign_pack). With
`KJNODES_DIR` naming a checkout of ComfyUI-KJNodes, the same for KJNodes' own H3 nodes; without it those skip.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from comfy_harness.vendored import h3_comfyui_root as comfyui_root
from comfy_harness.vendored import why_no_h3_comfyui as skip_reason
from comfy_harness.worker_checks import run_worker

REPO = Path(__file__).resolve().parents[1]
WORKER = REPO / "fixtures" / "comfy_harness" / "dit_foreign_worker.py"
CHECKS = ([f"foreign/{part}/{order}" for part in ("ffn", "attention", "block", "replace")
           for order in ("before", "after")]
          + ["foreign/replace/after-says-entry-did-not-run", "foreign/none-found-nothing-logged",
             "foreign/logged-once-while-unchanged", "foreign/node-text-names-the-pack"])
KJNODES = os.environ.get("KJNODES_DIR")
HAVE_KJNODES = bool(KJNODES) and Path(KJNODES, "nodes", "minimax_nodes.py").is_file()
KJ_CHECKS = [f"kjnodes/{name}/{order}" for name in ("chunk-ffn", "lowvram-attention") for order in ("before", "after")]

ROOT = comfyui_root()
pytestmark = [pytest.mark.comfyui, pytest.mark.skipif(ROOT is None, reason=skip_reason() if ROOT is None else "")]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("foreign")
    return run_worker(WORKER, [ROOT, work], "H3FOREIGN-RESULTS", python=os.environ.get("COMFYUI_PYTHON"), timeout=600,
                      env={"H3_KERNEL_CACHE": str(work / "kernels.json")})


def test_worker_ran_every_check(results):
    assert sorted(results) == sorted(CHECKS + (KJ_CHECKS if HAVE_KJNODES else []))


@pytest.mark.parametrize("name", CHECKS)
def test_check(results, name):
    entry = results[name]
    assert entry["ok"], entry["detail"]


@pytest.mark.skipif(not HAVE_KJNODES, reason="KJNODES_DIR does not name a ComfyUI-KJNodes checkout")
@pytest.mark.parametrize("name", KJ_CHECKS)
def test_kjnodes(results, name):
    entry = results[name]
    assert entry["ok"], entry["detail"]
