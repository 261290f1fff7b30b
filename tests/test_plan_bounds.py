"""The planner's work does not grow with the length or the layer count, and its inputs are bounded."""

from h3director.plan import activations
from h3director.plan.activations import DiTShape, PackedRows, dit_forward_peak_bytes


def _count_blocks(monkeypatch, leak: bool = False) -> list[int]:
    calls = []
    real = activations._dit_block

    def counting(ledger, *args, **kwargs):
        calls.append(1)
        real(ledger, *args, **kwargs)
        if leak:                                   # a block that leaves something live behind
            ledger.alloc(f"leak{len(calls)}", 1)

    monkeypatch.setattr(activations, "_dit_block", counting)
    return calls


def test_the_dit_forward_replays_one_block_whatever_the_layer_count(monkeypatch):
    calls = _count_blocks(monkeypatch)
    rows = PackedRows(512, 0, 414, 37_296)
    peak_50 = dit_forward_peak_bytes(DiTShape(), rows)
    assert len(calls) == 1
    assert dit_forward_peak_bytes(DiTShape(layers=200), rows) == peak_50 == \
        dit_forward_peak_bytes(DiTShape(), rows, layers=1)


def test_a_block_that_changes_the_live_set_is_replayed_for_every_layer(monkeypatch):
    calls = _count_blocks(monkeypatch, leak=True)
    dit_forward_peak_bytes(DiTShape(layers=7), PackedRows(8, 0, 4, 64))
    assert len(calls) == 7
