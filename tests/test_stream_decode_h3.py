"""stream_decode over the real AutoencoderKLMiniMaxH3 (tiny config) equals vae.decode bit for bit."""

import pytest
import torch
from decode_helpers import CollectingSink, h3_reference, single_thread  # noqa: F401 - fixture

from h3director.geometry import H3_TEMPORAL
from h3director.integrations.diffusers_h3 import IMAGENET_MEAN, IMAGENET_STD, H3VideoAdapter
from h3director.video.scheduler import stream_decode

pytestmark = pytest.mark.usefixtures("single_thread")

TILED = (6, 7)   # 96 x 112 px: 2 x 2 tiles with the `small_tiles` geometry, uneven overlaps


@pytest.fixture(scope="module")
def adapter(tiny_h3):
    return H3VideoAdapter(tiny_h3)


@pytest.fixture
def small_tiles(tiny_h3):
    """64 px tiles with >= 16 px overlap: the same tiling code, a fraction of the cost (restored after)."""
    tiny_h3.enable_tiling(64, 64, 16, 16)
    yield tiny_h3
    tiny_h3.enable_tiling(256, 256, 64, 64)


def director(adapter, z, **kwargs):
    sink = CollectingSink()
    with torch.no_grad():
        report = stream_decode(adapter, z, sink, **kwargs)
    return report, sink


@pytest.mark.parametrize("n", range(1, 9))
def test_on_grid_lengths_bit_identical(small_tiles, adapter, n):
    z = torch.randn(1, 24, 5 * n + 2, *TILED)
    report, sink = director(adapter, z)
    expected = h3_reference(small_tiles, z)
    assert adapter.tile_grid(*TILED).count == 4
    assert report.result.shape == expected.shape == (1, 3, 17 * n + 5, 96, 112)
    assert torch.equal(report.result, expected)
    assert report.clips == n and report.retries == []
    # frames reach the sink clip by clip: 17 final frames per clip, the last clip's 5-frame tail with it
    assert [count for _, count in sink.writes] == [17] * (n - 1) + [22]


@pytest.mark.parametrize("latent_frames", [3, 4, 5, 6, 8, 9, 10, 11])
def test_off_grid_lengths_bit_identical(small_tiles, adapter, latent_frames):
    z = torch.randn(1, 24, latent_frames, *TILED)
    report, _ = director(adapter, z)
    expected = h3_reference(small_tiles, z)
    assert report.frames == expected.shape[2]
    assert torch.equal(report.result, expected)


@pytest.mark.parametrize("size", [(24, 40), (17, 16)])
def test_fractional_tile_counts_default_tiles(tiny_h3, adapter, size):
    """The tiny VAE's own 256 px / 64 px tiling: 384 x 640 px is 2 x 3 tiles, 272 x 256 px is 2 x 1."""
    grid = adapter.tile_grid(*size)
    assert grid.count > 1 and grid.y_lengths[0] == 256
    z = torch.randn(1, 24, 3, *size)
    report, _ = director(adapter, z)
    assert torch.equal(report.result, h3_reference(tiny_h3, z))


@pytest.mark.parametrize("slicing", [False, True])
def test_batch_of_two(small_tiles, adapter, slicing):
    small_tiles.use_slicing = slicing
    try:
        z = torch.randn(2, 24, 9, *TILED)
        report, _ = director(adapter, z)
        expected = h3_reference(small_tiles, z)
    finally:
        small_tiles.use_slicing = False
    assert report.result.shape[0] == 2
    assert torch.equal(report.result, expected)


@pytest.mark.parametrize("size", [TILED, (9, 13)])
def test_streamed_tiles_are_bit_identical(small_tiles, adapter, size):
    z = torch.randn(1, 24, 12, *size)
    report, _ = director(adapter, z, tiles_per_call=1)
    assert report.execution.tiles_per_call == 1
    assert torch.equal(report.result, h3_reference(small_tiles, z))


def test_batched_tiles_are_close_not_exact_by_contract(small_tiles, adapter):
    """Several tiles per decoder call batch the matmuls: equal up to float32 rounding only (documented)."""
    z = torch.randn(1, 24, 7, 9, 13)
    report, _ = director(adapter, z, tiles_per_call=3)
    torch.testing.assert_close(report.result, h3_reference(small_tiles, z), rtol=0, atol=1e-5)


def test_untiled_vae(tiny_h3, adapter):
    tiny_h3.disable_tiling()
    try:
        z = torch.randn(1, 24, 8, 17, 10)
        report, _ = director(adapter, z)
        expected = h3_reference(tiny_h3, z)
    finally:
        tiny_h3.enable_tiling()
    assert torch.equal(report.result, expected)


