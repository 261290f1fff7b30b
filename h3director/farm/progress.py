"""The farm's display: a live table while jobs run (rich, on a terminal; one line per event, with the
seconds since the run started, otherwise) and the final table (job, worker, device, predicted vs measured peak, time, result)."""

from __future__ import annotations

import time

from h3director.units import format_size


def _size(value: int | None) -> str:
    return "-" if value is None else format_size(value)


def _seconds(row) -> str:
    return "-" if row.seconds is None else f"{row.seconds:.1f} s"


def _result(row) -> str:
    if row.state == "done":
        return f"done ({row.attempts} attempt{'s' if row.attempts != 1 else ''})"
    return f"{row.state}: {(row.error or '').splitlines()[0][:120]}" if row.error else row.state


def final_table(rows, title: str = "H3 farm"):
    """A rich `Table` of ledger rows."""
    from rich.table import Table

    table = Table(title=title)
    for name, justify in (("job", "left"), ("worker", "left"), ("device", "left"), ("predicted", "right"),
                          ("measured peak", "right"), ("time", "right"), ("result", "left")):
        table.add_column(name, justify=justify)
    for row in rows:
        table.add_row(row.id, row.worker or "-", row.device or "-", _size(row.predicted_bytes),
                      _size(row.measured_peak_bytes), _seconds(row), _result(row))
    return table


def counts_line(counts: dict[str, int]) -> str:
    """One line from job counts by state (needs done, running, queued, failed and refused): "D/T done, ..."."""
    total = sum(counts.values())
    return f"{counts['done']}/{total} done, {counts['running']} running, {counts['queued']} queued, " \
           f"{counts['failed']} failed, {counts['refused']} refused"


class Display:
    """Per-job states and the overall count; `event` records a change, `refresh` redraws."""

    def __init__(self, console, ledger):
        self.console, self.ledger = console, ledger
        self.live = None
        self.recent: list[str] = []
        self.started = time.monotonic()

    def __enter__(self) -> Display:
        if self.console.is_terminal:
            from rich.live import Live

            self.live = Live(self._render(), console=self.console, refresh_per_second=4, transient=True)
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def _render(self):
        from rich.console import Group
        from rich.table import Table

        running = Table(title="running", show_edge=False)
        for name in ("job", "attempt", "setting", "predicted"):
            running.add_column(name)
        for row in self.ledger.rows("WHERE state='running'")[:20]:
            setting = ", ".join(f"{k} {v}" for k, v in (row.settings or {}).items())
            running.add_row(row.id, str(row.attempts), setting, _size(row.predicted_bytes))
        from rich.text import Text

        return Group(counts_line(self.ledger.counts()), running, *(Text(line) for line in self.recent[-8:]))

    def event(self, text: str) -> None:
        text = f"{time.monotonic() - self.started:7.1f} s  {text}"
        if self.live is None:
            self.console.print(text, highlight=False, soft_wrap=True, markup=False)
        else:
            self.recent.append(text)
            self.live.update(self._render())

    def refresh(self) -> None:
        if self.live is not None:
            self.live.update(self._render())


__all__ = ["Display", "counts_line", "final_table"]
