"""Resumable ComfyUI sampling: ComfyUI's own k-diffusion samplers, checkpointed every k steps.

`resumable_sampler_function(name, folder, every, restart)` returns a sampler function for ComfyUI's
`comfy.samplers.KSAMPLER` (the SAMPLER that SamplerCustom / SamplerCustomAdvanced run). It calls the
named function of `comfy.k_diffusion.sampling` itself, unchanged, through a thin wrapper of the model:

- checkpoint: at the model call of step i (i a multiple of `every`, 0 < i < steps) the wrapper sees the
  sampler's latent at the start of step i; it saves that latent, the previous step's denoised output
  where the method carries it (dpmpp_2m's `old_denoised`) and the noise generator's state where the
  method draws noise (euler_ancestral: the generator ComfyUI's `default_noise_sampler` would make,
  seeded the same way, created here so that its state can be read and restored);
- resume: the sampler runs over the same sigmas from step 0, but the model calls of steps before the
  checkpoint return zeros (no model evaluation, no noise drawn) and the callbacks (previews, progress)
  are not called; the call before the checkpoint returns the saved denoised; at the checkpoint's step
  the wrapper writes the saved latent into the sampler's own latent tensor (in place, so the sampler
  continues from it), restores the generator state, and from then on the run is the original one.
  The final latent is bit-identical to an uninterrupted run (checked by tests/test_comfy_real_resume.py
  for every method in `RESUMABLE`).

Methods outside `RESUMABLE` are refused by name (`resumable_method` says why): more than one model call
per step, state beyond one denoised output, or noise from a generator whose state is not exposed (the
Brownian-tree samplers).

The checkpoint key is built at sampling time from what the sampling consumes, so ComfyUI's node cache
cannot make it stale: sampler, model (class, parameter count, dtype, a CRC of its first and last
weights, patched keys), conditioning (every positive/negative entry and the cfg), seed, sigmas
(steps, scheduler, denoise), latent shapes, a CRC of the initial latent (noise plus input latent) and the
device type.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from h3director.errors import InvalidInputError
from h3director.resume.checkpoint import CheckpointStore, SamplingCheckpoint
from h3director.resume.fingerprint import module_identity, sigmas_digest, structure_digest, tensor_digest

LOG = logging.getLogger("h3director.resume")


@dataclass(frozen=True)
class ResumableMethod:
    """A k-diffusion sampler this module resumes exactly: `function` in `comfy.k_diffusion.sampling`, one
    model call per step, carrying at most the previous denoised output and one noise generator."""

    name: str
    function: str
    carries_denoised: bool = False
    draws_noise: bool = False


RESUMABLE: dict[str, ResumableMethod] = {
    "euler": ResumableMethod("euler", "sample_euler"),
    "euler_ancestral": ResumableMethod("euler_ancestral", "sample_euler_ancestral", draws_noise=True),
    "dpmpp_2m": ResumableMethod("dpmpp_2m", "sample_dpmpp_2m", carries_denoised=True),
}

# Why the other samplers ComfyUI lists are refused (a name not here gets the generic reason).
REFUSED: dict[str, str] = {
    **{name: "two or more model calls per step" for name in (
        "heun", "heunpp2", "dpm_2", "dpm_2_ancestral", "dpmpp_2s_ancestral", "dpmpp_sde", "dpmpp_sde_gpu",
        "exp_heun_2_x0", "exp_heun_2_x0_sde", "res_multistep", "seeds_2", "seeds_3", "sa_solver", "sa_solver_pece")},
    **{name: "noise from a Brownian tree whose state is not exposed" for name in (
        "dpmpp_2m_sde", "dpmpp_2m_sde_gpu", "dpmpp_2m_sde_heun", "dpmpp_2m_sde_heun_gpu",
        "dpmpp_3m_sde", "dpmpp_3m_sde_gpu")},
    **{name: "carries several past steps (multistep history) that is not saved" for name in (
        "lms", "ipndm", "ipndm_v", "deis", "uni_pc", "uni_pc_bh2", "gradient_estimation")},
    **{name: "adaptive or internally scheduled steps" for name in ("dpm_fast", "dpm_adaptive")},
}


def resumable_method(name: str) -> ResumableMethod:
    """The `ResumableMethod` for sampler `name`; `InvalidInputError` naming why for any other sampler."""
    if name in RESUMABLE:
        return RESUMABLE[name]
    reason = REFUSED.get(name, "not verified to resume bit-identically")
    raise InvalidInputError(f"sampler {name!r} cannot be resumed exactly ({reason}); resumable samplers: "
                            f"{', '.join(RESUMABLE)}")


def model_identity(guider: Any) -> str:
    """`module_identity` of the diffusion model the guider samples (its `BaseModel` class named), plus its
    patched keys (LoRA and the like) with their strengths."""
    patcher = getattr(guider, "model_patcher", None)
    model = getattr(patcher, "model", None)
    if model is None:
        return type(guider).__name__
    text = f"{type(model).__name__}: {module_identity(getattr(model, 'diffusion_model', model))}"
    patches = getattr(patcher, "patches", None) or {}
    if patches:
        strengths = sorted((key, tuple(float(p[0]) for p in entries)) for key, entries in patches.items())
        text += f", {len(patches)} patched keys crc {structure_digest(strengths)}"
    return text


def run_key(method: ResumableMethod, model: Any, x: torch.Tensor, sigmas: torch.Tensor,
            extra_args: dict) -> dict[str, str]:
    """The key a checkpoint must match (see the module docstring); `model` is what KSAMPLER hands the
    sampler function (`KSamplerX0Inpaint`, whose `inner_model` is the guider)."""
    guider = getattr(model, "inner_model", None)
    base = getattr(guider, "inner_model", None)
    shapes = getattr(base, "latent_shapes", None) or [tuple(x.shape)]
    return {
        "sampler": method.name,
        "model": model_identity(guider),
        "conditioning": f"crc {structure_digest(getattr(guider, 'original_conds', {}))}, "
                        f"cfg {getattr(guider, 'cfg', '?')}",
        "seed": str(extra_args.get("seed")),
        "sigmas": sigmas_digest(sigmas),
        "latent shape": " + ".join(str(list(s)) for s in shapes),
        "initial latent": tensor_digest(x),
        "device": x.device.type,   # the same bits (and generator kind) need the same kind of device
    }


class _NoiseSource:
    """The generator ComfyUI's `default_noise_sampler(x, seed)` makes (seed + 1 on the CPU), drawing the same
    `torch.randn` calls; `paused` returns zeros without drawing (steps being skipped on resume)."""

    def __init__(self, x: torch.Tensor, seed: int | None) -> None:
        if seed is None:
            raise InvalidInputError("an ancestral sampler needs the run's seed to resume; ComfyUI passed none")
        if x.device == torch.device("cpu"):
            seed += 1
        self.generator = torch.Generator(device=x.device)
        self.generator.manual_seed(seed)
        self.paused = False

    def bind(self, x: torch.Tensor) -> Callable:
        """The `noise_sampler(sigma, sigma_next)` the k-diffusion function gets, for latents like `x`."""
        size, dtype, layout, device = x.size(), x.dtype, x.layout, x.device

        def draw(sigma, sigma_next):
            if self.paused:
                return torch.zeros(size, dtype=dtype, layout=layout, device=device)
            return torch.randn(size, dtype=dtype, layout=layout, device=device, generator=self.generator)

        return draw


class _Run:
    """One sampling run's bookkeeping: which model call is which step, what to save, where to resume."""

    def __init__(self, method: ResumableMethod, store: CheckpointStore, every: int, sigmas: torch.Tensor,
                 key: dict[str, str], checkpoint: SamplingCheckpoint | None, noise: _NoiseSource | None) -> None:
        self.method, self.store, self.every, self.key = method, store, every, key
        self.sigmas = sigmas
        self.total = len(sigmas) - 1
        self.checkpoint = checkpoint
        self.resume_at = checkpoint.step if checkpoint is not None else 0
        self.noise = noise
        self.calls = 0
        self.previous_denoised: torch.Tensor | None = None
        if noise is not None and self.resume_at:
            noise.paused = True

    def _check_sigma(self, step: int, sigma: torch.Tensor) -> None:
        expected = self.sigmas[step] if step < len(self.sigmas) else None
        if expected is None or not bool((sigma == expected).all()):
            raise RuntimeError(f"H3 Director resume: model call {step} ran at sigma {sigma.flatten()[:1].tolist()}, "
                               f"expected {None if expected is None else float(expected)}; the sampler "
                               f"{self.method.name!r} did not make one model call per step as it must to resume")

    def model_call(self, model: Callable, x: torch.Tensor, sigma: torch.Tensor, **kwargs) -> torch.Tensor:
        step = self.calls
        self.calls += 1
        self._check_sigma(step, sigma)
        saved = self.checkpoint.tensors if self.checkpoint is not None else {}
        if step < self.resume_at:
            if step == self.resume_at - 1 and self.method.carries_denoised:
                return saved["old_denoised"].to(device=x.device, dtype=x.dtype).clone()
            return torch.zeros_like(x)
        if step == self.resume_at and self.checkpoint is not None:
            x.copy_(saved["latent"].to(device=x.device, dtype=x.dtype))
            if self.noise is not None:
                self.noise.generator.set_state(saved["generator_state"])
                self.noise.paused = False
            LOG.info("H3 Director resume: continuing at step %d of %d from %s", step, self.total,
                     self.checkpoint.path)
        elif step > 0 and step % self.every == 0 and step < self.total:
            self._save(step, x)
        denoised = model(x, sigma, **kwargs)
        if self.method.carries_denoised:
            self.previous_denoised = denoised
        return denoised

    def _save(self, step: int, x: torch.Tensor) -> None:
        tensors = {"latent": x}
        if self.method.carries_denoised:
            tensors["old_denoised"] = self.previous_denoised
        if self.noise is not None:
            tensors["generator_state"] = self.noise.generator.get_state()
        self.store.save_in_background(SamplingCheckpoint(step=step, total_steps=self.total, key=self.key, tensors=tensors))


