"""The op and transfer log (`h3director.core.transfers`) and `h3director monitor --ops`.

This machine has no accelerator, so "the job's device" is the ``meta`` device here: a CPU->meta copy
stands in for a host->device copy (it goes through the same ``aten._to_copy`` / ``aten.copy_`` ops),
and CPU ops count as ops that ran on the CPU while the job's device is not the CPU. A meta tensor
has no data, so a real device->host copy cannot run here; the direction rules are checked on device
pairs (`copy_kind`). The synchronising calls are real calls on CPU tensors (the log records them on
any device). PyTorch's MPS fallback warning is raised here with its exact text, since there is no MPS.
"""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from h3director.core.transfers import TransferLog, copy_kind, format_table, phase
from h3director.errors import InvalidInputError

REPO = Path(__file__).resolve().parents[1]
MPS_WARNING = ("The operator 'aten::_linalg_eigh' is not currently supported on the MPS backend and will fall back "
               "to run on the CPU. This may have performance implications.")


def _rows(log, **match):
    return [r for r in log.rows() if all(getattr(r, k) == v for k, v in match.items())]


def test_host_to_job_device_copies_are_counted_with_bytes_and_phase():
    x = torch.ones(1000)                                      # 4000 bytes
    log = TransferLog("meta")
    with log:
        with log.phase("load"):
            x.to("meta")
            torch.empty(1000, device="meta").copy_(x)
            x.to("cpu")                                       # already there: no op, no copy
        with phase("decode"):                                 # the module-level phase reaches active logs
            x.to("meta", dtype=torch.float16)                 # bytes of the source
    load = _rows(log, phase="load", kind="h2d")
    assert {(r.op, r.device, r.count, r.bytes) for r in load} == {("aten::_to_copy", "cpu->meta", 1, 4000),
                                                                  ("aten::copy_", "cpu->meta", 1, 4000)}
    assert [(r.count, r.bytes) for r in _rows(log, phase="decode", kind="h2d")] == [(1, 4000)]
    assert log.totals()["h2d"] == {"count": 3, "bytes": 12000}


def test_copy_direction_rules():
    cpu, cuda0, cuda1, mps = (torch.device(d) for d in ("cpu", "cuda:0", "cuda:1", "mps"))
    assert copy_kind(cpu, cuda0) == "h2d" and copy_kind(mps, cpu) == "d2h" and copy_kind(cuda0, cuda1) == "d2d"
    assert copy_kind(cuda0, cuda0) is None and copy_kind(cpu, cpu) is None


def test_synchronising_calls_are_recorded():
    x = torch.arange(10.0)
    log = TransferLog("meta")
    with log, log.phase("sample"):
        x[3].item()
        bool(x.sum() > 0)
        x.nonzero()
        x[x > 4]                                               # boolean-mask indexing
        torch.masked_select(x, x > 4)
        torch.unique(x)
        torch.repeat_interleave(torch.tensor([1, 2]))          # no output_size: the host must wait for the sum
        torch.repeat_interleave(torch.tensor([1, 2]), output_size=3)
        x[torch.tensor([1, 2])]                                # integer indexing: no wait
    ops = {r.op: r.count for r in _rows(log, phase="sample", kind="sync")}
    assert ops["aten::_local_scalar_dense"] == 2
    assert ops["aten::nonzero"] == 1 and ops["aten::masked_select"] == 1 and ops["aten::index"] == 1
    assert ops["aten::repeat_interleave"] == 1
    assert any("unique" in op for op in ops)
    with log, log.phase("inference"), torch.inference_mode():   # ComfyUI runs nodes in inference mode
        torch.ones(3)[0].item()
        torch.ones(3).to("meta")
    assert [r.op for r in _rows(log, phase="inference", kind="sync")] == ["aten::item"]
    assert [r.bytes for r in _rows(log, phase="inference", kind="h2d")] == [12]


