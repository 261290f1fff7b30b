"""`h3director plan ... --workflow OUT.json | --staged`: the plan writes the workflow that runs it.

- `--workflow OUT.json`: the ComfyUI API-format workflow of the recommendation (plan/workflow_comfy.py) with the
  user's model file names `--dit`, `--text-encoder`, `--vae`, `--audio-vae` (not with `--no-audio`); `--image
  NAME` makes it image-to-video (the first frame, a file in ComfyUI's input folder, counted as one keyframe).
- `--diffusers OUT.py` (target diffusers): the Python script that runs the plan with diffusers
  (plan/workflow_diffusers.py), `--dit` a transformer folder or a .gguf, `--vae`/`--audio-vae` VAE folders,
  `--text-encoder` a Qwen3-VL folder (optional: the script then takes `--prompt-embeds`).
- `--staged [--draft WxH] [--draft-fps N] [--refine-denoise D]`: prices a video-only draft and the full-size
  refinement separately (plan/staged.py); with `--workflow OUT.json` it writes OUT.stage1.json and
  OUT.stage2.json.

Every refusal (a missing model name, an unknown weights format, a frame count off the 17n+5 grid, a draft
larger than the final video, an output folder that does not exist) happens before anything is written; files are
written atomically (a temporary name, then a rename).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from h3director.errors import InvalidInputError

FILE_FLAGS = ("dit", "text_encoder", "vae", "audio_vae", "prompt", "seed", "steps")
STAGED_FLAGS = ("draft", "draft_fps", "refine_denoise")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `--workflow`, `--diffusers` and `--staged` option groups (and their file options) to `plan`'s
    parser."""
    out = parser.add_argument_group("write what runs the plan")
    out.add_argument("--workflow", default=None, metavar="OUT.json",
                     help="write the ComfyUI API-format workflow (with --staged: OUT.stage1.json, OUT.stage2.json)")
    out.add_argument("--diffusers", default=None, metavar="OUT.py",
                     help="write the Python script that runs the plan with diffusers (plans for --target diffusers; "
                          "--dit, --vae, --audio-vae, --text-encoder then name diffusers folders or a .gguf DiT)")
    out.add_argument("--dit", default=None, help="DiT file as ComfyUI lists it (.safetensors; .gguf with --weights "
                                                 "naming its quantisation)")
    out.add_argument("--text-encoder", default=None, help="text encoder file (models/text_encoders)")
    out.add_argument("--vae", default=None, help="video VAE file (models/vae)")
    out.add_argument("--audio-vae", default=None, help="audio VAE file (models/vae); not with --no-audio")
    out.add_argument("--image", default=None,
                     help="image-to-video: the first frame's file name in ComfyUI's input folder (one keyframe)")
    out.add_argument("--prompt", default=None, help="the prompt written into the workflow")
    out.add_argument("--seed", type=int, default=None, help="sampler seed (default 42)")
    out.add_argument("--steps", type=int, default=None, help="sampler steps (default 30)")
    staged = parser.add_argument_group("staged generation: a video-only draft, then the full audio-video result")
    staged.add_argument("--staged", action="store_true",
                        help="price stage one (video-only draft) and stage two (refine at full size, with audio)")
    staged.add_argument("--draft", default=None, metavar="WxH",
                        help="draft size in pixels (default: the final aspect ratio within 512x512)")
    staged.add_argument("--draft-fps", type=float, default=None, help="draft frame rate, <= 24 (default 12)")
    staged.add_argument("--refine-denoise", type=float, default=None,
                        help="stage two's KSampler denoise, in (0, 1) (default 0.6)")


def _given(args: argparse.Namespace, names) -> list[str]:
    return [f"--{n.replace('_', '-')}" for n in names if getattr(args, n) is not None]


