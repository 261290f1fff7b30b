"""Multi-device placement (plan/placement.py) and `h3director plan --devices`: device spec parsing, placement
strings, per-device numbers taken from the planner's own estimate, the residency policies, and refusals."""

import dataclasses
import json

import pytest
import torch

from h3director.cli import main
from h3director.errors import BudgetError, InvalidInputError
from h3director.plan.estimate import PlanRequest, estimate
from h3director.plan.placement import DeviceSpec, parse_devices, parse_placement, place
from h3director.plan.recommend import Budget, recommend

GiB = 2**30
REQUEST = PlanRequest(1344, 768, 124)


def _phase(plan, name):
    return next(p for p in plan.phases if p.name == name)


def test_parse_devices_reads_sizes_as_cards_are_sold():
    assert parse_devices("cuda:0=24GB, cuda:1=512MiB") == (DeviceSpec("cuda:0", 24 * GiB),
                                                            DeviceSpec("cuda:1", 512 * 2**20))


@pytest.mark.parametrize("spec, message", [
    ("", "empty"),
    ("cuda:0", "has no size"),
    ("cuda:0=24XB", "unknown size unit"),
    ("cuda:0=0GB", "above zero"),
    ("cuda:0=24GB,cuda:0=12GB", "given twice"),
    ("cpu=64GB", "--ram"),
    ("cuda=24GB", "write the index"),
    ("gpu0=24GB", "not a CUDA device"),
])
def test_parse_devices_refuses_bad_specs(spec, message):
    with pytest.raises(InvalidInputError, match=message):
        parse_devices(spec)


def test_parse_placement_accepts_plan_names_and_comfy_aliases():
    assert parse_placement("model=cuda:0, clip=cpu,vae=cuda:1") == {"dit": "cuda:0", "text_encoder": "cpu",
                                                                     "video_vae": "cuda:1"}
    assert parse_placement("") == {}


@pytest.mark.parametrize("spec, message", [
    ("dit", "COMPONENT=DEVICE"), ("unet=cuda:0", "unknown component"), ("dit=gpu:0", "not cpu, cuda"),
    ("dit=cuda:0,model=cuda:1", "placed twice"),
])
def test_parse_placement_refuses(spec, message):
    with pytest.raises(InvalidInputError, match=message):
        parse_placement(spec)


def _check_numbers(placement):
    """Every device's phase bytes are the planner's estimate of the chosen settings, summed per policy."""
    plan = estimate(placement.request)
    te, sampling, decode = (_phase(plan, p) for p in ("text_encoding", "sampling", "decode"))
    video = _phase(estimate(dataclasses.replace(placement.request, audio=False)), "decode")
    where = placement.assignment
    for device in placement.devices:
        name = device.name
        bytes_ = placement.device_phase_bytes[name]
        assert max(bytes_.values()) <= placement.device_usable[name]
        resident = placement.policy == "resident"
        weights = {"text_encoder": te.weights_bytes if where["text_encoder"] == name else 0,
                   "dit": sampling.weights_bytes if where["dit"] == name else 0}
        vaes = [c for c in ("video_vae", "audio_vae") if where.get(c) == name]
        if vaes == ["video_vae", "audio_vae"]:
            weights["vae"], vae_working = decode.weights_bytes, decode.working_bytes
        elif vaes == ["video_vae"]:
            weights["vae"], vae_working = video.weights_bytes, video.working_bytes
        elif vaes == ["audio_vae"]:       # its working set is the audio decode's own (not a phase of the estimate)
            weights["vae"], vae_working = decode.weights_bytes - video.weights_bytes, None
        else:
            weights["vae"], vae_working = 0, 0
        all_weights = sum(weights.values())
        expect_te = (all_weights if resident else weights["text_encoder"]) + (
            te.working_bytes if where["text_encoder"] == name else 0)
        expect_sampling = (all_weights if resident else weights["dit"]) + (
            sampling.working_bytes if where["dit"] == name else 0)
        assert bytes_["text_encoding"] == expect_te
        assert bytes_["sampling"] == expect_sampling
        if vae_working is not None:
            assert bytes_["decode"] == (all_weights if resident else weights["vae"]) + vae_working


def test_24_plus_12_fits_with_the_planners_numbers():
    placement = place(REQUEST, parse_devices("cuda:0=24GB,cuda:1=12GB"), host_bytes=64 * GiB)
    _check_numbers(placement)
    assert placement.assignment["dit"] == "cuda:0"              # the DiT takes the larger card
    assert placement.assignment["video_vae"] == "cuda:1"        # the VAE moves off it
    assert max(placement.host_phase_bytes.values()) <= placement.host_usable
    assert placement.spec().startswith("text_encoder=")
    assert parse_placement(placement.spec()) == dict(placement.assignment)


def test_a_second_device_keeps_the_dit_resident_in_bf16():
    """Resident on one 80 GB card: the bf16 DiT and the text encoder cannot both stay loaded; with a 48 GB
    card beside it the DiT stays bf16 with no block offloaded and the encoder moves to the second card."""
    one = place(REQUEST, parse_devices("cuda:0=80GB"), host_bytes=256 * GiB, policy="resident")
    two = place(REQUEST, parse_devices("cuda:0=80GB,cuda:1=48GB"), host_bytes=256 * GiB, policy="resident")
    _check_numbers(one)
    _check_numbers(two)
    assert (two.request.weights, two.request.offload_blocks) == ("bf16", 0)
    assert two.assignment["text_encoder"] == "cuda:1"
    assert two.assignment["dit"] == "cuda:0"
    assert (one.request.weights, one.request.offload_blocks, one.request.text_encoder_device) != ("bf16", 0, "gpu")


