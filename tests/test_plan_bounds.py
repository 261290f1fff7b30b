"""The planner's work does not grow with the length or the layer count, and its inputs are bounded."""

import dataclasses
import importlib
import re

import pytest

from h3director.cli import main
from h3director.errors import BudgetError, InvalidInputError
from h3director.plan import activations
from h3director.plan.activations import DiTShape, PackedRows, dit_forward_peak_bytes
from h3director.plan.estimate import MAX_FRAMES, PlanRequest, estimate


def _count_blocks(monkeypatch, leak: bool = False) -> list[int]:
    calls = []
    real = activations._dit_block

    def counting(ledger, *args, **kwargs):
        calls.append(1)
        real(ledger, *args, **kwargs)
        if leak:                                   # a block that leaves something live behind
            ledger.alloc(f"leak{len(calls)}", 1)

    monkeypatch.setattr(activations, "_dit_block", counting)
    return calls


def test_the_dit_forward_replays_one_block_whatever_the_layer_count(monkeypatch):
    calls = _count_blocks(monkeypatch)
    rows = PackedRows(512, 0, 414, 37_296)
    peak_50 = dit_forward_peak_bytes(DiTShape(), rows)
    assert len(calls) == 1
    assert dit_forward_peak_bytes(DiTShape(layers=200), rows) == peak_50 == \
        dit_forward_peak_bytes(DiTShape(), rows, layers=1)


def test_a_block_that_changes_the_live_set_is_replayed_for_every_layer(monkeypatch):
    calls = _count_blocks(monkeypatch, leak=True)
    dit_forward_peak_bytes(DiTShape(layers=7), PackedRows(8, 0, 4, 64))
    assert len(calls) == 7


# --- bounds: refused with a specific message before any estimate --------------------------------------------

recommend_module = importlib.import_module("h3director.plan.recommend")
Budget, recommend = recommend_module.Budget, recommend_module.recommend
GiB = 1024**3
BUDGET = ["--vram", "24GB", "--ram", "64GB"]


@pytest.mark.parametrize("argv, message", [
    (["--frames", "124", "--dit-layers", "0"], "the DiT must have 1 to 100 blocks (num_layers), got 0"),
    (["--frames", "124", "--dit-layers", "-3"], "the DiT must have 1 to 100 blocks (num_layers), got -3"),
    (["--frames", "124", "--dit-layers", "101"], "the DiT must have 1 to 100 blocks (num_layers), got 101"),
    (["--frames", "99999989"], "frames 99,999,989 is above the planner's 86,400 (one hour at 24 fps); "
                               "the longest legal count is 86,399"),
    (["--frames", "86416"], "frames 86,416 is above the planner's 86,400"),
    (["--frames", "-5"], "frames must be >= 5 (H3's shortest 17n+5 length), got -5"),
    (["--frames", "0"], "frames must be >= 5"),
    (["--frames", "124", "--width", "4128"], "width 4128 is above the planner's 4096 pixels"),
    (["--frames", "124", "--height", "65536"], "height 65536 is above the planner's 4096 pixels"),
])
def test_out_of_range_plans_are_refused_with_the_range(capsys, argv, message):
    args = {"--width": "1344", "--height": "768"}
    for flag in ("--width", "--height"):
        if flag in argv:
            args[flag] = argv[argv.index(flag) + 1]
            argv = argv[:argv.index(flag)] + argv[argv.index(flag) + 2:]
    code = main(["plan", "--width", args["--width"], "--height", args["--height"], *argv, *BUDGET])
    assert code == 2
    assert message in capsys.readouterr().err


def test_the_range_edges_are_accepted():
    for request in (PlanRequest(4096, 4096, 5), PlanRequest(32, 32, 86_399, dit_config={"num_layers": 1}),
                    PlanRequest(1344, 768, 124, dit_config={"num_layers": 100})):
        request.validate()
    with pytest.raises(InvalidInputError, match="above the planner's 86,400"):
        PlanRequest(1344, 768, 17 * 5083 + 5).validate()
    assert 17 * 5082 + 5 == 86_399 <= MAX_FRAMES


# --- the work does not grow with the length ---------------------------------------------------------------------

def _count_estimates(monkeypatch) -> list[int]:
    calls = []
    real = recommend_module.estimate

    def counting(request):
        calls.append(request.frames)
        return real(request)

    monkeypatch.setattr(recommend_module, "estimate", counting)
    return calls


@pytest.mark.parametrize("frames", [2_011, 20_405, 86_399])
def test_a_long_form_plan_prices_a_bounded_number_of_settings(monkeypatch, frames):
    # Before: one full settings search per 17-frame step below the length (19,692 estimates at 4,085 frames,
    # 34 s at 20,405). Now the chunk length is bisected: about 100 estimates per tried length, 14 lengths at most
    # (1,458 estimates at 86,399 frames when written); the bound leaves room for pricing more settings per length.
    calls = _count_estimates(monkeypatch)
    advice = recommend(PlanRequest(1344, 768, frames), Budget(24 * GiB, 64 * GiB))
    lf = advice.long_form
    assert lf is not None and (lf.chunk_frames - 5) % 17 == 0
    assert lf.chunk_frames + (lf.chunks - 1) * (lf.chunk_frames - lf.overlap_frames) >= frames
    assert len(calls) <= 3_000, len(calls)
    assert len({f for f in calls if f != frames}) <= 14          # chunk lengths tried: log2(86,399 / 17) + 1


