"""The Python script that runs a plan with diffusers (`h3director plan ... --target diffusers --diffusers OUT.py`).

`diffusers_script(request, files, run)` returns the text of a standalone script: every setting of the plan comes
from the capability registry (`capabilities.applied_settings(request, "diffusers")`) and appears in the script as
the call that applies it, in order:

1. the prompt's embeddings: the text encoder (`files.text_encoder`, a Qwen3-VL folder with its tokenizer and
   processor, in the planned format and on the planned device) through diffusers' `MiniMaxH3TextEncoderStep`, then
   freed; or, with the script's `--prompt-embeds FILE`, embeddings saved earlier (no text encoder at all);
2. the DiT (`files.dit`: a diffusers `transformer` folder, or a GGUF file) in the planned format, with the DiT
   memory tier (`apply_memory_plan`) and block offload (`apply_block_offload`) the plan chose;
3. diffusers' `MiniMaxH3CoreDenoiseStep` (text-to-video-and-audio), latents out, then the DiT freed;
4. the streaming decode (`stream_decode`) of the video (`files.vae`) and, unless the plan has no audio, of the
   audio (`files.audio_vae`) straight into an MP4.

Model paths are written as given (absolute paths keep the script runnable from anywhere). Nothing here imports
diffusers; the script does.
"""

from __future__ import annotations

import datetime
import textwrap
from dataclasses import dataclass

from h3director.errors import InvalidInputError
from h3director.plan.capabilities import GGUF_TYPES, applied_settings


@dataclass(frozen=True)
class DiffusersFiles:
    """Where the models are: `dit` a diffusers transformer folder or a `.gguf`; `vae` and `audio_vae` diffusers
    VAE folders; `text_encoder` a Qwen3-VL folder (None: the script needs `--prompt-embeds`)."""

    dit: str | None
    vae: str | None
    audio_vae: str | None = None
    text_encoder: str | None = None

    def check(self, request) -> None:
        """Refuse missing names before anything is written (`InvalidInputError`, one line)."""
        missing = [flag for flag, value in (("--dit", self.dit), ("--vae", self.vae)) if not value]
        if request.audio and not self.audio_vae:
            missing.append("--audio-vae (or --no-audio)")
        if missing:
            raise InvalidInputError(f"--diffusers needs the model paths {', '.join(missing)}")
        if request.weights in GGUF_TYPES and not str(self.dit).lower().endswith(".gguf"):
            raise InvalidInputError(f"the plan loads the DiT as {GGUF_TYPES[request.weights]} GGUF: --dit must be a "
                                    f".gguf file (h3director weights convert --type {GGUF_TYPES[request.weights]})")
        if request.weights not in GGUF_TYPES and str(self.dit).lower().endswith(".gguf"):
            raise InvalidInputError(f"--dit is a GGUF file but the plan chose {request.weights} weights: give "
                                    "--weights with the file's quantisation (e.g. q4_k_m)")


_LOADERS = {
    "dit.weights.bf16": """
        transformer = MiniMaxH3Transformer3DModel.from_pretrained(DIT, torch_dtype=DTYPE, local_files_only=True)""",
    "dit.weights.fp8": """
        transformer = MiniMaxH3Transformer3DModel.from_pretrained(DIT, torch_dtype=DTYPE, local_files_only=True)
        transformer.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=DTYPE)""",
    "dit.weights.gguf": """
        transformer = load_h3_transformer_gguf(DIT, torch_dtype=DTYPE)""",
}


def _lines(applied, key: str) -> list:
    return [a for a in applied if a.capability == key]


