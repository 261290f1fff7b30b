"""Keyframe selection (h3director.video.keyframes) and detail carry (h3director.video.detail_carry), with real
OpenCV flow on synthetic moving content whose all-frames-detailed truth is known (fixtures/synthetic_motion.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from synthetic_motion import MovingScenes

from h3director.errors import InvalidInputError
from h3director.video import detail_carry, keyframes


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(1.0 / np.mean((np.asarray(a, np.float64) - b) ** 2)))


def _carried(frames, detailed, indices, flow_warp):
    return np.stack([f.copy() for f in detail_carry.carry_detail(frames, detailed, indices, flow_warp=flow_warp)])


@pytest.fixture(scope="module")
def moving():
    """24 frames 64x96 translating (2, 1) px per frame; a cut to a second scene at frame 14."""
    clip = MovingScenes(frames=24, cut_at=14)
    return clip.clip(), clip.clip(detail=True)


# --- selection -------------------------------------------------------------------------------------


@pytest.mark.parametrize("count,n,expected", [(23, 5, (0, 5, 10, 15, 20, 22)), (20, 5, (0, 5, 10, 15, 19)),
                                              (5, 5, (0, 4)), (3, 1, (0, 1, 2))])
def test_every_n_includes_the_first_and_last_frame(count, n, expected):
    frames = np.zeros((count, 4, 4, 3), np.float32)
    assert keyframes.select_keyframes(frames, "every_n", n=n).indices == expected


def test_scene_score_follows_its_definition():
    # gray 0.2 for frames 0-4, 0.4 from frame 5: mafd = 0 except 0.2 at the cut, so score[5] = 2.19 * min(0.2, 0.2)
    frames = np.full((9, 8, 8, 3), 0.2, np.float32)
    frames[5:] = 0.4
    scores = keyframes.scene_scores(frames)
    assert scores[5] == pytest.approx(0.438, abs=1e-6)
    assert np.count_nonzero(scores) == 1
    frames[5:] = 0.8                                         # 2.19 * 0.6 is clipped to 1
    assert keyframes.scene_scores(frames)[5] == 1.0
    # steady change (mafd 0.1 at every step) scores 0.219 once, then 0: it is not a cut
    ramp = np.stack([np.full((8, 8, 3), 0.1 * t, np.float32) for t in range(8)])
    scores = keyframes.scene_scores(ramp)
    assert scores[1] == pytest.approx(0.219, abs=1e-6) and np.all(scores[2:] < 1e-6)


def _ffmpeg_scene_scores(frames_u8: np.ndarray) -> np.ndarray:
    """ffmpeg's own scene score (select filter, ``lavfi.scene_score``) of RGB frames converted to yuv420p."""
    import fractions

    import av

    graph = av.filter.Graph()
    source = graph.add_buffer(width=frames_u8.shape[2], height=frames_u8.shape[1], format="yuv420p",
                              time_base=fractions.Fraction(1, 24))
    select, sink = graph.add("select", "gte(scene\\,0)"), graph.add("buffersink")
    source.link_to(select)
    select.link_to(sink)
    graph.configure()
    scores = []
    for index, frame in enumerate(frames_u8):
        video = av.VideoFrame.from_ndarray(frame, format="rgb24").reformat(format="yuv420p")
        video.pts = index
        graph.push(video)
        scores.append(float(graph.pull().metadata["lavfi.scene_score"]))
    return np.array(scores)


def test_scene_score_is_on_ffmpeg_select_scale(moving):
    # the same numbers as ffmpeg's select=gt(scene,T) on the same frames, so its thresholds (0.4) mean the same
    originals, _ = moving
    frames = np.rint(originals * 255).astype(np.uint8)
    ours, theirs = keyframes.scene_scores(frames), _ffmpeg_scene_scores(frames)
    assert theirs[14] > 0.8
    assert np.abs(ours - theirs).max() < 0.002               # 0.00017 here


def test_scene_mode_finds_the_cut_and_brackets_it(moving):
    originals, _ = moving
    selection = keyframes.select_keyframes(originals, "scene", threshold=0.4)
    assert selection.indices == (0, 13, 14, 23)
    assert selection.scores[14] > 0.4 and np.delete(selection.scores, 14).max() < 0.05
    combined = keyframes.select_keyframes(originals, "every_n+scene", n=5, threshold=0.4)
    assert combined.indices == (0, 5, 10, 13, 14, 15, 20, 23)


def test_motion_mode_finds_the_peaks_with_the_minimum_spacing():
    clip = MovingScenes(frames=12, shift=(1.0, 0.0))
    speeds = [0, 1, 1, 1, 6, 1, 1, 1, 1, 4, 1, 1]            # px moved from frame t - 1 to t
    positions = np.cumsum(speeds)
    frames = np.stack([clip.render(p) for p in positions])
    wide = keyframes.select_keyframes(frames, "motion", min_spacing=3)
    assert {4, 9} <= set(wide.indices) and wide.indices[0] == 0 and wide.indices[-1] == 11
    assert wide.scores[4] == pytest.approx(6, rel=0.15) and wide.scores[9] == pytest.approx(4, rel=0.15)
    assert set(keyframes.select_keyframes(frames, "motion", min_spacing=6).indices) == {0, 4, 11}


