"""Resumable diffusers H3 sampling: the modular H3 pipeline's denoising loop, checkpointed every k steps.

diffusers runs MiniMax H3 as a modular pipeline (`diffusers.modular_pipelines.minimax_h3`); its denoising
loop (`MiniMaxH3DenoiseStep`: one transformer forward and one `MiniMaxH3Scheduler.step` per video and audio
row set) takes no `callback_on_step_end`. `ResumableH3DenoiseStep` is that loop block with the same
sub-blocks (so the same arithmetic) and a loop that:

- saves a checkpoint at the start of step i (i a multiple of `every`, 0 < i < steps): the packed video
  rows ``latent``, the audio rows ``audio_latent``; the schedulers' only state is their step index, which
  is the checkpoint's step (their sigmas are rebuilt from the same request by the pipeline's
  set-timesteps block); the scheduler is deterministic (`eta = 0`), so no generator state is needed;
- on a run whose key matches the newest readable checkpoint, skips the steps before it, loads the rows
  and sets both schedulers' begin index, then runs the remaining steps: the final latents are
  `torch.equal` to an uninterrupted run (tests/test_diffusers_resume.py, with the process SIGKILLed);
- refuses (`CheckpointMismatch`) a checkpoint whose key differs: transformer (class, parameter count,
  dtype, weight CRCs), conditioning (prompt embeddings and the packed layout's fields), seed (the
  request generator's `initial_seed()`), timesteps, latent shapes, initial latents (the noise draw).

Use `resumable_core_denoise(folder, every)` where the pipeline uses `MiniMaxH3CoreDenoiseStep()`.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from diffusers.modular_pipelines.minimax_h3.denoise import MiniMaxH3DenoiseStep
from diffusers.modular_pipelines.minimax_h3.modular_blocks_minimax_h3 import MiniMaxH3CoreDenoiseStep

from h3director.errors import InvalidInputError
from h3director.resume.checkpoint import CheckpointStore, SamplingCheckpoint
from h3director.resume.fingerprint import module_identity, sigmas_digest, structure_digest, tensor_digest


def h3_run_key(components, block_state, generator: torch.Generator | None) -> dict[str, str]:
    """The key a diffusers H3 checkpoint must match (see the module docstring), at the loop's start."""
    timesteps = block_state.timesteps
    return {
        "sampler": "diffusers MiniMaxH3Scheduler (euler, eta 0)",
        "model": module_identity(components.transformer),
        "conditioning": f"prompt {tensor_digest(block_state.prompt_embeds)}, layout crc "
                        f"{structure_digest(dict(block_state.denoiser_input_fields))}",
        "seed": str(generator.initial_seed()) if generator is not None else "global generator",
        "sigmas": f"video {sigmas_digest(timesteps)}; audio {sigmas_digest(block_state.audio_timesteps)}",
        "latent shape": f"video rows {list(block_state.latents.shape)}, audio rows {list(block_state.audio_latents.shape)}",
        "initial latent": f"{tensor_digest(block_state.latents)} + {tensor_digest(block_state.audio_latents)}",
    }


class ResumableH3DenoiseStep(MiniMaxH3DenoiseStep):
    """`MiniMaxH3DenoiseStep` with checkpoints every `every` steps in `folder` (see the module docstring).

    `restart`: discard the folder's checkpoints and start at step 0. A finished loop removes its checkpoints;
    a failed write warns once that checkpoints stopped and the loop goes on.
    """

    def __init__(self, folder: str | os.PathLike, every: int, restart: bool = False) -> None:
        if every < 1:
            raise InvalidInputError(f"every must be at least 1 step, got {every}")
        super().__init__()
        self.folder = Path(folder)
        self.every = every
        self.restart = restart
        self.resumed_from: int | None = None  # the step the last run continued at (None: from the start)

    @torch.no_grad()
    def __call__(self, components, state):
        block_state = self.get_block_state(state)
        store = CheckpointStore(self.folder)
        key = h3_run_key(components, block_state, state.get("generator"))
        if self.restart:
            store.clear()
        checkpoint = store.latest(key)
        if checkpoint is None:
            store.clear()
        total = len(block_state.timesteps)
        start = 0
        if checkpoint is not None:
            start = checkpoint.step
            block_state.latents = checkpoint.tensors["latent"].to(block_state.latents)
            block_state.audio_latents = checkpoint.tensors["audio_latent"].to(block_state.audio_latents)
            components.scheduler.set_begin_index(start)
            components.audio_scheduler.set_begin_index(start)
        self.resumed_from = start if checkpoint is not None else None
        with self.progress_bar(total=total) as progress_bar:
            for i, t in enumerate(block_state.timesteps):
                if i < start:
                    progress_bar.update()
                    continue
                if i > start and i % self.every == 0:
                    store.save_in_background(SamplingCheckpoint(step=i, total_steps=total, key=key, tensors={
                        "latent": block_state.latents, "audio_latent": block_state.audio_latents}))
                components, block_state = self.loop_step(components, block_state, i=i, t=t)
                progress_bar.update()
        store.clear()
        self.set_block_state(state, block_state)
        return components, state


def resumable_core_denoise(folder: str | os.PathLike, every: int, restart: bool = False) -> MiniMaxH3CoreDenoiseStep:
    """A diffusers `MiniMaxH3CoreDenoiseStep` (t2va) whose denoising loop is
    `ResumableH3DenoiseStep(folder, every, restart)`: checkpoints every `every` steps in `folder`;
    `restart` discards the run's checkpoints first."""
    core = MiniMaxH3CoreDenoiseStep()
    core.sub_blocks["denoise"] = ResumableH3DenoiseStep(folder, every, restart)
    return core


__all__ = ["ResumableH3DenoiseStep", "resumable_core_denoise"]
