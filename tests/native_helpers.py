"""Shared by the tests/test_native_*.py files: run each test on both native backends."""

from __future__ import annotations

import pytest

from h3director import native


def backend_params() -> list:
    """pytest params "c" and "numpy"; "c" skips (with the loader's reason) where the library is absent."""
    try:
        native.implementation("c")
        c = pytest.param("c", id="c")
    except ImportError as exc:
        c = pytest.param("c", id="c", marks=pytest.mark.skip(reason=f"C library unavailable: {exc}"))
    return [c, pytest.param("numpy", id="numpy")]
