"""H3Director Cached Text Encode in process (ComfyUI stand-ins from `fixtures/comfy_harness`) and the shared
store's memory budget: content keys, LRU spill to the disk tier and back, counters in /h3director/stats.

The CLIP here is a test object with ComfyUI's CLIP surface (`cond_stage_model`, `patcher` with
`patches_uuid`, `layer_idx`, `tokenize`, `encode_from_tokens_scheduled`) around a real small torch
encoder (an embedding and a linear layer) whose forwards are counted.
"""

from __future__ import annotations

import uuid

import pytest
import torch
from comfy_harness.loader import install_stubs

from h3director.core.config import validate_config
from h3director.core.disk_tier import DiskTier
from h3director.core.shared_store import SharedTensorMutatedError, SharedTensorStore
from h3director.errors import InvalidInputError

install_stubs()


class CountingEncoder(torch.nn.Module):
    def __init__(self, tokens: int = 8, width: int = 64) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(256, width)
        self.proj = torch.nn.Linear(width, width)
        self.tokens = tokens
        self.forwards = 0

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return self.proj(self.embed(ids))


class Patcher:
    def __init__(self) -> None:
        self.patches_uuid = uuid.uuid4()
        self.patches: dict = {}
        self.forced_hooks = None


class CountedClip:
    """ComfyUI's CLIP surface over `CountingEncoder`."""

    def __init__(self, encoder: CountingEncoder | None = None) -> None:
        self.cond_stage_model = encoder or CountingEncoder()
        self.patcher = Patcher()
        self.layer_idx = None

    def tokenize(self, text: str) -> torch.Tensor:
        data = text.encode()[: self.cond_stage_model.tokens].ljust(self.cond_stage_model.tokens, b"\0")
        return torch.tensor(list(data)).view(1, -1)

    def encode_from_tokens_scheduled(self, tokens: torch.Tensor):
        with torch.no_grad():
            cond = self.cond_stage_model(tokens)
        return [[cond, {"pooled_output": cond.mean(1)}]]


@pytest.fixture()
def level3(tmp_path, monkeypatch):
    import folder_paths

    from h3director.comfy import nodes_shared, nodes_textcache, settings

    def use(**fields):
        config = validate_config({"memory_optimization_level": 3, **fields}, env={})
        monkeypatch.setattr(settings, "pack_config", lambda: config)
        monkeypatch.setattr(nodes_shared, "_store", None)
        return config

    monkeypatch.setattr(folder_paths, "temp_directory", str(tmp_path))
    monkeypatch.setattr(nodes_textcache, "_counters", {"hits": 0, "misses": 0, "bypassed": 0, "bytes_saved": 0})
    use()
    return use


def _run(clip, text):
    from h3director.comfy.nodes_textcache import CachedTextEncode

    return CachedTextEncode.execute(clip, text).args


def test_second_prompt_runs_no_encoder_forward_and_is_equal(level3):
    from h3director.comfy.nodes_textcache import text_cache_stats
    from h3director.comfy.routes import stats_payload

    clip = CountedClip()
    first, report1 = _run(clip, "a red fox in snow")
    assert clip.cond_stage_model.forwards == 1 and "miss" in report1
    second, report2 = _run(clip, "a red fox in snow")   # a new prompt: only the length changed downstream
    assert clip.cond_stage_model.forwards == 1 and "hit" in report2
    assert torch.equal(first[0][0], second[0][0]) and torch.equal(first[0][1]["pooled_output"],
                                                                  second[0][1]["pooled_output"])
    assert second[0][0].data_ptr() == first[0][0].data_ptr(), "a hit hands out views of the cached copy"
    _run(clip, "another prompt")
    assert clip.cond_stage_model.forwards == 2
    stats = text_cache_stats()
    assert stats["hits"] == 1 and stats["misses"] == 2 and stats["bypassed"] == 0
    assert stats["bytes_saved"] == (8 * 64 + 64) * 4
    payload = stats_payload(10)
    assert payload["text_cache"] == stats and payload["shared_store"]["hits"] >= 1


def _storages(conditioning) -> dict[int, int]:
    """{storage address: storage bytes} of every tensor in a ComfyUI conditioning."""
    from h3director.comfy.nodes_shared import flatten

    tensors: list[torch.Tensor] = []
    flatten(conditioning, tensors)
    return {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}


