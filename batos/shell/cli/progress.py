"""Progress of commands that can run for minutes: a rich bar on a terminal, plain lines otherwise.

A piped or logged run gets one line at most every ``progress_seconds`` (and one when the work
ends), written and flushed as it happens, so the log shows how far the work got before the
command's summary rather than after it.
"""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from batos import settings
from batos.shell.cli.terminal import visible


class ProgressReport:
    """``with ProgressReport(console, "ingest", total=n, unit="files") as bar: bar.update(...)``.

    ``total`` None means the amount of work is not known (a spinner, and no "of N").
    """

    def __init__(self, console: Console, title: str, *, total: int | None, unit: str) -> None:
        self.console = console
        self.title = title
        self.total = total
        self.unit = unit
        self.done = 0
        self.note = ""
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._started = time.monotonic()
        self._printed_at: float | None = None
        self._printed: tuple[int, str] | None = None

    def __enter__(self) -> ProgressReport:
        self._started = time.monotonic()
        if self.console.is_terminal:
            columns: list[ProgressColumn] = [SpinnerColumn()] if self.total is None else []
            columns += [TextColumn(f"[bold]{self.title}[/]")]
            if self.total is not None:
                columns += [BarColumn(), MofNCompleteColumn()]
            # The note names files and says what servers answered: shown, not read as markup.
            columns += [TimeElapsedColumn(), TextColumn("{task.description}", markup=False)]
            self._bar = Progress(*columns, console=self.console)
            self._bar.__enter__()
            self._task = self._bar.add_task("", total=self.total)
        return self

    def update(self, done: int | None = None, note: str | None = None) -> None:
        """Record progress: ``done`` units so far (None: unchanged) and a note to show."""
        if done is not None:
            self.done = done
        if note is not None:
            self.note = note
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self.done, description=visible(self.note))
            return
        now = time.monotonic()
        every = settings.get_float("progress_seconds")
        if self._printed_at is None or now - self._printed_at >= every:
            self._line(now)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, error, trace)
        elif self._printed != (self.done, self.note) and (error is None or self.done or self.note):
            # A refusal before any work ('0 steps [0s]') says nothing the error does not.
            self._line(time.monotonic())

    def _line(self, now: float) -> None:
        self._printed_at = now
        self._printed = (self.done, self.note)
        count = f"{self.done}" if self.total is None else f"{self.done}/{self.total}"
        elapsed = now - self._started
        note = f", {visible(self.note)}" if self.note else ""
        # Straight to the stream and flushed: a log must get the line now, unwrapped.
        self.console.file.write(f"{self.title}: {count} {self.unit}{note} [{elapsed:.0f}s]\n")
        self.console.file.flush()