def test_cpu_ops_count_only_when_the_job_device_is_not_the_cpu():
    x = torch.ones(256)
    on_meta, on_cpu = TransferLog("meta"), TransferLog("cpu")
    with on_meta:
        x * 2
    with on_cpu:
        x * 2
    assert [(r.op, r.bytes) for r in _rows(on_meta, kind="cpu_op")] == [("aten::mul", 1024)]
    assert _rows(on_cpu, kind="cpu_op") == []
    with on_meta:
        torch.ones(4, device="meta") * 2                      # on the job's device: not a CPU op
    assert [r.count for r in _rows(on_meta, kind="cpu_op")] == [1]


def test_mps_fallback_warning_is_recorded_in_its_phase_and_others_pass_through():
    log = TransferLog("mps")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        with log, log.phase("decode"):
            warnings.warn(MPS_WARNING, UserWarning, stacklevel=1)
            warnings.warn(MPS_WARNING, UserWarning, stacklevel=1)           # same place: still recorded each time
            warnings.warn("an unrelated warning", UserWarning, stacklevel=1)
    assert [(r.phase, r.op, r.device, r.count) for r in _rows(log, kind="cpu_fallback")] == \
        [("decode", "aten::_linalg_eigh", "mps", 2)]
    assert [str(w.message) for w in shown] == ["an unrelated warning"]
    assert "PyTorch: The operator 'aten::_linalg_eigh'" in log.table()


def test_table_lists_each_phase_worst_first_and_round_trips_through_json():
    a, b = torch.ones(10), torch.ones(1000)
    log = TransferLog("meta")
    with log:
        with log.phase("load"):
            a * 2                                             # a CPU op of 40 bytes: below the copies
            b.to("meta")
            b.to("meta")
        with log.phase("decode"):
            a.nonzero()
    rows = log.rows()
    assert [(r.phase, r.kind, r.bytes) for r in rows[:2]] == [("load", "h2d", 8000), ("load", "cpu_op", 40)]
    table = format_table(json.loads(json.dumps(log.to_dict())), top=1)
    lines = table.splitlines()
    assert sum(line.strip().startswith("load") for line in lines) == 1           # top=1 per phase
    assert any(line.strip().startswith("decode") and "aten::nonzero" in line for line in lines)
    assert "totals: h2d 2" in table
    with pytest.raises(InvalidInputError, match="top must be at least 1"):
        log.table(top=0)


def test_bad_input():
    with pytest.raises(InvalidInputError, match="not a torch device"):
        TransferLog("gpu0")
    log = TransferLog("meta")
    with log, pytest.raises(InvalidInputError, match="already active"):
        log.__enter__()
    assert format_table({"rows": []}).endswith("nothing recorded: no copies, synchronising calls or CPU ops")


def test_monitor_ops_runs_a_python_program_under_the_log(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import sys, torch\nfrom h3director.core.transfers import phase\n"
                      "x = torch.ones(4096)\nwith phase('upload'):\n    x.to('meta')\n"
                      "print('total', x.sum().item())\nsys.exit(3)\n")
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "h3director", "monitor", "--ops", "--ops-device", "meta", "--out",
                           str(out), "--no-plot", "--interval", "50", "--", sys.executable, str(script)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 3, done.stderr                  # the program's exit code
    assert "total 4096.0" in done.stdout and "op and transfer log (job device meta)" in done.stdout
    ops = json.loads((out / "ops.json").read_text())
    upload = [r for r in ops["rows"] if r["phase"] == "upload"]
    assert upload == [{"phase": "upload", "kind": "h2d", "op": "aten::_to_copy", "device": "cpu->meta",
                       "count": 1, "bytes": 16384}]
    assert (out / "ops.txt").read_text().startswith("op and transfer log")


@pytest.mark.parametrize("command", [["ls", "-l"], ["python"], ["python", "-u", "x.py"], ["python", "-m"]])
def test_monitor_ops_refuses_what_it_cannot_hook(tmp_path, command):
    from h3director.commands.monitor import ops_command

    with pytest.raises(InvalidInputError, match="--ops needs a Python command"):
        ops_command(command, tmp_path / "ops.json", None)
