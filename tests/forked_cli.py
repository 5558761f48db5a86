"""`kernel-factory` that signals itself at a chosen moment (tests only): the crash-safety tests need kills that land
at known points of a run, not after a guessed sleep or a polling loop.

    python tests/forked_cli.py journal:K  run CONFIG ...   dies right after its K-th journal record is on disk
    python tests/forked_cli.py child:K    resume RUN ...   dies right after its K-th MLflow child run is finished,
                                                           before the candidate table that would list it
    python tests/forked_cli.py term:result=3,refused=1 run CONFIG ...
                                                           sends itself SIGTERM once its journal holds that many
                                                           records of each event

journal and child name points where a real kill lands between two writes that resume must reconcile: the process
dies as a kill -9 would leave it, with no handler, no flush, nothing closed. term is what `timeout` sends: the
run's own handler stops it.
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


def terminate_when(wanted: dict[str, int]) -> None:
    """SIGTERM to this process, once, right after the journal record that completes `wanted` ({event: count})."""
    original = JournalObserver._write
    seen = {event: 0 for event in wanted}

    def counted(self: Any, record: Any) -> None:
        original(self, record)
        if record.get("event") in seen:
            seen[record["event"]] += 1
            if seen[record["event"]] == wanted[record["event"]] and all(seen[e] >= n for e, n in wanted.items()):
                os.kill(os.getpid(), signal.SIGTERM)

    JournalObserver._write = counted   # type: ignore[method-assign]


if __name__ == "__main__":
    point, _, count = sys.argv[1].partition(":")
    if point == "term":
        terminate_when({event: int(n) for event, _, n in (part.partition("=") for part in count.split(","))})
        sys.exit(cli.main(sys.argv[2:]))
    if point not in POINTS or not count.isdigit() or int(count) < 1:
        sys.exit(f"forked_cli: the first argument is one of {', '.join(f'{p}:K' for p in POINTS)} (K >= 1) "
                 f"or term:EVENT=N,..., "
                 f"not {sys.argv[1]!r}")
    die_after(*POINTS[point], int(count))
    sys.exit(cli.main(sys.argv[2:]))
