"""The allocation tracker the planner is calibrated with, checked on allocations of known size."""

import torch

from h3director.plan.live_bytes import LiveBytesTracker, peak_live_bytes


def test_counts_new_storage_and_its_release():
    with LiveBytesTracker() as tracker:
        a = torch.empty(1000, dtype=torch.float32)
        assert tracker.live_bytes == 4000
        b = torch.empty(250, dtype=torch.float64)
        assert tracker.live_bytes == 6000
        del a
        assert tracker.live_bytes == 2000
        del b
    assert tracker.live_bytes == 0
    assert tracker.peak_bytes == 6000


def test_views_and_in_place_ops_add_nothing():
    with LiveBytesTracker() as tracker:
        a = torch.zeros(64, 32)
        base = tracker.live_bytes
        v = a.view(32, 64).t()[1:]
        v.add_(1.0)
        a.mul_(2.0)
        _ = a.chunk(4)
        assert tracker.live_bytes == base == 64 * 32 * 4
        del a
        assert tracker.live_bytes == base     # the view keeps the storage alive
        del v, _
        assert tracker.live_bytes == 0


def test_tensors_from_outside_the_block_are_not_counted():
    weight = torch.randn(128, 64)
    x = torch.randn(16, 64)
    with LiveBytesTracker() as tracker:
        weight.t()                            # a view of an outside tensor
        x.add_(1)                             # in place on an outside tensor
        assert tracker.live_bytes == 0
        y = torch.nn.functional.linear(x, weight)
        assert tracker.live_bytes == 16 * 128 * 4
        del y


def test_peak_includes_temporaries_and_resize():
    x = torch.randn(1000)
    peak, result = peak_live_bytes(lambda t: (t * 2 + 1).sum(), x)
    assert peak == 2 * 4000                   # t*2 alive while (t*2)+1 is computed
    assert result.numel() == 1
    with LiveBytesTracker() as tracker:
        a = torch.empty(10)
        a.resize_(1000)
        assert tracker.live_bytes == 4000


def test_meta_tensors_are_sized_without_memory():
    with torch.device("meta"):
        layer = torch.nn.Linear(4096, 4096)
    x = torch.empty(100, 4096, device="meta")
    with LiveBytesTracker() as tracker:
        layer(x)
    assert tracker.peak_bytes == 100 * 4096 * 4
