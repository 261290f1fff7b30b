"""Render the figures of README.md and docs/*.md from the benches' results files (bench/results/*.json).

A rendered block in a document is everything between two markers:

    <!-- rendered: NAME -->
    ...
    <!-- /rendered -->

NAME is one of `RENDERERS` (it reads its results file and returns the block's text), or `BENCH/KEY` for a bench
whose results file `bench/results/BENCH.json` holds `tables` or `figures` (bench/_results.py `table`): KEY names
a table (rendered as a markdown table, its note, and where the numbers come from) or a figure (its text, one
line, for a sentence of the document). Nobody edits a block by hand.

    python scripts/render_docs.py           rewrite every block from its results file
    python scripts/render_docs.py --stale   print the benches whose results are missing or stale
    python scripts/render_docs.py --check   change nothing; exit 1 naming every block that differs from its
                                            results file, every results file that is missing, and every one
                                            older than the code it describes (the code of one of its sources,
                                            comments, docstrings and __all__ aside, differs from the code at
                                            the commit that produced it)

Run from anywhere; paths are the repository's. The staleness check needs the git history (in a shallow clone
it is skipped and says so).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
# what the ComfyUI decode bench measures: the streaming node and what it runs
COMFY_DECODE_SOURCES = ("h3director/comfy/nodes_decode.py", "h3director/integrations/comfy_vae.py", "h3director/video",
                        "bench/comfy_decode_memory.py")
# what the A/V accuracy bench measures: `measure_file` and what it reads with, and the clips it writes
AVSYNC_SOURCES = tuple(f"h3director/av/{name}.py" for name in ("measure", "onsets", "envelopes", "media", "open_file")
                       ) + ("fixtures/synthetic_av.py", "bench/avsync_accuracy.py")
DOCUMENTS = ("README.md", "docs/*.md")
BLOCK = re.compile(r"(<!-- rendered: ([a-z0-9_]+(?:/[a-z0-9_]+)?) -->\n)(.*?)(<!-- /rendered -->)", re.S)


@dataclass(frozen=True)
class Renderer:
    """`results`: the file under bench/results/; `sources`: the paths (files or folders) whose code produced it;
    `render`: the results' JSON -> the block's text (without the markers, ending with a newline). A renderer
    without `sources` reads them from the results file (`write_results(..., sources=)`)."""

    results: str
    sources: tuple[str, ...] | None
    render: Callable[[dict], str]

    def sources_of(self, data: dict) -> tuple[str, ...]:
        """The paths whose later change makes `data` stale."""
        return self.sources if self.sources is not None else tuple(data.get("sources") or ())


def _bench_module(name: str):
    sys.path.insert(0, str(REPO / "bench"))
    try:
        return __import__(name)
    finally:
        sys.path.pop(0)


def _provenance(data: dict) -> str:
    code = data.get("code") or {}
    commit = (code.get("commit") or "unknown")[:10]
    machine = data.get("machine") or {}
    return (f"Results: `bench/results/{data['bench']}.json` (commit {commit}"
            f"{', uncommitted changes' if code.get('dirty') else ''}; {data.get('date', 'no date')}; "
            f"{machine.get('cpus', '?')} CPUs, {machine.get('platform', 'unknown platform')}).\n")


def _planner_external(data: dict) -> str:
    module = _bench_module("planner_external")
    return module.markdown(data["rows"], data["counts"]) + "\n\n" + _provenance(data)


def _avsync_accuracy(data: dict) -> str:
    summary = data["summary"]
    lines = ["| set | cases | median abs(error) ms | max abs(error) ms | mean error ms | median confidence |",
             "|---|---|---|---|---|---|"]
    for name in ("beep-flash", "speech", "aac", "pcm", "all"):
        row = summary[name]
        lines.append(f"| {name} | {row['cases']} | {row['median_abs_ms']:.2f} | {row['max_abs_ms']:.2f} | "
                     f"{row['mean_ms']:+.2f} | {row['median_confidence']:.2f} |")
    none, targets = summary["no_events"], summary["targets"]
    lines += ["", f"No-event clips: {none['unusable']}/{none['cases']} answered \"no usable events\". Targets (median "
              f"<= {targets['median_abs_ms_max']:g} ms, max <= one frame = {targets['max_abs_ms_max']:g} ms): "
              f"{'met' if targets['met'] else 'NOT met'}.", "", _provenance(data).rstrip()]
    return "\n".join(lines) + "\n"


def _planner_external_counts(data: dict) -> str:
    counts = data["counts"]
    return (", ".join(f"{n} {band}" for band, n in counts.items()) + f" (of {sum(counts.values())} rows; "
            f"`bench/results/{data['bench']}.json`).\n")


def _comfy_decode_memory(data: dict) -> str:
    return _bench_module("comfy_decode_memory").markdown(data["rows"]) + "\n\n" + _provenance(data)


def _comfy_decode_memory_ratio(data: dict) -> str:
    module = _bench_module("comfy_decode_memory")
    longest = max(data["rows"], key=lambda row: row["frames"])
    width, height = data["size"]
    return (f"{module.ratio(longest):.1f}x smaller at {longest['frames']} frames ({width}x{height}, CPU, each run in its "
            "own process with the high-water mark reset before the decode)\n")


def _generic(key: str) -> Callable[[dict], str]:
    """The block of table or figure `key` of a results file (see the module docstring)."""
    def render(data: dict) -> str:
        if key in (data.get("figures") or {}):
            return str(data["figures"][key]).rstrip("\n") + "\n"
        found = (data.get("tables") or {}).get(key)
        if found is None:
            known = sorted({*(data.get("tables") or {}), *(data.get("figures") or {})})
            raise KeyError(f"no table or figure {key!r} in bench/results/{data['bench']}.json (has: {', '.join(known)})")
        return _bench_module("_results").table_markdown(found) + "\n\n" + _provenance(data)
    return render


def renderer_for(name: str) -> Renderer | None:
    """The renderer of block `name`: a named one, or the generic one of `BENCH/KEY`; None when neither."""
    if name in RENDERERS:
        return RENDERERS[name]
    if "/" in name:
        bench, key = name.split("/", 1)
        return Renderer(f"{bench}.json", None, _generic(key))
    return None


def _shared_read_copies(data: dict) -> str:
    return _bench_module("shared_read_copies").markdown(data["rows"], data["arguments"]) + "\n\n" + _provenance(data)


def _arena_staging(data: dict) -> str:
    return (_bench_module("arena_staging").markdown(data["rows"], data["arguments"]) + "\n\n  "
            + _provenance(data))


def _dit_quantised_cell(record: dict) -> str:
    if record["decision"] != "chunk":
        return f"kept stock: {record['reason']}"
    measured = list(record["measured"].values())
    equal = sum(m["equal"] for m in measured)
    if equal == len(measured):
        return f"{record['exactness']}; equal in all {len(measured)}"
    worst = max(m["max_abs_diff"] for m in measured)
    return f"{record['exactness']}; UNEQUAL in {len(measured) - equal} of {len(measured)} (max difference {worst:.3g})"


def _dit_quantised_exactness(data: dict) -> str:
    args = data["arguments"]
    lines = [f"One real ComfyUI quantised `Linear` per row ({args['out_features']} x {args['in_features']} weight, "
             f"{args['rows']} input rows, {args['dtype']}, {args['device']}, {args['threads']} threads), each chunked "
             "use `torch.equal` to the whole call (counts: row chunk counts, weight-row slice counts).", "",
             "| format | path | input_scale | rows | weight rows | fc2 with SwiGLU |", "|---|---|---|---|---|---|"]
    for entry in data["results"]:
        uses = entry["uses"]
        scale = "none" if entry["input_scale"] is None else f"{entry['input_scale']:g}"
        lines.append(f"| {entry['format']} | {entry['path']} | {scale} | {_dit_quantised_cell(uses['rows'])} | "
                     f"{_dit_quantised_cell(uses['weight_rows'])} | {_dit_quantised_cell(uses['act_rows'])} |")
    wrong = data["unequal_where_reported_exact"]
    lines += ["", "Chunked uses unequal to the whole call: " + (", ".join(wrong) if wrong else "none") + ".", "",
              _provenance(data).rstrip()]
    return "\n".join(lines) + "\n"


DIT_QUANTISED_SOURCES = ("h3director/dit/quantised.py", "h3director/integrations/comfy_quant.py",
                         "bench/dit_quantised_exactness.py", "fixtures/comfy_harness/quant_layers.py")

RENDERERS: dict[str, Renderer] = {
    "planner_external": Renderer("planner_external.json", ("h3director/plan", "bench/planner_external.py"),
                                 _planner_external),
    "planner_external_counts": Renderer("planner_external.json", ("h3director/plan", "bench/planner_external.py"),
                                        _planner_external_counts),
    "avsync_accuracy": Renderer("avsync_accuracy.json", AVSYNC_SOURCES, _avsync_accuracy),
    "comfy_decode_memory": Renderer("comfy_decode_memory.json", COMFY_DECODE_SOURCES, _comfy_decode_memory),
    "comfy_decode_memory_ratio": Renderer("comfy_decode_memory.json", COMFY_DECODE_SOURCES, _comfy_decode_memory_ratio),
    "shared_read_copies": Renderer("shared_read_copies.json", ("h3director/core/shared_store.py",
                                                               "h3director/comfy/nodes_shared.py",
                                                               "bench/shared_read_copies.py"), _shared_read_copies),
    "arena_staging": Renderer("arena_staging.json", ("h3director/native", "h3director/video/sinks/pixels.py",
                                                     "bench/arena_staging.py"), _arena_staging),
    "dit_quantised_exactness": Renderer("dit_quantised_exactness.json", DIT_QUANTISED_SOURCES,
                                        _dit_quantised_exactness),
}


def documents() -> list[Path]:
    """The documents that may hold rendered blocks."""
    found = []
    for pattern in DOCUMENTS:
        found += sorted(REPO.glob(pattern))
    return found


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=60)


def _without_documentation(source: bytes) -> str:
    """A Python file's code with what does not run removed: comments, docstrings and `__all__` (the AST's dump);
    a file that does not parse is compared as it is."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return source.decode("utf-8", "replace")
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            node.body = [statement for statement in body
                         if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant)
                                 and isinstance(statement.value.value, str))
                         and not (isinstance(statement, (ast.Assign, ast.AnnAssign)) and any(
                             isinstance(target, ast.Name) and target.id == "__all__"
                             for target in (statement.targets if isinstance(statement, ast.Assign)
                                            else [statement.target])))] or [ast.Pass()]
    return ast.dump(tree)


