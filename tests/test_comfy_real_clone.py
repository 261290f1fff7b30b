"""The pack as a clone runs it in a REAL ComfyUI server: audio off, the native core on first use, missing packages.

Audio off: a text-to-video workflow that never loads the H3 audio VAE.

ComfyUI's H3 nodes build an AV latent (`EmptyMiniMaxH3LatentAV`, `MiniMaxH3ImageToVideo`: no audio VAE input)
and the DiT samples both streams; only decoding the audio needs the audio VAE. Here the workflow has no audio
VAE loader at all: UNETLoader (ComfyUI's own `MiniMaxH3Model`, tiny random weights, `dit_worker.py`) ->
KSampler over `EmptyMiniMaxH3LatentAV` -> `H3DirectorDecodeAVStreaming` with only the video VAE (ComfyUI's H3
video VAE class at a small width, `real_comfy.py`). Checks: the MP4 has every frame and no audio stream
(PyAV), the AUDIO output is None, the report says the audio was not decoded, and ComfyUI's server log shows
the video VAE loaded and no audio VAE.

The server runs with an empty per-user native cache ($H3_NATIVE_CACHE): the decode report names the native
core in use (built on first use where a C compiler exists). `gguf` is made unimportable in the server (a
package of that name that raises ImportError comes first on its path), as in a clone whose requirements were
not installed: the GGUF loader's error names ComfyUI's own interpreter and the pack's requirements.txt.
Same harness as tests/test_comfy_real.py (skips without ComfyUI).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from comfy_harness.server import (
    HARNESS,
    comfyui_python,
    comfyui_server,
    prepare_base,
    submit,
    write_tiny_dit_checkpoint,
    write_tiny_vae_weights,
)
from comfy_harness.vendored import real_comfyui_marks

pytestmark = real_comfyui_marks()
FRAMES = 22   # 17n+5: 7 latent frames
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def comfy(tmp_path_factory):
    base = prepare_base(tmp_path_factory.mktemp("comfy-audio-off"), ["models/vae", "models/diffusion_models"],
                        {"h3director_test_nodes": HARNESS / "real_node",
                         "h3director_dit_test_nodes": HARNESS / "dit_real_node"})
    test_nodes = base / "custom_nodes" / "h3director_test_nodes"
    shutil.copy(HARNESS / "real_comfy.py", test_nodes / "real_comfy.py")
    write_tiny_vae_weights(base, test_nodes)
    (base / "models" / "vae" / "h3_tiny_audio.safetensors").unlink()   # nothing could load it by mistake
    write_tiny_dit_checkpoint(base)
    (base / "models" / "diffusion_models" / "h3_dit_q4.gguf").write_bytes(b"GGUF")   # never read: gguf is missing
    blocker = tmp_path_factory.mktemp("no-gguf") / "gguf"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError(\"No module named 'gguf'\", name='gguf')\n")
    env = {"PYTHONPATH": str(blocker.parent), "H3_NATIVE_CACHE": str(tmp_path_factory.mktemp("native-cache"))}
    with comfyui_server(base, extra_args=["--use-pytorch-cross-attention"], env=env) as server:
        yield server


def video_only_workflow(output: str) -> dict:
    """Text to video without any audio VAE: the route through the real nodes that never loads it."""
    return {
        "1": {"class_type": "UNETLoader", "inputs": {"unet_name": "h3_tiny_dit.safetensors", "weight_dtype": "default"}},
        "2": {"class_type": "H3TestDiTConditioning", "inputs": {"length": 7, "dim": 48, "seed": 0}},
        "3": {"class_type": "EmptyMiniMaxH3LatentAV", "inputs": {"width": 128, "height": 128, "length": FRAMES}},
        "4": {"class_type": "KSampler", "inputs": {
            "model": ["1", 0], "seed": 3, "steps": 2, "cfg": 1.0, "sampler_name": "euler", "scheduler": "simple",
            "denoise": 1.0, "positive": ["2", 0], "negative": ["2", 0], "latent_image": ["3", 0]}},
        "5": {"class_type": "VAELoader", "inputs": {"vae_name": "h3_tiny_video.safetensors"}},
        "6": {"class_type": "H3DirectorDecodeAVStreaming", "inputs": {
            "samples": ["4", 0], "vae": ["5", 0], "output": output, "filename_prefix": "videoonly/h3",
            "fps": 24.0, "crf": 18}},
        "7": {"class_type": "H3TestSaveTensor", "inputs": {
            "name": f"video_only_{output}", "image": ["6", 0], "audio": ["6", 1], "text": ["6", 2]}},
    }


@pytest.mark.parametrize("output", ["video_file", "images"])
def test_video_only_workflow_never_loads_an_audio_vae(comfy, output):
    import av
    import safetensors.torch

    entry = submit(comfy, video_only_workflow(output))
    assert entry["status"]["status_str"] == "success", json.dumps(entry["status"])[:4000]
    tensors = comfy["base"] / "output" / "tensors"
    saved = safetensors.torch.load_file(str(tensors / f"video_only_{output}.safetensors"))
    assert "waveform" not in saved                        # the AUDIO output was None
    assert saved["image"].shape == ((1 if output == "video_file" else FRAMES), 128, 128, 3)
    report = (tensors / f"video_only_{output}.txt").read_text()
    assert "audio not decoded: no audio VAE connected" in report
    assert "audio:" not in report
    if output == "video_file":
        video = entry["outputs"]["6"]["images"][0]
        with av.open(str(comfy["base"] / "output" / video["subfolder"] / video["filename"])) as container:
            assert container.streams.video[0].frames == FRAMES
            assert len(container.streams.audio) == 0
        [native] = [line for line in report.splitlines() if line.startswith("native core: ")]
        in_use = "C library (h3_core)" if shutil.which("cc") or shutil.which("gcc") else "numpy fallback"
        assert in_use in native, native
    # ComfyUI logs each model it loads ("Requested to load <class>"): the video VAE yes, no audio VAE ever.
    # (ComfyUI's classes: MiniMaxH3VideoVAE, MiniMaxH3AudioVAE in comfy/ldm/minimax/).
    loaded = re.findall(r"Requested to load (\w+)", comfy["log"].read_text())
    assert "MiniMaxH3VideoVAE" in loaded, loaded
    assert not any("Audio" in name for name in loaded), loaded


def test_a_missing_package_names_comfyuis_own_interpreter_and_the_pack_requirements(comfy):
    workflow = video_only_workflow("images")   # the same render, its DiT from a GGUF file
    workflow["1"] = {"class_type": "H3DirectorGGUFDiTLoader", "inputs": {"gguf_name": "h3_dit_q4.gguf",
                                                                         "weight_dtype": "default"}}
    entry = submit(comfy, workflow)
    assert entry["status"]["status_str"] == "error"
    [error] = [data for kind, data in entry["status"]["messages"] if kind == "execution_error"]
    message = error["exception_message"]
    assert "reading GGUF files needs the 'gguf' package" in message, message
    assert f'"{comfyui_python()}" -m pip install "gguf>=0.10"' in message, message
    assert f'-r "{REPO / "requirements.txt"}"' in message, message
    assert "h3director[gguf]" not in message