def test_gather_returns_the_keyframes_as_a_batch_of_the_input_type(moving):
    originals, _ = moving
    as_torch = keyframes.gather_keyframes(torch.from_numpy(originals), (0, 5, 23))
    assert isinstance(as_torch, torch.Tensor) and torch.equal(as_torch[1], torch.from_numpy(originals[5]))
    assert np.array_equal(keyframes.gather_keyframes(originals, (0, 5, 23)), originals[[0, 5, 23]])


def test_indices_text_round_trips():
    assert keyframes.parse_indices(keyframes.format_indices((0, 5, 9))) == [0, 5, 9]
    assert keyframes.parse_indices("0, 5, 9") == [0, 5, 9]
    with pytest.raises(InvalidInputError, match="JSON list"):
        keyframes.parse_indices("zero, five")


# --- merge -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("flow_warp", [False, True])
def test_keyframes_come_out_exactly_and_the_inputs_are_untouched(moving, flow_warp):
    originals, truth = moving
    indices = keyframes.every_n_indices(24, 5)
    source = torch.from_numpy(originals.copy())
    detailed = torch.from_numpy(truth[list(indices)].copy())
    out = torch.empty(detail_carry.output_shape(source, detailed, indices))
    detail_carry.merge_into(out, source, detailed, indices, flow_warp=flow_warp)
    for slot, t in enumerate(indices):
        assert torch.equal(out[t], detailed[slot])
    assert np.array_equal(source.numpy(), originals)
    assert not torch.equal(out[7], source[7]) and float(out.min()) >= 0 and float(out.max()) <= 1


def test_without_flow_the_residuals_are_weighted_linearly(moving):
    originals, truth = moving
    indices = (0, 5, 10)
    out = _carried(originals[:11], truth[list(indices)], indices, flow_warp=False)
    w = np.float32(2 / 5)                                     # frame 7 between keyframes 5 and 10
    expected = originals[7] + (1 - w) * (truth[5] - originals[5]) + w * (truth[10] - originals[10])
    assert np.allclose(out[7], np.clip(expected, 0, 1), atol=1e-6)


def test_before_the_first_and_after_the_last_keyframe_its_residual_is_held(moving):
    originals, truth = moving
    out = _carried(originals[:8], truth[[3]], (3,), flow_warp=False)
    assert np.allclose(out[0], np.clip(originals[0] + truth[3] - originals[3], 0, 1), atol=1e-6)
    assert np.allclose(out[7], np.clip(originals[7] + truth[3] - originals[3], 0, 1), atol=1e-6)


def test_flow_warp_carries_translating_detail_closer_to_the_all_frames_result():
    clip = MovingScenes(frames=21, shift=(2.0, 1.0))
    originals, truth = clip.clip(), clip.clip(detail=True)
    indices = keyframes.every_n_indices(21, 5)
    between = [t for t in range(21) if t not in indices]
    plain = _psnr(_carried(originals, truth[list(indices)], indices, False)[between], truth[between])
    warped = _psnr(_carried(originals, truth[list(indices)], indices, True)[between], truth[between])
    nothing = _psnr(originals[between], truth[between])
    assert warped > plain + 2.0, (warped, plain)
    assert warped > nothing + 2.0, (warped, nothing)


def test_the_stream_holds_a_few_frames_not_the_clip():
    import tracemalloc

    clip = MovingScenes(frames=40, height=48, width=64)
    originals, truth = clip.clip(), clip.clip(detail=True)
    indices = keyframes.every_n_indices(40, 13)               # (0, 13, 26, 39)
    detailed = truth[list(indices)]
    frame_bytes = originals[0].nbytes
    for _ in detail_carry.carry_detail(originals[:3], truth[[0, 2]], (0, 2), flow_warp=True):
        pass                                                  # first use imports OpenCV: not traced
    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    for _ in detail_carry.carry_detail(originals, detailed, indices, flow_warp=True):
        pass
    peak = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    assert peak < 12 * frame_bytes, peak / frame_bytes        # 40 frames if the clip were held


def test_half_precision_tensors_are_read_as_float32(moving):
    originals, truth = moving
    indices = (0, 5, 10)
    half = torch.from_numpy(originals[:11]).to(torch.bfloat16)
    detailed = torch.from_numpy(truth[list(indices)]).to(torch.bfloat16)
    out = _carried(half, detailed, indices, False)
    assert out.dtype == np.float32 and np.array_equal(out[5], detailed[1].float().numpy())


