"""The Memory Guard node prices each H3 DiT forward with the capacity check's cost model, on ComfyUI's real model.

Runs in a fresh Python (the pack's other tests put stand-in `comfy` modules on sys.path) with the tiny
ComfyUI `MiniMaxH3Model` of fixtures/comfy_harness/dit_worker.py: the guard's preflight must be the ledger
cost of the packed rows ComfyUI's `PackedLayout` builds, at the stock block without the DiT Memory node
and at the node's floor tier with it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dit_tier_cases import comfy_root

REPO = Path(__file__).resolve().parents[1]

SCRIPT = r"""
import json, sys, warnings
warnings.simplefilter("ignore")
import dit_worker as w
h3 = w.import_comfy(sys.argv[1])
import torch
from comfy.patcher_extension import WrappersMP
from h3director.comfy.nodes_guard import GUARD_KEY, make_guard_wrapper
from h3director.dit.capacity import ledger_cost_model
from h3director.dit.tiers import STOCK, DiTMemoryPlan
from h3director.integrations import comfy_dit

class Recording:
    def __init__(self):
        self.seen = []
    def preflight(self, nbytes, what):
        self.seen.append((nbytes, what))

out = {}
base = w.load(w.tiny_state_dict(h3), torch.float32)
model = base.model.diffusion_model
x, t, context, kwargs = w.inputs(torch.float32)
rows = comfy_dit.packed_rows(model, x, context, None)
cost = ledger_cost_model(comfy_dit.comfy_shape(model), "comfy", device="cpu")
for name, patcher, plan in (("stock", base, STOCK),
                            ("node", comfy_dit.install(base, ffn_chunks=4)[0], DiTMemoryPlan(ffn_chunks=4))):
    guard = Recording()
    guarded = patcher.clone()
    guarded.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, GUARD_KEY, make_guard_wrapper(guard))
    w.forward(guarded, torch.float32)
    out[name] = {"seen": guard.seen, "expected": cost(plan, rows, torch.float32), "rows": rows}
from h3director.comfy.nodes_guard import _forward_rows
from h3director.errors import H3DirectorError
try:
    _forward_rows(model, x, context, {"minimax_payload": {"layout": object()}})
    out["broken_layout"] = "counted"
except H3DirectorError as error:
    out["broken_layout"] = str(error)
print(json.dumps(out))
"""


@pytest.mark.skipif(comfy_root() is None, reason="no ComfyUI source tree (set COMFYUI_DIR)")
def test_guard_prices_the_forward_with_the_ledger_at_the_tier_that_runs():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "fixtures" / "comfy_harness")]))
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(comfy_root())], capture_output=True, text=True,
                         env=env, cwd=str(REPO), timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    for name in ("stock", "node"):
        seen = out[name]["seen"]
        assert len(seen) == 1, seen
        nbytes, what = seen[0]
        assert nbytes == out[name]["expected"]
        assert f"{out[name]['rows']} packed rows" in what
    assert "stock block" in out["stock"]["seen"][0][1] and "4 FFN row chunks" in out["node"]["seen"][0][1]
    assert out["node"]["expected"] < out["stock"]["expected"]
    # an H3 forward whose rows cannot be counted is refused, never priced without its audio/conditioning rows
    assert "could not count the packed rows" in out["broken_layout"]
