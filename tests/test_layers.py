"""The package's import direction: layers import only downwards (see shared design.md).

    native < core < plan < video < integrations < comfy < commands/cli

Relative imports count as their absolute names (see also tests/test_import_graph.py: no cycles at all).

The top-level leaf modules (`errors`, `units`, `geometry`, `fragmentation`) import nothing above
them and may be used by every layer. diffusers and ComfyUI are imported only from
`integrations/` and above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "h3director"
LAYERS = {"native": 0, "core": 1, "weights": 1, "plan": 2, "video": 3, "dit": 3, "av": 3, "resume": 3, "integrations": 4, "comfy": 5, "farm": 5,
          "commands": 6, "cli": 6, "__main__": 6}
LEAVES = {"errors", "units", "geometry", "fragmentation"}
FRAMEWORKS = {"diffusers", "transformers", "comfy", "comfy_api", "folder_paths", "server"}


def _layer_of(module: str) -> int | None:
    parts = module.split(".")
    if parts[0] != "h3director" or len(parts) < 2:
        return None
    return LAYERS.get(parts[1])


def _imports(path: Path, module: str) -> list[str]:
    """Every module name `path` imports, anywhere in it; relative imports resolved against its package."""
    names: list[str] = []
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = ".".join(package[:len(package) - (node.level - 1)] + ([node.module] if node.module else []))
            names += [f"{base}.{alias.name}" for alias in node.names] if not node.module else [base]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def _modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        yield path, module


def test_the_layer_table_covers_every_subpackage():
    subpackages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    modules = {p.stem for p in PACKAGE.glob("*.py")} - {"__init__"}
    assert subpackages | modules <= set(LAYERS) | LEAVES


@pytest.mark.parametrize("path,module", list(_modules()), ids=lambda v: str(v) if isinstance(v, str) else "")
def test_imports_point_down_only(path, module):
    own = _layer_of(module)
    upward = []
    for imported in _imports(path, module):
        target = _layer_of(imported)
        if own is None:
            # A leaf module may import other leaves only.
            stem = path.stem
            if stem in LEAVES and target is not None:
                upward.append(imported)
            continue
        if target is not None and target > own:
            upward.append(imported)
        if imported.split(".")[0] in FRAMEWORKS and own < LAYERS["integrations"]:
            upward.append(imported)
    assert not upward, f"{module} imports {upward}, which lie above it"