def test_two_consumers_hold_one_copy_and_a_write_names_the_consumer(level3):
    from h3director.comfy.nodes_textcache import _conditioning_bytes, cached_encode

    clip = CountedClip()
    with torch.inference_mode():                            # as ComfyUI runs its nodes
        first, what = cached_encode(clip, "a red fox in snow", reader="comfy-node-4")
        second, _ = cached_encode(clip, "a red fox in snow", reader="comfy-node-9")
    assert what == "miss" and clip.cond_stage_model.forwards == 1
    both = {**_storages(first), **_storages(second)}
    assert both == _storages(first), "the second consumer holds no storage of its own"
    assert sum(both.values()) == _conditioning_bytes(first), "two consumers, one copy of the bytes"
    original = first[0][0].clone()
    with torch.inference_mode():
        second[0][0].mul_(2)                                # a node downstream of consumer 9 writes in place
        with pytest.raises(SharedTensorMutatedError, match="by consumer 'comfy-node-9'"):
            cached_encode(clip, "a red fox in snow", reader="comfy-node-4")
        again, what = cached_encode(clip, "a red fox in snow", reader="comfy-node-4")
    assert what == "hit" and clip.cond_stage_model.forwards == 1
    assert torch.equal(again[0][0], original), "the written entry left memory; the disk tier had it as put"


def test_patches_or_clip_skip_change_the_key(level3):
    clip = CountedClip()
    _run(clip, "same text")
    clip.patcher.patches = {"proj.weight": [(0.8, torch.randn(64, 64), 1.0, None, None)]}   # a LoRA was added
    clip.patcher.patches_uuid = uuid.uuid4()
    _run(clip, "same text")
    clip.layer_idx = -2                                     # CLIP Set Last Layer
    _run(clip, "same text")
    other = CountedClip()                                   # other weights, same class
    _run(other, "same text")
    assert clip.cond_stage_model.forwards == 3 and other.cond_stage_model.forwards == 1
    reloaded = CountingEncoder()                            # the same weights loaded again: a new object
    reloaded.load_state_dict(other.cond_stage_model.state_dict())
    again = CountedClip(reloaded)
    _run(again, "same text")
    assert reloaded.forwards == 0


def test_below_level_3_it_encodes_every_time_and_says_so(level3):
    from h3director.comfy import nodes_shared

    level3(memory_optimization_level=2)
    clip = CountedClip()
    _run(clip, "x")
    _, report = _run(clip, "x")
    assert clip.cond_stage_model.forwards == 2 and "bypassed: the shared store is off" in report
    assert nodes_shared.existing_store() is None


def test_budget_spills_least_recently_used_to_disk_and_brings_it_back(level3, tmp_path):
    from h3director.comfy import nodes_shared

    level3(shared_memory_budget_mb=1)                        # 1 MiB: a few 256 KiB conditionings
    clip = CountedClip(CountingEncoder(tokens=1024, width=64))  # 1024 x 64 float32 = 256 KiB per prompt
    texts = [f"prompt {i}" for i in range(6)]
    for text in texts:
        _run(clip, text)
    store = nodes_shared.existing_store()
    stats = store.stats()
    assert stats.bytes_held <= 1024 * 1024 and stats.spills > 0
    assert clip.cond_stage_model.forwards == 6
    disk_hits = stats.disk_hits
    _run(clip, texts[0])                                     # the oldest: spilled, comes back from disk
    assert clip.cond_stage_model.forwards == 6
    assert store.stats().disk_hits > disk_hits
    assert store.stats().bytes_held <= 1024 * 1024


def test_store_budget_unit(tmp_path, caplog):
    store = SharedTensorStore(disk_tier=DiskTier(tmp_path / "tier"), memory_budget_bytes=3 * 4096)
    for index in range(4):
        store.put(f"k{index}", torch.full((1024,), float(index)), "producer")
    assert store.keys() == ["k1", "k2", "k3"] and store.stats().spills == 1
    assert store.get("k1") is not None                        # k1 is now the most recently used
    back = store.get("k0", keep=True)                         # from disk, kept: evicts k2 (least recent)
    assert torch.equal(back, torch.full((1024,), 0.0))
    assert store.keys() == ["k0", "k1", "k3"]
    assert store.release("k2", "producer") == 0               # spilled: no references left
    no_disk = SharedTensorStore(memory_budget_bytes=4096)
    no_disk.put("a", torch.zeros(1024), "p")
    with caplog.at_level("WARNING", logger="h3director.shared_store"):
        no_disk.put("b", torch.zeros(1024), "p")
    assert no_disk.keys() == ["b"] and no_disk.get("a") is None
    assert no_disk.dropped == 1 and "dropped a (4096 bytes)" in caplog.text   # never silent
    with pytest.raises(InvalidInputError, match="memory_budget_bytes"):
        SharedTensorStore(memory_budget_bytes=0)


def test_bad_clip_is_refused(level3):
    with pytest.raises(InvalidInputError, match="clip input is None"):
        _run(None, "x")
    with pytest.raises(InvalidInputError, match="ComfyUI's CLIP"):
        _run(object(), "x")
