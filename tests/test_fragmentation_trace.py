"""The H3 decode + upscale trace that bench/fragmentation.py replays: balanced, and sized from the geometry."""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

from h3director.geometry import H3_TEMPORAL, latent_frames_for


@pytest.fixture(scope="module")
def bench():
    path = Path(__file__).resolve().parents[1] / "bench" / "fragmentation.py"
    spec = importlib.util.spec_from_file_location("bench_fragmentation", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module          # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def test_every_allocation_is_freed_once(bench):
    events = bench.h3_decode_upscale_trace(1344, 768, 39, layers=2)
    allocs = Counter(e.key for e in events if e.op == "alloc")
    frees = Counter(e.key for e in events if e.op == "free")
    assert allocs == frees and set(allocs.values()) == {1}
    first = {}
    for i, e in enumerate(events):
        first.setdefault(e.key, i)
        if e.op == "free":
            assert events[first[e.key]].op == "alloc", "freed before it was allocated"


def test_trace_sizes_follow_the_geometry(bench):
    width, height, frames = 1344, 768, 39
    events = bench.h3_decode_upscale_trace(width, height, frames, layers=2)
    clips = H3_TEMPORAL.reference_clip_count(latent_frames_for(frames))
    labels = Counter(e.label for e in events if e.op == "alloc")
    assert labels["tile pixels"] == clips * 4 * 7            # 256 px tiles, 64 px overlap over 768 x 1344
    assert labels["clip buffer"] == clips
    assert labels["upscaled frame"] == frames               # every finished frame is upscaled once
    clip = next(e for e in events if e.label == "clip buffer")
    assert clip.nbytes == 3 * 22 * height * width * 2
    tokens = 7 * 16 * 16 + 4
    qkv = next(e for e in events if e.label == "qkv")
    assert qkv.nbytes == 3 * tokens * 2048 * 2
    assert bench.peak_live_bytes(events) > clip.nbytes
