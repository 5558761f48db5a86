"""How a `kernel-factory` command ends: its exit codes, and SIGTERM raised like Ctrl-C so that a command stopped by
`timeout` or a job scheduler closes its journal, MLflow run and bench report as after Ctrl-C."""
from __future__ import annotations

import contextlib
import signal

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143   # 128 + SIGTERM
EXIT_FAILED = 1         # the command ran and its answer is "no": a regression, a missed target, no correct candidate


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that everything closes the same way; only the exit code differs."""


EXIT_BROKEN_PIPE = 141   # 128 + SIGPIPE, as the shell reports a pipe closed by its reader


def interrupt_code(exc: BaseException) -> int:
    """The exit code of a command stopped by Ctrl-C (130) or SIGTERM (143)."""
    return EXIT_TERMINATED if isinstance(exc, Terminated) else EXIT_INTERRUPTED


@contextlib.contextmanager
def sigterm_as_interrupt():
    """SIGTERM (as `timeout` sends) raises KeyboardInterrupt inside the block, so that a command stopped that way
    ends as after Ctrl-C: runs close their journal and MLflow run, benches write what they measured."""
    def raise_interrupt(signum, frame):
        raise Terminated
    try:
        previous = signal.signal(signal.SIGTERM, raise_interrupt)
    except ValueError:   # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
