"""The capability registry: every executor it names exists (pack node and inputs, vendored ComfyUI node and inputs,
library callable), and the planner recommends nothing without an executor for the target, over a grid of canvases,
lengths, cards, host RAM and both targets."""

from __future__ import annotations

import importlib
import itertools
import re

import pytest
from comfy_harness.loader import REPO, load_pack

from h3director.errors import BudgetError, InvalidInputError
from h3director.plan import capabilities as caps
from h3director.plan.estimate import PlanRequest, estimate
from h3director.plan.recommend import Budget, recommend

GiB = 1024**3
VENDORED = REPO / ".comfy" / "ComfyUI"
# Built on other branches at the same time as this registry; checked here once they are merged.
ARRIVING = {"H3DirectorBlockSwap": "the block-swap node", "h3director.integrations.diffusers_offload": "block offload"}


@pytest.fixture(scope="module")
def pack_inputs():
    _, _, nodes = load_pack()
    schemas = [node.GET_SCHEMA() for node in nodes]
    return {s.node_id: {i.id for i in s.inputs} for s in schemas}


def _core_node_inputs(node: str) -> dict[str, str]:
    """Input name -> its declaration text in the vendored ComfyUI's nodes.py `INPUT_TYPES` of class `node`."""
    source = (VENDORED / "nodes.py").read_text()
    body = re.search(rf"^class {node}\b.*?def INPUT_TYPES.*?return (\{{.*?\}}\s*\}})", source, re.S | re.M).group(1)
    return {m.group(1): m.group(2) for m in re.finditer(r'"(\w+)": \((.*?)\)\s*[,}]', body, re.S)}


COMFY = [(key, cap.comfy) for key, cap in caps.REGISTRY.items() if isinstance(cap.comfy, caps.ComfyExecutor)]
LIBRARY = [(key, cap.diffusers) for key, cap in caps.REGISTRY.items()
           if isinstance(cap.diffusers, caps.LibraryExecutor)]


@pytest.mark.parametrize("key, executor", COMFY, ids=[k for k, _ in COMFY])
def test_every_comfy_executor_is_a_real_node_with_those_inputs(pack_inputs, key, executor):
    if executor.node.startswith("H3Director"):
        if executor.node not in pack_inputs and executor.node in ARRIVING:
            pytest.skip(f"{executor.node} ({ARRIVING[executor.node]}) arrives with its branch")
        assert executor.node in pack_inputs, f"{key}: no pack node {executor.node}"
        assert set(executor.inputs) <= pack_inputs[executor.node], (key, executor.inputs)
        return
    if not (VENDORED / "nodes.py").is_file():
        pytest.skip("no vendored ComfyUI (.comfy/ComfyUI): run scripts/setup_comfyui.sh")
    inputs = _core_node_inputs(executor.node)
    assert set(executor.inputs) <= set(inputs), (key, executor.inputs, sorted(inputs))


def test_the_core_loaders_take_the_values_the_registry_sets():
    if not (VENDORED / "nodes.py").is_file():
        pytest.skip("no vendored ComfyUI (.comfy/ComfyUI): run scripts/setup_comfyui.sh")
    assert "fp8_e4m3fn" in _core_node_inputs("UNETLoader")["weight_dtype"]
    clip = _core_node_inputs("CLIPLoader")
    assert '"minimax"' in clip["type"] and '"cpu"' in clip["device"] and '"default"' in clip["device"]
    # int8 is offered for ComfyUI because its quantised ops load int8 layers; nf4 has no layout there
    quant = (VENDORED / "comfy" / "quant_ops.py").read_text()
    assert 'QUANT_ALGOS["int8_tensorwise"]' in quant and "nf4" not in quant.replace("nvfp4", "")
    assert '"nvfp4": {' in quant                  # nvfp4 layers load too (int8_convrot: int8_tensorwise + convrot)


@pytest.mark.parametrize("key, executor", LIBRARY, ids=[k for k, _ in LIBRARY])
def test_every_library_executor_resolves_to_a_callable(key, executor):
    parts = executor.call.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj = importlib.import_module(module_name)
        except ImportError:
            if module_name in ARRIVING:
                pytest.skip(f"{module_name} ({ARRIVING[module_name]}) arrives with its branch")
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        assert callable(obj), executor.call
        assert executor.template.split("(")[0].split(".")[-1] == parts[-1]      # the template calls it
        return
    pytest.fail(f"{key}: nothing importable in {executor.call}")


