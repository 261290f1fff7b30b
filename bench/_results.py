"""Results files for benches: one JSON per bench run under bench/results/, with what produced it.

`write_results(path, bench, arguments, data, sources=...)` writes ``{"bench", "arguments", "code", "machine", "date",
"sources", ...data}`` atomically: `code` is the git commit of the checkout when the bench started (and whether it had uncommitted
changes to tracked files), `machine` the
platform, processor count, memory and library versions, `date` UTC ISO 8601, `sources` the paths (files or
folders) whose code the numbers measure. Documents quote these files; a number typed by hand has no such record.

Generic blocks: a bench that puts `tables` ({name: `table(...)`}) and/or `figures` ({name: text}) in its data can be
quoted in a document with `<!-- rendered: BENCH/NAME -->` (scripts/render_docs.py) without a renderer of its own.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def code_version() -> dict:
    """{"commit": 40 hex digits or None outside git, "dirty": uncommitted changes to tracked code (results files
    and documents do not count)}."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    commit = git("rev-parse", "HEAD")
    # results files and documents are not code: a bench run after another bench wrote its results is clean
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results", ":!docs", ":!*.md")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def machine() -> dict:
    """Platform, processors, memory (bytes) and the versions of the libraries the benches measure through."""
    import numpy

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version(), "numpy": numpy.__version__}
    try:
        import psutil

        info["memory_bytes"] = int(psutil.virtual_memory().total)
    except ImportError:
        pass
    try:
        import torch

        info["torch"] = torch.__version__
        info["cuda_device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError:
        pass
    return info


CODE_AT_START = code_version()
"""The checkout as it was when the bench started (imported): what the numbers were measured on."""


def table(columns: list[str], rows: list[list], note: str = "") -> dict:
    """A table for a generic rendered block: `columns` the header cells, `rows` the body (each cell formatted
    as the document should show it; numbers are written with `str`), `note` a sentence printed under it (what
    the figures compare with)."""
    if any(len(row) != len(columns) for row in rows):
        raise ValueError(f"every row needs {len(columns)} cells ({columns})")
    return {"columns": list(columns), "rows": [[str(cell) for cell in row] for row in rows], "note": note}


def write_results(path: str | os.PathLike, bench: str, arguments: dict, data: dict,
                  sources: tuple[str, ...] = ()) -> Path:
    """Write the results JSON of one run of `bench` (its `arguments` and measured `data`) to `path`, atomically,
    with the code version taken when the bench started (`CODE_AT_START`). `sources`: repository paths (files or
    folders) of the code measured, besides the bench itself (`bench/<bench>.py`, always included): a later
    commit that changes one of them makes these results stale for the render script."""
    from h3director.core.atomic_file import atomic_path

    own = f"bench/{bench}.py"
    record = {"bench": bench, "arguments": arguments, "code": CODE_AT_START, "machine": machine(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "sources": [own, *[s for s in sources if s != own]], **data}
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(target) as temporary:
        Path(temporary).write_text(json.dumps(record, indent=1, default=float) + "\n")
    return target


def table_markdown(found: dict) -> str:
    """A `table(...)` as the markdown the render script puts in a document (header, rows, note), for a bench's
    own printout."""
    lines = ["| " + " | ".join(found["columns"]) + " |", "|" + "---|" * len(found["columns"])]
    lines += ["| " + " | ".join(row) + " |" for row in found["rows"]]
    if found.get("note"):
        lines += ["", found["note"]]
    return "\n".join(lines)
