"""`apply_placement` on a real diffusers MiniMax H3 modular pipeline (small random-initialised components):
placing every component on the CPU runs the pipeline through the aligned calls and gives the same tensors as
without; bad placements are refused before anything moves. The multi-device path needs GPUs
(bench/gpu/multi_gpu_placement.py)."""

from __future__ import annotations

import pytest
import torch

from h3director.commands.demo_vaes import tiny_h3_audio_vae, tiny_h3_vae
from h3director.errors import InvalidInputError
from h3director.integrations.diffusers_placement import apply_placement, remove_placement
from h3director.plan.estimate import PlanRequest
from h3director.plan.placement import parse_devices, place

ALL_CPU = "text_encoder=cpu,dit=cpu,video_vae=cpu,audio_vae=cpu"


def tiny_text_encoder():
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    config = Qwen3VLConfig(
        text_config={"vocab_size": 64, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3,
                     "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
                     "rope_scaling": {"rope_type": "default", "mrope_section": [2, 3, 3]}},
        vision_config={"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32,
                       "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 1,
                       "deepstack_visual_indexes": [0]})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(2)
        return Qwen3VLForConditionalGeneration(config).eval()


def tiny_pipeline(with_text_encoder: bool = True):
    """The H3 modular pipeline's t2va denoise and video decode blocks over small real components (24 latent
    channels and 32 audio channels as released; 2 blocks of 2 heads); prompt embeddings are an input."""
    from diffusers import MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel
    from diffusers.modular_pipelines import SequentialPipelineBlocks
    from diffusers.modular_pipelines.minimax_h3.decoders import MiniMaxH3VideoDecodeStep
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3CoreDenoiseStep

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        transformer = MiniMaxH3Transformer3DModel(
            num_attention_heads=2, attention_head_dim=16, hidden_size=32, num_layers=2, num_refiner_layers=1,
            ffn_dim=64, in_channels=24, audio_in_channels=32, patch_size=(1, 2, 2), text_dim=32, freq_dim=32,
            time_embed_hidden_dim=32, time_embed_dim=24, rope_freq_dim=2).eval()
    blocks = SequentialPipelineBlocks.from_blocks_dict({"denoise": MiniMaxH3CoreDenoiseStep(),
                                                       "decode": MiniMaxH3VideoDecodeStep()})
    pipe = blocks.init_pipeline()
    pipe.load_components()
    pipe.update_components(transformer=transformer, vae=tiny_h3_vae(), scheduler=MiniMaxH3Scheduler(shift=12.0),
                           audio_scheduler=MiniMaxH3Scheduler(shift=3.0))
    pipe.audio_vae = tiny_h3_audio_vae()          # decoded below on its own (its full-length decode is slow)
    if with_text_encoder:
        pipe.text_encoder = tiny_text_encoder()
    return pipe


def _run(pipe) -> dict:
    embeds = torch.randn(1, 8, 32, generator=torch.Generator().manual_seed(1))
    return pipe(prompt_embeds=embeds, text_token_tags=torch.ones(8, dtype=torch.long), height=32, width=32,
                num_frames=124, num_inference_steps=2, generator=torch.Generator().manual_seed(3), output_type="pt",
                output=["videos", "audio_latents"])


def _text(pipe):
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    out = pipe.text_encoder.model(input_ids=ids, attention_mask=torch.ones_like(ids),
                                  mm_token_type_ids=torch.zeros_like(ids), use_cache=False, output_hidden_states=True)
    return out.hidden_states[2]


def test_cpu_placement_gives_the_same_output_through_the_aligned_calls():
    pipe = tiny_pipeline()
    reference = _run(pipe)
    audio_latents = reference["audio_latents"][..., :6].contiguous()
    audio_reference = pipe.audio_vae.decode(audio_latents, return_dict=False)[0]
    text_reference = _text(pipe)

    assert apply_placement(pipe, ALL_CPU) == {c: "cpu" for c in ("text_encoder", "dit", "video_vae", "audio_vae")}
    # the calls now go through the alignment: accelerate's hook on the forwards, wrapped encode/decode
    assert pipe.transformer._hf_hook.execution_device == torch.device("cpu")
    assert pipe.text_encoder.model._hf_hook.io_same_device
    assert hasattr(pipe.vae.decode, "_h3director_original") and hasattr(pipe.audio_vae.decode, "_h3director_original")
    placed = _run(pipe)
    assert torch.equal(placed["videos"], reference["videos"])
    assert torch.equal(placed["audio_latents"], reference["audio_latents"])
    assert torch.equal(pipe.audio_vae.decode(audio_latents, return_dict=False)[0], audio_reference)
    output = pipe.audio_vae.decode(audio_latents)          # an output class comes back whole
    assert torch.equal(output.sample, audio_reference)
    assert torch.equal(_text(pipe), text_reference)

    remove_placement(pipe)
    assert not hasattr(pipe.transformer, "_hf_hook") and "decode" not in pipe.vae.__dict__