def test_phased_counts_only_the_active_component():
    placement = place(REQUEST, parse_devices("cuda:0=80GB"), host_bytes=256 * GiB, policy="phased")
    _check_numbers(placement)
    sampling = _phase(estimate(placement.request), "sampling")
    assert placement.device_phase_bytes["cuda:0"]["sampling"] == sampling.device_bytes
    # the single-device recommender assumes the same (components unloaded after their phase)
    advice = recommend(REQUEST, Budget(80 * GiB, 256 * GiB))
    assert (placement.request.weights, placement.request.offload_blocks) == \
        (advice.request.weights, advice.request.offload_blocks)


def test_refusal_shows_each_device_and_what_would_fit():
    with pytest.raises(BudgetError) as info:
        place(PlanRequest(1344, 768, 991), parse_devices("cuda:0=8GB,cuda:1=6GB"), host_bytes=64 * GiB)
    message = str(info.value)
    assert "cuda:0: 8.00 GiB, usable" in message and "cuda:1: 6.00 GiB, usable" in message
    assert "smallest need per component" in message and "dit:" in message
    assert "what fits: on cuda:0 alone" in message


def test_plan_devices_text_and_json(capsys):
    argv = ["plan", "--width", "1344", "--height", "768", "--frames", "124", "--devices",
            "cuda:0=24GB,cuda:1=12GB", "--ram", "64GB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "dit           -> cuda:0" in out and "host RAM" in out
    assert 'placement "text_encoder=' in out
    assert main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    placement = data["placement"]
    assert placement["placement"]["dit"] == "cuda:0"
    assert [d["name"] for d in placement["devices"]] == ["cuda:0", "cuda:1"]
    for device in placement["devices"]:
        assert device["peak_bytes"] <= device["usable_bytes"]
        assert set(device["phase_bytes"]) == {"text_encoding", "sampling", "decode"}
    assert data["budget"]["devices"] == {"cuda:0": 24 * GiB, "cuda:1": 12 * GiB}


def test_plan_devices_refusals(capsys):
    base = ["plan", "--width", "1344", "--height", "768", "--frames", "124"]
    assert main(base + ["--devices", "cuda:0=24GB", "--vram", "24GB"]) == 2
    assert "replaces --vram" in capsys.readouterr().err
    assert main(base + ["--devices", "cuda:0=24QB"]) == 2
    assert "unknown size unit" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(base + ["--devices", "auto"]) == 2
        assert "--devices auto: no CUDA device here" in capsys.readouterr().err
    assert main(["plan", "--width", "1344", "--height", "768", "--frames", "991", "--devices",
                 "cuda:0=8GB,cuda:1=6GB", "--ram", "64GB"]) == 2
    assert "no placement of H3" in capsys.readouterr().err


def test_plan_without_devices_is_unchanged(capsys):
    assert main(["plan", "--width", "1344", "--height", "768", "--frames", "124", "--vram", "24GB", "--ram",
                 "64GB", "--json"]) == 0
    assert "placement" not in json.loads(capsys.readouterr().out)


def test_parse_devices_reads_the_index_as_a_number():
    """'cuda:00' is cuda:0: written twice it is refused, and the name is the one torch and the appliers use."""
    with pytest.raises(InvalidInputError, match="given twice"):
        parse_devices("cuda:0=24GB,cuda:00=12GB")
    assert parse_devices("cuda:01=24GB") == (DeviceSpec("cuda:1", 24 * GiB),)
    assert parse_placement("dit=cuda:01,vae=CUDA:002") == {"dit": "cuda:1", "video_vae": "cuda:2"}


def test_placement_policy_without_devices_is_refused(capsys):
    """--placement-policy only acts with --devices; with --vram it would be ignored without a word."""
    base = ["plan", "--width", "1344", "--height", "768", "--frames", "124", "--vram", "24GB", "--ram", "64GB"]
    assert main(base + ["--placement-policy", "phased"]) == 2
    assert "--placement-policy" in capsys.readouterr().err
    assert main(base) == 0


def test_resident_host_ram_holds_the_offloaded_blocks_in_every_phase():
    """Resident: the DiT is loaded once, so its offloaded blocks sit in host RAM from the text encoding on."""
    placement = place(REQUEST, parse_devices("cuda:0=24GB,cuda:1=12GB"), host_bytes=64 * GiB, policy="resident")
    chosen = placement.request
    assert chosen.offload_blocks > 0
    offloaded = (_phase(estimate(chosen), "sampling").host_bytes
                 - _phase(estimate(dataclasses.replace(chosen, offload_blocks=0)), "sampling").host_bytes)
    te_host = _phase(estimate(chosen), "text_encoding").host_bytes
    assert placement.host_phase_bytes["text_encoding"] == te_host + offloaded


def test_refusal_names_a_plan_command_that_runs(capsys):
    """The refusal's 'what fits' names the one-device command with every input it needs."""
    with pytest.raises(BudgetError) as info:
        place(PlanRequest(1344, 768, 991, audio=False), parse_devices("cuda:0=8GB,cuda:1=6GB"), host_bytes=64 * GiB)
    command = str(info.value).split("(`")[-1].split("`")[0]
    assert command == ("h3director plan --width 1344 --height 768 --frames 991 --vram 8GB --ram 64GB --no-audio")
    assert main(command.split()[1:]) == 0
    assert "long-form" in capsys.readouterr().out