def _linear_longest_chunk(request, budget, formats):
    """The specification the bisection must match: walk down the grid, take the first chunk that fits."""
    chunk = 17 * ((request.frames - 1 - 5) // 17) + 5
    while chunk > 22:
        candidate = dataclasses.replace(request, frames=chunk, keyframes=request.keyframes + 7)
        chosen = recommend_module._fit_length(candidate, budget, formats, [])
        if chosen is not None:
            return chunk, chosen
        chunk -= 17
    return None


@pytest.mark.parametrize("width, height, frames, vram, ram, formats", [
    (1344, 768, 362, 10, 48, ("q4_k_m",)),
    (1344, 768, 1008, 16, 64, None),
    (1344, 768, 549, 12, 64, None),
    (736, 416, 2011, 8, 32, None),
    (640, 384, 2011, 8, 32, None),               # 32 GB: the smallest text encoder (fp8 on the CPU) needs ~24 GiB
    (1024, 1024, 736, 16, 32, ("int8", "q4_k_m")),
    (1344, 768, 549, 24, 64, None),              # fits in one pass
    (736, 416, 1008, 6, 32, None),               # nothing fits
])
def test_the_bisection_finds_the_chunk_the_grid_walk_finds(width, height, frames, vram, ram, formats):
    budget = Budget(vram * GiB, ram * GiB)
    request = PlanRequest(width, height, frames)
    try:
        advice = recommend(request, budget, formats=formats)
    except BudgetError:
        advice = None
    base = recommend_module._choose_text_encoder(request, budget, [])
    walked = _linear_longest_chunk(base, budget, tuple(formats or recommend_module.DIT_FORMATS))
    if advice is None or advice.long_form is None:
        assert walked is None or advice is not None
        return
    assert walked is not None
    assert advice.long_form.max_chunk_frames == walked[0]     # the chain is then balanced below it


def test_nothing_fits_quotes_a_need_above_what_is_usable():
    # The quoted need was priced without the chunk's conditioning rows, so it could read as fitting.
    budget = Budget(24 * GiB, 64 * GiB)
    with pytest.raises(BudgetError) as caught:
        recommend(PlanRequest(4096, 4096, 124), budget)
    text = str(caught.value)
    device, host = (float(x) for x in re.search(r"needs ([\d.]+) GiB on the device and ([\d.]+) GiB", text).groups())
    assert "conditioned on the previous chunk's last 22 frames" in text
    assert device * GiB > budget.device_usable or host * GiB > budget.host_usable


# --- a CPU-only machine ------------------------------------------------------------------------------------------

def test_a_cpu_budget_places_the_text_encoder_on_the_cpu():
    advice = recommend(PlanRequest(1344, 768, 124), Budget(64 * GiB, 64 * GiB, device="cpu"))
    assert advice.request.text_encoder_device == "cpu"
    assert "on gpu" not in advice.summary() and "offloaded" not in advice.summary()
    need = max(p.device_bytes + p.host_bytes for p in estimate(advice.request).phases)
    assert need <= advice.budget.host_usable


def test_plan_on_a_cpu_device_never_says_gpu_or_accelerator(capsys):
    code = main(["plan", "--width", "1344", "--height", "768", "--frames", "124", "--device", "cpu",
                 "--ram", "64GB"])
    out = capsys.readouterr().out
    assert code == 0
    assert "on gpu" not in out and "accelerator" not in out
    assert "Qwen3-VL bf16 on cpu" in out and "everything on the CPU, one memory" in out
    assert "Recommendation (cpu, one memory" in out


def test_an_mps_budget_is_one_memory_but_keeps_the_encoder_on_the_device():
    advice = recommend(PlanRequest(736, 416, 124), Budget(96 * GiB, 96 * GiB, device="mps"))
    assert advice.budget.unified and advice.request.text_encoder_device == "gpu"
    assert max(p.device_bytes + p.host_bytes for p in advice.estimate.phases) <= advice.budget.host_usable


def test_the_decode_ledger_replays_two_vit_blocks_per_tile_whatever_the_depth(monkeypatch):
    # The first block reads a bf16 residual, the others a float32 one; from the second on they repeat.
    from h3director.plan import decode

    calls = []
    real = decode._vit_block

    def counting(*args, **kwargs):
        calls.append(1)
        real(*args, **kwargs)

    monkeypatch.setattr(decode, "_vit_block", counting)
    decode.decode_clip_working_set_bytes({}, 256, 256, None, "bf16")    # one tile, the released 36 layers
    assert len(calls) == 2


def test_no_audio_drops_the_audio_vae_and_its_output_but_not_the_sampled_audio_rows():
    """H3 samples its audio rows whatever the output (ComfyUI's empty AV latent always carries them); without
    audio output the audio VAE is not loaded and nothing of it is planned."""
    from h3director.plan import PlanRequest, estimate

    with_audio = estimate(PlanRequest(1344, 768, 124))
    without = estimate(PlanRequest(1344, 768, 124, audio=False))
    assert without.geometry.packed_tokens == with_audio.geometry.packed_tokens
    assert without.geometry.audio_rows == with_audio.geometry.audio_rows > 0
    phase = {p.name: p for p in with_audio.phases}
    phase_off = {p.name: p for p in without.phases}
    assert phase_off["sampling"] == phase["sampling"]
    assert phase_off["decode"].weights_bytes < phase["decode"].weights_bytes
    assert phase_off["decode"].host_bytes < phase["decode"].host_bytes
