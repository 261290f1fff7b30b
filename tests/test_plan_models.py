"""Parameter counts from config arithmetic against the real diffusers classes, and the published sizes."""

import pytest

from h3director.plan.activations import DiTShape, block_token_bytes
from h3director.plan.formats import GGML_BLOCKS, weight_format
from h3director.plan.models import (
    audio_vae_inventory,
    dit_inventory,
    text_encoder_inventory,
    video_vae_inventory,
)

GiB = 1024**3


def _numel(model) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("config", [
    dict(num_attention_heads=4, attention_head_dim=16, hidden_size=48, num_layers=2, num_refiner_layers=1,
         ffn_dim=96, text_dim=40, freq_dim=32, time_embed_hidden_dim=64, time_embed_dim=24, rope_freq_dim=2),
    dict(num_attention_heads=2, attention_head_dim=8, hidden_size=24, num_layers=3, num_refiner_layers=0,
         ffn_dim=40, in_channels=8, audio_in_channels=6, patch_size=(1, 1, 2), text_dim=12, freq_dim=16,
         time_embed_hidden_dim=20, time_embed_dim=10, rope_freq_dim=1),
])
def test_dit_parameter_count_matches_the_real_class(config):
    from diffusers import MiniMaxH3Transformer3DModel

    model = MiniMaxH3Transformer3DModel(**config)
    assert dit_inventory(model.config).params == _numel(model)


@pytest.mark.parametrize("config", [
    dict(block_out_channels=(32, 32, 64, 64), layers_per_block=1, spatial_downsample_factors=(2, 2, 2, 2),
         temporal_downsample_factors=(1, 2, 2, 1), norm_num_groups=8, decoder_num_layers=2,
         decoder_num_attention_heads=4, decoder_attention_head_dim=16),
    dict(block_out_channels=(16, 32), layers_per_block=2, spatial_downsample_factors=(2, 2),
         temporal_downsample_factors=(2, 2), norm_num_groups=8, decoder_num_layers=1,
         decoder_num_attention_heads=2, decoder_attention_head_dim=8, decoder_ffn_mult=2,
         decoder_num_register_tokens=2, latent_channels=8, latents_mean=(0.0,) * 8, latents_std=(1.0,) * 8),
])
def test_video_vae_parameter_count_matches_the_real_class(config):
    from diffusers import AutoencoderKLMiniMaxH3

    model = AutoencoderKLMiniMaxH3(**config)
    assert video_vae_inventory(model.config).params == _numel(model)


@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_audio_vae_parameter_count_matches_the_real_class():
    from diffusers import AutoencoderKLMiniMaxH3Audio

    model = AutoencoderKLMiniMaxH3Audio(encoder_dim=8, latent_dim=64, latent_channels=16, num_attention_heads=2,
                                        decoder_dim=64, decoder_rates=(8, 10, 10), decoder_kernel_sizes=(16, 20, 20),
                                        resblock_kernel_sizes=(3, 7), resblock_dilation_sizes=((1, 3), (1, 3, 5)))
    assert audio_vae_inventory(model.config).params == _numel(model)


@pytest.mark.parametrize("inventory, fmt, float_bytes, published_gib", [
    (dit_inventory(), "bf16", 2, 61.7),              # awesome-minimax-h3-integration README
    (video_vae_inventory(), "fp16", 2, 4.85),
    (audio_vae_inventory(), "fp32", 4, 0.56),
    (text_encoder_inventory(), "bf16", 2, 48.0),
])
def test_full_size_weights_match_the_published_file_sizes(inventory, fmt, float_bytes, published_gib):
    predicted = inventory.weight_bytes(weight_format(fmt), float_bytes=float_bytes) / GiB
    assert predicted == pytest.approx(published_gib, rel=0.02)


def test_ggml_block_layouts_match_the_gguf_package():
    gguf = pytest.importorskip("gguf")
    for name, layout in GGML_BLOCKS.items():
        assert gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name]] == layout


def test_per_token_terms_match_the_facts():
    terms = block_token_bytes(DiTShape(), "bf16")
    assert (terms.fused_qkv, terms.ffn_fc1, terms.attention_out, terms.residual) == (43_008, 57_344, 14_336, 10_752)


def test_unknown_format_is_refused_with_the_choices():
    from h3director.errors import InvalidInputError

    with pytest.raises(InvalidInputError, match="unknown weights format 'q3_k'.*int8"):
        weight_format("q3_k")


def test_text_encoder_parameter_count_matches_transformers_qwen3_vl():
    transformers = pytest.importorskip("transformers")
    from h3director.plan.models import TextEncoderSpec

    config = transformers.Qwen3VLConfig(
        text_config=dict(hidden_size=64, intermediate_size=160, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=16, vocab_size=1000, num_hidden_layers=2,
                         rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]}),
        vision_config=dict(depth=3, hidden_size=32, intermediate_size=72, out_hidden_size=64, num_heads=2,
                           deepstack_visual_indexes=[0, 2], num_position_embeddings=144))
    model = transformers.Qwen3VLModel(config)
    assert text_encoder_inventory(TextEncoderSpec.from_transformers(config)).params == _numel(model)
