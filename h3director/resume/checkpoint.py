"""Sampling checkpoints on disk: atomic, checksummed, matched on a key, the last two kept.

A checkpoint is the state a sampler needs to continue at step `step` (0-based, the next step to run) of
`total_steps`: the latent at the start of that step (``latent``) and whatever the sampler carries from
step to step (``old_denoised`` for a two-step method, ``generator_state`` for one that draws noise). It
is one safetensors file ``<folder>/step_<step:06d>.safetensors`` whose metadata holds the format tag,
the step numbers, the run's key (a JSON object of short strings) and a CRC32 per tensor.

Guarantees:
- a file under a final name is complete: it is written under a hidden temporary name, fsynced and
  renamed (`core.atomic_file.atomic_path`); a killed writer leaves at most the temporary;
- `latest` returns the newest checkpoint whose header, tensors and CRCs read back; a corrupt or
  truncated one is skipped with a warning and the one before it is used;
- a checkpoint whose key differs from the run's is refused (`CheckpointMismatch`, naming each field
  that differs), never silently resumed;
- `save` never raises for a write that fails (full disk, read-only folder): it warns once that
  checkpoints stopped, and the sampling goes on without them;
- `save_in_background` costs the sampling thread only a host copy of the tensors: the CRC, serializing,
  writing and fsync run on one writer thread (a new save first waits for the one in flight, so files
  are written in step order); `wait` joins it. A process killed mid-write leaves the previous checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from h3director.core.atomic_file import atomic_path, remove_quietly
from h3director.errors import InvalidInputError
from h3director.resume.fingerprint import tensor_crc32

FORMAT = "h3director-sampling-checkpoint-1"
KEEP = 2
_NAME = re.compile(r"^step_(\d{6})\.safetensors$")
LOG = logging.getLogger("h3director.resume")


class CheckpointMismatch(InvalidInputError):
    """A checkpoint exists for this run name but was made by a different run (model, prompt, seed, geometry...)."""


@dataclass
class SamplingCheckpoint:
    """The sampler state at the start of step `step` of `total_steps` (see the module docstring)."""

    step: int
    total_steps: int
    key: dict[str, str]
    tensors: dict[str, torch.Tensor]
    path: Path | None = field(default=None, compare=False)


def key_differences(saved: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """One ``"<field>: checkpoint <a>, this run <b>"`` line per key field that differs (missing reads '-')."""
    lines = []
    for name in sorted(set(saved) | set(current)):
        if saved.get(name) != current.get(name):
            lines.append(f"{name}: checkpoint {saved.get(name, '-')}, this run {current.get(name, '-')}")
    return lines


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:06d}.safetensors"


def _listed(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of the final-named checkpoint files in `folder`, newest first."""
    if not folder.is_dir():
        return []
    found = []
    for path in folder.iterdir():
        match = _NAME.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found, reverse=True)


