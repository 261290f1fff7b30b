"""Allocator merge (prestartup), route input validation, shared conditioning and the guard node."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from comfy_harness.loader import REPO, install_stubs

from h3director.errors import InvalidInputError

install_stubs()


def _allocator(**values):
    base = dict(backend=None, expandable_segments=None, max_split_size_mb=None, garbage_collection_threshold=None)
    return SimpleNamespace(**{**base, **values})


def test_alloc_merge_keeps_comfyui_async_backend_and_drops_native_only_options():
    from h3director.comfy.alloc_env import merge_alloc_conf

    merged = merge_alloc_conf("backend:cudaMallocAsync", _allocator(expandable_segments=True))
    assert merged.value == "backend:cudaMallocAsync"
    assert any("expandable_segments ignored" in note for note in merged.notes)


def test_alloc_merge_config_backend_replaces_comfyui_default_and_adds_options():
    from h3director.comfy.alloc_env import merge_alloc_conf

    merged = merge_alloc_conf("roundup_power2_divisions:4,backend:cudaMallocAsync",
                              _allocator(backend="native", expandable_segments=True, max_split_size_mb=512))
    assert merged.value == "roundup_power2_divisions:4,backend:native,expandable_segments:True,max_split_size_mb:512"
    assert merge_alloc_conf(None, _allocator()).value is None
    assert merge_alloc_conf(None, _allocator(garbage_collection_threshold=0.8)).value == \
        "garbage_collection_threshold:0.8"
    with pytest.raises(ValueError, match="key:value"):
        merge_alloc_conf("nonsense", _allocator())


def test_prestartup_script_rewrites_the_variable_before_torch(tmp_path):
    config = tmp_path / "h3.yaml"
    config.write_text("allocator:\n  backend: native\n  expandable_segments: true\n")
    env = dict(os.environ, H3_CONFIG=str(config), PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")
    code = ("import importlib.util, os, sys;"
            f"spec = importlib.util.spec_from_file_location('p', {str(REPO / 'prestartup_script.py')!r});"
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
            "print(os.environ['PYTORCH_CUDA_ALLOC_CONF']); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["backend:native,expandable_segments:True", "False"]


def test_route_query_validation():
    from h3director.comfy.routes import int_query

    assert int_query({}, "samples", 120, 1, 2000) == 120
    assert int_query({"samples": "7"}, "samples", 120, 1, 2000) == 7
    for bad in ("-1", "0", "2001", "1e3", "abc", "../x"):
        with pytest.raises(InvalidInputError):
            int_query({"samples": bad}, "samples", 120, 1, 2000)


def test_render_report_png_stays_inside_output_folder(tmp_path):
    from h3director.comfy.live import start_monitor, stop_monitor
    from h3director.comfy.routes import render_report_png

    stop_monitor(start_monitor(10, "route"))
    png = render_report_png(tmp_path, 640, 360)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(tmp_path.iterdir()) == []


def test_shared_write_read_round_trip_conflict_and_disk_tier(tmp_path, monkeypatch):
    import folder_paths

    from h3director.comfy import nodes_shared
    from h3director.core.shared_store import SharedKeyConflictError

    monkeypatch.setattr(folder_paths, "temp_directory", str(tmp_path))
    monkeypatch.setattr(nodes_shared, "_store", None)
    _use_config(monkeypatch, {"memory_optimization_level": 3})
    cond = [[torch.randn(1, 7, 16), {"pooled_output": None, "minimax_keyframes": [
        {"resolved_frame_index": 0, "latent": torch.randn(1, 24, 1, 2, 2)}], "shape": (1, 2)}]]
    nodes_shared.write_shared("scene_a", cond, owner="node-1", replace=False)
    back = nodes_shared.read_shared("scene_a")
    assert torch.equal(back[0][0], cond[0][0])
    assert torch.equal(back[0][1]["minimax_keyframes"][0]["latent"], cond[0][1]["minimax_keyframes"][0]["latent"])
    assert back[0][1]["shape"] == (1, 2) and back[0][1]["pooled_output"] is None
    other = [[torch.randn(1, 7, 16), {}]]
    with pytest.raises(SharedKeyConflictError):
        nodes_shared.write_shared("scene_a", other, owner="node-2", replace=False)
    nodes_shared.write_shared("scene_a", other, owner="node-2", replace=True)
    assert torch.equal(nodes_shared.read_shared("scene_a")[0][0], other[0][0])
    # a fresh store (ComfyUI restarted) finds the entry in the disk tier
    monkeypatch.setattr(nodes_shared, "_store", None)
    assert torch.equal(nodes_shared.read_shared("scene_a")[0][0], other[0][0])
    with pytest.raises(InvalidInputError, match="no conditioning shared"):
        nodes_shared.read_shared("missing")
    with pytest.raises(InvalidInputError, match="letters"):
        nodes_shared.write_shared("bad/key", cond, owner="n", replace=False)
    with pytest.raises(InvalidInputError, match="cannot be shared"):
        nodes_shared.write_shared("objs", [[torch.zeros(1), {"hook": object()}]], owner="n", replace=False)


def test_two_shared_reads_hold_one_copy_and_a_write_names_the_reading_node(tmp_path, monkeypatch):
    import folder_paths

    from h3director.comfy import nodes_shared
    from h3director.core.shared_store import SharedTensorMutatedError

    monkeypatch.setattr(folder_paths, "temp_directory", str(tmp_path))
    monkeypatch.setattr(nodes_shared, "_store", None)
    _use_config(monkeypatch, {"memory_optimization_level": 3})
    with torch.inference_mode():                            # ComfyUI's nodes run in inference mode
        cond = [[torch.randn(1, 7, 16), {"pooled_output": torch.randn(1, 16)}]]
        written = nodes_shared.write_shared("scene_b", cond, owner="comfy-node-1", replace=False)
        reads = [nodes_shared.read_shared("scene_b", reader=f"comfy-node-{n}") for n in (5, 6)]
    addresses = {(c[0][0].untyped_storage().data_ptr(), c[0][1]["pooled_output"].untyped_storage().data_ptr())
                 for c in [written, *reads]}
    assert len(addresses) == 1, "the writer's output and both reads are views of one stored copy"
    assert torch.equal(reads[1][0][0], cond[0][0])
    with torch.inference_mode():
        reads[1][0][1]["pooled_output"].zero_()             # downstream of reader 6, a node writes in place
    with pytest.raises(SharedTensorMutatedError, match="by consumer 'comfy-node-6'"):
        nodes_shared.read_shared("scene_b", reader="comfy-node-5")
    assert torch.equal(nodes_shared.read_shared("scene_b")[0][1]["pooled_output"], cond[0][1]["pooled_output"])


def _use_config(monkeypatch, fields: dict):
    from h3director.comfy import settings
    from h3director.core.config import validate_config

    config = validate_config(fields, env={})
    monkeypatch.setattr(settings, "pack_config", lambda: config)
    return config


@pytest.mark.parametrize("fields", [{"memory_optimization_level": 2},
                                    {"memory_optimization_level": 3, "shared_memory_enabled": False}])
def test_shared_nodes_refuse_when_the_config_turns_the_store_off(tmp_path, monkeypatch, fields):
    import folder_paths

    from h3director.comfy import nodes_shared

    monkeypatch.setattr(folder_paths, "temp_directory", str(tmp_path))
    monkeypatch.setattr(nodes_shared, "_store", None)
    _use_config(monkeypatch, fields)
    with pytest.raises(InvalidInputError, match="shared store is off"):
        nodes_shared.write_shared("scene_a", [[torch.zeros(1, 2), {}]], owner="n", replace=False)
    with pytest.raises(InvalidInputError, match="shared store is off"):
        nodes_shared.read_shared("scene_a")
    assert nodes_shared.existing_store() is None and list(tmp_path.iterdir()) == []


def test_guard_node_adds_diffusion_model_wrapper_to_a_clone():
    from h3director.comfy.nodes_guard import GUARD_KEY, MemoryGuardNode

    class Patcher:
        """Mirrors the ModelPatcher surface the node uses: `load_device`, `clone()`, `add_wrapper_with_key`."""

        def __init__(self):
            self.load_device = torch.device("cpu")
            self.wrappers = {}

        def clone(self):
            return Patcher()

        def add_wrapper_with_key(self, wrapper_type, key, wrapper):
            self.wrappers.setdefault(wrapper_type, {}).setdefault(key, []).append(wrapper)

    original = Patcher()
    (patched,) = MemoryGuardNode.execute(original, "stop_and_clear", 64.0).args
    assert original.wrappers == {}
    (wrapper,) = patched.wrappers["diffusion_model"][GUARD_KEY]
    assert wrapper(lambda x: "ran", torch.zeros(1, 24, 1, 2, 2)) == "ran"
    huge = torch.zeros(1).expand(1, 24, 64, 256, 256)  # 1 M tokens x 116 kB > 64 GiB, no memory used
    with pytest.raises(Exception, match="Director Safety"):
        wrapper(lambda x: "ran", huge)


def test_plan_node_shows_estimate_and_recommendation():
    from h3director.comfy.nodes_plan import PlanNode
    from h3director.plan import PlanRequest, estimate

    latent = {"samples": torch.zeros(1, 24, 37, 48, 84)}  # 124 frames at 1344x768
    text, head_chunks, ffn_chunks, blocks_offloaded, budget_gb = PlanNode.execute(latent, 48.0).args
    assert text.startswith("H3 1344x768, 124 frames on the given budget (budget 48.00 GiB)")
    assert estimate(PlanRequest(width=1344, height=768, frames=124)).summary_table() in text
    assert len(text.splitlines()) > 3
    # the outputs are the recommendation's settings (what a written workflow sets on the same nodes)
    import psutil

    from h3director.plan.recommend import DIT_FORMATS, recommend
    from h3director.plan.workflow_comfy import loadable_formats

    advice = recommend(PlanRequest(width=1344, height=768, frames=124), 48 * 2**30,
                       host_bytes=psutil.virtual_memory().total, formats=loadable_formats(DIT_FORMATS))
    chosen = advice.request
    assert (head_chunks, ffn_chunks, blocks_offloaded) == (chosen.head_chunks, chosen.ffn_chunks,
                                                           chosen.offload_blocks)
    decode = next(p for p in advice.estimate.phases if p.name == "decode")
    assert decode.device_bytes / 2**30 <= budget_gb < decode.device_bytes / 2**30 + 0.01
    assert f"outputs: head_chunks {head_chunks}, ffn_chunks {ffn_chunks}" in text
    with pytest.raises(InvalidInputError):
        PlanNode.execute({"samples": torch.zeros(1, 4, 8, 8)}, 0.0)
