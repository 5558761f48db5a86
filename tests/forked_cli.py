"""`kernel-factory` that kills itself with SIGKILL at a chosen moment (tests only): the crash-safety tests need kills
that land at known points of a run, not after a guessed sleep.

    python tests/forked_cli.py journal:K  run CONFIG ...   dies right after its K-th journal record is on disk
    python tests/forked_cli.py child:K    resume RUN ...   dies right after its K-th MLflow child run is finished,
                                                           before the candidate table that would list it

Each names a point where a real kill lands between two writes that resume must reconcile. The process dies as a
kill -9 would leave it: no handler, no flush, nothing closed.
"""
from __future__ import annotations

import os
import signal
import sys
from typing import Any, Callable

from kernel_factory.evo.observers.journal import JournalObserver
from kernel_factory.evo.observers.mlflow import MlflowObserver
from kernel_factory.evo.tools import cli

# point -> (class, method, the attribute whose growth shows a call did its write: a resumed run calls
# _log_candidate again for children it logged before, which return at once)
POINTS: dict[str, tuple[type, str, str | None]] = {"journal": (JournalObserver, "_write", None),
                                                   "child": (MlflowObserver, "_log_candidate", "child_ids")}


def die_after(owner: type, method: str, grows: str | None, count: int) -> None:
    original: Callable[..., Any] = getattr(owner, method)
    calls = 0

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        before = len(getattr(self, grows)) if grows else 0
        out = original(self, *args, **kwargs)
        calls += not grows or len(getattr(self, grows)) > before
        if calls >= count:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(owner, method, counted)


if __name__ == "__main__":
    point, _, count = sys.argv[1].partition(":")
    if point not in POINTS or not count.isdigit() or int(count) < 1:
        sys.exit(f"forked_cli: the first argument is one of {', '.join(f'{p}:K' for p in POINTS)} (K >= 1), "
                 f"not {sys.argv[1]!r}")
    die_after(*POINTS[point], int(count))
    sys.exit(cli.main(sys.argv[2:]))
