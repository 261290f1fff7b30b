"""Long-form chains sized to the request: `geometry.chain_segments` and the planner's `LongForm`."""

from __future__ import annotations

import pytest

from h3director import geometry
from h3director.errors import InvalidInputError
from h3director.plan.estimate import PlanRequest
from h3director.plan.recommend import Budget, recommend
from h3director.units import GiB

GRID_124_TO_1000 = [f for f in range(124, 1001) if geometry.is_on_grid(f)]


@pytest.mark.parametrize("frames", GRID_124_TO_1000)
def test_every_chain_covers_exactly_the_requested_frames_on_the_grid(frames):
    for longest in (39, 56, 124, 192, 294, 481):
        segments = geometry.chain_segments(frames, longest)
        k = len(segments)
        assert sum(segments) - (k - 1) * geometry.CHAIN_OVERLAP == frames
        assert all(geometry.is_on_grid(s) and geometry.CHAIN_OVERLAP < s <= longest for s in segments) or k == 1
        assert max(segments) - min(segments) <= geometry.CLIP_LENGTH
        # the fewest segments: one fewer, even at the longest length, cannot cover the request
        assert (k - 1) * longest - max(k - 2, 0) * geometry.CHAIN_OVERLAP < frames


def test_the_issue_example_is_two_segments_of_192():
    assert geometry.chain_segments(362, 294) == (192, 192)
    assert geometry.chain_segments(362, 362) == (362,)


@pytest.mark.parametrize("frames, longest, overlap", [(363, 294, 22), (362, 300, 22), (362, 294, 21),
                                                       (362, 22, 22), (362, 5, 22)])
def test_off_grid_or_degenerate_chains_are_refused(frames, longest, overlap):
    with pytest.raises(InvalidInputError, match="grid|longer than the overlap"):
        geometry.chain_segments(frames, longest, overlap)


def test_the_plan_recommends_a_chain_sized_to_the_request_with_each_segment_priced():
    # Before: "2 chunks of 294 frames, 22-frame overlap" for 362 frames (a 566-frame video).
    advice = recommend(PlanRequest(1344, 768, 362), Budget(10 * GiB, 48 * GiB), formats=["q4_k_m"])
    lf = advice.long_form
    assert lf is not None
    assert lf.segments == (192, 192) and lf.total_frames == 362 and lf.max_chunk_frames == 277
    assert [p.conditioning_latent_frames for p in lf.plans] == [0, 7]
    # the conditioned segment costs more than the first; both fit the usable device memory
    assert lf.plans[0].peak_device_bytes < lf.plans[1].peak_device_bytes <= advice.budget.device_usable
    assert advice.request.frames == 192
    assert "2 segments (192 + 192 frames), 22-frame overlap -> 362 frames" in advice.summary()


@pytest.mark.parametrize("frames", [549, 1008, 2011])
def test_planned_chains_cover_the_request_exactly(frames):
    advice = recommend(PlanRequest(1344, 768, frames), Budget(12 * GiB, 64 * GiB))
    lf = advice.long_form
    assert lf is not None and lf.total_frames == frames
    assert max(lf.segments) <= lf.max_chunk_frames and len(lf.plans) == lf.chunks == len(lf.segments)