def read_checkpoint(path: Path) -> SamplingCheckpoint:
    """Load one checkpoint file and verify it; raises `ValueError`/`OSError` describing what is wrong.
    Returns the `SamplingCheckpoint`."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as handle:
        meta = handle.metadata() or {}
        if meta.get("format") != FORMAT:
            raise ValueError(f"not an H3 Director sampling checkpoint (format {meta.get('format')!r})")
        crcs = json.loads(meta["crc32"])
        tensors = {name: handle.get_tensor(name) for name in handle.keys()}
    if set(crcs) != set(tensors):
        raise ValueError(f"tensors {sorted(tensors)} do not match the recorded {sorted(crcs)}")
    for name, tensor in tensors.items():
        if tensor_crc32(tensor) != int(crcs[name]):
            raise ValueError(f"tensor {name!r} fails its CRC32 check")
    if "latent" not in tensors:
        raise ValueError("no 'latent' tensor")
    return SamplingCheckpoint(step=int(meta["step"]), total_steps=int(meta["total_steps"]),
                              key=json.loads(meta["key"]), tensors=tensors, path=path)


class CheckpointStore:
    """The checkpoints of one run name in `folder` (created on the first save).

    `warn` receives each warning (default: the ``h3director.resume`` logger). `stopped` is None while
    checkpoints are written, else the reason they stopped (the first write that failed).
    """

    def __init__(self, folder: str | os.PathLike, keep: int = KEEP,
                 warn: Callable[[str], None] | None = None) -> None:
        if keep < 1:
            raise InvalidInputError(f"keep must be at least 1, got {keep}")
        self.folder = Path(folder)
        self.keep = keep
        self.warn = warn or LOG.warning
        self.stopped: str | None = None
        self.written: list[Path] = []
        self._writer: threading.Thread | None = None
        self._writer_error: BaseException | None = None

    def save(self, checkpoint: SamplingCheckpoint) -> Path | None:
        """Write `checkpoint` atomically and drop all but the newest `keep`; returns the path, or None when
        the write failed (warned once; later calls do nothing) or checkpoints already stopped."""
        if self.stopped is not None:
            return None
        from safetensors.torch import save

        tensors = {name: t.detach().contiguous().cpu() for name, t in checkpoint.tensors.items()}
        meta = {"format": FORMAT, "step": str(checkpoint.step), "total_steps": str(checkpoint.total_steps),
                "key": json.dumps(checkpoint.key, sort_keys=True),
                "crc32": json.dumps({name: tensor_crc32(t) for name, t in tensors.items()}, sort_keys=True)}
        final = checkpoint_path(self.folder, checkpoint.step)
        payload = save(tensors, metadata=meta)  # serialized here so that a failed write is a plain OSError
        try:
            with atomic_path(final) as temporary:
                temporary.write_bytes(payload)
        except OSError as error:
            self.stopped = f"{type(error).__name__}: {error}"
            self.warn(f"H3 Director resume: writing the checkpoint of step {checkpoint.step} to {final} failed "
                      f"({self.stopped}); checkpoints stopped for this run, sampling goes on")
            return None
        self.written.append(final)
        for _, old in _listed(self.folder)[self.keep:]:
            remove_quietly(old)
        return final

    def save_in_background(self, checkpoint: SamplingCheckpoint) -> None:
        """Copy `checkpoint`'s tensors to the host now, write them on the writer thread (see `save`)."""
        self.wait()
        if self.stopped is not None:
            return
        host = SamplingCheckpoint(step=checkpoint.step, total_steps=checkpoint.total_steps, key=checkpoint.key,
                                  tensors={name: t.detach().to("cpu", copy=True)
                                           for name, t in checkpoint.tensors.items()})

        def write() -> None:
            try:
                self.save(host)
            except BaseException as error:  # noqa: BLE001 - handed to the sampling thread by `wait`
                self._writer_error = error

        self._writer = threading.Thread(target=write, name=f"h3director-checkpoint-{checkpoint.step}")
        self._writer.start()

    def wait(self) -> None:
        """Join the write in flight, if any; re-raise what it raised other than a failed write (which `save`
        turns into the warning)."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None
        if self._writer_error is not None:
            error, self._writer_error = self._writer_error, None
            raise error

    def latest(self, key: Mapping[str, str]) -> SamplingCheckpoint | None:
        """The newest readable checkpoint, or None when there is none.

        Unreadable ones (corrupt, truncated, not ours) are skipped with a warning. Raises
        `CheckpointMismatch` when the newest readable one was made with a different `key`.
        """
        for _, path in _listed(self.folder):
            try:
                found = read_checkpoint(path)
            except Exception as error:  # noqa: BLE001 - any unreadable file is skipped, never trusted
                self.warn(f"H3 Director resume: ignoring the unreadable checkpoint {path} "
                          f"({type(error).__name__}: {error}); trying the one before it")
                continue
            differences = key_differences(found.key, key)
            if differences:
                raise CheckpointMismatch(
                    f"the checkpoint {path} (step {found.step} of {found.total_steps}) was made by another run, "
                    f"refusing to resume from it: {'; '.join(differences)}. Set resume to 'restart' to discard it, "
                    f"or give this run another run name")
            return found
        return None

    def clear(self) -> None:
        """Remove every checkpoint (and leftover temporary) of this run name, after the write in flight."""
        self.wait()
        if not self.folder.is_dir():
            return
        for path in self.folder.iterdir():
            if _NAME.match(path.name) or (path.name.startswith(".step_") and path.name.endswith(".tmp")):
                remove_quietly(path)


__all__ = ["CheckpointMismatch", "CheckpointStore", "SamplingCheckpoint", "read_checkpoint"]
