"""Check a weight file: its header and offsets (validated on open), a SHA-256 per tensor, and, against
another file, that every tensor holds what it should.

Every tensor of the file is hashed and, with another file, checked: all components of an all-in-one file,
small ones such as ``vae.latents_mean`` and ``audio_vae.latents_mean`` included. Names are matched exactly
first, then by component and name without the component's prefix (`h3_keys.split_components`: so a
converted DiT's ``blocks.0...`` meets ``model.diffusion_model.blocks.0...``, and two components' tensors
of the same bare name never meet each other).

Comparisons, per tensor present in both files:

- same storage type: the stored bytes are identical ("identical bytes");
- this file quantised, the other float: re-encoding the other file's values with the same quantiser
  (``gguf.quants.quantize`` or `kquant`) gives exactly this file's bytes ("re-quantises identically"),
  and the largest absolute difference after dequantisation is reported;
- both float, different types: this file's values equal the other file's cast to this file's type
  ("equal after cast"; what `slim --dtype` and `convert`'s kept tensors must satisfy);
- anything else is a mismatch. Tensors only in this file are a failure; tensors only in the other file are
  listed but expected (a converted or slimmed file holds a subset).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

import numpy as np

from h3director.weights.files import WeightFile, open_weights
from h3director.weights.h3_keys import COMPONENT_PREFIXES, split_components

FLOAT_TYPES = ("F64", "F32", "F16", "BF16")  # widest first
_TORCH = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


@dataclass
class TensorCheck:
    """One tensor in a `VerifyReport`: `name`, stored `type`, `nbytes` (bytes), the `sha256` of its stored
    bytes, and with `--against` its `status` ("identical bytes", ..., "MISMATCH: ...") and `max_abs_diff`
    (None when not compared by value)."""

    name: str
    type: str
    nbytes: int
    sha256: str
    status: str = ""          # "" without --against; else "identical bytes", ..., "MISMATCH: ..."
    max_abs_diff: float | None = None

    @property
    def ok(self) -> bool:
        return not self.status.startswith(("MISMATCH", "ERROR"))


@dataclass
class VerifyReport:
    """`verify`'s result for the file at `path` (`kind` "safetensors" or "gguf"): one `TensorCheck` per
    tensor and, `against` another file, the names found `only_here` / `only_there`. `ok` is False on any
    mismatch."""

    path: str
    kind: str
    tensors: list[TensorCheck] = field(default_factory=list)
    against: str | None = None
    only_here: list[str] = field(default_factory=list)
    only_there: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(t.ok for t in self.tensors) and not (self.against and self.only_here)


def _sha256(source: WeightFile, name: str) -> str:
    digest = hashlib.sha256()
    for chunk in source.raw_chunks(name):
        digest.update(chunk)
    return digest.hexdigest()


def _bare(name: str) -> str:
    for prefixes in COMPONENT_PREFIXES.values():
        for prefix in prefixes:
            if name.startswith(prefix):
                return name[len(prefix):]
    return name


def _keyed(names) -> dict[tuple[str, str], list[str]]:
    """(component, name without its component prefix) -> the names with that key, in file order."""
    keyed: dict[tuple[str, str], list[str]] = {}
    for component, members in split_components(names).items():
        for name in members:
            keyed.setdefault((component, _bare(name)), []).append(name)
    return keyed


def pair_names(here, there) -> dict[str, str]:
    """Each name of `here` -> its counterpart in `there` (absent when none): the same name, else the same
    component and bare name (see the module docstring). No name of `there` is used twice."""
    there_names = set(there)
    pairs = {name: name for name in here if name in there_names}
    used = set(pairs.values())
    by_key = _keyed(there)
    for key, names in _keyed(here).items():
        free = [n for n in by_key.get(key, []) if n not in used]
        for name in (n for n in names if n not in pairs):
            if free:
                pairs[name] = free.pop(0)
                used.add(pairs[name])
    return pairs


def verify(path: str | os.PathLike, against: str | os.PathLike | None = None) -> VerifyReport:
    """The `VerifyReport` of the weight file at `path`: validated, every tensor hashed (SHA-256 of its
    stored bytes), and compared tensor by tensor with `against` when given (see the module docstring).
    `InvalidInputError` for a missing or malformed file."""
    with open_weights(path) as source:
        report = VerifyReport(str(path), source.kind, against=None if against is None else str(against))
        other = open_weights(against) if against is not None else None
        try:
            pairs = pair_names(list(source.entries), list(other.entries)) if other is not None else {}
            for name, entry in source.entries.items():
                check = TensorCheck(name, entry.type, entry.nbytes, _sha256(source, name))
                if other is not None:
                    if name not in pairs:
                        report.only_here.append(name)
                    else:
                        _compare(check, source, name, other, pairs[name])
                report.tensors.append(check)
            if other is not None:
                matched = set(pairs.values())
                report.only_there = [n for n in other.entries if n not in matched]
        finally:
            if other is not None:
                other.close()
    return report


def _compare(check: TensorCheck, source: WeightFile, name: str, other: WeightFile, other_name: str) -> None:
    import torch

    mine, theirs = source.entries[name], other.entries[other_name]
    if tuple(mine.shape) != tuple(theirs.shape):
        check.status = f"MISMATCH: shape {list(mine.shape)} vs {list(theirs.shape)}"
        return
    if mine.type == theirs.type:
        same = check.sha256 == _sha256(other, other_name)
        check.status = "identical bytes" if same else "MISMATCH: bytes differ"
        return
    if mine.type in FLOAT_TYPES and (theirs.type in FLOAT_TYPES or theirs.type.startswith("F8")):
        dtype = getattr(torch, _TORCH[mine.type])
        a, b = source.load(name), other.load(other_name, dtype)
        equal = _same_bits(a, b)
        check.status = (f"equal after cast to {mine.type}" if equal else
                        f"MISMATCH: values differ from the other file's cast to {mine.type}")
        return
    if theirs.type in FLOAT_TYPES or theirs.type.startswith("F8"):
        values = other.load(other_name, torch.float32)
        row = source.file.tensors[name].ggml_shape[0] if source.kind == "gguf" else mine.shape[-1]
        encoded = _encode(values.numpy().reshape(-1, row), mine.type)
        if encoded is None:
            check.status = f"MISMATCH: cannot re-encode {mine.type}"
            return
        stored = np.concatenate([np.frombuffer(c, np.uint8) for c in source.raw_chunks(name)]) if mine.nbytes else \
            np.zeros(0, np.uint8)
        decoded = source.load(name, torch.float32)
        check.max_abs_diff = float((decoded - values).abs().max()) if values.numel() else 0.0
        same = encoded.reshape(-1).view(np.uint8).tobytes() == stored.tobytes()
        check.status = "re-quantises identically" if same else "MISMATCH: re-quantised bytes differ"
        return
    check.status = f"MISMATCH: cannot compare {mine.type} with {theirs.type}"


def _same_bits(a, b) -> bool:
    """Equal values, NaN where the other has NaN."""
    import torch

    nan = torch.isnan(a)
    return bool(torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan]))


def _encode(values: np.ndarray, type_name: str) -> np.ndarray | None:
    from gguf import GGMLQuantizationType, quants

    from h3director.weights import kquant

    rows = values
    if type_name in kquant.ENCODERS:  # convert's encoders for these (gguf has none)
        return kquant.quantize(rows, type_name)
    try:
        return quants.quantize(rows, GGMLQuantizationType[type_name])
    except NotImplementedError:
        return None


def summary_line(report: VerifyReport) -> str:
    """One line: tensors, bytes, and the outcome."""
    total = sum(t.nbytes for t in report.tensors)
    text = (f"{report.path}: {report.kind}, header and offsets valid; checked all {len(report.tensors)} tensors "
            f"({total:,} bytes, SHA-256 each)")
    if report.against:
        bad = [t for t in report.tensors if not t.ok]
        text += (f"; against {report.against}: {len(report.tensors) - len(bad) - len(report.only_here)} match, "
                 f"{len(bad)} mismatch, {len(report.only_here)} only here, {len(report.only_there)} only there")
    return text


__all__ = ["TensorCheck", "VerifyReport", "summary_line", "verify"]
