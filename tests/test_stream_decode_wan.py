"""stream_decode over the real AutoencoderKLWan (tiny config): frames stream per latent frame, bit-identical."""

import pytest
import torch
from decode_helpers import CollectingSink, single_thread  # noqa: F401 - fixture

from h3director.integrations.diffusers_wan import WanVideoAdapter
from h3director.video.scheduler import stream_decode

pytestmark = pytest.mark.usefixtures("single_thread")


@pytest.fixture(scope="module")
def adapter(tiny_wan):
    return WanVideoAdapter(tiny_wan)


def wan_reference(vae, z):
    """The Wan pipeline's denormalization (`latents / (1 / std) + mean`), then `vae.decode(...).sample`."""
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = 1.0 / torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        return vae.decode(z / std + mean).sample


def director(adapter, z, **kwargs):
    sink = CollectingSink()
    with torch.no_grad():
        report = stream_decode(adapter, z, sink, **kwargs)
    return report, sink


@pytest.mark.parametrize("latent_frames", [1, 2, 3, 5, 8])
def test_lengths_bit_identical_and_streamed_per_latent_frame(tiny_wan, adapter, latent_frames):
    z = torch.randn(1, 4, latent_frames, 6, 7)
    report, sink = director(adapter, z)
    expected = wan_reference(tiny_wan, z)
    assert report.frames == expected.shape[2] == 1 + 4 * (latent_frames - 1)
    assert torch.equal(report.result, expected)
    assert [count for _, count in sink.writes] == [1] + [4] * (latent_frames - 1)
    assert sink.spec.pixel_mean is None   # [-1, 1] convention


@pytest.mark.parametrize("slicing", [False, True])
def test_batch_of_two(tiny_wan, adapter, slicing):
    tiny_wan.use_slicing = slicing
    try:
        z = torch.randn(2, 4, 3, 5, 6)
        report, _ = director(adapter, z)
        expected = wan_reference(tiny_wan, z)
    finally:
        tiny_wan.use_slicing = False
    assert torch.equal(report.result, expected)


@pytest.mark.parametrize("size", [(12, 14), (9, 20)])
def test_tiled_decode_bit_identical(tiny_wan, adapter, size):
    """Wan's own tiling (64 px tiles, stride 48 here): per-tile caches, in-place blends reproduced per frame."""
    tiny_wan.enable_tiling(64, 64, 48, 48)
    try:
        z = torch.randn(1, 4, 4, *size)
        report, _ = director(adapter, z)
        expected = wan_reference(tiny_wan, z)
    finally:
        tiny_wan.disable_tiling()
        tiny_wan.enable_tiling(256, 256, 192, 192)
        tiny_wan.disable_tiling()
    assert torch.equal(report.result, expected)
