"""Decode working-set estimate: tile layout as diffusers lays it, input checks, and its ordering claims."""

import pytest

from h3director.errors import InvalidInputError
from h3director.plan.decode import decode_clip_working_set_bytes, output_host_bytes, split_tiles


@pytest.mark.parametrize("length", [64, 256, 384, 416, 736, 768, 1344, 2048])
def test_tile_layout_matches_diffusers(length):
    from diffusers import AutoencoderKLMiniMaxH3

    vae = AutoencoderKLMiniMaxH3(block_out_channels=(8,) * 6, layers_per_block=1, norm_num_groups=4,
                                 decoder_num_layers=1, decoder_num_attention_heads=2, decoder_attention_head_dim=8)
    starts, lengths, overlaps = vae._split_tiles(length, 256, 64)
    assert split_tiles(length, 256, 64, 16) == (starts, overlaps)


def test_streaming_one_tile_per_call_needs_less_than_the_reference_path():
    reference = decode_clip_working_set_bytes({}, 768, 1344, None, "bf16")
    streamed = [decode_clip_working_set_bytes({}, 768, 1344, k, "bf16") for k in (1, 2, 4, 8)]
    assert streamed[0] < reference
    assert streamed == sorted(streamed)                # more tiles per call, more memory
    canvas = 3 * 28 * 768 * 1344 * 2                   # the clip itself, bf16
    assert streamed[0] > canvas


def test_bad_decode_inputs_are_refused():
    with pytest.raises(InvalidInputError, match="height must be a positive multiple of 16 pixels, got 100"):
        decode_clip_working_set_bytes({}, 100, 256)
    with pytest.raises(InvalidInputError, match="tiles_per_call must be None or >= 1, got 0"):
        decode_clip_working_set_bytes({}, 256, 256, 0)
    with pytest.raises(InvalidInputError, match="unknown compute dtype 'int3'"):
        decode_clip_working_set_bytes({}, 256, 256, None, "int3")


def test_host_buffer_by_sink():
    frames, width, height = 124, 1344, 768
    assert output_host_bytes("tensor", frames, width, height) == frames * width * height * 3 * 4
    assert output_host_bytes("uint8", frames, width, height) == frames * width * height * 3
    assert output_host_bytes("memmap", frames, width, height) < output_host_bytes("uint8", frames, width, height)