def test_formats_without_a_loader_are_not_offered():
    assert caps.dit_formats("comfyui") == ("bf16", "fp8", "fp8_scaled", "int8", "int8_convrot", "q8_0", "q6_k",
                                           "q5_k", "nvfp4", "q4_k_m", "q4_k")
    for fmt in ("fp8_scaled", "int8", "int8_convrot", "nvfp4"):   # comfy_quant layers: no diffusers loader here
        assert fmt not in caps.dit_formats("diffusers")
    for target in caps.TARGETS:
        assert "nf4" not in caps.dit_formats(target)
        assert caps.text_encoder_formats(target) == ("bf16", "fp8")   # nothing loads a GGUF Qwen3-VL
    with pytest.raises(InvalidInputError, match="'nf4' have no loader for target comfyui"):
        recommend(PlanRequest(1344, 768, 124), Budget(24 * GiB, 64 * GiB), formats=["nf4"])
    with pytest.raises(InvalidInputError, match="'int8' have no loader for target diffusers"):
        recommend(PlanRequest(1344, 768, 124), Budget(24 * GiB, 64 * GiB), formats=["int8"], target="diffusers")
    with pytest.raises(InvalidInputError, match="target must be one of"):
        recommend(PlanRequest(1344, 768, 124), Budget(24 * GiB, 64 * GiB), target="a1111")


def test_a_block_count_out_of_range_is_refused():
    request = PlanRequest(1344, 768, 124, offload_blocks=51)
    with pytest.raises(InvalidInputError, match="offload_blocks must be <= the DiT's 50 blocks"):
        request.validate()
    import dataclasses
    bad = dataclasses.replace(PlanRequest(1344, 768, 124), offload_blocks=-1)
    with pytest.raises(InvalidInputError):
        caps.applied_settings(bad, "comfyui")


def _check(rec, target):
    """Fail on any chosen setting of `rec` without an executor for `target`, or not in its applied settings."""
    r = rec.request
    applied = {a.capability: a for a in rec.applied()}
    assert all(a.target == target for a in applied.values())
    weights_key = caps.weights_capability(r.weights)
    assert caps.offered(weights_key, target) and weights_key in applied, (target, r.weights)
    assert caps.offered(f"text_encoder.weights.{r.text_encoder_weights}", target), r.text_encoder_weights
    te = applied["text_encoder.placement"]
    if target == "comfyui":
        assert (te.node, te.inputs["device"]) == ("CLIPLoader", "cpu" if r.text_encoder_device == "cpu" else "default")
    if (r.head_chunks, r.ffn_chunks) != (1, 1):
        chunk = applied["dit.chunking"]
        assert chunk.values == {"head_chunks": r.head_chunks, "ffn_chunks": r.ffn_chunks}
    if r.offload_blocks:
        swap = applied["dit.block_offload"]
        assert swap.values == {"blocks_offloaded": r.offload_blocks}
        if target == "comfyui":
            assert (swap.node, swap.inputs) == ("H3DirectorBlockSwap", {"blocks_offloaded": r.offload_blocks})
        else:
            assert swap.call.startswith(f"apply_block_offload(transformer, blocks_offloaded={r.offload_blocks},")
    assert "decode.streaming" in applied
    if rec.long_form:
        chain = applied["long_form.chain"]
        assert chain.values["segments"] == list(rec.long_form.segments)
        assert chain.node == "H3DirectorStitch" if target == "comfyui" else chain.call.startswith("stitch_files(")
    if rec.pool_mb:
        assert rec.pool_mb % 1024 == 0 and applied["memory.pool"].config == {"pre_allocated_pool_mb": rec.pool_mb}
    for a in applied.values():
        assert caps.offered(a.capability, target)
        assert a.node or a.call or a.config, a


CANVASES = [(512, 512), (768, 512), (1024, 576), (768, 1344), (1344, 768)]
FRAMES = [73, 124, 175, 226, 277, 328, 362]


@pytest.mark.parametrize("target", caps.TARGETS)
def test_no_recommendation_on_the_grid_lacks_an_executor(target):
    fitted = refused = chained = 0
    for (width, height), frames, card, ram in itertools.product(CANVASES, FRAMES, (8, 12, 16, 24, 48), (32, 64, 128)):
        budget = Budget(card * GiB, ram * GiB)
        try:
            rec = recommend(PlanRequest(width, height, frames), budget, target=target)
        except BudgetError:
            refused += 1
            continue
        fitted += 1
        chained += rec.long_form is not None
        _check(rec, target)
        assert budget.fits(estimate(rec.request))
    assert fitted > refused          # the grid mostly fits: the walk checked real recommendations
    assert chained                   # and some of them are long-form chains


def test_the_pool_is_sized_on_the_clip_buffers_it_serves():
    from h3director.plan.decode import clip_buffer_bytes

    served = clip_buffer_bytes({}, 768, 1344, "bf16")
    assert served == 3 * (7 * 4 + 5) * 768 * 1344 * 2     # clip of 7 latent frames x 4 + a 5-frame tail, RGB bf16
    rec = recommend(PlanRequest(1344, 768, 124), Budget(141 * GiB, 512 * GiB))
    assert rec.pool_mb == 1024     # ~195 MiB of clip buffers, rounded up to a whole GiB
    assert all(p.device_bytes + GiB <= rec.budget.device_usable for p in rec.estimate.phases)
    # a plan that fills the card (blocks offloaded to the last one that fits) leaves no room for a held pool
    tight = recommend(PlanRequest(1344, 768, 124), Budget(12 * GiB, 32 * GiB))
    assert tight.pool_mb == 0 and "does not fit beside" in tight.pool_note
