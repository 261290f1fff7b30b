"""glibc heap control: a pinned mmap threshold returns freed frame buffers to the OS."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from h3director.core import host_heap

# A child allocates and frees a 30 MiB buffer (glibc then raises its dynamic mmap threshold to 30 MiB
# and its trim threshold to 60 MiB), then allocates and frees a 24 MiB one, and prints how much of the
# second buffer is still resident after the free.
CHILD = textwrap.dedent("""
    import sys
    import numpy as np
    from h3director.core.devices import process_rss_bytes
    from h3director.core.host_heap import pin_mmap_threshold
    if sys.argv[1] == "pin":
        assert pin_mmap_threshold(1 << 20)
    first = np.ones(30 << 20, dtype=np.uint8); del first
    before = process_rss_bytes()
    second = np.ones(24 << 20, dtype=np.uint8); del second
    print(process_rss_bytes() - before)
""")


def _resident_after_free(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, check=True)
    return int(out.stdout.strip())


@pytest.mark.skipif(host_heap._glibc() is None, reason="needs glibc")
def test_pinned_threshold_returns_freed_buffers_where_the_dynamic_one_keeps_them():
    kept_dynamic = _resident_after_free("dynamic")
    kept_pinned = _resident_after_free("pin")
    assert kept_dynamic > 16 << 20, kept_dynamic   # glibc's default keeps the freed 24 MiB resident
    assert kept_pinned < 4 << 20, kept_pinned      # pinned: it went back to the OS


def test_out_of_range_threshold_is_refused():
    with pytest.raises(ValueError, match="0..33554432"):
        host_heap.pin_mmap_threshold(64 << 20)
    with pytest.raises(ValueError):
        host_heap.pin_mmap_threshold(-1)
