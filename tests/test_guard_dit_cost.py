"""The Memory Guard node prices each H3 DiT forward with the DiT Memory node's cost model, on ComfyUI's real model.

Runs in a fresh Python (the pack's other tests put stand-in `comfy` modules on sys.path) with the tiny
ComfyUI `MiniMaxH3Model` of fixtures/comfy_harness/dit_worker.py:

- the guard's preflight is the ledger cost of the packed rows ComfyUI's `PackedLayout` builds, at the attention
  backend the forward calls (PyTorch SDPA: a fused kernel; `attention_basic`: the materialised scores), at the
  stock block without the DiT Memory node, and exactly what the node's capacity check needs at its floor with it;
- the two nodes agree on whether a forward fits: for two model shapes, three floors, two attention backends and
  budgets on both sides of the boundary (one byte apart), the guard refuses exactly the forwards the DiT
  Memory node's capacity check refuses. Both read the same device state (a fixed in-use figure: the
  documented reader hooks of `MemoryGuard` and `CapacityCheck`), so the only thing compared is the pricing.
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
from comfy.ldm.modules.attention import attention_basic, attention_pytorch
from comfy.patcher_extension import WrappersMP
from h3director.comfy.nodes_guard import GUARD_KEY, _forward_rows, make_guard_wrapper
from h3director.core.devices import DeviceSample
from h3director.core.guard import MemoryGuard, MemoryLimitExceeded
from h3director.dit.capacity import CapacityCheck, ledger_cost_model
from h3director.dit.tiers import LIFETIME_ONLY, STOCK, DiTMemoryPlan
from h3director.errors import BudgetError, H3DirectorError
from h3director.integrations import comfy_dit

BACKENDS = {"flash": attention_pytorch, "math": attention_basic}
CPU = torch.device("cpu")
IN_USE = 1 << 20


class Recording:
    def __init__(self):
        self.seen = []

    def preflight(self, nbytes, what):
        self.seen.append((nbytes, what))


def guarded(patcher, guard):
    copy = patcher.clone()
    copy.add_wrapper_with_key(WrappersMP.DIFFUSION_MODEL, GUARD_KEY, make_guard_wrapper(guard, stopper=lambda: None))
    return copy


def quiet(device):
    # IN_USE bytes of live tensors and plenty free: what the guard's device_reader reports too
    return DeviceSample("cpu", "cpu", IN_USE, None, None, 1 << 40, 1 << 40, 0.0)


out = {"price": {}, "agree": []}
base = w.load(w.tiny_state_dict(h3), torch.float32)
model = base.model.diffusion_model
x, t, context, kwargs = w.inputs(torch.float32)
rows = comfy_dit.packed_rows(model, x, context, None)
for attention, backend in BACKENDS.items():
    h3.optimized_attention = backend
    cost = ledger_cost_model(comfy_dit.comfy_shape(model), "comfy", attention=attention, device="cpu")
    node = DiTMemoryPlan(ffn_chunks=4)
    for name, patcher, expected in (("stock", base, cost(STOCK, rows, torch.float32)),
                                    ("node", comfy_dit.install(base, ffn_chunks=4)[0],
                                     CapacityCheck(cost, "cpu").need_bytes(node, rows, torch.float32))):
        guard = Recording()
        w.forward(guarded(base if name == "stock" else patcher, guard), torch.float32)
        out["price"][f"{name}/{attention}"] = {"seen": guard.seen, "expected": expected, "rows": rows}

floors = (LIFETIME_ONLY, DiTMemoryPlan(ffn_chunks=2), DiTMemoryPlan(head_chunks=2, ffn_chunks=3))
for shape, overrides in (("2 blocks, FFN 96", {}), ("3 blocks, FFN 192", dict(num_layers=3, ffn_hidden_size=192))):
    shaped = w.load(w.tiny_state_dict(h3, **overrides), torch.float32)
    dm = shaped.model.diffusion_model
    for attention, backend in BACKENDS.items():
        h3.optimized_attention = backend
        cost = ledger_cost_model(comfy_dit.comfy_shape(dm), "comfy", attention=attention, device="cpu")
        for floor in floors:
            need = CapacityCheck(cost, "cpu").need_bytes(floor, rows, torch.float32)
            for budget in (IN_USE + need // 2, IN_USE + need - 1, IN_USE + need, IN_USE + 2 * need):
                def dit_node(patcher):
                    patched, handle = comfy_dit.install(patcher, mode="fixed", budget_bytes=budget,
                                                        head_chunks=floor.head_chunks, ffn_chunks=floor.ffn_chunks)
                    comfy_dit.forward_capacity(dm, CPU, {}, handle).reader = quiet
                    return patched
                try:
                    w.forward(dit_node(shaped), torch.float32)
                    dit_fits = True
                except BudgetError:
                    dit_fits = False
                guard = MemoryGuard(budget, device="cpu", action="stop_and_clear", device_reader=lambda d: IN_USE,
                                    cache_clearer=lambda d: None)
                try:
                    # the guard's wrapper first (the outer one: ComfyUI runs wrappers in the order added), so
                    # its verdict comes before the DiT Memory node's
                    w.forward(dit_node(guarded(shaped, guard)), torch.float32)
                    verdict = "both ran"
                except MemoryLimitExceeded:
                    verdict = "guard refused"
                except BudgetError:
                    verdict = "guard passed, DiT refused"
                out["agree"].append({"case": f"{shape}/{attention}/{floor.describe()}/{budget - IN_USE - need:+d} B",
                                     "dit_fits": dit_fits, "verdict": verdict})
try:
    _forward_rows(model, x, context, {"minimax_payload": {"layout": object()}})
    out["broken_layout"] = "counted"
except H3DirectorError as error:
    out["broken_layout"] = str(error)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def results() -> dict:
    if comfy_root() is None:
        pytest.skip("no ComfyUI source tree (set COMFYUI_DIR)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "fixtures" / "comfy_harness")]))
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(comfy_root())], capture_output=True, text=True,
                         env=env, cwd=str(REPO), timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_guard_prices_the_forward_with_the_ledger_at_the_tier_and_attention_that_run(results):
    price = results["price"]
    for name, entry in price.items():
        assert len(entry["seen"]) == 1, (name, entry)
        nbytes, what = entry["seen"][0]
        assert nbytes == entry["expected"], name
        assert f"{entry['rows']} packed rows" in what
    for attention in ("flash", "math"):
        assert "stock block" in price[f"stock/{attention}"]["seen"][0][1]
        assert "4 FFN row chunks" in price[f"node/{attention}"]["seen"][0][1]
    assert price["node/flash"]["expected"] < price["stock/flash"]["expected"]
    # the materialised scores of attention_basic are priced: more than the fused kernel
    assert price["stock/math"]["expected"] > price["stock/flash"]["expected"]
    # an H3 forward whose rows cannot be counted is refused, never priced without its audio/conditioning rows
    assert "could not count the packed rows" in results["broken_layout"]


def test_guard_and_dit_memory_node_agree_on_whether_a_forward_fits(results):
    cases = results["agree"]
    assert len(cases) == 2 * 2 * 3 * 4
    disagree = [c for c in cases if c["verdict"] != ("both ran" if c["dit_fits"] else "guard refused")]
    assert not disagree, disagree
    # both sides of the boundary were met, one byte apart
    assert {c["dit_fits"] for c in cases if c["case"].endswith("/-1 B")} == {False}
    assert {c["dit_fits"] for c in cases if c["case"].endswith("/+0 B")} == {True}
