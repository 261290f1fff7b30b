"""DiskTier: ownership, atomic writes under a killed process, validation, LRU/age limits, sweeping, purge."""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from h3director.core.disk_tier import MARKER_NAME, DiskTier, DiskTierError
from h3director.errors import InvalidInputError


def test_claims_new_or_empty_folder_and_refuses_a_foreign_one(tmp_path):
    DiskTier(tmp_path / "new")
    assert (tmp_path / "new" / MARKER_NAME).is_file()
    (tmp_path / "empty").mkdir()
    DiskTier(tmp_path / "empty")
    DiskTier(tmp_path / "new")                                  # reopening its own folder is fine
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "holiday.jpg").write_bytes(b"jpeg")
    with pytest.raises(DiskTierError, match="no .h3director-disk-tier marker"):
        DiskTier(foreign)
    assert (foreign / "holiday.jpg").read_bytes() == b"jpeg" and not (foreign / MARKER_NAME).exists()


def test_round_trip_and_key_validation(tmp_path):
    tier = DiskTier(tmp_path / "t")
    tensors = {"a": torch.randn(2, 3), "b": torch.arange(5, dtype=torch.int16)}
    written = tier.put("abc123", tensors)
    assert written == (tmp_path / "t" / "entry-abc123.safetensors").stat().st_size
    back = tier.get("abc123")
    assert set(back) == {"a", "b"} and all(torch.equal(back[k], tensors[k]) for k in tensors)
    assert tier.get("missing") is None
    for bad in ("../escape", "a/b", "", "x" * 129, "dot.dot"):
        with pytest.raises(InvalidInputError, match="keys are"):
            tier.put(bad, torch.zeros(1))


_KILLED_WRITER = textwrap.dedent(
    """
    import os, signal, sys, torch
    from h3director.core.disk_tier import DiskTier
    tier = DiskTier(sys.argv[1])
    tier.put("k", torch.zeros(4))                       # the old, complete entry
    def die(src, dst):                                  # killed after the temp file is written and fsynced
        os.kill(os.getpid(), signal.SIGKILL)
    os.replace = die
    tier.put("k", torch.ones(1 << 16))
    """
)


def test_a_write_killed_before_rename_leaves_the_old_entry_and_an_orphan_only(tmp_path):
    folder = tmp_path / "t"
    folder.mkdir()
    proc = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(folder)], capture_output=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    temps = [p for p in folder.iterdir() if p.name.startswith(".tmp-k-")]
    assert len(temps) == 1 and temps[0].stat().st_size > 1 << 18, "the killed write reached its temp file"
    (folder / "notes.txt").write_text("someone else's file")
    tier = DiskTier(folder, orphan_age_s=3600)              # too young to sweep on open
    old = tier.get("k")
    assert old is not None and torch.equal(old["tensor"], torch.zeros(4))
    assert tier.sweep_orphans(older_than_s=0) == 1
    assert sorted(p.name for p in folder.iterdir()) == [MARKER_NAME, "entry-k.safetensors", "notes.txt"]


def test_injected_failure_between_write_and_rename_cleans_up(tmp_path, monkeypatch):
    tier = DiskTier(tmp_path / "t")

    def fail(src, dst):
        raise OSError("disk full (injected)")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="injected"):
        tier.put("k", torch.ones(10))
    monkeypatch.undo()
    assert tier.get("k") is None
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [MARKER_NAME]


