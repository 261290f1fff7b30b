"""`h3director plan`: the JSON schema, the text report, and specific refusals (exit code 2)."""

import json
import re

import pytest

from h3director.cli import main


def _run(capsys, *argv):
    code = main(["plan", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_json_has_geometry_phases_and_recommendation(capsys):
    code, out, _ = _run(capsys, "--width", "1344", "--height", "768", "--frames", "124",
                        "--vram", "24GB", "--ram", "64GB", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["geometry"]["latent_frames"] == 37
    assert data["geometry"]["video_tokens"] == 37 * 1008
    assert [p["name"] for p in data["phases"]] == ["text_encoding", "sampling", "decode"]
    for phase in data["phases"]:
        assert phase["device_bytes"] == phase["weights_bytes"] + phase["working_bytes"]
        assert isinstance(phase["host_bytes"], int)
    rec = data["recommendation"]
    assert rec["fits"] is True
    assert rec["peak_device_bytes"] <= rec["device_usable_bytes"]
    assert set(rec["settings"]) >= {"weights", "offload_blocks", "head_chunks", "ffn_chunks", "text_encoder",
                                    "decode_tiles_per_call", "sink"}
    assert rec["pool"]["recommended_mb"] % 1024 == 0 and rec["pool"]["config_key"] == "pre_allocated_pool_mb"
    applied = {a["capability"]: a for a in rec["applied"]}
    assert rec["target"] == "comfyui" and all(a["node"] for a in applied.values() if a["capability"] != "memory.pool")
    if rec["settings"]["offload_blocks"]:
        assert applied["dit.block_offload"]["inputs"] == {"blocks_offloaded": rec["settings"]["offload_blocks"]}
    assert data["budget"]["device_bytes"] == 24 * 1024**3


def test_fixed_weights_are_respected(capsys):
    code, out, _ = _run(capsys, "--width", "736", "--height", "416", "--frames", "124",
                        "--vram", "16GB", "--ram", "32GB", "--weights", "int8", "--dit-layers", "30", "--json")
    assert code == 0
    assert json.loads(out)["recommendation"]["settings"]["weights"] == "int8"


def test_text_report_prints_the_table_how_to_apply_and_the_pool(capsys):
    code, out, _ = _run(capsys, "--width", "1344", "--height", "768", "--frames", "124", "--vram", "24GB",
                        "--ram", "64GB")
    assert code == 0
    assert "37 latent frames x 1008 tokens" in out
    assert "sampling" in out and "decode" in out and "text_encoding" in out
    # every recommended setting is printed with the node and input that applies it (the pool: the config key)
    assert "How to apply (comfyui):" in out
    offloaded = int(re.search(r"(\d+) of 50 blocks offloaded to host RAM", out).group(1))
    assert f"node H3DirectorBlockSwap: blocks_offloaded={offloaded}" in out
    assert "node CLIPLoader: type='minimax', device=" in out
    # the pool is sized on the decode's clip buffers it serves, or not recommended (the old sizing on the DiT's
    # working set is gone: nothing but decode clip buffers leases from the pool)
    assert re.search(r"Pool \(h3_config.yaml pre_allocated_pool_mb\): (0 MB; .* does not fit beside|\d+024 MB)", out)


def test_the_diffusers_target_prints_library_calls(capsys):
    code, out, _ = _run(capsys, "--width", "1344", "--height", "768", "--frames", "124", "--vram", "24GB",
                        "--ram", "64GB", "--target", "diffusers", "--json")
    assert code == 0
    rec = json.loads(out)["recommendation"]
    assert rec["target"] == "diffusers" and rec["settings"]["weights"] != "int8"
    for applied in rec["applied"]:
        assert applied["node"] is None and (applied["call"] or applied["config"]), applied
    calls = " ".join(a["call"] or "" for a in rec["applied"])
    if rec["settings"]["offload_blocks"]:
        assert f"apply_block_offload(transformer, blocks_offloaded={rec['settings']['offload_blocks']}" in calls


@pytest.mark.parametrize("argv, message", [
    (["--width", "1340", "--height", "768", "--frames", "124", "--vram", "24GB"], "width 1340 is not a positive multiple of 32"),
    (["--width", "1344", "--height", "768", "--frames", "130", "--vram", "24GB"], "nearest legal counts are 124 and 141"),
    (["--width", "1344", "--height", "768", "--frames", "124", "--vram", "2GB", "--ram", "64GB"], "nothing fits"),
    (["--width", "1344", "--height", "768", "--frames", "124"], "give a budget"),
    (["--width", "1344", "--height", "768", "--frames", "124", "--vram", "24 parsecs"], "unknown size unit"),
    (["--width", "1344", "--height", "768", "--frames", "124", "--vram", "24GB", "--weights", "q2"],
     "unknown weights format"),
    (["--width", "1344", "--height", "768", "--frames", "124", "--vram", "24GB", "--weights", "nf4"],
     "'nf4' have no loader for target comfyui"),
    (["--width", "1344", "--height", "768", "--frames", "124", "--vram", "24GB", "--weights", "int8",
      "--target", "diffusers"], "'int8' have no loader for target diffusers"),
    (["--width", "1344", "--height", "768", "--frames", "124", "--devices", "cuda:0=24GB", "--ram", "64GB",
      "--weights", "nf4"], "'nf4' have no loader for target comfyui"),
    (["--width", "1344", "--height", "768", "--frames", "124", "--vram", "24GB", "--compute-capability", "12"],
     "--compute-capability must be MAJOR.MINOR"),
    (["--width", "1344", "--height", "768", "--frames", "124", "--device", "cpu", "--compute-capability", "8.9"],
     "--compute-capability goes with --vram"),
])
def test_bad_input_gets_a_specific_message(capsys, argv, message):
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert message in err


@pytest.mark.parametrize("capability, path", [("12.0", "native"), ("8.9", "emulated")])
def test_the_compute_capability_decides_the_nvfp4_path_priced(capsys, capability, path):
    code, out, _ = _run(capsys, "--width", "1344", "--height", "768", "--frames", "124", "--vram", "16GB",
                        "--ram", "64GB", "--weights", "nvfp4", "--compute-capability", capability, "--json")
    assert code == 0
    notes = json.loads(out)["recommendation"]["notes"]
    assert any(f"TensorCoreNVFP4Layout ({path})" in n for n in notes), notes


def test_device_auto_reads_this_machine():
    import psutil
    import torch

    from h3director.plan.machine import detect_budget

    budget, source = detect_budget("auto", host_bytes=64 * 1024**3)
    assert budget.host_bytes == 64 * 1024**3
    if torch.cuda.is_available():
        assert budget.device == "cuda" and budget.device_bytes > 0
    else:
        assert budget.device == "cpu" and "host RAM" in source
        auto, _ = detect_budget("auto")
        assert 0 < auto.host_bytes <= psutil.virtual_memory().total
