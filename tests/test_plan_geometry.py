"""Token counts of the packed sequence against the published tables (h3-facts.md)."""

import pytest

from h3director.errors import InvalidInputError
from h3director.plan.estimate import PlanRequest, estimate, packed_geometry


def test_124_frames_at_1344x768():
    geo = packed_geometry(1344, 768, 124, text_tokens=0)
    assert geo.latent_frames == 37
    assert geo.tokens_per_latent_frame == 1008
    assert geo.video_tokens == 37 * 1008
    assert geo.audio_latents == 207          # 124 / 24 s x 40 latents/s, rounded as ComfyUI does
    assert geo.audio_rows == 2 * 207         # stereo: two rows per audio latent


def test_362_frames_is_107_latent_frames():
    geo = packed_geometry(1344, 768, 362, text_tokens=0)
    assert (geo.latent_frames, geo.video_tokens, geo.audio_rows) == (107, 107 * 1008, 2 * 603)


@pytest.mark.parametrize("frames, keyframes, published, implied_text", [
    (124, 2, 41_822, 2_096),    # fl2va with 2 keyframes (H3 workload profile of a ComfyUI fork)
    (345, 0, 104_030, 64),      # t2v, same profile
    (362, 0, 113_406, 4_344),   # h3_resolutions.md; prompt length not stated
])
def test_published_packed_lengths_leave_a_plausible_text_row_count(frames, keyframes, published, implied_text):
    rows = packed_geometry(1344, 768, frames, text_tokens=0, keyframes=keyframes)
    assert published - rows.packed_tokens == implied_text
    assert packed_geometry(1344, 768, frames, text_tokens=implied_text, keyframes=keyframes).packed_tokens == published


def test_off_grid_frames_name_the_nearest_legal_counts():
    with pytest.raises(InvalidInputError, match="125 is off H3's 17n\\+5 grid.*124 and 141"):
        estimate(PlanRequest(1344, 768, 125))


def test_sizes_not_multiples_of_32_name_the_nearest():
    with pytest.raises(InvalidInputError, match="height 760 .* multiple of 32 \\(nearest: 736 or 768\\)"):
        estimate(PlanRequest(1344, 760, 124))


def test_int32_hazard_is_noted_past_99864_tokens():
    from h3director.plan.activations import DiTShape
    from h3director.plan.estimate import int32_qkv_token_limit

    assert int32_qkv_token_limit(DiTShape()) == 99_864       # h3-facts.md
    assert not estimate(PlanRequest(1344, 768, 311)).notes
    assert any("int32" in note for note in estimate(PlanRequest(1344, 768, 345)).notes)
