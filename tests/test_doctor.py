"""`h3director doctor`'s environment report: what it says about the native core and a bad config."""

from __future__ import annotations

import pytest

from h3director import native
from h3director.core import environment


def _c_library_loads() -> bool:
    try:
        native.implementation("c")
    except ImportError:
        return False
    return True


@pytest.mark.skipif(not _c_library_loads(), reason="the C library is not built in this checkout")
def test_a_built_library_forced_off_is_not_reported_as_not_built(monkeypatch):
    monkeypatch.setenv("H3_NATIVE", "numpy")
    line = environment.native_core_line()
    assert "forced off by H3_NATIVE=numpy" in line and "not built" not in line, line
    monkeypatch.delenv("H3_NATIVE")
    assert environment.native_core_line().startswith("C library (h3_core)")


def test_doctor_blames_the_variable_for_an_invalid_environment_override(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no ./h3_config.yaml: the packaged file is used
    monkeypatch.delenv("H3_CONFIG", raising=False)
    monkeypatch.setenv("H3_MEMORY_OPTIMIZATION_LEVEL", "9")
    env = environment.collect()
    [warning] = [w for w in env.warnings if "invalid" in w]
    assert "H3_MEMORY_OPTIMIZATION_LEVEL" in warning, warning
    assert env.config_problems == ["memory_optimization_level: 9 (from H3_MEMORY_OPTIMIZATION_LEVEL) is not allowed; "
                                   "allowed: 0 <= value <= 3"]