def _code(text: bytes, path: str) -> str:
    """What of a file decides what a bench measures: Python without its documentation, other files whole."""
    import hashlib

    kept = _without_documentation(text) if path.endswith(".py") else text.decode("utf-8", "replace")
    return hashlib.sha256(kept.encode()).hexdigest()


def _code_at(commit: str, sources: tuple[str, ...]) -> dict[str, str] | None:
    """{path: code hash} of the files under `sources` at `commit`; None when git cannot tell (the commit is
    not in this clone)."""
    listing = _git("ls-tree", "-r", commit, "--", *sources)
    if listing.returncode != 0:
        return None
    blobs = {}
    for line in listing.stdout.splitlines():
        meta, path = line.split("\t", 1)
        blobs[path] = meta.split()[2]
    if not blobs:
        return {}
    read = subprocess.run(["git", "-C", str(REPO), "cat-file", "--batch"], input="\n".join(blobs.values()).encode()
                          + b"\n", capture_output=True, timeout=120)
    out, found, at = read.stdout, {}, 0
    for path in blobs:
        header_end = out.index(b"\n", at)
        size = int(out[at:header_end].split()[2])
        found[path] = _code(out[header_end + 1:header_end + 1 + size], path)
        at = header_end + 1 + size + 1
    return found


def _code_now(sources: tuple[str, ...]) -> dict[str, str]:
    """{path: code hash} of the tracked files under `sources` as they are in the checkout."""
    tracked = _git("ls-files", "--", *sources).stdout.splitlines()
    return {path: _code((REPO / path).read_bytes(), path) for path in tracked if (REPO / path).is_file()}