def test_uint8_memmap_frames_give_the_float_result(moving, tmp_path):
    originals, truth = moving
    as_u8 = np.rint(originals * 255).astype(np.uint8)
    np.save(tmp_path / "frames.npy", as_u8)
    mapped = np.load(tmp_path / "frames.npy", mmap_mode="r")
    indices = (0, 6, 12)
    detailed = truth[list(indices)]
    from_file = _carried(mapped[:13], detailed, indices, True)
    from_float = _carried(as_u8[:13].astype(np.float32) / 255.0, detailed, indices, True)
    assert np.array_equal(from_file, from_float)


def test_larger_keyframes_resize_the_originals(moving):
    import cv2

    originals, truth = moving
    indices = (0, 5, 10)
    detailed = np.stack([cv2.resize(truth[t], (192, 128), interpolation=cv2.INTER_CUBIC) for t in indices])
    out = _carried(originals[:11], detailed, indices, True)
    assert out.shape == (11, 128, 192, 3)
    assert all(np.array_equal(out[t], detailed[slot]) for slot, t in enumerate(indices))
    upscaled = cv2.resize(originals[3], (192, 128), interpolation=cv2.INTER_CUBIC)
    assert _psnr(out[3], upscaled) > 20                      # the original, upscaled, plus a small detail


# --- bad input: refused before any output ----------------------------------------------------------


@pytest.mark.parametrize("indices,match", [
    ((0, 10, 5), "sorted and unique"), ((0, 5, 5), "sorted and unique"), ((0, 5, 24), "outside"),
    ((-1, 5), "outside"), ((0, 5.0), "integers"), ((), "no keyframe indices"),
])
def test_bad_indices_are_refused_before_any_output(moving, indices, match):
    originals, truth = moving
    detailed = truth[: max(len(indices), 1)]
    out = np.full((24, 64, 96, 3), 7.0, np.float32)
    with pytest.raises(InvalidInputError, match=match):
        detail_carry.carry_detail(originals, detailed[:len(indices)] if indices else detailed, indices)
    with pytest.raises(InvalidInputError, match=match):
        detail_carry.merge_into(out, originals, detailed[:len(indices)] if indices else detailed, indices)
    assert np.all(out == 7.0)


def test_mismatched_keyframes_are_refused_before_any_output(moving):
    originals, truth = moving
    with pytest.raises(InvalidInputError, match="3 detailed keyframes for 2 keyframe indices"):
        detail_carry.carry_detail(originals, truth[:3], (0, 23))
    with pytest.raises(InvalidInputError, match="channels"):
        detail_carry.carry_detail(originals, truth[:2, ..., :1], (0, 23))
    with pytest.raises(InvalidInputError, match=r"detailed keyframes must be \[K, H, W, C\]"):
        detail_carry.carry_detail(originals, truth[0], (0, 23))
    with pytest.raises(InvalidInputError, match="output must be"):
        detail_carry.merge_into(np.zeros((24, 32, 48, 3), np.float32), originals, truth[:2], (0, 23))



def test_keyframes_of_another_aspect_ratio_are_refused(moving):
    # 64x96 originals: a detailer that returns square (cropped) or transposed frames would be stretched, not merged
    originals, truth = moving
    for height, width in ((64, 64), (96, 64), (128, 160)):
        detailed = np.zeros((2, height, width, 3), np.float32)
        with pytest.raises(InvalidInputError, match="aspect ratio"):
            detail_carry.carry_detail(originals, detailed, (0, 23))
    for height, width in ((128, 192), (32, 48), (43, 64)):    # one factor for both sides, up to rounding
        assert detail_carry.output_shape(originals, np.zeros((2, height, width, 3), np.float32), (0, 23)) == (
            24, height, width, 3)

def test_bad_selection_parameters_are_refused(moving):
    originals, _ = moving
    with pytest.raises(InvalidInputError, match="at least n=30 frames, got 24"):
        keyframes.select_keyframes(originals, "every_n", n=30)
    for threshold in (0.0, 1.0, -0.2, 1.5):
        with pytest.raises(InvalidInputError, match=r"scene threshold must be in \(0, 1\)"):
            keyframes.select_keyframes(originals, "scene", threshold=threshold)
    with pytest.raises(InvalidInputError, match=r"scene threshold must be in \(0, 1\)"):
        keyframes.select_keyframes(originals, "every_n+scene", n=5, threshold=1.0)
    with pytest.raises(InvalidInputError, match="at least n=30 frames"):
        keyframes.select_keyframes(originals, "every_n+scene", n=30)
    with pytest.raises(InvalidInputError, match="min_spacing"):
        keyframes.select_keyframes(originals, "motion", min_spacing=0)
    with pytest.raises(InvalidInputError, match="unknown keyframe mode"):
        keyframes.select_keyframes(originals, "random")
    with pytest.raises(InvalidInputError, match="frames must be"):
        keyframes.select_keyframes(originals[0], "every_n")
