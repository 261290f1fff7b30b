"""`h3director plan` prices the DiT memory tiers with the per-block ledgers and names the settings that run them."""

from __future__ import annotations

from h3director.plan.estimate import PlanRequest, estimate
from h3director.plan.recommend import Budget, dit_memory_settings, recommend
from h3director.units import GiB


def _sampling(request: PlanRequest) -> int:
    return next(p for p in estimate(request).phases if p.name == "sampling").working_bytes


def test_head_groups_are_predicted_to_save_memory():
    base = dict(width=1344, height=768, frames=260, attention="sage")
    ffn_only = _sampling(PlanRequest(**base, head_chunks=1, ffn_chunks=8))
    grouped = _sampling(PlanRequest(**base, head_chunks=4, ffn_chunks=8))
    stock = _sampling(PlanRequest(**base))
    assert grouped < ffn_only < stock
    assert ffn_only - grouped > GiB // 2          # head groups save real memory at this length, not 0


def test_recommendation_names_the_node_and_the_diffusers_call():
    advice = recommend(PlanRequest(width=1344, height=768, frames=362), Budget(24 * GiB, 128 * GiB), formats=["bf16"])
    settings = advice.settings()
    head, ffn = settings["head_chunks"], settings["ffn_chunks"]
    assert (head, ffn) != (1, 1)
    text = advice.summary()
    assert f"H3Director DiT Memory: mode fixed, head_chunks {head}, ffn_chunks {ffn}" in text
    assert f"apply_memory_plan(transformer, head_chunks={head}, ffn_chunks={ffn})" in text
    assert settings["dit_memory"]["node"] == "H3Director DiT Memory"


def test_stock_needs_no_node():
    assert dit_memory_settings(1, 1)["node"] is None
    small = recommend(PlanRequest(width=512, height=320, frames=22), Budget(80 * GiB, 128 * GiB))
    assert "no DiT memory node needed" in small.summary()


def test_when_blocks_must_be_offloaded_the_chunking_that_needs_fewest_is_chosen():
    """Offloaded blocks cross the bus every step while the chunked tiers are exact and cost little time: with
    offload needed, no other chunking of the chosen format offloads fewer blocks (the old search took the first
    chunking that fit with offload: stock blocks and 30 blocks offloaded here, against 24 with 4 head groups)."""
    from h3director.plan.recommend import CHUNKINGS, _fewest_offloaded, _replace

    budget = Budget(24 * GiB, 64 * GiB)
    chosen = recommend(PlanRequest(1344, 768, 124), budget).request
    assert chosen.offload_blocks > 0 and (chosen.head_chunks, chosen.ffn_chunks) != (1, 1)
    others = [_fewest_offloaded(_replace(chosen, head_chunks=h, ffn_chunks=f, offload_blocks=0), budget, 50)
              for h, f in CHUNKINGS]
    assert chosen.offload_blocks == min(o.offload_blocks for o in others if o is not None)
    stock = _fewest_offloaded(_replace(chosen, head_chunks=1, ffn_chunks=1, offload_blocks=0), budget, 50)
    assert stock is not None and stock.offload_blocks > chosen.offload_blocks
