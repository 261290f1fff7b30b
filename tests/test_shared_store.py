"""SharedTensorStore: conflicts, mutation detection, refcounts, accounting, threads, content keys, disk spill."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from h3director.core.shared_store import (
    SharedKeyConflictError,
    SharedTensorMutatedError,
    SharedTensorStore,
    content_key,
)
from h3director.errors import InvalidInputError


def test_put_get_release_and_accounting():
    store = SharedTensorStore()
    emb = torch.randn(4, 16)
    store.put("text", emb, owner="text_encoder")
    view_a = store.get("text", owner="dit")
    view_b = store.get("text", owner="audio_dit")
    assert torch.equal(view_a, emb) and view_a.data_ptr() == view_b.data_ptr() == emb.data_ptr(), "views, not copies"
    stats = store.stats()
    assert stats.bytes_held == emb.numel() * 4
    assert stats.bytes_saved == 2 * emb.numel() * 4
    assert stats.references == 3 and stats.hits == 2
    assert store.holders("text") == {"text_encoder": 1, "dit": 1, "audio_dit": 1}
    assert store.release("text", "dit") == 2
    assert store.release("text", "text_encoder") == 1
    assert store.release("text", "audio_dit") == 0
    assert store.keys() == [] and store.stats().bytes_held == 0
    assert store.get("text") is None and store.stats().misses == 1
    with pytest.raises(InvalidInputError, match="holds no reference"):
        store.release("text", "dit")


def test_key_conflicts_unless_replace():
    store = SharedTensorStore()
    store.put("k", torch.ones(3), owner="a")
    store.put("k", torch.ones(3), owner="a")                 # same producer, equal tensor: no-op
    assert store.holders("k") == {"a": 1}
    with pytest.raises(SharedKeyConflictError, match="'a'.*'b'"):
        store.put("k", torch.ones(3), owner="b")
    with pytest.raises(SharedKeyConflictError, match=r"\(3,\).*\(4,\)"):
        store.put("k", torch.ones(4), owner="a")
    with pytest.raises(SharedKeyConflictError):
        store.put("k", torch.zeros(3), owner="a")             # same shape, different content
    store.put("k", torch.zeros(5), owner="b", replace=True)
    assert store.get("k").shape == (5,) and store.holders("k") == {"b": 1}


def test_in_place_mutation_is_detected_with_both_owners():
    store = SharedTensorStore()
    store.put("t", torch.zeros(8), owner="text_encoder")
    view = store.get("t", owner="sampler")
    view.mul_(2)                                            # a consumer writes into the shared tensor
    with pytest.raises(SharedTensorMutatedError, match="'text_encoder'.*'sampler'"):
        store.get("t", owner="vae")
    assert store.stats().mutations_detected == 1
    store.check("t")                                        # reported once, then re-armed


def test_debug_checksum_catches_writes_that_bypass_the_version_counter(caplog):
    caplog.set_level(logging.INFO, logger="h3director.shared_store")
    plain, debug = SharedTensorStore(), SharedTensorStore(debug=True)
    for store in (plain, debug):
        store.put("t", torch.zeros(8), owner="producer")
        store.get("t", owner="consumer").numpy()[0] = 1.0   # numpy writes do not bump _version
    plain.check("t")                                        # the version counter cannot see it
    with pytest.raises(SharedTensorMutatedError, match="checksum"):
        debug.check("t")
    logged = [r.getMessage() for r in caplog.records if r.name == "h3director.shared_store"]
    assert any("put key=t owner=producer" in m for m in logged)
    assert any("get key=t owner=consumer" in m for m in logged)


def test_concurrent_writers_and_readers():
    store = SharedTensorStore(debug=True)
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def writer(w: int) -> None:
        barrier.wait()
        try:
            for i in range(40):
                store.put(f"w{w}-{i}", torch.full((64,), float(w * 1000 + i)), owner=f"writer{w}")
        except BaseException as exc:  # noqa: BLE001 - collected and asserted below
            errors.append(exc)

    def reader(r: int) -> None:
        barrier.wait()
        try:
            for i in range(40):
                for w in range(3):
                    got = store.get(f"w{w}-{i}", owner=f"reader{r}")
                    if got is not None:
                        assert torch.all(got == float(w * 1000 + i))
                        store.release(f"w{w}-{i}", f"reader{r}")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    threads += [threading.Thread(target=reader, args=(r,)) for r in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    stats = store.stats()
    assert stats.entries == 120 and stats.references == 120      # each writer's own reference is left
    assert stats.bytes_held == 120 * 64 * 4
    assert stats.bytes_saved == stats.hits * 64 * 4
    assert stats.mutations_detected == 0


def test_content_key_separates_inputs_and_models():
    prompt = torch.arange(6, dtype=torch.int64)
    key = content_key(prompt, "a cat", {"cfg": 4.0, "seed": 1}, model_fingerprint="qwen3vl-32b:abc")
    assert len(key) == 64 and int(key, 16) >= 0
    assert key == content_key(prompt.clone(), "a cat", {"seed": 1, "cfg": 4.0}, model_fingerprint="qwen3vl-32b:abc")
    others = {
        content_key(prompt, "a cat", {"cfg": 4.0, "seed": 1}, model_fingerprint="qwen3vl-32b:def"),
        content_key(prompt.to(torch.int32), "a cat", {"cfg": 4.0, "seed": 1}, model_fingerprint="qwen3vl-32b:abc"),
        content_key(prompt.view(2, 3), "a cat", {"cfg": 4.0, "seed": 1}, model_fingerprint="qwen3vl-32b:abc"),
        content_key(prompt, "a dog", {"cfg": 4.0, "seed": 1}, model_fingerprint="qwen3vl-32b:abc"),
        content_key(prompt, "a cat", {"cfg": 4, "seed": 1}, model_fingerprint="qwen3vl-32b:abc"),
    }
    assert key not in others and len(others) == 5
    with pytest.raises(InvalidInputError, match="model_fingerprint"):
        content_key(prompt, model_fingerprint="")
    with pytest.raises(InvalidInputError, match="cannot hash"):
        content_key(object(), model_fingerprint="m")


def test_disk_tier_serves_a_miss_after_memory_is_released(tmp_path):
    store = SharedTensorStore(disk_dir=tmp_path / "cache")
    emb = torch.randn(3, 5, dtype=torch.bfloat16)
    key = content_key("prompt", model_fingerprint="te")
    store.put(key, emb, owner="text_encoder")
    store.release(key, "text_encoder")
    assert store.stats().bytes_held == 0
    again = SharedTensorStore(disk_dir=tmp_path / "cache").get(key, owner="dit")
    assert again is not None and again.dtype == torch.bfloat16 and torch.equal(again, emb)
    store2 = SharedTensorStore(disk_dir=tmp_path / "cache")
    store2.get(key, owner="dit")
    assert store2.stats().disk_hits == 1


def test_store_from_config():
    from h3director.core.config import load_config

    assert SharedTensorStore.from_config(load_config(env={"H3_MEMORY_OPTIMIZATION_LEVEL": "2"})) is None
    store = SharedTensorStore.from_config(
        load_config(env={"H3_MEMORY_OPTIMIZATION_LEVEL": "3", "H3_DEBUG_SHARED_MEMORY": "true"})
    )
    assert store is not None and store.debug


def test_disk_entries_stay_in_memory_only_while_referenced(tmp_path):
    SharedTensorStore(disk_dir=tmp_path / "cache").put("k", torch.ones(4), owner="text_encoder")
    store = SharedTensorStore(disk_dir=tmp_path / "cache")
    assert torch.equal(store.get("k"), torch.ones(4))          # a peek: nothing is kept
    assert store.stats().bytes_held == 0 and store.keys() == []
    store.get("k", owner="dit")
    assert store.holders("k") == {"dit": 1} and store.stats().bytes_held == 16
    store.put("k", torch.ones(4), owner="text_encoder")         # recomputed equal output: adopted, no conflict
    assert store.holders("k") == {"dit": 1, "text_encoder": 1}
    with pytest.raises(SharedKeyConflictError):
        store.put("k", torch.ones(4), owner="someone_else")
    store.release("k", "dit")
    assert store.release("k", "text_encoder") == 0 and store.keys() == []


def test_inference_tensors_are_stored_as_normal_copies(tmp_path):
    """ComfyUI runs nodes under inference_mode; such tensors have no version counter to watch."""
    from h3director.core.disk_tier import DiskTier

    store = SharedTensorStore(disk_tier=DiskTier(tmp_path / "tier"))
    with torch.inference_mode():
        made = torch.arange(6.0)
        store.put("k", made, "producer")
        assert torch.equal(store.get("k"), made)
    fresh = SharedTensorStore(disk_tier=DiskTier(tmp_path / "tier"))
    with torch.inference_mode():
        assert torch.equal(fresh.get("k", owner="reader"), torch.arange(6.0))
    fresh.check("k")


def test_named_consumers_share_one_storage_and_a_write_names_the_writer(tmp_path):
    store = SharedTensorStore(disk_dir=tmp_path / "tier")
    emb = torch.randn(4, 16)
    store.put("text", emb, owner="text_encoder")
    dit = store.get("text", reader="dit")
    audio = store.get("text", owner="audio_dit")
    assert dit.data_ptr() == audio.data_ptr() == emb.data_ptr(), "one physical copy"
    assert store.get("text", reader="dit") is dit, "a consumer's own view is handed out again"
    with torch.inference_mode():
        audio[1:].add_(1)                                   # a write through a slice of audio_dit's view
    with pytest.raises(SharedTensorMutatedError, match="by consumer 'audio_dit'") as raised:
        store.get("text", reader="dit")
    assert "'dit'" not in raised.value.args[0].split("owners holding views")[0], "only the writer is blamed"
    assert store.stats().mutations_detected == 1
    back = store.get("text", reader="dit")                  # left memory; the disk tier has it as it was put
    assert back is not None and back.data_ptr() != emb.data_ptr()
    assert store.release("text", "audio_dit") == 0          # its entry left memory: nothing held


def test_a_write_without_a_disk_copy_is_reported_once_and_the_entry_stays():
    store = SharedTensorStore()
    store.put("t", torch.zeros(8), owner="text_encoder")
    store.get("t", reader="vae").fill_(3)
    with pytest.raises(SharedTensorMutatedError, match="by consumer 'vae'"):
        store.check("t")
    store.check("t")
    assert store.get("t", reader="sampler")[0] == 3         # no other copy to go back to
