"""Subprocess worker for tests/test_diffusers_resume.py: one diffusers H3 sampling run (t2va, latents out).

    python tests/resume_worker.py PIPE EMBEDS OUT [--folder DIR --every K] [--seed S]
                                  [--gate-step N --gate-dir DIR] [--fsize-limit BYTES]

Loads the tiny pipeline folder `PIPE` (fixtures/comfy_harness/farm_diffusers.py), runs diffusers'
`MiniMaxH3CoreDenoiseStep` (stock) or, with `--folder`, `resumable_core_denoise(folder, every)`, on one
thread, and saves ``latents`` / ``audio_latents`` to `OUT`. `--gate-step N` blocks forever in the
transformer call of step N after touching `<gate-dir>/reached` (the test SIGKILLs the process there).
`--fsize-limit` lowers this process's soft file-size limit while sampling (SIGXFSZ ignored), so the
kernel refuses checkpoint writes past that size with EFBIG, as a full disk refuses them with ENOSPC.
"""

from __future__ import annotations

import argparse
import resource
import signal
import sys
import time
from pathlib import Path

import torch


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    for name in ("pipe", "embeds", "out"):
        parser.add_argument(name)
    parser.add_argument("--folder")
    parser.add_argument("--every", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--gate-step", type=int)
    parser.add_argument("--gate-dir")
    parser.add_argument("--fsize-limit", type=int)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)

    from diffusers import MiniMaxH3Scheduler, MiniMaxH3Transformer3DModel
    from diffusers.modular_pipelines import SequentialPipelineBlocks
    from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3CoreDenoiseStep
    from safetensors.torch import load_file, save_file

    from h3director.integrations.diffusers_resume import resumable_core_denoise

    folder = Path(args.pipe)
    transformer = MiniMaxH3Transformer3DModel.from_pretrained(folder / "transformer", local_files_only=True).eval()
    core = resumable_core_denoise(args.folder, args.every) if args.folder else MiniMaxH3CoreDenoiseStep()
    pipe = SequentialPipelineBlocks.from_blocks_dict({"denoise": core}).init_pipeline()
    pipe.update_components(transformer=transformer,
                           scheduler=MiniMaxH3Scheduler.from_pretrained(folder / "scheduler", local_files_only=True),
                           audio_scheduler=MiniMaxH3Scheduler(shift=3.0))
    if args.gate_step is not None:
        calls = {"n": 0}

        def gate(module, inputs):
            if calls["n"] == args.gate_step:
                (Path(args.gate_dir) / "reached").write_text("x")
                while True:  # the test SIGKILLs this process here
                    time.sleep(0.05)
            calls["n"] += 1

        transformer.register_forward_pre_hook(gate)
    embeds = load_file(args.embeds)["prompt_embeds"]
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    if args.fsize_limit is not None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (args.fsize_limit, hard))
    with torch.no_grad():
        out = pipe(prompt_embeds=embeds, text_token_tags=torch.ones(embeds.shape[1], dtype=torch.long), height=32,
                   width=32, num_frames=124, num_inference_steps=args.steps,
                   generator=torch.Generator("cpu").manual_seed(args.seed), output=["latents", "audio_latents"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    save_file({"latents": out["latents"].contiguous(), "audio_latents": out["audio_latents"].contiguous()}, args.out)
    if args.folder:
        loop = pipe.blocks.sub_blocks["denoise"].sub_blocks["denoise"]   # the pipeline holds copies of the blocks
        print(f"resumed_from={loop.resumed_from}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