def check_args(args: argparse.Namespace) -> None:
    """Refuse, with `InvalidInputError` and before any planning, flag combinations that would do nothing
    and bad output paths; returns None. Sets `args.target` ("diffusers" with `--diffusers`, else "comfyui"
    when unset)."""
    from h3director.core.atomic_file import check_output_path
    from h3director.plan.workflow_comfy import dit_file_kind

    if args.diffusers is not None:
        if args.workflow is not None or args.staged or args.image or args.devices is not None:
            raise InvalidInputError("--diffusers writes one text-to-video script for one device: not with "
                                    "--workflow, --staged, --image or --devices")
        if args.target == "comfyui":
            raise InvalidInputError("--diffusers plans for --target diffusers, not comfyui")
        args.target = "diffusers"
        check_output_path(args.diffusers, (".py",), "plan --diffusers")
    args.target = args.target or "comfyui"
    writing = args.workflow is not None or args.diffusers is not None
    if not writing and _given(args, FILE_FLAGS):
        raise InvalidInputError(f"{', '.join(_given(args, FILE_FLAGS))} go into a written workflow: "
                                "give --workflow OUT.json or --diffusers OUT.py")
    if args.no_audio and args.audio_vae:
        raise InvalidInputError("--audio-vae with --no-audio: a plan without audio loads no audio VAE")
    if not args.staged and _given(args, STAGED_FLAGS):
        raise InvalidInputError(f"{', '.join(_given(args, STAGED_FLAGS))} describe the draft of --staged")
    if args.target != "comfyui" and (args.workflow is not None or args.staged):
        raise InvalidInputError("--workflow and --staged write ComfyUI workflows: they plan for --target comfyui")
    if args.devices is not None and (args.workflow is not None or args.staged):
        raise InvalidInputError("--workflow and --staged plan one device: give --vram or --device, not --devices")
    if args.refs and writing:
        raise InvalidInputError("the workflow writer covers text-to-video and image-to-video (--image); "
                                "--refs needs MiniMaxH3ReferenceToVideo, which it does not write")
    if args.steps is not None and not 1 <= args.steps <= 1000:
        raise InvalidInputError(f"--steps must be 1 to 1000, got {args.steps}")
    if args.workflow is not None:
        check_output_path(args.workflow, (".json",), "plan --workflow")
        if args.dit:
            dit_file_kind(args.dit)


def formats(args: argparse.Namespace) -> list[str] | None:
    """The DiT formats the plan may choose: `--weights` if given (checked against what loads it when a
    workflow is written); for a workflow, the format read from its `--dit` file when that is a path here
    (`_dit_file_format`), else those its `--dit` file can hold; else None (every format).
    `InvalidInputError` for a GGUF `--dit` without `--weights`, or weights no ComfyUI loader reads."""
    from h3director.plan.capabilities import GGUF_TYPES
    from h3director.plan.formats import weight_format
    from h3director.plan.workflow_comfy import dit_file_kind, loadable_formats

    if args.diffusers:
        if args.weights:
            return [weight_format(args.weights).name]
        if args.dit and str(args.dit).lower().endswith(".gguf"):
            raise InvalidInputError(f"--dit {args.dit} is a GGUF file: say which quantisation it holds with "
                                    f"--weights ({', '.join(GGUF_TYPES)})")
        return ["bf16", "fp8"]                      # what a diffusers transformer folder loads as
    if args.weights:
        fmt = weight_format(args.weights).name
        if args.workflow and not loadable_formats([fmt], "comfyui"):
            raise InvalidInputError(f"DiT weights {fmt} have no ComfyUI loader to write into the workflow")
        return [fmt]
    if args.workflow:
        read = _dit_file_format(args.dit) if args.dit else None
        if read is not None:
            return [read]
        if args.dit and dit_file_kind(args.dit) == "gguf":
            raise InvalidInputError(f"--dit {args.dit} is a GGUF file: say which quantisation it holds with "
                                    f"--weights ({', '.join(GGUF_TYPES)}), or give its path so its header is read")
        return list(loadable_formats(("bf16", "fp8"), "comfyui"))
    return None


def _dit_file_format(dit: str) -> str | None:
    """The planner format of `--dit` read from the file when it exists here (a path): a GGUF's type from its
    header, a safetensors file's ComfyUI quantised layers; None when the file is not here or is not quantised."""
    from pathlib import Path

    from h3director.plan import capabilities
    from h3director.plan.workflow_comfy import dit_file_kind

    path = Path(dit)
    if not path.is_file():
        return None
    if dit_file_kind(dit) == "gguf":
        return capabilities.gguf_file_format(path)
    return capabilities.comfy_dit_file_format(path)


def _run_spec(args: argparse.Namespace):
    from h3director.plan.workflow_comfy import RunSpec

    changes = {k: getattr(args, k) for k in ("prompt", "seed", "steps") if getattr(args, k) is not None}
    return RunSpec(image=args.image, **changes)


def _files(args: argparse.Namespace):
    from h3director.plan.workflow_comfy import ModelFiles

    return ModelFiles(dit=args.dit, text_encoder=args.text_encoder, vae=args.vae, audio_vae=args.audio_vae)


def _single_pass(advice) -> None:
    if advice.long_form is not None:
        raise InvalidInputError(f"the plan needs {advice.long_form.chunks} long-form segments on this budget: the "
                                "workflow writer writes one pass; shorten the video or give more memory")


