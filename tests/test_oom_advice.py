"""`h3director oom` on ComfyUI logs: a sampler OOM gets the DiT settings the planner chooses for the logged geometry
on that card (or the plan command that computes them), a decode OOM the decode settings; the failing node is
named; the five steps come in order, each with a real setting. Log texts as ComfyUI writes them: the executor's
"!!! Exception during processing !!!" line, then the traceback (frames from the vendored ComfyUI's files), with
PyTorch's cudaMallocAsync message (built as tests/test_oom.py builds it)."""

from __future__ import annotations

import json
import re

from test_oom import cuda_async_oom, cuda_oom

from h3director.cli import main
from h3director.core.oom import explain_log
from h3director.plan.estimate import PlanRequest
from h3director.plan.oom_advice import STEPS, advise
from h3director.plan.recommend import Budget, recommend

GiB, MiB = 1024**3, 1024**2
CARD = int(11.99 * GiB)

EXECUTOR_FRAMES = '''Traceback (most recent call last):
  File "/home/user/ComfyUI/execution.py", line 525, in execute
    output_data, output_ui, has_subgraph, has_pending_tasks = await get_output_data(prompt_id, unique_id, obj, input_data_all, execution_block_cb=execution_block_cb, pre_execute_cb=pre_execute_cb, v3_data=v3_data)
  File "/home/user/ComfyUI/execution.py", line 334, in get_output_data
    return_values = await _async_map_node_over_list(prompt_id, unique_id, obj, input_data_all, obj.FUNCTION, allow_interrupt=True, execution_block_cb=execution_block_cb, pre_execute_cb=pre_execute_cb, v3_data=v3_data)
  File "/home/user/ComfyUI/execution.py", line 308, in _async_map_node_over_list
    await process_inputs(input_dict, i)
  File "/home/user/ComfyUI/execution.py", line 296, in process_inputs
    result = f(**inputs)
'''
SAMPLER_FRAMES = '''  File "/home/user/ComfyUI/nodes.py", line 1622, in sample
    return common_ksampler(model, seed, steps, cfg, sampler_name, scheduler, positive, negative, latent_image, denoise=denoise)
  File "/home/user/ComfyUI/nodes.py", line 1589, in common_ksampler
    samples = comfy.sample.sample(model, noise, steps, cfg, sampler_name, scheduler, positive, negative, latent_image,
  File "/home/user/ComfyUI/comfy/sample.py", line 60, in sample
    samples = sampler.sample(noise, positive, negative, cfg=cfg, latent_image=latent_image, start_step=start_step, last_step=last_step, force_full_denoise=force_full_denoise, denoise_mask=noise_mask, sigmas=sigmas, callback=callback, disable_pbar=disable_pbar, seed=seed)
  File "/home/user/ComfyUI/comfy/samplers.py", line 1240, in outer_sample
    output = self.inner_sample(noise, latent_image, device, sampler, sigmas, denoise_mask, callback, disable_pbar, seed, latent_shapes=latent_shapes)
  File "/home/user/ComfyUI/comfy/k_diffusion/sampling.py", line 199, in sample_euler
    denoised = model(x, sigma_hat * s_in, **extra_args)
  File "/home/user/ComfyUI/comfy/ldm/minimax/model.py", line 700, in _forward
    for i, block in enumerate(self.blocks):
  File "/home/user/ComfyUI/comfy/ldm/minimax/model.py", line 195, in forward
    out = optimized_attention(q, k, v, self.heads, mask=None, skip_reshape=True, transformer_options=transformer_options)
  File "/home/user/ComfyUI/comfy/ldm/modules/attention.py", line 560, in attention_pytorch
    out = comfy.ops.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, is_causal=False)
'''
DECODE_FRAMES = '''  File "/home/user/ComfyUI/custom_nodes/h3director/h3director/comfy/nodes_decode.py", line 118, in execute
    report = stream_decode(adapter, latents, sink, budget_bytes=budget, audio=audio_job, config=config)
  File "/home/user/ComfyUI/custom_nodes/h3director/h3director/video/scheduler.py", line 262, in stream_decode
    decoded = execution.run(adapter, clip)
  File "/home/user/ComfyUI/comfy/ldm/minimax/vae.py", line 698, in decode
    out = self.decoder(z)
'''


def comfy_log(message: str, frames: str, before: str = "") -> str:
    """A ComfyUI console log of a prompt that failed with `message` in the code of `frames`."""
    return (f"got prompt\n{before}Requested to load MiniMaxH3\n"
            "loaded partially; 9843.11 MB usable, 9812.00 MB loaded, 8210.45 MB offloaded, lowvram patches: 0\n"
            "  0%|          | 0/30 [00:00<?, ?it/s]\n"
            f"!!! Exception during processing !!! {message}\n{EXECUTOR_FRAMES}{frames}"
            f"torch.OutOfMemoryError: {message}\n\nGot an OOM, unloading all loaded models.\n"
            "Prompt executed in 41.62 seconds\n")


SAMPLER_OOM = cuda_async_oom(int(9.87 * GiB), int(2.07 * GiB), CARD, int(52.7 * MiB), CARD)


def _advised(text: str, ram: int = 64 * GiB):
    items = explain_log(text)
    advise(items, host_bytes=ram, target="comfyui")
    (item,) = items
    return item


