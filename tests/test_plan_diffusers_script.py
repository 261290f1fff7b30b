"""`h3director plan --target diffusers --diffusers OUT.py`: the script runs the plan with diffusers.

A plan for a 4-block DiT on an 8 GB card offloads 3 blocks: the written script, run on the CPU against a tiny
random-initialised diffusers H3 pipeline of 4 blocks (with prompt embeddings from a file: the Qwen3-VL text
encoder is far too large here), samples, offloads those blocks and streams the decode into an MP4 with the
request's frame count and a soundtrack. Bad input is refused in one line with nothing written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("diffusers")
REPO = Path(__file__).resolve().parents[1]
PLAN = [sys.executable, "-m", "h3director", "plan", "--width", "32", "--height", "32", "--frames", "124",
        "--ram", "64GB"]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    import torch
    from comfy_harness.farm_diffusers import write_embeds
    from diffusers import MiniMaxH3Transformer3DModel

    from h3director.commands.demo_vaes import tiny_h3_audio_vae, tiny_h3_vae

    folder = tmp_path_factory.mktemp("pipe")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        MiniMaxH3Transformer3DModel(
            num_attention_heads=2, attention_head_dim=16, hidden_size=32, num_layers=4, num_refiner_layers=1,
            ffn_dim=64, in_channels=24, audio_in_channels=32, patch_size=(1, 2, 2), text_dim=32, freq_dim=32,
            time_embed_hidden_dim=32, time_embed_dim=24, rope_freq_dim=2).save_pretrained(folder / "transformer")
    tiny_h3_vae().save_pretrained(folder / "vae")
    tiny_h3_audio_vae().save_pretrained(folder / "audio_vae")
    write_embeds(folder / "embeds.safetensors")
    return folder


def _plan(*args, cwd):
    return subprocess.run([*PLAN, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_the_written_script_runs_the_plan(pipeline, tmp_path):
    import av

    script = tmp_path / "render.py"
    done = _plan("--vram", "8GB", "--dit-layers", "4", "--diffusers", script, "--dit", pipeline / "transformer",
                 "--vae", pipeline / "vae", "--audio-vae", pipeline / "audio_vae", "--steps", "2", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    text = script.read_text()
    assert "apply_block_offload(transformer, blocks_offloaded=3, onload_device=device)" in text
    assert "3 of 4 DiT blocks offloaded" in text                      # the settings, listed in its docstring
    out = tmp_path / "h3.mp4"
    run = subprocess.run([sys.executable, str(script), "--prompt-embeds", str(pipeline / "embeds.safetensors"),
                          "--out", str(out), "--device", "cpu"], capture_output=True, text=True, cwd=tmp_path,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "wrote" in run.stdout and "124 frames" in run.stdout
    with av.open(str(out)) as container:
        assert sum(1 for _ in container.decode(video=0)) == 124
        assert container.streams.audio                                   # the audio VAE decoded the soundtrack


def test_a_chunked_plan_writes_the_memory_plan_call(tmp_path):
    script = tmp_path / "big.py"
    done = _plan("--width", "1344", "--height", "768", "--vram", "24GB", "--no-audio", "--diffusers", script,
                 "--dit", "/models/h3/transformer", "--vae", "/models/h3/vae", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    text = script.read_text()
    compile(text, str(script), "exec")
    assert "apply_memory_plan(transformer, head_chunks=" in text and "AUDIO_VAE = None" in text


@pytest.mark.parametrize("extra,message", [
    (["--dit", "/m/t"], "--diffusers needs the model paths --vae, --audio-vae (or --no-audio)"),
    (["--dit", "/m/t", "--vae", "/m/v", "--target", "comfyui"], "--diffusers plans for --target diffusers"),
    (["--dit", "/m/t", "--vae", "/m/v", "--workflow", "x.json"], "not with --workflow"),
    (["--dit", "/m/t.gguf", "--vae", "/m/v", "--no-audio"], "is a GGUF file: say which quantisation"),
])
def test_bad_input_is_one_line_and_nothing_is_written(tmp_path, extra, message):
    script = tmp_path / "x.py"
    done = _plan("--vram", "24GB", "--diffusers", script, *extra, cwd=tmp_path)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert not script.exists()
