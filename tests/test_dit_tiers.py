"""The DiT tier foundation: chunk ranges, plan validation, exactness classes and the escalation ladder."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from h3director.dit.blocks import chunked_rows, grouped_attention
from h3director.dit.ranges import head_ranges, row_ranges
from h3director.dit.tiers import (
    ATTENTION_HEAD_GROUPS,
    ATTENTION_QUERY_CHUNKS,
    FFN_ROW_CHUNKS,
    LIFETIME_ONLY,
    QKV_COLUMN_GROUPS,
    QUERY_ALIGN,
    STOCK,
    DiTMemoryPlan,
    Exactness,
    escalation_ladder,
)
from h3director.errors import InvalidInputError


@given(total=st.integers(0, 5000), chunks=st.integers(1, 64), align=st.sampled_from([1, 8, 128]))
def test_row_ranges_cover_every_row_once_in_order(total, chunks, align):
    ranges = row_ranges(total, chunks, align)
    covered = [row for a, b in ranges for row in range(a, b)]
    assert covered == list(range(total))
    assert len(ranges) <= chunks
    assert all(b > a for a, b in ranges)
    assert all(a % align == 0 for a, _ in ranges)


def test_row_ranges_uneven_split():
    assert row_ranges(10, 3) == [(0, 4), (4, 8), (8, 10)]
    assert row_ranges(300, 2, 128) == [(0, 256), (256, 300)]


@pytest.mark.parametrize("args", [(-1, 2, 1), (10, 0, 1), (10, 2, 0)])
def test_row_ranges_refuse_bad_counts(args):
    with pytest.raises(InvalidInputError):
        row_ranges(*args)


def test_head_ranges_need_a_divisor_and_name_the_valid_ones():
    assert head_ranges(56, 4) == [(0, 14), (14, 28), (28, 42), (42, 56)]
    with pytest.raises(InvalidInputError, match=r"valid: \[1, 2, 4, 7, 8, 14, 28, 56\]"):
        head_ranges(56, 5)


def test_exactness_classes_follow_the_techniques():
    assert STOCK.is_stock and STOCK.exactness is Exactness.BY_CONSTRUCTION
    assert LIFETIME_ONLY.exactness is Exactness.BY_CONSTRUCTION and LIFETIME_ONLY.relies_on == ()
    plan = DiTMemoryPlan(head_chunks=4, ffn_chunks=8, query_chunks=2)
    assert plan.exactness is Exactness.WHERE_VERIFIED
    assert set(plan.relies_on) == {QKV_COLUMN_GROUPS, ATTENTION_HEAD_GROUPS, ATTENTION_QUERY_CHUNKS, FFN_ROW_CHUNKS}
    assert DiTMemoryPlan(ffn_chunks=2).relies_on == (FFN_ROW_CHUNKS,)
    assert plan.describe() == "4 head groups, 2 query chunks, 8 FFN row chunks"


@pytest.mark.parametrize("kwargs", [{"head_chunks": 0}, {"ffn_chunks": -1}, {"query_chunks": 1.5},
                                    {"head_chunks": True}, {"ffn_chunks": 2, "lifetime": False}])
def test_plan_refuses_bad_fields(kwargs):
    with pytest.raises(InvalidInputError):
        DiTMemoryPlan(**kwargs)


def test_plan_check_fits_names_the_problem():
    with pytest.raises(InvalidInputError, match="does not divide the model's 56 heads"):
        DiTMemoryPlan(head_chunks=3).check_fits(56)
    with pytest.raises(InvalidInputError, match="exceeds the 10 rows"):
        DiTMemoryPlan(ffn_chunks=11).check_fits(56, rows=10)
    with pytest.raises(InvalidInputError, match="query rows"):
        DiTMemoryPlan(query_chunks=3).check_fits(56, rows=2 * QUERY_ALIGN)
    DiTMemoryPlan(head_chunks=7, ffn_chunks=10, query_chunks=2).check_fits(56, rows=2 * QUERY_ALIGN)


def test_ladder_starts_at_lifetime_and_every_tier_fits():
    ladder = escalation_ladder(56, rows=41_822)
    assert ladder[0] == LIFETIME_ONLY
    assert len(set(ladder)) == len(ladder)
    for plan in ladder:
        plan.check_fits(56, 41_822)
    short = escalation_ladder(4, rows=100)
    assert all(p.query_chunks == 1 and p.ffn_chunks <= 100 for p in short)


def test_drivers_visit_every_group_and_chunk_once_and_drop_each_group():
    calls, projected = [], []

    def project(h0, h1):
        projected.append((h0, h1))
        return ("qkv", h0, h1)

    grouped_attention(DiTMemoryPlan(head_chunks=2, query_chunks=2), heads=4, rows=300,
                      project=project, attend_into=lambda qkv, h0, h1, a, b: calls.append((qkv[1], h0, h1, a, b)))
    assert projected == [(0, 2), (2, 4)]
    assert calls == [(0, 0, 2, 0, 256), (0, 0, 2, 256, 300), (2, 2, 4, 0, 256), (2, 2, 4, 256, 300)]
    seen = []
    chunked_rows(10, 3, lambda a, b: seen.append((a, b)))
    assert seen == [(0, 4), (4, 8), (8, 10)]
