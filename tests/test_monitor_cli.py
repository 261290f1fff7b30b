"""`h3director monitor` as a command: the report's folder is checked before the job runs, and errors
name the program as `h3director monitor`."""

from __future__ import annotations

import os
import sys

import pytest

from h3director.cli import main


def _monitor(capsys, *argv) -> tuple[int, str]:
    code = main(["monitor", *map(str, argv)])
    return code, capsys.readouterr().err


def _marking_command(marker) -> list[str]:
    return ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]


def test_errors_name_the_subcommand_not_the_monitored_command(capsys):
    code, err = _monitor(capsys, "--budget", "lots", "--", "true")
    assert code == 2
    assert err.startswith("h3director monitor: error: cannot read size 'lots'"), err


def test_an_out_path_that_cannot_take_the_report_is_refused_before_the_command_runs(tmp_path, capsys):
    marker = tmp_path / "ran"
    a_file = tmp_path / "report.txt"
    a_file.write_text("earlier notes")
    clash = tmp_path / "clash"
    (clash / "report.json").mkdir(parents=True)
    cases = [
        (a_file, "is a file, not a folder"),
        (a_file / "sub", "is a file, not a folder"),
        (clash, "report.json"),
    ]
    for out, message in cases:
        code, err = _monitor(capsys, "--no-plot", "--out", out, *_marking_command(marker))
        assert code == 2, (out, err)
        assert err.startswith("h3director monitor: error: --out") and message in err, (out, err)
        assert not marker.exists(), f"the command ran although {out} cannot take the report"
    assert a_file.read_text() == "earlier notes"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a POSIX user that permissions apply to")
def test_an_unwritable_out_folder_is_refused_before_the_command_runs(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    marker = tmp_path / "ran"
    try:
        code, err = _monitor(capsys, "--out", locked / "report", *_marking_command(marker))
    finally:
        locked.chmod(0o700)
    assert code == 2 and "--out" in err and not marker.exists(), err


def test_a_writable_new_out_folder_takes_the_report(tmp_path, capsys):
    marker = tmp_path / "ran"
    code, err = _monitor(capsys, "--no-plot", "--interval", "20", "--out", tmp_path / "new" / "report",
                         *_marking_command(marker))
    assert code == 0, err
    assert marker.exists() and (tmp_path / "new" / "report" / "report.json").is_file()
    assert sorted(p.name for p in (tmp_path / "new" / "report").iterdir()) == ["report.csv", "report.json"]
