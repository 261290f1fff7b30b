"""Chunked audio decode over the real AutoencoderKLMiniMaxH3Audio (tiny config keeps the real receptive field)."""

import pytest
import torch
from decode_helpers import CollectingSink, single_thread  # noqa: F401 - fixture

from h3director.integrations.diffusers_h3 import H3VideoAdapter
from h3director.integrations.diffusers_h3_audio import H3AudioAdapter, context_latents, decoder_influence
from h3director.video.scheduler import AudioJob, stream_decode

pytestmark = pytest.mark.usefixtures("single_thread")

# Measured on this tiny config (docs/BENCHMARKS.md): chunked vs full differ by 1.04e-7 at most.
CHUNK_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def adapter(tiny_h3_audio):
    return H3AudioAdapter(tiny_h3_audio, chunk_seconds=0.5)


def test_tiny_config_keeps_the_real_receptive_field(tiny_h3_audio):
    from diffusers import AutoencoderKLMiniMaxH3Audio

    with torch.device("meta"):
        released = AutoencoderKLMiniMaxH3Audio()
    assert decoder_influence(tiny_h3_audio) == decoder_influence(released)
    assert context_latents(tiny_h3_audio) == context_latents(released)


def test_measured_receptive_field_inside_derived_bound(tiny_h3_audio):
    """Perturb one latent frame; every changed sample lies inside the derived influence interval."""
    frames, frame, hop = 120, 60, tiny_h3_audio.hop_length
    z = torch.randn(1, 32, frames)
    bumped = z.clone()
    bumped[:, :, frame] += 1.0
    with torch.no_grad():
        delta = (tiny_h3_audio.decode(z).sample - tiny_h3_audio.decode(bumped).sample).abs()[0, 0]
    changed = delta.nonzero().flatten()
    first, last = decoder_influence(tiny_h3_audio)
    assert changed.numel() > 0
    assert changed.min().item() - frame * hop >= first
    assert changed.max().item() - frame * hop <= last
    # the bound is not vacuous: the measured reach is more than half of it on each side
    assert changed.min().item() - frame * hop < first / 2 and changed.max().item() - frame * hop > last / 2


@pytest.mark.parametrize("frames,chunk_seconds", [(90, 0.5), (50, 0.3), (25, 0.5)])
def test_chunked_equals_full_within_rounding(adapter, frames, chunk_seconds):
    z = torch.randn(2, 32, frames)
    with torch.no_grad():
        full = adapter.decode_reference(z)
        chunked = adapter.decode(z, chunk_seconds=chunk_seconds)
    assert chunked.shape == full.shape == (1, 2, frames * 800)
    torch.testing.assert_close(chunked, full, rtol=0, atol=CHUNK_TOLERANCE)


def test_chunks_without_context_would_differ(adapter):
    """The context matters: chunk boundaries without it change the output far beyond rounding."""
    z = torch.randn(2, 32, 60)
    with torch.no_grad():
        full = adapter.decode_reference(z)
        saved, adapter.context = adapter.context, 0
        try:
            naive = adapter.decode(z, chunk_seconds=0.5)
        finally:
            adapter.context = saved
    assert (naive - full).abs().max().item() > 100 * CHUNK_TOLERANCE


def test_comfyui_layout_and_pipeline_denormalization(tiny_h3_audio, adapter):
    z = torch.randn(1, 32, 2, 45)
    mean = torch.tensor(tiny_h3_audio.config.latents_mean).view(1, -1, 1)
    std = torch.tensor(tiny_h3_audio.config.latents_std).view(1, -1, 1)
    stereo_as_batch = z[0].permute(1, 0, 2)   # [2, 32, T]
    with torch.no_grad():
        expected = tiny_h3_audio.decode(stereo_as_batch * std + mean).sample.permute(1, 0, 2)
        out = adapter.decode(z, chunk_seconds=0.4)
    assert out.shape == (1, 2, 45 * 800)
    torch.testing.assert_close(out, expected, rtol=0, atol=CHUNK_TOLERANCE)


def test_audio_goes_to_the_sink_with_the_video(tiny_h3, adapter):
    video = torch.randn(1, 24, 7, 4, 4)
    audio = torch.randn(2, 32, 40)
    sink = CollectingSink()
    with torch.no_grad():
        report = stream_decode(H3VideoAdapter(tiny_h3), video, sink, audio=AudioJob(adapter, audio))
        expected = adapter.decode_reference(audio)
    assert report.audio_samples == 40 * 800 and sink.sample_rate == 32000
    torch.testing.assert_close(sink.audio, expected, rtol=0, atol=CHUNK_TOLERANCE)
