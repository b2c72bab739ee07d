"""Progress of a whole model through capture -> plan -> check -> compile -> measure: one rich bar per stage.

Planning a model takes seconds per region; a bar per stage (items done of items
seen so far, the current region in the description) shows where the time goes.
The display is on only when asked (``progress=True``) and stderr is a terminal;
otherwise every call here is a no-op and nothing is printed (the log keeps its
one line per region). A ``Tracker`` is what the compiler talks to: ``start`` one
more item of a stage, ``done`` one, ``say`` a line of status.
"""

from __future__ import annotations

import sys
from typing import Any, Protocol

STAGES = ("capture", "plan", "check", "compile", "measure")


class Tracker(Protocol):
    def start(self, stage: str) -> None: ...

    def done(self, stage: str) -> None: ...

    def say(self, text: str) -> None: ...

    def close(self) -> None: ...


class NullTracker:
    """No display (not a terminal, or ``progress=False``)."""

    def start(self, stage: str) -> None:
        pass

    def done(self, stage: str) -> None:
        pass

    def say(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


class RichTracker:
    """One ``rich`` bar per stage on ``console`` (default: stderr), live until ``close``."""

    def __init__(self, console: Any = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console or Console(stderr=True)
        self.bars = Progress(TextColumn("{task.fields[stage]:>8}"), BarColumn(), MofNCompleteColumn(),
                             TimeElapsedColumn(), TextColumn("{task.description}"), console=self.console,
                             transient=False)
        self.tasks = {s: self.bars.add_task("", total=0, stage=s) for s in STAGES}
        self.last = "capture"
        self.bars.start()

    def start(self, stage: str) -> None:
        t = self.tasks[stage]
        self.bars.update(t, total=(self.bars.tasks[t].total or 0) + 1)
        self.last = stage

    def done(self, stage: str) -> None:
        self.bars.advance(self.tasks[stage])

    def say(self, text: str) -> None:
        self.bars.update(self.tasks[self.last], description=" ".join(text.split())[:80])

    def close(self) -> None:
        self.bars.stop()


def tracker(progress: bool | Tracker) -> Tracker:
    """``progress`` as given when it is a tracker; bars when True and stderr is a terminal; else none."""
    if not isinstance(progress, bool):
        return progress
    if progress and sys.stderr.isatty():
        return RichTracker()
    return NullTracker()
