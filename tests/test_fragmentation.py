"""The project's one definition of fragmentation, in both of its forms."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h3director.fragmentation import fragmentation, fragmentation_of


def test_one_run_is_not_fragmented_and_nothing_free_is_zero():
    assert fragmentation([4096]) == 0.0
    assert fragmentation([]) == 0.0 and fragmentation([0, 0]) == 0.0


def test_scattered_runs():
    assert fragmentation([64, 64, 64]) == pytest.approx(2 / 3)
    assert fragmentation([300, 100]) == pytest.approx(0.25)


@given(st.lists(st.integers(min_value=0, max_value=1 << 40), max_size=50))
def test_both_forms_agree(runs):
    assert fragmentation(runs) == fragmentation_of(max(runs, default=0), sum(runs))
    assert 0.0 <= fragmentation(runs) < 1.0


def test_impossible_inputs_are_refused():
    with pytest.raises(ValueError):
        fragmentation([10, -1])
    with pytest.raises(ValueError):
        fragmentation_of(20, 10)
