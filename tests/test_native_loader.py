"""Loading the C library: ABI check, refusal of foreign libraries, forcing a backend, building it on first use
into a per-user cache (a temporary one here), and the fallback without a compiler (PATH without cc, or CC naming
a missing program), as the loader and `h3director doctor` report it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from h3director import native
from h3director.core import environment
from h3director.errors import InvalidInputError
from h3director.native import _loader, build

HAVE_CC = shutil.which(build.compiler()[0]) is not None
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def fresh_loader(tmp_path, monkeypatch):
    """The loader as in a fresh process of a clone: nothing loaded yet, no library installed next to the source,
    an empty per-user cache in `tmp_path/cache`."""
    monkeypatch.delenv("H3_NATIVE", raising=False)
    monkeypatch.delenv("H3_NATIVE_LIB", raising=False)
    monkeypatch.setenv("H3_NATIVE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(_loader, "_loaded", None)
    monkeypatch.setattr(_loader, "_built_now", False)
    monkeypatch.setattr(_loader, "candidates", lambda: [build.cached_library_path()])
    return tmp_path / "cache"


def test_environment_forces_the_numpy_backend(monkeypatch):
    monkeypatch.setenv("H3_NATIVE", "numpy")
    assert native.backend() == "numpy"
    assert native.implementation().NAME == "numpy"


def test_unknown_backend_name_is_refused():
    with pytest.raises(InvalidInputError, match="'c' or 'numpy'"):
        native.implementation("cuda")


def test_a_file_that_is_not_a_library_is_refused(tmp_path):
    fake = tmp_path / "_h3_core.so"
    fake.write_bytes(b"not an ELF file")
    with pytest.raises(OSError):
        _loader.open_library(fake)


@pytest.mark.skipif(shutil.which(build.compiler()[0]) is None, reason="no C compiler")
def test_a_library_with_another_abi_version_is_refused(tmp_path):
    out = tmp_path / "_h3_core_abi999.so"
    subprocess.run([*build.compiler(), "-std=c11", "-O0", "-fPIC", "-shared", "-DH3_ABI_VERSION=999u",
                    "-o", str(out), str(build.SOURCE), "-pthread", "-lm"], check=True)
    with pytest.raises(OSError, match="ABI version 999"):
        _loader.open_library(out)


def test_fallback_logs_one_line_when_the_library_is_missing(fresh_loader, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))   # and cannot be built
    with caplog.at_level(logging.WARNING, logger="h3director.native"):
        assert [native.backend() for _ in range(3)] == ["numpy"] * 3
        assert native.pack_frames(torch.zeros(3, 1, 2, 2)).shape == (1, 2, 2, 3)
        with pytest.raises(ImportError, match="unavailable"):
            native.implementation("c")
    lines = [r for r in caplog.records if r.name == "h3director.native"]
    assert len(lines) == 1 and "numpy fallback" in lines[0].getMessage()
    assert _loader.describe().startswith("numpy fallback")


def test_on_demand_build_produces_a_loadable_library(tmp_path):
    if shutil.which(build.compiler()[0]) is None:
        pytest.skip("no C compiler")
    path = build.build(tmp_path / build.library_filename())
    lib = _loader.open_library(path)
    assert lib.h3_abi_version() == _loader.ABI_VERSION


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
def test_first_use_builds_the_library_into_the_cache_and_loads_it(fresh_loader):
    source_tree = sorted(p.name for p in build.SOURCE.parent.iterdir())
    assert not fresh_loader.exists()
    assert native.backend() == "c"
    state = _loader.status()
    assert state.built_now and state.reason == ""
    library = Path(state.library)
    assert library == build.cached_library_path() and library.is_file()
    assert library.parent.parent == fresh_loader and build.source_key() in library.parent.name
    assert [p.name for p in library.parent.iterdir()] == [library.name]          # no temporary file left
    assert sorted(p.name for p in build.SOURCE.parent.iterdir()) == source_tree  # nothing written beside the source
    assert "built on first use" in environment.native_core_line()
    frames = torch.rand(3, 2, 4, 4) * 2 - 1
    assert np.array_equal(native.pack_frames(frames, backend="c"), native.pack_frames(frames, backend="numpy"))


_CHILD = """
import json, sys
from h3director.native import _loader, build
_loader.candidates = lambda: [build.cached_library_path()]   # as in a clone: nothing installed beside the source
state = _loader.status()
print(json.dumps({"backend": state.backend, "library": state.library, "built_now": state.built_now}))
"""


@pytest.mark.skipif(not HAVE_CC, reason="no C compiler")
def test_processes_building_at_once_all_load_one_cached_library_and_later_ones_reuse_it(tmp_path):
    env = dict(os.environ, H3_NATIVE_CACHE=str(tmp_path / "cache"), PYTHONPATH=str(REPO))
    env.pop("H3_NATIVE", None)
    env.pop("H3_NATIVE_LIB", None)
    racers = [subprocess.Popen([sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE, text=True)
              for _ in range(3)]
    first = [json.loads(p.communicate(timeout=300)[0]) for p in racers]
    assert all(r["backend"] == "c" for r in first), first
    assert len({r["library"] for r in first}) == 1
    later = json.loads(subprocess.run([sys.executable, "-c", _CHILD], env=env, stdout=subprocess.PIPE, text=True,
                                      check=True, timeout=300).stdout)
    assert later == {**first[0], "built_now": False}
    folder = Path(first[0]["library"]).parent
    assert [p.name for p in folder.iterdir()] == [Path(first[0]["library"]).name]


@pytest.mark.parametrize("no_compiler", ["path_without_cc", "cc_names_a_missing_program"])
def test_without_a_compiler_the_fallback_is_used_and_reported(fresh_loader, tmp_path, monkeypatch, no_compiler):
    if no_compiler == "path_without_cc":
        monkeypatch.delenv("CC", raising=False)
        empty = tmp_path / "empty-bin"
        empty.mkdir()
        monkeypatch.setenv("PATH", str(empty))
        expected = "not on PATH"
    else:
        monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
        expected = f"$CC={str(tmp_path / 'no-such-cc')!r} not found"
    assert native.backend() == "numpy"
    state = _loader.status()
    assert state.backend == "numpy" and state.library is None and "no C compiler" in state.reason
    assert expected in state.reason, state.reason
    assert not fresh_loader.exists() or not any(fresh_loader.rglob("*.so"))
    line = environment.native_core_line()
    assert line.startswith("numpy fallback (no C compiler (") and expected in line, line
    assert "cost: " in line
    env_warnings = [w for w in environment.collect().warnings if "native core not in use" in w]
    assert len(env_warnings) == 1 and "C compiler" in env_warnings[0]


def test_doctor_cites_the_measured_fallback_cost_from_the_bench_results(tmp_path):
    results = tmp_path / "native.json"
    assert environment.native_fallback_cost(results).startswith("not measured")
    results.write_text(json.dumps({"date": "2026-12-01 15:00 UTC", "machine": "x86_64, 2 CPUs",
                                   "pack_frames": {"shape": [3, 24, 768, 1344], "fallback_over_c": 6.25}}))
    text = environment.native_fallback_cost(results)
    assert "6.2x" in text and "3x24x768x1344" in text and "2026-12-01 15:00 UTC" in text, text
    results.write_text(json.dumps({"date": "2026-12-01T18:00:00+00:00", "machine": {"processor": "x86_64", "cpus": 2},
                                   "pack_frames": {"shape": [3, 24, 768, 1344], "fallback_over_c": 5.0}}))
    text = environment.native_fallback_cost(results)      # bench/_results.py's record: machine is a dict
    assert "5.0x" in text and "x86_64, 2 CPUs" in text and "2026-12-01T18:00:00+00:00" in text, text
    results.write_text("{not json")
    assert environment.native_fallback_cost(results).startswith("not measured")