def staleness(name: str, data: dict) -> str | None:
    """Why the results of renderer `name` are older than the code they describe, or None when they are not (or
    when the history needed to tell is missing: a shallow clone).

    The code of the renderer's sources at the results' commit is compared with the checkout's, without comments,
    docstrings and `__all__` (they change nothing a bench measures): any other change, a file added, removed or
    moved makes the results stale."""
    renderer = renderer_for(name)
    sources = renderer.sources_of(data)
    code = data.get("code") or {}
    if code.get("dirty"):
        return f"{renderer.results} was produced with uncommitted changes: rerun it on committed code"
    commit = code.get("commit")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        return None
    if not commit:
        return f"{renderer.results} names no commit"
    if not sources:
        return f"{renderer.results} names no sources (write_results(..., sources=))"
    then = _code_at(commit, sources)
    if then is None:
        return f"{renderer.results} comes from commit {commit[:10]}, which this clone does not have: rerun the bench"
    now = _code_now(sources)
    changed = sorted(path for path in then.keys() | now.keys() if then.get(path) != now.get(path))
    if changed:
        return (f"{renderer.results} comes from commit {commit[:10]}, but the code of "
                f"{', '.join(changed[:6])}{' ...' if len(changed) > 6 else ''} changed since: rerun the bench")
    return None


