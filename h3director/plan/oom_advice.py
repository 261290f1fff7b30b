"""Phase-aware advice for out-of-memory errors, from the planner and its capability registry.

`h3director.core.oom.explain_log` finds each error, its numbers, and from the log around it the phase
(sampling, decode, text encoding), the failing ComfyUI node and the geometry. `advise` then replaces the
generic advice of an error whose phase is known with what the planner would set for that geometry on that
card (`recommend(...)` with the card's total from the message and the host RAM given), each setting named by
the node input or library call that applies it (`capabilities.applied_settings`); when the log does not
state the geometry it gives the exact `h3director plan` command that computes them.

Every error with a phase also gets the five steps (`STEPS`), in the planner's own search order: the
text encoder off the accelerator, DiT chunking, DiT block offload, the DiT weight format, decode tiling and
sink. Each step names its setting, with the planner's value where there is a plan.
"""

from __future__ import annotations

from h3director.errors import BudgetError, InvalidInputError
from h3director.plan import capabilities as caps
from h3director.units import GiB

#: The five steps: (what, the registry keys that apply it), in the order the planner tries them
#: (`plan.recommend`: text encoder, then per weight format the chunking, then block offload; decode last).
STEPS = (
    ("text encoder off the accelerator before sampling (or its fp8 file)",
     ("text_encoder.placement", "text_encoder.weights.fp8")),
    ("DiT attention head groups and FFN row chunks (exact where verified, about as fast)", ("dit.chunking",)),
    ("DiT blocks offloaded to host RAM (exact, slower: each step streams them)", ("dit.block_offload",)),
    ("a smaller DiT weight format (approximate)", ("dit.weights.fp8", "dit.weights.gguf")),
    ("decode tiling and sink: a budget per clip, frames straight to a file, no audio VAE if no sound",
     ("decode.streaming", "decode.audio_off")),
)
_PHASE_KEYS = {
    "sampling": ("dit.weights", "dit.chunking", "dit.block_offload", "text_encoder"),
    "decode": ("decode", "memory.pool"),
    "text_encoding": ("text_encoder",),
}
#: Diagnoses whose advice is about the allocator or other processes, not the job's size: kept as they are.
_ALLOCATOR_DIAGNOSES = ("fragmentation", "other-processes", "limit", "size-bug")


def _gb(nbytes: int) -> str:
    return f"{nbytes / GiB:.2f}".rstrip("0").rstrip(".") + "GB"


def plan_command(geometry: dict | None, card_bytes: int | None, host_bytes: int, target: str) -> str:
    """The `h3director plan` command for `geometry` ({"width", "height", "frames"}; placeholders when None) on a
    card of `card_bytes` (placeholder when None) with `host_bytes` of RAM, for `target`."""
    g = geometry or {}
    return (f"h3director plan --width {g.get('width', 'WIDTH')} --height {g.get('height', 'HEIGHT')} "
            f"--frames {g.get('frames', 'FRAMES')} --vram {_gb(card_bytes) if card_bytes else 'VRAM'} "
            f"--ram {_gb(host_bytes)} --target {target}")


def _generic(key: str, target: str) -> str:
    executor = caps.capability(key).executor(target)
    if executor is None:
        return f"{key}: no executor for {target}"
    if isinstance(executor, caps.ComfyExecutor):
        return f"node {executor.node} ({', '.join(executor.inputs) or executor.note})"
    if isinstance(executor, caps.ConfigExecutor):
        return f"h3_config.yaml {executor.key}"
    return executor.call


def five_steps(recommendation, target: str) -> list[str]:
    """The five steps as lines: each with the planner's setting from `recommendation` (a `Recommendation`, or
    None: the node or call that applies it, without a value)."""
    applied = recommendation.applied() if recommendation is not None else ()
    lines = []
    for number, (what, keys) in enumerate(STEPS, start=1):
        if recommendation is None:
            settings = [_generic(key, target) for key in keys if caps.offered(key, target)]
        else:
            weights = any(key.startswith("dit.weights.") for key in keys)
            settings = [f"{a.text}: {a.how()}" for a in applied
                        if a.capability in keys or (weights and a.capability.startswith("dit.weights."))]
            settings = settings or ["not needed for this plan"]
        lines.append(f"{number}. {what}: " + "; ".join(settings))
    return lines


def _recommendation(geometry: dict, card_bytes: int, host_bytes: int, target: str):
    from h3director.plan.estimate import PlanRequest
    from h3director.plan.recommend import Budget, recommend

    request = PlanRequest(geometry["width"], geometry["height"], geometry["frames"])
    return recommend(request, Budget(card_bytes, host_bytes), target=target)


def advise(items: list, *, host_bytes: int, target: str = "comfyui", host_source: str = "") -> None:
    """Add phase-aware advice, in place, to every `core.oom.OomError` in `items` whose phase is known;
    returns None. `host_bytes`: the host RAM to plan with (bytes; the log does not say it), `host_source`
    how it was chosen (for the text); `target`: "comfyui" or "diffusers" (else `InvalidInputError`). Errors
    of an unknown phase keep the allocator's generic advice."""
    from h3director.core.oom import OomError

    caps.check_target(target)
    for item in items:
        if not isinstance(item, OomError) or item.phase is None:
            continue
        card = item.total_bytes
        recommendation, refusal = None, None
        if item.geometry and card:
            try:
                recommendation = _recommendation(item.geometry, card, host_bytes, target)
            except BudgetError as error:
                refusal = f"the planner finds nothing that fits: {str(error).splitlines()[0]}"
            except InvalidInputError as error:
                refusal = f"the planner refuses it: {error}"
        advice = item.advice if item.diagnosis in _ALLOCATOR_DIAGNOSES else []
        command = plan_command(item.geometry, card, host_bytes, target)
        if recommendation is not None:
            g = item.geometry
            keys = _PHASE_KEYS[item.phase]
            chosen = [a for a in recommendation.applied() if a.capability.startswith(keys)]
            advice.append(f"for {g['width']}x{g['height']}, {g['frames']} frames on this {_gb(card)} card with "
                          f"{_gb(host_bytes)} of RAM{host_source} the planner sets, for the "
                          f"{item.phase.replace('_', ' ')} phase:")
            advice += [f"  {a.text}: {a.how()}" for a in chosen]
            if recommendation.long_form:
                lf = recommendation.long_form
                advice.append(f"  and generates in {lf.chunks} segments of up to {lf.chunk_frames} frames "
                              f"(`h3director stitch --overlap {lf.overlap_frames}` joins them)")
            advice.append(f"the whole plan: `{command}`")
        elif refusal is not None:
            g = item.geometry
            advice.append(f"for {g['width']}x{g['height']}, {g['frames']} frames on this {_gb(card)} card "
                          f"{refusal}; `{command}` shows the numbers")
        else:
            missing = "the canvas and length" if not item.geometry else "the card's size"
            advice.append(f"the log does not state {missing}: `{command}` computes the "
                          f"{item.phase.replace('_', ' ')} settings that fit (fill in the placeholders)")
        item.advice = advice
        item.steps = five_steps(recommendation, target)


__all__ = ["STEPS", "advise"]
