"""Numbers in the docs come from results files: every rendered block matches its results file and is not older
than the code it describes (scripts/render_docs.py --check), the planner's external check is recomputed here
against its results file, and every row of it beyond 10% carries a reason."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "scripts"))


def test_every_rendered_block_matches_its_fresh_results_file():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "render_docs.py"), "--check"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_planner_external_check_recomputed_equals_its_results_file():
    import planner_external

    records, counts = planner_external.table(planner_external.rows())
    saved = json.loads((REPO / "bench" / "results" / "planner_external.json").read_text())
    assert [r["what"] for r in records] == [r["what"] for r in saved["rows"]]
    for now, then in zip(records, saved["rows"], strict=True):
        assert now["predicted"] == pytest.approx(then["predicted"], rel=1e-12), now["what"]
        assert now["why"] == then["why"], now["what"]
    assert counts == saved["counts"]
    unexplained = [r["what"] for r in records if abs(r["error"]) > planner_external.MISS and not r["why"]]
    assert not unexplained, f"rows beyond 10% without a measured reason: {unexplained}"


def test_the_check_names_a_block_edited_by_hand_and_a_missing_results_file(tmp_path, monkeypatch):
    import render_docs

    docs = tmp_path / "docs"
    docs.mkdir()
    shutil.copy(REPO / "docs" / "PLANNER.md", docs / "PLANNER.md")
    text = (docs / "PLANNER.md").read_text()
    (docs / "PLANNER.md").write_text(text.replace("| +0.0% |", "| +0.1% |", 1))
    (docs / "EXTRA.md").write_text("<!-- rendered: avsync_accuracy -->\nold\n<!-- /rendered -->\n")
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(REPO / "bench" / "results" / "planner_external.json", results / "planner_external.json")
    monkeypatch.setattr(render_docs, "REPO", tmp_path)
    monkeypatch.setattr(render_docs, "RESULTS", results)
    monkeypatch.setattr(render_docs, "DOCUMENTS", ("docs/*.md",))
    monkeypatch.setattr(render_docs, "staleness", lambda name, data: None)   # no git history in tmp_path
    problems = render_docs.render_all(check=True)
    assert any("PLANNER.md: block 'planner_external': differs" in p for p in problems), problems
    assert any("EXTRA.md: block 'avsync_accuracy': bench/results/avsync_accuracy.json is missing" in p
               for p in problems), problems
    assert render_docs.render_all(check=False) == [p for p in problems if "missing" in p]
    assert (docs / "PLANNER.md").read_text() == text                  # rendering puts the figure back


def test_a_generic_block_renders_a_benchs_table_and_figure_and_names_an_unknown_key(tmp_path, monkeypatch):
    import render_docs
    from _results import table

    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "X.md").write_text("before\n<!-- rendered: toy/speed -->\nold\n<!-- /rendered -->\n"
                               "<!-- rendered: toy/headline -->\n\n<!-- /rendered -->\n"
                               "<!-- rendered: toy/absent -->\n\n<!-- /rendered -->\n")
    results = tmp_path / "results"
    results.mkdir()
    record = {"bench": "toy", "code": {"commit": "0" * 40, "dirty": False}, "machine": {"cpus": 2},
              "date": "2026-12-01", "sources": ["bench/toy.py"],
              "tables": {"speed": table(["size", "ratio"], [["1 MiB", "2.5x"], ["8 MiB", 3.25]], note="vs stock")},
              "figures": {"headline": "3.2x faster at 8 MiB"}}
    (results / "toy.json").write_text(json.dumps(record))
    monkeypatch.setattr(render_docs, "REPO", tmp_path)
    monkeypatch.setattr(render_docs, "RESULTS", results)
    monkeypatch.setattr(render_docs, "DOCUMENTS", ("docs/*.md",))
    monkeypatch.setattr(render_docs, "staleness", lambda name, data: None)
    problems = render_docs.render_all(check=False)
    assert problems == ["docs/X.md: block 'toy/absent': no table or figure 'absent' in bench/results/toy.json "
                        "(has: headline, speed)"]
    text = (docs / "X.md").read_text()
    assert "| size | ratio |\n|---|---|\n| 1 MiB | 2.5x |\n| 8 MiB | 3.25 |\n\nvs stock\n\nResults: `bench/results/toy.json`" in text
    assert "<!-- rendered: toy/headline -->\n3.2x faster at 8 MiB\n<!-- /rendered -->" in text
    assert render_docs.render_all(check=True) == problems


def test_a_table_with_a_short_row_is_refused():
    from _results import table

    with pytest.raises(ValueError, match="every row needs 2 cells"):
        table(["a", "b"], [["1"]])


def test_documentation_does_not_make_results_stale_but_code_does():
    from render_docs import _code

    base = b'"""Module."""\nimport os\n\n\ndef f(x):\n    """Twice x."""\n    return 2 * x  # double\n'
    documented = (b'"""Module: what it does, at length."""\nimport os\n\n\ndef f(x):\n    """Returns 2x (units: none)."""'
                  b'\n    # a comment\n    return 2 * x\n\n\n__all__ = ["f"]\n')
    changed = base.replace(b"2 * x", b"3 * x")
    assert _code(base, "m.py") == _code(documented, "m.py")
    assert _code(base, "m.py") != _code(changed, "m.py")
    assert _code(b"a: 1\n", "c.yaml") != _code(b"a: 1 # note\n", "c.yaml")    # other files compare whole
