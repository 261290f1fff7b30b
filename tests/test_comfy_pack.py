"""Contract tests: the repository loads as a ComfyUI V3 node pack and every schema is well formed.

Runs without ComfyUI, on the stand-ins in `fixtures/comfy_harness/stubs` (see their docstrings for the
ComfyUI files they mirror); `tests/test_comfy_real.py` repeats the loading on a real ComfyUI.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from comfy_harness.loader import REPO, load_pack

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}


@pytest.fixture(scope="module")
def pack():
    return load_pack()


def test_pack_exports_v3_entry_point_and_web_directory(pack):
    module, extension, nodes = pack
    assert not hasattr(module, "NODE_CLASS_MAPPINGS")
    web = (REPO / module.WEB_DIRECTORY).resolve()
    assert web.is_dir() and any(p.suffix == ".js" for p in web.iterdir())
    names = {node.__name__ for node in nodes}
    assert names >= {"DecodeAVStreaming", "MonitorStart", "MonitorStop", "MemoryGuardNode", "SharedWrite", "SharedRead",
                     "FrameOffset", "PlanNode", "DiTMemoryNode", "GGUFDiTLoader", "CachedTextEncode",
                     "KeyframeSelect", "KeyframeMerge", "UpscaleStreaming", "ResumableSampler"}
    assert len(names) == len(nodes)


def test_node_ids_are_unique_prefixed_and_categorised(pack):
    schemas = [node.GET_SCHEMA() for node in pack[2]]
    ids = [s.node_id for s in schemas]
    assert len(ids) == len(set(ids))
    for schema in schemas:
        assert schema.node_id.startswith("H3Director"), schema.node_id
        assert schema.display_name.startswith("H3Director "), schema.display_name
        assert schema.category.startswith("H3 Director/"), schema.category
        assert schema.description


@pytest.mark.parametrize("index", [*range(8), "KeyframeSelect", "KeyframeMerge", "UpscaleStreaming"])
def test_schema_inputs_are_valid(pack, index):
    node = pack[2][index] if isinstance(index, int) else next(n for n in pack[2] if n.__name__ == index)
    schema = node.GET_SCHEMA()
    ids = [i.id for i in schema.inputs] + [o.id for o in schema.outputs]
    assert len(ids) == len(set(ids))
    for item in schema.inputs:
        io_type = item.io_type
        assert io_type, item.id
        if io_type in ("INT", "FLOAT") and item.default is not None:
            assert item.min <= item.default <= item.max, (schema.node_id, item.id)
            assert isinstance(item.default, int if io_type == "INT" else float)
        if io_type == "COMBO":
            assert item.options and item.default in item.options, (schema.node_id, item.id)
        if io_type in WIDGET_TYPES and not item.optional:
            assert item.default is not None, f"{schema.node_id}.{item.id}: required widget without default"
    # every required input is a parameter of execute without a default; optional ones have defaults
    import inspect

    params = inspect.signature(node.execute).parameters
    for item in schema.inputs:
        assert item.id in params, (schema.node_id, item.id)
        has_default = params[item.id].default is not inspect.Parameter.empty
        assert has_default == bool(item.optional), (schema.node_id, item.id)


def test_loading_the_pack_imports_nothing_heavy():
    code = (
        "import sys; sys.path[:0] = ['fixtures/comfy_harness/stubs', 'fixtures'];"
        "from comfy_harness.loader import load_pack; load_pack();"
        "heavy = [m for m in ('diffusers', 'matplotlib', 'av', 'transformers') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout


def test_h3director_is_loaded_once_from_the_folder_without_pip(tmp_path):
    # a copy of the pack with no h3director installed: the bootstrap must load the folder's copy
    import shutil

    copy = tmp_path / "H3-Director"
    shutil.copytree(REPO / "h3director", copy / "h3director", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("__init__.py", "_h3_bootstrap.py", "prestartup_script.py"):
        shutil.copy(REPO / name, copy / name)
    # -S: no site-packages, so neither a pip install nor an editable-install finder can supply it
    code = (
        "import sys, importlib.util;"
        f"spec = importlib.util.spec_from_file_location('pack', {str(copy / '__init__.py')!r});"
        "m = importlib.util.module_from_spec(spec); sys.modules['pack'] = m; spec.loader.exec_module(m);"
        "import h3director, h3director.comfy.settings;"
        "print(h3director.__file__);"
        "print(sorted(k for k in sys.modules if k.endswith('h3director')))"
    )
    out = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    first, names = out.stdout.strip().splitlines()
    assert Path(first).resolve().is_relative_to(copy.resolve())
    assert names == "['h3director']"
