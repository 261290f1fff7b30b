"""H3Director Keyframe Select and Keyframe Merge (ComfyUI nodes) on the stand-in comfy_api: the nodes give the
library's result (h3director.video.keyframes, detail_carry) and refuse bad wiring with the library's errors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from comfy_harness.loader import install_stubs

from h3director.errors import InvalidInputError

install_stubs()

from synthetic_motion import MovingScenes  # noqa: E402

from h3director.comfy.nodes_keyframes import KeyframeMerge, KeyframeSelect  # noqa: E402
from h3director.video import detail_carry  # noqa: E402


@pytest.fixture(scope="module")
def clip():
    scenes = MovingScenes(frames=20, cut_at=12)
    return torch.from_numpy(scenes.clip()), torch.from_numpy(scenes.clip(detail=True))


def test_select_then_merge_gives_the_library_result(clip):
    originals, truth = clip
    keyframes, indices, count = KeyframeSelect.execute(originals, "every_n", 5, 0.4, 5).args
    assert json.loads(indices) == [0, 5, 10, 15, 19] and count == 5
    assert torch.equal(keyframes, originals[[0, 5, 10, 15, 19]])
    detailed = truth[[0, 5, 10, 15, 19]]
    (merged,) = KeyframeMerge.execute(originals, detailed, indices, True).args
    expected = np.stack([f.copy() for f in detail_carry.carry_detail(originals, detailed, [0, 5, 10, 15, 19],
                                                                        flow_warp=True)])
    assert merged.dtype == torch.float32 and torch.equal(merged, torch.from_numpy(expected))


def test_scene_mode_brackets_the_cut(clip):
    _, indices, _ = KeyframeSelect.execute(clip[0], "scene", 5, 0.4, 5).args
    assert json.loads(indices) == [0, 11, 12, 19]


def test_merge_refuses_bad_wiring(clip):
    originals, truth = clip
    with pytest.raises(InvalidInputError, match="2 detailed keyframes for 3 keyframe indices"):
        KeyframeMerge.execute(originals, truth[:2], "[0, 5, 19]", False)
    with pytest.raises(InvalidInputError, match="no keyframe indices"):
        KeyframeMerge.execute(originals, truth[:2], "", False)
    with pytest.raises(InvalidInputError, match="sorted and unique"):
        KeyframeMerge.execute(originals, truth[:2], "[5, 0]", False)
    with pytest.raises(InvalidInputError, match="at least n=30 frames"):
        KeyframeSelect.execute(originals, "every_n", 30, 0.4, 5)
