"""A ComfyUI quantised DiT file's format read from its layers (`weights.inspect.comfy_quant_layers`), and the plan
and the farm pricing such a file by what it holds. Files are real safetensors with ComfyUI's per-layer
``comfy_quant`` entries (JSON as uint8, the keys comfy/sd.py reads)."""

from __future__ import annotations

import json

import pytest
import torch
from comfy_quant_files import CONVROT, INT8, LAYERS, comfy_quant_entry, write_dit
from safetensors.torch import save_file

from h3director.cli import main
from h3director.errors import InvalidInputError
from h3director.plan import capabilities as caps
from h3director.weights.files import open_weights
from h3director.weights.inspect import MAX_COMFY_QUANT_BYTES, comfy_quant_layers, summarise


def test_the_layers_per_quantisation_are_read_and_named(tmp_path):
    path = write_dit(tmp_path / "dit.safetensors", {LAYERS[0]: INT8, LAYERS[1]: CONVROT, LAYERS[2]: CONVROT})
    with open_weights(path) as source:
        assert comfy_quant_layers(source) == {"int8_tensorwise": 1, "int8_tensorwise+convrot": 2}
    assert summarise(path)["comfy_quant"] == {"int8_tensorwise": 1, "int8_tensorwise+convrot": 2}
    assert caps.comfy_dit_file_format(path) == "int8_convrot"
    plain = tmp_path / "plain.safetensors"
    save_file({"blocks.0.mlp.fc1.weight": torch.zeros(8, 8, dtype=torch.bfloat16)}, str(plain))
    assert caps.comfy_dit_file_format(plain) is None


@pytest.mark.parametrize("layers, fmt", [({"int8_tensorwise": 3}, "int8"), ({"nvfp4": 5, "int8_tensorwise": 1}, "nvfp4"),
                                         ({"float8_e4m3fn": 2}, "fp8_scaled"), ({}, None)])
def test_the_quantisation_of_most_layers_decides_the_format(layers, fmt):
    assert caps.comfy_quant_format(layers) == fmt
    if fmt is not None:
        assert fmt in caps.dit_formats("comfyui")


def test_a_quantisation_the_planner_does_not_price_is_named():
    with pytest.raises(InvalidInputError, match="mxfp8 layers cannot be planned"):
        caps.comfy_quant_format({"mxfp8": 4})


@pytest.mark.parametrize("entry, message", [
    (torch.zeros(4), "1-D uint8"),
    (torch.zeros(MAX_COMFY_QUANT_BYTES + 1, dtype=torch.uint8), "1-D uint8"),
    (torch.tensor(list(b"\xff\xfe"), dtype=torch.uint8), "not JSON"),
    (comfy_quant_entry(layout="int8"), "no string 'format'"),
])
def test_a_bad_comfy_quant_entry_is_refused_naming_it(tmp_path, entry, message):
    path = write_dit(tmp_path / "bad.safetensors", {}, {"blocks.0.mlp.fc1.comfy_quant": entry})
    with pytest.raises(InvalidInputError, match=message), open_weights(path) as source:
        comfy_quant_layers(source)


def test_the_plan_reads_the_dit_file_it_writes_into_the_workflow(tmp_path, capsys):
    dit = write_dit(tmp_path / "h3_int8.safetensors", {name: INT8 for name in LAYERS})
    out = tmp_path / "wf.json"
    code = main(["plan", "--width", "1344", "--height", "768", "--frames", "124", "--vram", "24GB", "--ram", "64GB",
                 "--workflow", str(out), "--dit", str(dit), "--text-encoder", "te.safetensors",
                 "--vae", "vae.safetensors", "--audio-vae", "avae.safetensors", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    advice = json.loads(captured.out)["recommendation"]
    assert advice["settings"]["weights"] == "int8"
    assert any("TensorWiseINT8Layout" in note for note in advice["notes"])
    loaders = [n for n in json.loads(out.read_text()).values() if n["class_type"] == "UNETLoader"]
    assert [n["inputs"]["weight_dtype"] for n in loaders] == ["default"]