def test_absent_components_are_reported():
    pipe = tiny_pipeline(with_text_encoder=False)
    assert apply_placement(pipe, {"dit": "cpu", "clip": "cpu"}) == {"text_encoder": "absent", "dit": "cpu"}


@pytest.mark.parametrize("placement, message", [
    ("dit=cpu,vae=cuda:1", "device cuda:1 does not exist on this machine: available cpu"),
    ("dit=gpu:0", "is not cpu, cuda, cuda:N or mps"),
    ("unet=cpu", "unknown component"),
])
def test_bad_placements_are_refused_before_anything_moves(placement, message):
    pipe = tiny_pipeline(with_text_encoder=False)
    with pytest.raises(InvalidInputError, match=message):
        apply_placement(pipe, placement)
    assert not hasattr(pipe.transformer, "_hf_hook") and "decode" not in pipe.vae.__dict__


def test_a_phased_plan_is_refused():
    phased = place(PlanRequest(1344, 768, 124), parse_devices("cuda:0=80GB"), host_bytes=256 * 2**30,
                   policy="phased")
    with pytest.raises(InvalidInputError, match="keeps its components loaded"):
        apply_placement(object(), phased)


def test_hooks_placement_did_not_add_are_neither_replaced_nor_removed():
    """A component that already carries an accelerate hook (CPU offload, a device map) is refused before anything
    moves; remove_placement takes off only its own hooks; applying a placement twice works."""
    from accelerate.hooks import ModelHook, add_hook_to_module

    pipe = tiny_pipeline(with_text_encoder=False)
    foreign = ModelHook()
    add_hook_to_module(pipe.vae, foreign)
    with pytest.raises(InvalidInputError, match="already carries"):
        apply_placement(pipe, "dit=cpu,vae=cpu")
    assert pipe.vae._hf_hook is foreign and not hasattr(pipe.transformer, "_hf_hook")
    assert apply_placement(pipe, "dit=cpu") == {"dit": "cpu"}
    assert apply_placement(pipe, "dit=cpu") == {"dit": "cpu"}          # its own hook is replaced
    remove_placement(pipe)
    assert not hasattr(pipe.transformer, "_hf_hook")
    assert pipe.vae._hf_hook is foreign


def test_a_plan_that_offloads_dit_blocks_says_how_to_apply_it_in_diffusers():
    """apply_placement moves the whole transformer; with blocks offloaded that is more than the plan priced. The
    placement says to enable group offload first, and apply_placement then leaves the DiT where group offload
    keeps it (same output)."""
    placement = place(PlanRequest(1344, 768, 124), parse_devices("cuda:0=24GB,cuda:1=12GB"), host_bytes=64 * 2**30,
                      policy="resident")
    assert placement.request.offload_blocks > 0
    assert any("enable_group_offload" in note and "before apply_placement" in note for note in placement.notes)
    pipe = tiny_pipeline(with_text_encoder=False)
    reference = _run(pipe)
    pipe.transformer.enable_group_offload(torch.device("cpu"), offload_device=torch.device("cpu"),
                                          offload_type="block_level", num_blocks_per_group=1)
    assert apply_placement(pipe, "dit=cpu,vae=cpu") == {"dit": "cpu", "video_vae": "cpu"}
    assert torch.equal(_run(pipe)["videos"], reference["videos"])


def test_a_group_offloaded_component_on_another_device_is_refused():
    """Group offload onloads the DiT's blocks on its own device and `.to()` leaves it there: a placement naming
    another device would report a device the DiT does not run on. (cuda:0 is only named here, never used.)"""
    pipe = tiny_pipeline(with_text_encoder=False)
    pipe.transformer.enable_group_offload(torch.device("cuda:0"), offload_device=torch.device("cpu"),
                                          offload_type="block_level", num_blocks_per_group=1)
    with pytest.raises(InvalidInputError, match="group offload onloads it on cuda:0"):
        apply_placement(pipe, "dit=cpu,vae=cpu")
    assert not hasattr(pipe.transformer, "_hf_hook") and "decode" not in pipe.vae.__dict__