def render_all(check: bool) -> list[str]:
    """Render (or, with `check`, compare) every block; returns the problems found, one line each."""
    problems: list[str] = []
    loaded: dict[str, dict | None] = {}
    for path in documents():
        text = path.read_text()

        def replace(match: re.Match, path: Path = path) -> str:
            name = match.group(2)
            where = f"{path.relative_to(REPO)}: block {name!r}"
            renderer = renderer_for(name)
            if renderer is None:
                problems.append(f"{where}: no renderer of that name (known: {', '.join(RENDERERS)}, or BENCH/KEY)")
                return match.group(0)
            if name not in loaded:
                results = RESULTS / renderer.results
                loaded[name] = json.loads(results.read_text()) if results.is_file() else None
                if loaded[name] is None:
                    problems.append(f"{where}: bench/results/{renderer.results} is missing")
                elif (stale := staleness(name, loaded[name])) is not None:
                    problems.append(f"{where}: {stale}")
            if loaded[name] is None:
                return match.group(0)
            try:
                body = renderer.render(loaded[name])
            except KeyError as missing:
                problems.append(f"{where}: {missing.args[0]}")
                return match.group(0)
            if check and body != match.group(3):
                problems.append(f"{where}: differs from bench/results/{renderer.results} "
                                "(run scripts/render_docs.py)")
            return match.group(1) + body + match.group(4)

        rendered = BLOCK.sub(replace, text)
        if not check and rendered != text:
            path.write_text(rendered)
    return problems


def stale_benches() -> list[str]:
    """The benches (results file stems) whose results some document renders and that are missing or stale."""
    names = set()
    for path in documents():
        for match in BLOCK.finditer(path.read_text()):
            renderer = renderer_for(match.group(2))
            if renderer is None:
                continue
            results = RESULTS / renderer.results
            if not results.is_file() or staleness(match.group(2), json.loads(results.read_text())) is not None:
                names.add(renderer.results.removesuffix(".json"))
    return sorted(names)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 on any difference")
    parser.add_argument("--stale", action="store_true",
                        help="change nothing; print the bench of every results file that is missing or stale, one "
                             "per line (for scripts/run_rendered_benches.sh)")
    args = parser.parse_args(argv)
    if args.stale:
        print("\n".join(stale_benches()))
        return 0
    problems = render_all(args.check)
    for line in problems:
        print(line)
    if not problems:
        print("every rendered block matches its results file" if args.check else "rendered")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