class _SteppedModel:
    """The model as the sampler function sees it: calls go through `_Run.model_call`, attributes
    (`inner_model`, used by the RF ancestral sampler) to the wrapped model."""

    def __init__(self, model: Any, run: _Run) -> None:
        self._model = model
        self._run = run

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def __call__(self, x, sigma, **kwargs):
        return self._run.model_call(self._model, x, sigma, **kwargs)


def resumable_sampler_function(name: str, folder: str | os.PathLike, every: int, restart: bool = False) -> Callable:
    """A KSAMPLER sampler function running k-diffusion's `name` with checkpoints every `every` steps in a
    `CheckpointStore` over `folder` (a fresh one per run, so a full disk in one run does not stop the next).

    On each run: `restart` clears the store first; otherwise the newest readable checkpoint is resumed
    when its key matches the run's and refused (`CheckpointMismatch`) when it does not. A finished run
    removes its checkpoints. Raises `InvalidInputError` for a sampler that cannot be resumed exactly.
    """
    method = resumable_method(name)
    if every < 1:
        raise InvalidInputError(f"checkpoint_every must be at least 1 step, got {every}")

    def sample(model, x, sigmas, extra_args=None, callback=None, disable=None):
        import comfy.k_diffusion.sampling as k_sampling

        extra_args = {} if extra_args is None else extra_args
        store = CheckpointStore(folder)
        key = run_key(method, model, x, sigmas, extra_args)
        if restart:
            store.clear()
        checkpoint = store.latest(key)
        if checkpoint is not None and checkpoint.total_steps != len(sigmas) - 1:  # the key covers it; belt and braces
            raise InvalidInputError(f"checkpoint {checkpoint.path} is for {checkpoint.total_steps} steps, "
                                    f"this run has {len(sigmas) - 1}")
        if checkpoint is None:
            store.clear()  # leftovers that did not read back
        noise = _NoiseSource(x, extra_args.get("seed")) if method.draws_noise else None
        run = _Run(method, store, every, sigmas, key, checkpoint, noise)

        def on_step(info):
            if callback is not None and info["i"] >= run.resume_at:
                callback(info)

        options = {"noise_sampler": noise.bind(x)} if noise is not None else {}
        samples = getattr(k_sampling, method.function)(_SteppedModel(model, run), x, sigmas, extra_args=extra_args,
                                                       callback=on_step, disable=disable, **options)
        store.clear()
        return samples

    sample.__name__ = f"resumable_{method.function}"
    return sample


__all__ = ["REFUSED", "RESUMABLE", "ResumableMethod", "resumable_method", "resumable_sampler_function"]