def diffusers_script(request, files: DiffusersFiles, *, prompt: str = "", seed: int = 42, steps: int = 30,
                     command: str = "h3director plan") -> str:
    """The script's text for the plan `request` (a `PlanRequest`, normally `Recommendation.request`).
    `InvalidInputError` for weights no diffusers loader is written for."""
    files.check(request)
    applied = applied_settings(request, "diffusers")
    weights = next(a for a in applied if a.capability.startswith("dit.weights."))
    if weights.capability not in _LOADERS:
        raise InvalidInputError(f"no diffusers loader is written for {weights.capability}")
    chunking = _lines(applied, "dit.chunking")
    offload = _lines(applied, "dit.block_offload")
    te_device = "cpu" if request.text_encoder_device == "cpu" else "cuda"
    te_fp8 = request.text_encoder_weights == "fp8"
    setting_lines = "\n".join(f"  - {a.text}" for a in applied)
    memory = []
    if chunking:
        memory.append(f"memory = apply_memory_plan(transformer, head_chunks={request.head_chunks}, "
                      f"ffn_chunks={request.ffn_chunks}, mode=\"fixed\")")
    if offload:
        memory.append(f"offload = apply_block_offload(transformer, blocks_offloaded={request.offload_blocks}, "
                      "onload_device=device)")
    else:
        memory.append("transformer.to(device)")
    tiles = request.decode_tiles_per_call
    header = textwrap.dedent(f'''\
        #!/usr/bin/env python3
        """MiniMax H3 {request.width}x{request.height}, {request.frames} frames with diffusers, as planned by
        `{command}` ({datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC).

        Settings (the plan's capability registry; the code below applies each):
        {{settings}}

            python THIS.py [--out OUT.mp4] [--prompt-embeds FILE] [--device cuda|cpu]

        --prompt-embeds: a .safetensors with `prompt_embeds` [1, L, text width] (and optionally `text_token_tags`
        [L]) used instead of running the text encoder.
        """
        ''').replace("{settings}", setting_lines)
    body = f'''
import argparse
import gc

import torch

WIDTH, HEIGHT, FRAMES = {request.width}, {request.height}, {request.frames}
PROMPT = {prompt!r}
SEED, STEPS = {seed}, {steps}
DIT = {files.dit!r}
VAE = {files.vae!r}
AUDIO_VAE = {files.audio_vae if request.audio else None!r}
TEXT_ENCODER = {files.text_encoder!r}
TEXT_ENCODER_DEVICE = {te_device!r}        # text_encoder.placement
TEXT_ENCODER_FP8 = {te_fp8!r}               # text_encoder.weights.fp8
TILES_PER_CALL = {tiles!r}                # decode.streaming (None: the reference tiling)
DTYPE = torch.bfloat16
AUDIO_SHIFT, VIDEO_SHIFT = 3.0, 12.0


def prompt_embeddings(path, device):
    """(prompt_embeds, text_token_tags) from `path`, or from the text encoder, which is freed afterwards."""
    if path:
        from safetensors.torch import load_file

        tensors = load_file(path)
        embeds = tensors["prompt_embeds"]
        return embeds, tensors.get("text_token_tags", torch.ones(embeds.shape[1], dtype=torch.long))
    if TEXT_ENCODER is None:
        raise SystemExit("no text encoder was named when this script was written: give --prompt-embeds FILE")
    from diffusers.modular_pipelines import SequentialPipelineBlocks
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3TextEncoderStep
    from transformers import Qwen2TokenizerFast, Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    place = torch.device(TEXT_ENCODER_DEVICE if TEXT_ENCODER_DEVICE == "cpu" or torch.cuda.is_available() else "cpu")
    encoder = Qwen3VLForConditionalGeneration.from_pretrained(TEXT_ENCODER, torch_dtype=DTYPE, local_files_only=True)
    if TEXT_ENCODER_FP8:
        from diffusers.hooks import apply_layerwise_casting

        apply_layerwise_casting(encoder, storage_dtype=torch.float8_e4m3fn, compute_dtype=DTYPE)
    encoder.to(place)
    pipe = SequentialPipelineBlocks.from_blocks_dict({{"text": MiniMaxH3TextEncoderStep()}}).init_pipeline()
    pipe.load_components()
    pipe.update_components(text_encoder=encoder,
                           tokenizer=Qwen2TokenizerFast.from_pretrained(TEXT_ENCODER, local_files_only=True),
                           processor=Qwen3VLProcessor.from_pretrained(TEXT_ENCODER, local_files_only=True))
    out = pipe(prompt=PROMPT, output=["prompt_embeds", "text_token_tags"])
    del pipe, encoder                              # the text encoder leaves before sampling
    gc.collect()
    return out["prompt_embeds"].cpu(), out["text_token_tags"].cpu()


def sample(embeds, tags, device):
    """Video latents [1, 24, T, h, w] and audio latents [2, 32, Ta] from the planned DiT."""
    from diffusers import MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel  # noqa: F401
    from diffusers.modular_pipelines import SequentialPipelineBlocks
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3CoreDenoiseStep

    from h3director.integrations.diffusers_dit import apply_memory_plan  # noqa: F401
    from h3director.integrations.diffusers_gguf import load_h3_transformer_gguf  # noqa: F401
    from h3director.integrations.diffusers_offload import apply_block_offload  # noqa: F401
{textwrap.indent(textwrap.dedent(_LOADERS[weights.capability]).strip(), "    ")}
    transformer.eval().requires_grad_(False)
{textwrap.indent(chr(10).join(memory), "    ")}
    pipe = SequentialPipelineBlocks.from_blocks_dict({{"denoise": MiniMaxH3CoreDenoiseStep()}}).init_pipeline()
    pipe.load_components()
    pipe.update_components(transformer=transformer, scheduler=MiniMaxH3Scheduler(shift=VIDEO_SHIFT),
                           audio_scheduler=MiniMaxH3Scheduler(shift=AUDIO_SHIFT))
    with torch.no_grad():
        out = pipe(prompt_embeds=embeds.to(device, DTYPE), text_token_tags=tags.to(device), height=HEIGHT,
                   width=WIDTH, num_frames=FRAMES, num_inference_steps=STEPS,
                   generator=torch.Generator(device).manual_seed(SEED), output=["latents", "audio_latents"])
    del pipe, transformer                          # the DiT leaves before decoding
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out["latents"], out["audio_latents"]


def decode(latents, audio_latents, path, device):
    """Stream the latents into an MP4 at `path` (24 fps, H.264; AAC when the plan has audio)."""
    from diffusers import AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio

    from h3director.integrations.diffusers_h3 import H3VideoAdapter
    from h3director.integrations.diffusers_h3_audio import H3AudioAdapter
    from h3director.video.scheduler import AudioJob, stream_decode
    from h3director.video.sinks import file_sink_for

    vae = AutoencoderKLMiniMaxH3.from_pretrained(VAE, torch_dtype=DTYPE, local_files_only=True).to(device).eval()
    audio = None
    if AUDIO_VAE is not None:
        audio_vae = AutoencoderKLMiniMaxH3Audio.from_pretrained(AUDIO_VAE, torch_dtype=torch.float32,
                                                                local_files_only=True).to(device).eval()
        audio = AudioJob(adapter=H3AudioAdapter(audio_vae), latents=audio_latents.float())
    sink = file_sink_for(path, fps=24.0, audio_sample_rate=audio.adapter.sample_rate if audio else None)
    with torch.no_grad():
        return stream_decode(H3VideoAdapter(vae), latents.to(device, DTYPE), sink, audio=audio,
                             tiles_per_call=TILES_PER_CALL)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="h3.mp4")
    parser.add_argument("--prompt-embeds", default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    embeds, tags = prompt_embeddings(args.prompt_embeds, device)
    latents, audio_latents = sample(embeds, tags, device)
    report = decode(latents, audio_latents, args.out, device)
    print(f"wrote {{args.out}}: {{report.frames}} frames")


if __name__ == "__main__":
    main()
'''
    return header + body


__all__ = ["DiffusersFiles", "diffusers_script"]
