"""glibc heap control: a pinned mmap threshold returns freed frame buffers to the OS."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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


# A child reports whether its mmap threshold is pinned (the probe from fixtures/comfy_harness/real_comfy.py) after
# doing what argv[1] says: nothing, pin_decode_threshold with the default config (1 MiB), or a streaming decode
# of the tiny H3 VAE at memory level 2 (what the ComfyUI node runs).
PROBE_CHILD = textwrap.dedent("""
    import sys
    import torch
    from comfy_harness.real_comfy import mmap_threshold_is_pinned
    from h3director.core.config import validate_config
    from h3director.core.host_heap import pin_decode_threshold
    config = validate_config({"memory_optimization_level": 2, "memory_safety": {"enabled": False}}, env={})
    if sys.argv[1] == "pin":
        assert pin_decode_threshold(config)
    elif sys.argv[1] == "decode":
        from h3director.integrations.diffusers_h3 import H3VideoAdapter
        from h3director.commands.demo_vaes import tiny_h3_vae
        from h3director.video.scheduler import stream_decode
        from h3director.video.sinks import Uint8FrameSink
        latents = torch.randn((1, 24, 12, 4, 4), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            report = stream_decode(H3VideoAdapter(tiny_h3_vae(seed=0)), latents, Uint8FrameSink(), config=config)
        assert report.clips_decoded == 2
    print(mmap_threshold_is_pinned())
""")


def _pinned_after(what: str) -> str:
    fixtures = str(Path(__file__).resolve().parents[1] / "fixtures")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([fixtures, os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", PROBE_CHILD, what], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.skipif(host_heap._glibc() is None, reason="needs glibc")
def test_the_streaming_decode_leaves_the_threshold_alone_and_the_cli_helper_pins_it():
    assert _pinned_after("nothing") == "False"
    assert _pinned_after("pin") == "True", "the probe sees a pinned threshold"
    assert _pinned_after("decode") == "False", "stream_decode changed a process-wide malloc setting"
