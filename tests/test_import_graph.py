"""The package's import graph has no cycle, and the benches do not import the tests.

Read from the AST of every module under `h3director/` (nothing is imported): `import a.b`, `from a import b`
and relative imports (`from . import x`, `from ..core import y`, resolved against the importing module's
package). Every import counts wherever it stands: at module level, inside a function, under
`if TYPE_CHECKING:` or in a `try:`. A function-level import still ties the two modules together (one cannot be
read, moved or tested without the other), so hiding an import inside a function does not break a cycle here.

`from pkg import name` is an edge to `pkg.name` when that is a module, else to `pkg` (its `__init__`).
Importing `pkg.sub` also runs `pkg/__init__.py`, but that edge is left out: a package's `__init__` that
re-exports its own submodules would otherwise be a cycle with each of them by construction.

The benches (`bench/`) may use the package, `fixtures/` and each other, never `tests/`: no import of a module that
lives under `tests/` (the benches put folders on `sys.path`, so a bare `import x` is checked against `tests/x.py`,
`tests/x/` and `tests/*/x.py`), and no path into `tests/` (a string "tests" or "tests/...") in their source. The
package never imports `fixtures/`.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "h3director"
BENCH = REPO / "bench"
TESTS = REPO / "tests"


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imported_names(path: Path, module: str, modules: set[str]) -> set[str]:
    """The package modules `path` (the module `module`) imports. Relative imports are resolved against the
    importing module's package; `from pkg import name` is `pkg.name` when that is a module, else `pkg`;
    `import a.b.c` is the longest of `a.b.c`, `a.b` that is a module."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()

    def add(name: str) -> None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)

    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                if not base:
                    raise AssertionError(f"{path}: relative import beyond the top-level package")
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                add(f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in modules else prefix)
    return found - {module}


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (see `_imported_names`). Importing `pkg.sub` also runs
    `pkg/__init__.py`; that implied edge is left out (a package's `__init__` may import its own submodules)."""
    modules = _package_modules()
    return {module: _imported_names(path, module, set(modules)) for module, path in modules.items()}


def subpackage_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The same graph between the package's parts: `h3director.video.x` is `video`, a top-level module
    (`errors`, `cli`) is itself, and `h3director/__init__.py` is left out (it sits above every part)."""
    def part(module: str) -> str | None:
        pieces = module.split(".")
        return pieces[1] if len(pieces) > 1 else None

    parts: dict[str, set[str]] = {}
    for module, targets in graph.items():
        source = part(module)
        if source is None:
            continue
        parts.setdefault(source, set()).update(
            t for t in map(part, targets) if t is not None and t != source)
    return parts


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component with more than one module, each as one cycle through it
    (Tarjan's algorithm, then a path search inside the component)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    counter = [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_one_cycle(graph, set(component)) for component in components]


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, as [a, b, ..., a]."""
    start = min(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for child in sorted(graph[node] & component):
                if child == start:
                    return paths[node] + [start]
                if child not in paths:
                    paths[child] = paths[node] + [child]
                    following.append(child)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")


def test_no_import_cycle_in_the_package():
    cycles = find_cycles(import_graph())
    assert not cycles, "import cycles in h3director/:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_no_import_cycle_between_the_package_parts():
    """`video` importing `av` while `av` imports `video` is a cycle even when no two modules form one."""
    cycles = find_cycles(subpackage_graph(import_graph()))
    assert not cycles, "import cycles between h3director's parts:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_cycles():
    """The check can fail: a two-module circle, a three-module circle and a relative import are each caught."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(map(tuple, find_cycles(graph))) == [("a", "b", "a"), ("c", "d", "e", "c")]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_are_resolved(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("from . import x\nfrom ..core import y\ndef f():\n    from .z import w\n")
    modules = {"h3director.video.x", "h3director.core", "h3director.video.z", "h3director.video.m"}
    assert _imported_names(path, "h3director.video.m", modules) == {"h3director.video.x", "h3director.core",
                                                                    "h3director.video.z"}
    graph = {"h3director.video.a": {"h3director.av.b"}, "h3director.av.b": {"h3director.video.c"},
             "h3director.video.c": set()}
    assert find_cycles(subpackage_graph(graph)) == [["av", "video", "av"]]


def _top_level_names(folder: Path) -> set[str]:
    """Import names `folder` provides when it, or a folder in it, is on `sys.path`: its modules and packages,
    and the modules of its subfolders."""
    names = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}
    names |= {p.stem for p in folder.glob("*/*.py")}
    return names - {"__init__", "conftest", "__pycache__"}


def bench_imports_of_tests(bench: Path = BENCH, tests: Path = TESTS) -> list[str]:
    """'file:line what' for each import of a module that lives in `tests` (or of `tests` itself), and each
    string naming a path into it ("tests", "tests/..."), in the Python files under `bench`. A name `bench` has a
    module or folder of its own for is the bench's."""
    own = {p.stem for p in bench.rglob("*.py")} | {p.name for p in bench.rglob("*") if p.is_dir()}
    forbidden = ({"tests"} | _top_level_names(tests)) - own
    found = []
    for path in sorted(bench.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            hit = None
            if isinstance(node, ast.Import):
                hit = next((a.name for a in node.names if a.name.split(".")[0] in forbidden), None)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                hit = node.module if node.module.split(".")[0] in forbidden else None
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value == "tests" or node.value.startswith("tests/"):
                    hit = repr(node.value)
            if hit:
                found.append(f"{path.relative_to(bench.parent)}:{node.lineno} {hit}")
    return found


def test_the_benches_do_not_import_the_tests():
    found = bench_imports_of_tests()
    assert not found, "bench/ reaches into tests/:\n" + "\n".join(found)


def test_the_bench_check_can_fail(tmp_path):
    (tmp_path / "tests" / "harness").mkdir(parents=True)
    (tmp_path / "tests" / "cases.py").write_text("")
    (tmp_path / "tests" / "harness" / "server.py").write_text("")
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "a.py").write_text(
        "import sys\nsys.path.insert(0, 'tests')\nfrom cases import X\ndef f():\n    import server\n")
    (tmp_path / "bench" / "ok.py").write_text("from h3director import units\nimport _results\n")
    found = bench_imports_of_tests(tmp_path / "bench", tmp_path / "tests")
    assert sorted(found) == ["bench/a.py:2 'tests'", "bench/a.py:3 cases", "bench/a.py:5 server"]


def test_the_package_does_not_import_the_fixtures():
    """`fixtures/` (what the tests and benches share) is never part of the product."""
    folder = REPO / "fixtures"      # its own top-level names (comfy_harness/server.py is `comfy_harness.server`)
    fixtures = {p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}
    found = [f"{module}: {name}" for module, path in _package_modules().items()
             for name in _all_imported_top_names(path) if name in fixtures]
    assert not found, "h3director/ imports fixtures/:\n" + "\n".join(found)


def _all_imported_top_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names
