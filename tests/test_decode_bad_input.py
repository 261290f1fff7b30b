"""Bad input and budgets are refused with specific errors before any decoding starts."""

import pytest
import torch
from decode_helpers import CollectingSink, single_thread  # noqa: F401 - fixture

from h3director.errors import BudgetError, InvalidInputError
from h3director.integrations.diffusers_h3 import H3VideoAdapter
from h3director.integrations.diffusers_h3_audio import H3AudioAdapter
from h3director.integrations.diffusers_wan import WanVideoAdapter
from h3director.units import MiB
from h3director.video.scheduler import AudioJob, stream_decode

pytestmark = pytest.mark.usefixtures("single_thread")


class RefusingSink(CollectingSink):
    """Fails the test if the scheduler got as far as starting the sink."""

    def begin(self, spec):
        raise AssertionError("the sink was started although the input is bad")


class BigBufferSink(CollectingSink):
    """Declares the host buffer a float32 in-RAM sink would need."""

    def bytes_needed(self, spec):
        return spec.batch * spec.frames * spec.frame_pixels * 4


@pytest.fixture(scope="module")
def h3(tiny_h3):
    return H3VideoAdapter(tiny_h3)


def nan_at(index):
    z = torch.randn(1, 24, 7, 4, 4)
    z[index] = float("nan")
    return z


@pytest.mark.parametrize("latents,message", [
    (torch.randn(24, 7, 4, 4), "rank 5"),
    (torch.randn(1, 23, 7, 4, 4), "24 channels"),
    (torch.randn(1, 24, 0, 4, 4), "empty"),
    (torch.randn(1, 24, 7, 0, 4), "empty"),
    (nan_at((0, 3, 2, 1, 1)), r"NaN/inf value\(s\), the first at index \(0, 3, 2, 1, 1\)"),
    (torch.full((1, 24, 7, 4, 4), float("inf")), "NaN/inf"),
    (torch.zeros(1, 24, 7, 4, 4, dtype=torch.int64), "floating"),
    (torch.empty(1, 24, 7, 4, 4, device="meta"), "meta device"),
    ([[1.0]], "torch.Tensor"),
])
def test_bad_video_latents(h3, latents, message):
    with pytest.raises(InvalidInputError, match=message):
        stream_decode(h3, latents, RefusingSink())


def test_bad_tiling_geometry(tiny_h3, h3):
    tiny_h3.enable_tiling(tile_sample_min_height=200)
    try:
        with pytest.raises(InvalidInputError, match="multiples of 16"):
            stream_decode(h3, torch.randn(1, 24, 7, 4, 4), RefusingSink())
    finally:
        tiny_h3.enable_tiling(256, 256, 64, 64)


@pytest.mark.parametrize("tiles", [0, -1, True])
def test_bad_tiles_per_call(h3, tiles):
    with pytest.raises(InvalidInputError, match="tiles_per_call"):
        stream_decode(h3, torch.randn(1, 24, 7, 4, 4), RefusingSink(), tiles_per_call=tiles)


def test_wrong_adapter_for_model(tiny_h3, tiny_wan):
    with pytest.raises(InvalidInputError, match="AutoencoderKLWan"):
        WanVideoAdapter(tiny_h3)
    with pytest.raises(InvalidInputError, match="AutoencoderKLMiniMaxH3"):
        H3VideoAdapter(tiny_wan)


def test_wan_latents_for_h3_are_refused(tiny_wan):
    with pytest.raises(InvalidInputError, match="4 channels"):
        stream_decode(WanVideoAdapter(tiny_wan), torch.randn(1, 24, 3, 4, 4), RefusingSink())


def test_bad_audio_refused_before_video(tiny_h3_audio, h3):
    audio = H3AudioAdapter(tiny_h3_audio)
    with pytest.raises(InvalidInputError, match="audio latents must have 32 channels"):
        stream_decode(h3, torch.randn(1, 24, 7, 4, 4), RefusingSink(), audio=AudioJob(audio, torch.randn(2, 16, 40)))
    with pytest.raises(InvalidInputError, match="rank"):
        audio.validate(torch.randn(32, 40))


def test_budget_too_small_names_the_settings(h3):
    with pytest.raises(BudgetError) as refused:
        stream_decode(h3, torch.randn(1, 24, 7, 24, 40), BigBufferSink(), budget_bytes=1 * MiB, tiles_per_call=2)
    text = str(refused.value)
    assert "video_decode.tiles_per_call: 1" in text
    assert "memmap" in text and "a budget of" in text


def test_budget_picks_the_streamed_tiles_when_only_they_fit(tiny_h3, h3):
    from h3director.video.decoder import ClipExecution

    size = (24, 40)
    reference = h3.clip_working_set_bytes(1, *size, ClipExecution(None))
    streamed = h3.clip_working_set_bytes(1, *size, ClipExecution(1))
    assert streamed < reference
    sink = CollectingSink()
    with torch.no_grad():
        report = stream_decode(h3, torch.randn(1, 24, 3, *size), sink, budget_bytes=(streamed + reference) // 2)
    assert report.execution == ClipExecution(1)
    assert report.preflight.clip_bytes == streamed


def test_budget_from_config(monkeypatch, h3):
    monkeypatch.setenv("H3_MEMORY_SAFETY__MAX_HOST_MEMORY_MB", "1")
    monkeypatch.delenv("H3_CONFIG", raising=False)
    with pytest.raises(BudgetError, match="h3_config.yaml memory_safety") as refused:
        stream_decode(h3, torch.randn(1, 24, 7, 8, 8), RefusingSink())
    assert "memory_safety.max_host_memory_mb: " in str(refused.value)


def test_budget_refusal_suggests_a_file_sink_only_when_the_sink_holds_the_video(h3):
    class FileLikeSink(BigBufferSink):
        writes_to_disk = True

    latents = torch.randn(1, 24, 7, 24, 40)
    with pytest.raises(BudgetError) as in_ram:
        stream_decode(h3, latents, BigBufferSink(), budget_bytes=1 * MiB, tiles_per_call=2)
    with pytest.raises(BudgetError) as on_disk:
        stream_decode(h3, latents, FileLikeSink(), budget_bytes=1 * MiB, tiles_per_call=2)
    assert "file sink" in str(in_ram.value)
    assert "file sink" not in str(on_disk.value) and "a budget of" in str(on_disk.value)