def _write_json(path: str, graph: dict) -> str:
    """Write `graph` as JSON to `path` atomically; returns the absolute path."""
    from h3director.core.atomic_file import atomic_path

    final = Path(path).expanduser().absolute()
    with atomic_path(final) as tmp:
        Path(tmp).write_text(json.dumps(graph, indent=2) + "\n")
    return str(final)


def _config_lines(workflow) -> list[str]:
    return [f"  h3_config.yaml: {key}: {value} (no node applies it)" for key, value in workflow.config.items()]


def _write_diffusers(args: argparse.Namespace, advice) -> list[str]:
    """`--diffusers OUT.py`: the script of a one-pass plan (refusing bad input first), written atomically."""
    import shlex
    import sys

    from h3director.core.atomic_file import atomic_path
    from h3director.plan.workflow_diffusers import DiffusersFiles, diffusers_script

    _single_pass(advice)
    files = DiffusersFiles(dit=args.dit, vae=args.vae, audio_vae=args.audio_vae, text_encoder=args.text_encoder)
    script = diffusers_script(advice.request, files, prompt=args.prompt or "", seed=42 if args.seed is None else args.seed,
                              steps=30 if args.steps is None else args.steps,
                              command="h3director " + shlex.join(sys.argv[1:]))
    final = Path(args.diffusers).expanduser().absolute()
    with atomic_path(final) as tmp:
        Path(tmp).write_text(script)
    return [f"Wrote {final}"]


def write_outputs(args: argparse.Namespace, advice) -> list[str]:
    """With `--workflow` (or `--diffusers`): build what runs a one-pass plan (refusing bad input first), then
    write it; returns the lines to print."""
    if args.diffusers:
        return _write_diffusers(args, advice)
    if not args.workflow:
        return []
    from h3director.plan.workflow_comfy import comfy_workflow

    _single_pass(advice)
    files = _files(args)
    workflow = comfy_workflow(advice.request, files, _run_spec(args))
    return [f"Wrote {_write_json(args.workflow, workflow.graph)}", *_config_lines(workflow),
            *(f"  note: {n}" for n in workflow.file_notes(advice.request, files))]


def stage_paths(path: str) -> tuple[str, str]:
    """OUT.json -> (OUT.stage1.json, OUT.stage2.json)."""
    stem = Path(path)
    return str(stem.with_name(f"{stem.stem}.stage1.json")), str(stem.with_name(f"{stem.stem}.stage2.json"))


def run_staged(args: argparse.Namespace, request, budget, source: str, fmts) -> int:
    """`--staged`: price both stages of `request` on `budget` (`source` says where the budget came from;
    `fmts` the DiT formats allowed), print them (or JSON), and write the two workflows with `--workflow`;
    returns 0."""
    from h3director.plan.staged import (
        DEFAULT_DENOISE,
        DEFAULT_DRAFT_FPS,
        parse_size,
        plan_staged,
    )

    size = parse_size(args.draft) if args.draft else None
    staged = plan_staged(request, budget, draft_size=size,
                         draft_fps=DEFAULT_DRAFT_FPS if args.draft_fps is None else args.draft_fps,
                         denoise=DEFAULT_DENOISE if args.refine_denoise is None else args.refine_denoise,
                         formats=fmts)
    written = []
    if args.workflow:
        from h3director.plan.workflow_comfy import staged_workflows

        one, two = staged_workflows(staged.draft.request, staged.final.request, _files(args), _run_spec(args),
                                    denoise=staged.denoise, draft_fps=staged.draft_fps_actual)
        first, second = stage_paths(args.workflow)
        written = [f"Wrote {_write_json(first, one.graph)} (stage one: draft, SaveLatent to output/latents/)",
                   f"Wrote {_write_json(second, two.graph)} (stage two: copy the draft .latent into ComfyUI's "
                   "input folder, then queue it)"]
        written += _config_lines(one) + _config_lines(two)
        written += [f"  note: {n}" for n in two.file_notes(staged.final.request, _files(args))]
    if args.json:
        out = staged.to_dict()
        out["budget"] = {"source": source, "device": budget.device, "device_bytes": budget.device_bytes,
                         "host_bytes": budget.host_bytes, "margin": budget.margin}
        out["written"] = written
        print(json.dumps(out, indent=2))
        return 0
    print(f"Budget: {source}")
    print(staged.summary())
    for line in written:
        print(line)
    return 0


__all__ = ["add_arguments", "check_args", "formats", "run_staged", "write_outputs"]
