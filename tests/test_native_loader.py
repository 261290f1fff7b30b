"""Loading the C library: ABI check, refusal of foreign libraries, forcing a backend."""

from __future__ import annotations

import logging
import shutil
import subprocess

import pytest
import torch

from h3director import native
from h3director.errors import InvalidInputError
from h3director.native import _loader, build


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


def test_fallback_logs_one_line_when_the_library_is_missing(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("H3_NATIVE", raising=False)
    monkeypatch.setattr(_loader, "_loaded", None)  # forget the real library for this test
    monkeypatch.setattr(_loader, "candidates", lambda: [tmp_path / "_h3_core.so"])
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