def _write_raw(path, header: dict, data: bytes) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.mark.parametrize(
    "make",
    [
        lambda p: p.write_bytes(b"\x01\x02"),                                                  # truncated prefix
        lambda p: p.write_bytes(struct.pack("<Q", 1 << 40) + b"{}"),                           # absurd header size
        lambda p: p.write_bytes(struct.pack("<Q", 4) + b"nope"),                               # not JSON
        lambda p: _write_raw(p, {"tensor": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8),
        lambda p: _write_raw(p, {"tensor": {"dtype": "Q9", "shape": [1], "data_offsets": [0, 1]}}, b"\0"),
        lambda p: _write_raw(p, {"a": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                                 "b": {"dtype": "U8", "shape": [2], "data_offsets": [1, 3]}}, b"\0" * 3),
    ],
    ids=["short", "huge-header", "not-json", "past-end", "bad-dtype", "overlap"],
)
def test_corrupt_entries_are_misses_and_only_that_file_goes(tmp_path, make):
    tier = DiskTier(tmp_path / "t", max_header_bytes=1 << 16)
    tier.put("good", torch.ones(2))
    make(tmp_path / "t" / "entry-bad.safetensors")
    assert tier.get("bad") is None and tier.corrupt_removed == 1
    assert sorted(p.name for p in (tmp_path / "t").iterdir()) == [MARKER_NAME, "entry-good.safetensors"]
    assert torch.equal(tier.get("good")["tensor"], torch.ones(2))


def test_a_read_error_is_a_miss_that_keeps_the_entry(tmp_path, monkeypatch, caplog):
    """An OSError proves nothing about the file (it may be the only copy of a shared entry): kept, logged, counted."""
    import errno
    from pathlib import Path

    tier = DiskTier(tmp_path / "t")
    tier.put("only", torch.arange(4.0))
    real_read = Path.read_bytes

    def flaky(self):
        if self.name == "entry-only.safetensors":
            raise OSError(errno.EIO, "Input/output error")
        return real_read(self)

    monkeypatch.setattr(Path, "read_bytes", flaky)
    with caplog.at_level("WARNING", logger="h3director.disk_tier"):
        assert tier.get("only") is None
    assert tier.read_errors == 1 and tier.corrupt_removed == 0
    assert (tmp_path / "t" / "entry-only.safetensors").is_file()
    assert "entry-only.safetensors" in caplog.text and "kept" in caplog.text
    monkeypatch.setattr(Path, "read_bytes", real_read)
    assert torch.equal(tier.get("only")["tensor"], torch.arange(4.0))


def test_lru_size_limit_and_age_limit(tmp_path):
    tier = DiskTier(tmp_path / "t")
    size = tier.put("a", torch.zeros(256))
    tier.put("b", torch.zeros(256))
    tier.put("c", torch.zeros(256))
    now = time.time()
    for i, key in enumerate(("a", "b", "c")):                # a used longest ago, then b, then c
        os.utime(tmp_path / "t" / f"entry-{key}.safetensors", (now - 300 + i * 100, now - 300 + i * 100))
    tier.get("a")                                            # using a makes b the least recently used
    tier.max_bytes = 2 * size
    assert tier.enforce_limits() == ["b"]
    assert [e.key for e in tier.entries()] == ["c", "a"]
    tier.max_bytes, tier.max_age_s = None, 50.0
    assert tier.enforce_limits() == ["c"]
    assert [e.key for e in tier.entries()] == ["a"]


def test_purge_and_sweep_never_touch_foreign_files(tmp_path):
    folder = tmp_path / "t"
    tier = DiskTier(folder)
    tier.put("a", torch.zeros(3))
    foreign = {
        "entry-a.safetensors.bak": b"x", "model.safetensors": b"x", ".tmp-notours.partial": b"x",
        "entry-.safetensors": b"x", "README": b"x",
    }
    for name, data in foreign.items():
        (folder / name).write_bytes(data)
    (folder / "sub").mkdir()
    (folder / "sub" / "entry-z.safetensors").write_bytes(b"x")
    outside = tmp_path / "victim.safetensors"
    outside.write_bytes(b"keep")
    os.symlink(outside, folder / "entry-link.safetensors")    # a link that looks like an entry
    old_orphan = folder / f".tmp-a-{os.getpid()}-{'0' * 16}.partial"
    old_orphan.write_bytes(b"partial")
    os.utime(old_orphan, (time.time() - 7200, time.time() - 7200))
    assert tier.sweep_orphans() == 1 and not old_orphan.exists()
    assert tier.get("link") is None
    assert tier.purge() == 1
    left = sorted(p.name for p in folder.iterdir())
    assert left == sorted([MARKER_NAME, "sub", "entry-link.safetensors", *foreign])
    assert outside.read_bytes() == b"keep" and (folder / "sub" / "entry-z.safetensors").exists()
