"""H3Director Resumable Sampler: a SAMPLER whose run a killed server continues from its last checkpoint."""

from __future__ import annotations

import re
from pathlib import Path

from comfy_api.latest import io

from h3director.errors import InvalidInputError

RESUME_FOLDER = "h3director_resume"
RESUME_AUTO = "auto"
RESUME_RESTART = "restart"
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


def run_folder(run_name: str) -> Path:
    """``<ComfyUI output>/h3director_resume/<run_name>/`` (the output folder survives a restart; temp does not)."""
    from h3director.comfy import runtime

    if not _RUN_NAME.match(run_name):
        raise InvalidInputError(f"run_name {run_name!r} must be 1-100 letters, digits, '.', '_' or '-', "
                                f"starting with a letter or digit")
    return runtime.output_directory() / RESUME_FOLDER / run_name


class ResumableSampler(io.ComfyNode):
    """Node `H3DirectorResumableSampler`: `sampler_name` (euler, euler_ancestral, dpmpp_2m), `run_name`,
    `checkpoint_every` (steps) and `resume` (auto or restart) -> a SAMPLER that checkpoints every k steps
    under output/h3director_resume/<run_name>/ and, queued again after a crash, continues bit-identical to
    an uninterrupted run. A checkpoint of another run raises `CheckpointMismatch` naming what differs."""

    @classmethod
    def define_schema(cls) -> io.Schema:
        from h3director.integrations.comfy_resume import REFUSED, RESUMABLE

        return io.Schema(
            node_id="H3DirectorResumableSampler",
            display_name="H3Director Resumable Sampler",
            category="H3 Director/sampling",
            description=(
                "A SAMPLER for SamplerCustom / SamplerCustomAdvanced that saves the latent and the sampler's "
                "state every checkpoint_every steps under output/h3director_resume/<run_name>/. After the "
                "server dies, queue the same prompt again: sampling continues at the last checkpoint and "
                "ends bit-identical to an uninterrupted run. A checkpoint made by a different model, prompt, "
                "seed, schedule or latent size is refused with what differs. Finished runs remove their "
                f"checkpoints. Not resumable exactly, so not offered: {', '.join(sorted(REFUSED))}."),
            inputs=[
                io.Combo.Input("sampler_name", options=list(RESUMABLE), default="euler"),
                io.String.Input("run_name", default="h3_render",
                                tooltip="Names the checkpoint folder; one run name per sampling in flight."),
                io.Int.Input("checkpoint_every", default=5, min=1, max=1000,
                             tooltip="Save a checkpoint every this many steps."),
                io.Combo.Input("resume", options=[RESUME_AUTO, RESUME_RESTART], default=RESUME_AUTO,
                               tooltip="auto: continue from a matching checkpoint (refuse another run's); "
                                       "restart: discard this run name's checkpoints and start at step 0."),
            ],
            outputs=[io.Sampler.Output()],
        )

    @classmethod
    def validate_inputs(cls, run_name, **kwargs) -> bool | str:
        if not _RUN_NAME.match(str(run_name)):
            return f"run_name {run_name!r} must be 1-100 letters, digits, '.', '_' or '-'"
        return True

    @classmethod
    def execute(cls, sampler_name, run_name, checkpoint_every, resume) -> io.NodeOutput:
        import comfy.samplers

        from h3director.integrations.comfy_resume import resumable_sampler_function
        if resume not in (RESUME_AUTO, RESUME_RESTART):
            raise InvalidInputError(f"resume must be {RESUME_AUTO!r} or {RESUME_RESTART!r}, got {resume!r}")
        function = resumable_sampler_function(sampler_name, run_folder(run_name), checkpoint_every,
                                              restart=resume == RESUME_RESTART)
        return io.NodeOutput(comfy.samplers.KSAMPLER(function))


__all__ = ["ResumableSampler"]