def comfy_decode(vae, z):
    """ComfyUI's `MiniMaxH3VideoVAE.decode_temporal` rule on diffusers' clip decoder, written from its code:
    1 latent frame -> decode it alone, keep the last frame; otherwise pad to whole chunks, at least one."""
    if z.shape[2] == 1:
        return vae._decode_clip(z)[:, :, -1:]
    chunk, overlap_tokens, drop, pre, overlap_frames = 5, 2, 3, 3, 5
    total = z.shape[2] + drop
    pad = (-total) % chunk
    chunks = (total + pad) // chunk - 1
    if chunks < 1:
        pad, chunks = pad + chunk, chunks + 1
    length = z.shape[2]
    z = torch.cat([z, z[:, :, -1:].repeat(1, 1, pad, 1, 1)], dim=2)
    parts, tail = [], None
    for i in range(chunks):
        clip = vae._decode_clip(z[:, :, i * chunk:i * chunk + chunk + overlap_tokens])
        body = clip[:, :, :chunk * 4][:, :, pre:]
        if tail is not None:
            body = vae._blend(tail, body, overlap_frames, dim=-3)
        parts.append(body)
        tail = clip[:, :, chunk * 4:2 * chunk * 4][:, :, pre:]
    parts.append(tail)
    out = torch.cat(parts, dim=2)
    pad_frames = sum(1 if (length + k) % chunk == 0 else 4 for k in range(pad))
    return out[:, :, :out.shape[2] - pad_frames]


@pytest.mark.parametrize("latent_frames", [1, 2, 3, 7, 8])
def test_shortest_lengths_follow_comfyui(small_tiles, adapter, latent_frames):
    z = torch.randn(1, 24, latent_frames, *TILED)
    report, _ = director(adapter, z)
    mean = torch.tensor(small_tiles.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(small_tiles.config.latents_std).view(1, -1, 1, 1, 1)
    with torch.no_grad():
        expected = comfy_decode(small_tiles, z * std + mean)
    assert report.frames == H3_TEMPORAL.frames_for_latents(latent_frames) == expected.shape[2]
    assert torch.equal(report.result, expected)


def test_denormalized_input_and_spec(tiny_h3, adapter):
    z = torch.randn(1, 24, 7, 8, 8)
    mean = torch.tensor(tiny_h3.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(tiny_h3.config.latents_std).view(1, -1, 1, 1, 1)
    progress = []
    report, sink = director(adapter, z * std + mean, denormalize=False,
                            on_progress=lambda done, total: progress.append((done, total)))
    assert torch.equal(report.result, h3_reference(tiny_h3, z))
    assert sink.spec.pixel_mean == IMAGENET_MEAN and sink.spec.pixel_std == IMAGENET_STD
    assert (sink.spec.frames, sink.spec.height, sink.spec.width) == (22, 128, 128)
    assert progress[-1] == (22, 22) and sink.finished and not sink.aborted


def test_tiny_config_is_deterministic_and_real(tiny_h3):
    from h3director.commands.demo_vaes import tiny_h3_vae

    again, other = tiny_h3_vae(seed=0), tiny_h3_vae(seed=1)
    same = [torch.equal(a, b) for a, b in zip(tiny_h3.state_dict().values(), again.state_dict().values(), strict=True)]
    assert all(same)
    assert not torch.equal(tiny_h3.decoder.proj_out.weight, other.decoder.proj_out.weight)
    assert (tiny_h3.config.clip_length, tiny_h3.config.token_drop) == (17, 3)
    assert (tiny_h3.spatial_compression_ratio, tiny_h3.temporal_compression_ratio) == (16, 4)
    assert len(set(tiny_h3.config.latents_std)) == 24 and tiny_h3.decoder.num_register_tokens == 4
    assert bool(tiny_h3.decoder.transformer_blocks[0].scale1.any())   # attention is not a no-op


@pytest.mark.filterwarnings("ignore:Mismatch dtype between input and weight")
def test_bfloat16_decoder(small_tiles, adapter):
    """A low-precision decoder: latents are cast like `decode` does and the blend weights are rounded in
    bfloat16 exactly as diffusers rounds them."""
    import copy

    vae = copy.deepcopy(small_tiles).to(torch.bfloat16)
    z = torch.randn(1, 24, 12, *TILED)
    report, _ = director(H3VideoAdapter(vae), z)
    expected = h3_reference(vae, z)
    assert report.result.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(report.result, expected)
