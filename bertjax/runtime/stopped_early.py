"""Whether a job of this process was stopped by a signal before its first step: the training loop says so here and
`cli.run_job` then ends the process at once (rc 0). Standard library only, so the command layer reads it without
importing the loop (or JAX)."""

from __future__ import annotations

from typing import Optional

_stopped = False
# What the signal unwound (a compile, half built) is kept, never freed: freeing it crashed in XLA's destructors
# (a segfault, 1 of 7 fine-tuning stops under load).
_unwound: Optional[BaseException] = None


def mark(unwound: BaseException) -> None:
    """The job was stopped before its first step; `unwound` is what the stop raised through."""
    global _stopped, _unwound
    _stopped, _unwound = True, unwound


def before_training() -> bool:
    """Whether a job of this process was stopped by a signal before its first step."""
    return _stopped
