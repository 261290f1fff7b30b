"""Estimators and planners: bytes for weights, activations, decode and host buffers; recommendations.

Public entry points: `PlanRequest`, `estimate(request) -> PlanEstimate`, `Budget`,
`recommend(request, budget) -> Recommendation`, and `decode_clip_working_set_bytes` (the decode
preflight's per-clip estimate). Nothing here imports torch or diffusers; `live_bytes` (the
measuring tracker, needs torch) is imported on its own.
"""

from h3director.plan.decode import decode_clip_working_set_bytes
from h3director.plan.estimate import PlanEstimate, PlanRequest, estimate
from h3director.plan.recommend import Budget, Recommendation, recommend

__all__ = ["Budget", "PlanEstimate", "PlanRequest", "Recommendation", "decode_clip_working_set_bytes",
           "estimate", "recommend"]
