"""H3 frame grid and the decode schedule, checked against the real diffusers VAE and ComfyUI's rule."""

import pytest
import torch
from decode_helpers import single_thread  # noqa: F401 - fixture

from h3director.errors import InvalidInputError
from h3director.geometry import (
    H3_TEMPORAL,
    causal_schedule,
    frames_for_latents,
    is_on_grid,
    latent_frames_for,
    nearest_grid_frames,
    video_tokens,
)


def comfy_output_frames(latent_frames: int) -> int:
    """ComfyUI `MiniMaxH3VideoVAE.decode_output_shape` for H3 (clip 17, time /4, token_drop 3), re-derived."""
    if latent_frames == 1:
        return 1
    chunk, ratio, drop, pre = 5, 4, 3, 3
    overlap_tokens = (-drop) % chunk
    total = latent_frames + drop
    pad = (-total) % chunk
    chunks = (total + pad) // chunk - 1
    if chunks < 1:
        pad += chunk
        chunks += 1
    padded = latent_frames + pad
    frames = last_tail = 0
    for i in range(chunks):
        clip = (min(i * chunk + chunk + overlap_tokens, padded) - min(i * chunk, padded)) * ratio
        frames += max(0, min(chunk * ratio, clip) - pre)
        last_tail = max(0, min(2 * chunk * ratio, clip) - chunk * ratio - pre)
    frames += last_tail
    pad_frames = sum(1 if (latent_frames + k) % chunk == 0 else ratio for k in range(pad))
    return frames - pad_frames


@pytest.mark.parametrize("n", range(0, 12))
def test_grid_round_trip(n):
    assert latent_frames_for(17 * n + 5) == 5 * n + 2
    assert frames_for_latents(5 * n + 2) == 17 * n + 5
    assert is_on_grid(17 * n + 5)


def test_known_values():
    assert latent_frames_for(124) == 37 and frames_for_latents(37) == 124
    assert video_tokens(1344, 768, 124) == 37 * 1008
    assert nearest_grid_frames(100) == (90, 107)
    assert not is_on_grid(100)


@pytest.mark.parametrize("latent_frames", range(1, 40))
def test_frames_follow_comfyui(latent_frames):
    assert frames_for_latents(latent_frames) == comfy_output_frames(latent_frames)


@pytest.mark.usefixtures("single_thread")
def test_frames_match_real_diffusers_decode(tiny_h3):
    """Lengths >= 3: the schedule's frame count is what diffusers' `_decode` returns (1x1 latents: cheap)."""
    for latent_frames in range(3, 23):
        z = torch.randn(1, 24, latent_frames, 1, 1)
        with torch.no_grad():
            frames = tiny_h3.decode(z).sample.shape[2]
        assert frames == frames_for_latents(latent_frames), latent_frames


def test_diffusers_refuses_shortest_lengths(tiny_h3):
    """Why lengths 1 and 2 follow ComfyUI: diffusers has no clip to decode there."""
    for latent_frames in (1, 2):
        with pytest.raises((RuntimeError, ValueError)), torch.no_grad():
            tiny_h3.decode(torch.randn(1, 24, latent_frames, 1, 1))


@pytest.mark.parametrize("latent_frames", [1, 2, 3, 6, 7, 8, 12, 13, 37, 42])
def test_schedule_final_ranges_tile_the_output(latent_frames):
    schedule = H3_TEMPORAL.decode_schedule(latent_frames)
    covered = []
    for clip in schedule.clips:
        start, stop = schedule.final_range(clip)
        covered.extend(range(start, stop))
        assert 0 <= clip.latent_start < clip.latent_stop <= schedule.padded_latent_frames
        if latent_frames > 1:
            assert clip.latent_length == 7
            assert clip.blend_frames == (5 if clip.index else 0)
    assert covered == list(range(schedule.frames))


def test_causal_schedule():
    schedule = causal_schedule(6, 4)
    assert schedule.frames == 1 + 4 * 5
    assert [schedule.final_range(c) for c in schedule.clips][:3] == [(0, 1), (1, 5), (5, 9)]


@pytest.mark.parametrize("bad", [0, -3])
def test_refuses_non_positive(bad):
    with pytest.raises(InvalidInputError):
        frames_for_latents(bad)
    with pytest.raises(InvalidInputError):
        latent_frames_for(bad)


def test_first_clip_for_a_resumed_job():
    schedule = H3_TEMPORAL.decode_schedule(17)   # 3 clips: frames [0, 17), [17, 34), [34, 56)
    assert schedule.first_clip_for(0) == 0
    assert schedule.first_clip_for(16) == 0
    assert schedule.first_clip_for(17) == 0   # clip 1 is missing; it blends with clip 0's tail
    assert schedule.first_clip_for(34) == 1
    assert schedule.first_clip_for(56) == 3   # nothing left
    assert causal_schedule(5, 4).first_clip_for(9) == 0   # a causal cache needs every earlier step


@pytest.mark.parametrize("frames", [5, 22, 56, 124, 141, 209, 362])
def test_audio_latents_follow_comfyui_temporal_shape(frames):
    # ComfyUI's comfy_extras/nodes_minimax_h3.py temporal_shape: round(frame_count / FPS * AUDIO_LATENT_FPS)
    from h3director.geometry import audio_latent_frames_for

    duration_s = frames / 24
    assert audio_latent_frames_for(frames) == round(duration_s * 40)
    assert abs(audio_latent_frames_for(frames) - frames * 5 / 3) < 0.5   # 5 audio latents per 3 video frames


def test_audio_latents_for_the_published_lengths():
    from h3director.geometry import audio_latent_frames_for

    assert audio_latent_frames_for(124) == 207 and audio_latent_frames_for(56) == 93