def test_a_sampler_oom_gets_the_dit_settings_the_planner_chooses_for_the_logged_geometry():
    log = comfy_log(SAMPLER_OOM, SAMPLER_FRAMES, before="H3 1344x768, 124 frames on cuda:0\n")
    item = _advised(log)
    assert (item.kind, item.phase, item.node) == ("cuda-async", "sampling", "KSampler or KSamplerAdvanced")
    assert item.geometry == {"width": 1344, "height": 768, "frames": 124}
    rec = recommend(PlanRequest(1344, 768, 124), Budget(item.total_bytes, 64 * GiB))
    r = rec.request
    text = "\n".join(item.advice)
    assert f"node H3DirectorDiTMemory: mode='fixed', head_chunks={r.head_chunks}, ffn_chunks={r.ffn_chunks}" in text
    assert r.offload_blocks and f"node H3DirectorBlockSwap: blocks_offloaded={r.offload_blocks}" in text
    assert "h3director plan --width 1344 --height 768 --frames 124 --vram 11.99GB --ram 64GB" in text
    # the decode-only advice the allocator parser gives a shortage is gone from a sampler OOM
    assert "memory_optimization_level" not in text and "tiles per call" not in text
    assert [line.split(".")[0] for line in item.steps] == ["1", "2", "3", "4", "5"]
    for line, (what, _) in zip(item.steps, STEPS, strict=True):
        assert line.startswith(f"{line[0]}. {what}: ")
    assert "H3DirectorBlockSwap: blocks_offloaded=" in item.steps[2]
    assert "H3DirectorDiTMemory" in item.steps[1]


def test_without_the_geometry_the_exact_plan_command_is_given():
    item = _advised(comfy_log(SAMPLER_OOM, SAMPLER_FRAMES), ram=32 * GiB)
    assert item.phase == "sampling" and item.geometry is None
    assert any("`h3director plan --width WIDTH --height HEIGHT --frames FRAMES --vram 11.99GB --ram 32GB "
               "--target comfyui` computes the sampling settings" in line for line in item.advice)
    # the steps name the node and inputs without values
    assert "node H3DirectorBlockSwap (blocks_offloaded)" in item.steps[2]
    assert "node CLIPLoader" in item.steps[0]


def test_a_decode_oom_gets_the_decode_settings_and_the_node_from_comfys_error_report():
    message = cuda_oom(int(3.2 * GiB), int(15.99 * GiB), int(1.1 * GiB), int(14.2 * GiB), int(120 * MiB))
    report = json.dumps({"type": "execution_error", "data": {"prompt_id": "4f1c", "node_id": "12",
                                                             "node_type": "H3DirectorDecodeAVStreaming"}})
    # the latent's shape as torch prints it: 1344x768 (48 x 84 latent pixels), 37 latent frames = 124 frames
    log = comfy_log(message, DECODE_FRAMES, before="latent torch.Size([1, 24, 37, 48, 84])\n") + report + "\n"
    item = _advised(log)
    assert (item.phase, item.node, item.node_id) == ("decode", "H3DirectorDecodeAVStreaming", "12")
    assert item.geometry == {"width": 1344, "height": 768, "frames": 124}
    text = "\n".join(item.advice)
    assert "node H3DirectorDecodeAVStreaming: output='video_file', budget_gb=" in text
    assert "H3DirectorBlockSwap" not in text and "H3DirectorDiTMemory" not in text


def test_an_oom_of_no_known_phase_keeps_the_allocators_advice():
    item = _advised("torch.OutOfMemoryError: " + SAMPLER_OOM + "\n")
    assert item.phase is None and not item.steps
    assert any("h3director plan" in line for line in item.advice)


def test_an_earlier_unrelated_traceback_is_not_read():
    earlier = 'Traceback (most recent call last):\n  File "/x/comfy/ldm/minimax/vae.py", line 1, in decode\nKeyError\n'
    item = _advised(earlier + "lots\nof\nother\nlines\nhere\ntorch.OutOfMemoryError: " + SAMPLER_OOM + "\n")
    assert item.phase is None


def test_the_cli_prints_the_node_phase_and_steps(tmp_path, capsys):
    path = tmp_path / "comfyui.log"
    path.write_text(comfy_log(SAMPLER_OOM, SAMPLER_FRAMES, before="H3 1344x768, 124 frames on cuda:0\n"))
    assert main(["oom", str(path), "--ram", "64GB"]) == 0
    out = capsys.readouterr().out
    assert "in phase sampling, node KSampler or KSamplerAdvanced" in out
    assert re.search(r"advice:\s+\d+ of 50 DiT blocks offloaded to host RAM: node H3DirectorBlockSwap", out)
    assert "the five steps, in the planner's order" in out and "5. decode tiling and sink" in out
    assert main(["oom", str(path), "--ram", "64GB", "--target", "diffusers", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)["errors"][0]
    assert data["phase"] == "sampling" and any("apply_block_offload(transformer" in a for a in data["advice"])


def test_a_bad_ram_size_is_refused_before_the_log_is_read(tmp_path, capsys):
    assert main(["oom", str(tmp_path / "absent.log"), "--ram", "lots"]) == 2
    assert "cannot read size 'lots'" in capsys.readouterr().err


def test_a_logged_geometry_off_the_grid_is_named_not_planned():
    item = _advised(comfy_log(SAMPLER_OOM, SAMPLER_FRAMES, before="H3 1344x768, 130 frames on cuda:0\n"))
    (line,) = [a for a in item.advice if "refuses" in a]
    assert "1344x768, 130 frames" in line and "off H3's 17n+5 grid: the nearest legal counts are 124 and 141" in line
