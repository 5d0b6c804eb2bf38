"""Where a run or one of its strategies stands, as stored in the run store and shown everywhere."""

from __future__ import annotations

from enum import StrEnum


class Status(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    DOES_NOT_FIT = "does_not_fit"
    """Memory, swap buffers or disk ran out: a result about the placement, not a fault."""
    INTERRUPTED = "interrupted"
    """A run whose process ended before it finished (a closed terminal, killed)."""
    UNKNOWN = "unknown"
    """A status this offloadlab does not write (a newer version's, or a hand-edited store): shown, not fatal."""

    @classmethod
    def _missing_(cls, value) -> "Status":
        return cls.UNKNOWN

    @property
    def label(self) -> str:
        return self.value.replace("_", " ")

    @property
    def style(self) -> str:
        """Its rich/Textual colour."""
        return _STYLE[self]

    @property
    def finished(self) -> bool:
        return self in (Status.DONE, Status.FAILED, Status.DOES_NOT_FIT)

    @property
    def unfinished(self) -> bool:
        return self in (Status.PENDING, Status.RUNNING)


_STYLE = {
    Status.PENDING: "dim",
    Status.RUNNING: "cyan",
    Status.DONE: "green",
    Status.FAILED: "red",
    Status.DOES_NOT_FIT: "yellow",
    Status.INTERRUPTED: "red",
    Status.UNKNOWN: "magenta",
}

# The reason an interrupted run's unfinished strategies show.
DIED_REASON = "offloadlab's process ended before the run finished (a closed terminal, or killed)"


def ran_to_its_end(status: Status, reason: str | None) -> bool:
    """Finished by itself (done, failed, did not fit), not stopped with its run: a strategy that Ctrl-C or a
    dead process ended is stored as failed with a reason that says "interrupted"."""
    return status.finished and not (reason or "").startswith(Status.INTERRUPTED.value)
