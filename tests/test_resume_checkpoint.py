"""`h3director.resume.checkpoint`: the checkpoint files a resumable sampler writes and reads back.

Real safetensors files in a temporary folder: the last two are kept, a corrupt or truncated newest file is
skipped with a warning and the one before it used, another run's checkpoint is refused naming each field
that differs, a folder that cannot be written stops checkpoints with one warning.
"""

from __future__ import annotations

import os

import pytest
import torch

from h3director.resume.checkpoint import (
    CheckpointMismatch,
    CheckpointStore,
    SamplingCheckpoint,
    read_checkpoint,
)
from h3director.resume.fingerprint import sigmas_digest, structure_digest, tensor_digest

KEY = {"seed": "3", "sigmas": "8 steps", "latent shape": "[1, 24, 7, 6, 4]", "model": "tiny"}


def _checkpoint(step: int, key=KEY) -> SamplingCheckpoint:
    generator = torch.Generator().manual_seed(step)
    return SamplingCheckpoint(step=step, total_steps=8, key=dict(key), tensors={
        "latent": torch.randn(1, 24, 7, 6, 4, generator=generator),
        "old_denoised": torch.randn(1, 24, 7, 6, 4, generator=generator).to(torch.bfloat16),
        "generator_state": generator.get_state()})


def test_saves_atomically_keeps_the_last_two_and_reads_them_back_bit_for_bit(tmp_path):
    store = CheckpointStore(tmp_path / "run")
    written = {step: _checkpoint(step) for step in (2, 4, 6)}
    for checkpoint in written.values():
        assert store.save(checkpoint) is not None
    assert sorted(os.listdir(tmp_path / "run")) == ["step_000004.safetensors", "step_000006.safetensors"]
    found = store.latest(KEY)
    assert found.step == 6 and found.total_steps == 8 and found.key == KEY
    for name, tensor in written[6].tensors.items():
        assert found.tensors[name].dtype == tensor.dtype and torch.equal(found.tensors[name], tensor), name
    store.clear()
    assert os.listdir(tmp_path / "run") == []
    assert store.latest(KEY) is None


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_corrupt_newest_checkpoint_is_skipped_with_a_warning(tmp_path, damage):
    warnings: list[str] = []
    store = CheckpointStore(tmp_path, warn=warnings.append)
    store.save(_checkpoint(2))
    newest = store.save(_checkpoint(4))
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        data = data[: len(data) // 2]
    else:  # one bit of the latent's data: the header still parses, the CRC catches it
        data[-100] ^= 0x01
    newest.write_bytes(bytes(data))
    found = store.latest(KEY)
    assert found.step == 2
    assert len(warnings) == 1 and "ignoring the unreadable checkpoint" in warnings[0] and str(newest) in warnings[0]
    if damage == "flip":
        with pytest.raises(ValueError, match="fails its CRC32 check"):
            read_checkpoint(newest)


def test_only_corrupt_checkpoints_mean_no_checkpoint(tmp_path):
    warnings: list[str] = []
    (tmp_path / "step_000004.safetensors").write_bytes(b"\x00" * 16)
    assert CheckpointStore(tmp_path, warn=warnings.append).latest(KEY) is None
    assert len(warnings) == 1


def test_another_runs_checkpoint_is_refused_naming_each_difference(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save(_checkpoint(4))
    other = dict(KEY, seed="4", **{"latent shape": "[1, 24, 7, 6, 6]"})
    with pytest.raises(CheckpointMismatch) as refused:
        store.latest(other)
    message = str(refused.value)
    assert "step 4 of 8" in message and "refusing to resume" in message
    assert "seed: checkpoint 3, this run 4" in message
    assert "latent shape: checkpoint [1, 24, 7, 6, 4], this run [1, 24, 7, 6, 6]" in message
    assert "model:" not in message and "sigmas:" not in message
    assert (tmp_path / "step_000004.safetensors").exists()   # refused, not deleted


def test_a_folder_that_cannot_be_made_stops_checkpoints_with_one_warning(tmp_path):
    (tmp_path / "file").write_text("not a folder")        # the kernel refuses the mkdir below it, even for root
    warnings: list[str] = []
    store = CheckpointStore(tmp_path / "file" / "run", warn=warnings.append)
    assert store.save(_checkpoint(2)) is None and store.save(_checkpoint(4)) is None
    assert len(warnings) == 1 and "checkpoints stopped" in warnings[0] and "NotADirectoryError" in store.stopped


def test_digests_follow_content_not_identity():
    a = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    assert tensor_digest(a) == tensor_digest(a.clone()) != tensor_digest(a + 1)
    assert tensor_digest(a) != tensor_digest(a.to(torch.float64))
    conds = [{"cross_attn": a, "model_conds": {}, "uuid": "random-1"}]
    assert structure_digest(conds) == structure_digest([{"cross_attn": a.clone(), "model_conds": {}, "uuid": "2"}])
    assert structure_digest(conds) != structure_digest([{"cross_attn": a + 1, "model_conds": {}}])
    assert sigmas_digest(torch.tensor([1.0, 0.5, 0.0])).startswith("2 steps, 1 -> 0, crc")
    assert sigmas_digest([1.0, 0.5, 0.0]) != sigmas_digest([1.0, 0.25, 0.0])


def test_background_saves_are_written_in_order_and_waited_for(tmp_path):
    store = CheckpointStore(tmp_path)
    written = {step: _checkpoint(step) for step in (2, 4, 6)}
    for checkpoint in written.values():
        store.save_in_background(checkpoint)
        checkpoint.tensors["latent"].add_(1.0)   # the sampler moves on: the saved copy must not change
    store.wait()
    assert [p.name for p in store.written] == [f"step_00000{s}.safetensors" for s in (2, 4, 6)]
    found = store.latest(KEY)
    assert found.step == 6 and torch.equal(found.tensors["latent"] + 1.0, written[6].tensors["latent"])
