"""Where a bench's timing runs: a spawned child process (its body is bench.child_main) that owns the CUDA context
and sends each row as it is measured. A provider that crashes (an illegal address poisons the context, torch's too)
ends the child; the parent records the crash on that row and goes on from the row in a fresh child, which records
the crashed provider there without running it again. A child that dies mid-row is a crash of that row. So a peer
that crashes on one shape costs that shape's bar, not the report. Only plain data crosses the pipe: the child
rebuilds the problem and the subject from their names.

Messages, child -> parent: ("start", head), ("row", row), ("crashed", case, provider, why), ("done", info),
("config_error", line), ("error", traceback), ("interrupted",).
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator, Mapping

from ..config import ConfigError
from ..evaluate.gpu import WorkerError

Target = Callable[[Any, Mapping[str, Any]], None]        # the child's body: (pipe end, job), e.g. bench.child_main
Spawn = Callable[[Mapping[str, Any], Target], Iterator[tuple]]


class BenchProcessError(WorkerError):
    """The bench's child process could not start, or failed outside any one provider (its traceback is the message):
    the command ends with that (exit 2), and the rows measured before it are kept."""


def spawn(job: Mapping[str, Any], target: Target) -> Iterator[tuple]:
    """Run target(pipe, job) in a fresh process and yield its messages; ("died", exit code) if it ends without a
    last word. Closing the iterator stops the child."""
    import multiprocessing
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(send, dict(job)), name="kf-bench")
    proc.start()
    send.close()
    last = None
    try:
        while True:
            try:
                last = recv.recv()
            except EOFError:
                proc.join(30)
                yield ("died", proc.exitcode)
                return
            yield last
            if last[0] not in ("start", "row"):
                return
    finally:
        recv.close()
        if last is not None and last[0] == "done":
            proc.join(60)   # a clean end: let CUDA tear down
        if proc.is_alive():
            proc.terminate()   # a poisoned context, or the parent interrupted
            proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def measure(job: Mapping[str, Any], head: Mapping[str, Any], target: Target,
            on_row: Callable[[dict[str, Any]], None] | None = None, spawn_child: Spawn | None = None) -> dict:
    """The bench result: `head` plus the rows of every case of the job, measured by as many children as crashes
    need. on_row gets the result so far after every row but the last."""
    spawn_child = spawn_child or spawn
    started = time.perf_counter()
    total = len(job["cases"])
    todo = list(job["cases"])
    rows: list[dict[str, Any]] = []
    restarts: list[dict[str, str]] = []
    skip: dict[str, dict[str, str]] = {}
    info: dict[str, Any] = {}

    def result() -> dict[str, Any]:
        fp = {**info.get("fingerprint", {}), **({"clocks_after": info["clocks_after"]} if "clocks_after" in info
                                                else {})}
        out = {**head, "copy_gbps": info.get("copy_gbps"), "flush_us": info.get("flush_us"),
               "wall_s": time.perf_counter() - started,
               "fingerprint": fp, "rows": list(rows)}
        if restarts:
            out["restarts"] = list(restarts)
        if len(rows) < total:
            out["partial"] = f"{len(rows)} of {total} cases"
        return out
    while todo:
        child = {**job, "cases": list(todo), "skip": {k: dict(v) for k, v in skip.items()}}   # a copy: todo shrinks
        crash = run_child(spawn_child(child, target), info, rows, todo,
                          lambda: on_row(result()) if on_row is not None and len(rows) < total else None)
        if crash is not None:
            case, provider, why = crash
            skip.setdefault(case, {})[provider] = why
            restarts.append({"case": case, "provider": provider, "why": why})
    return result()


def run_child(messages: Iterator[tuple], info: dict[str, Any], rows: list, todo: list,
              after_row: Callable[[], Any]) -> tuple[str, str, str] | None:
    """One child's messages: rows appended (and taken off todo), the first child's head kept in info; returns the
    crash that ended it, if one did."""
    started = False
    with contextlib.closing(messages):
        for msg in messages:
            kind = msg[0]
            if kind == "start":
                started = True
                for key, value in msg[1].items():
                    info.setdefault(key, value)   # the first process's copy bandwidth and fingerprint
            elif kind == "row":
                rows.append(msg[1])
                todo.pop(0)
                after_row()
            elif kind == "crashed":
                return msg[1], msg[2], msg[3]
            elif kind == "done":
                info["clocks_after"] = msg[1].get("clocks_after")
                return None
            elif kind == "died":
                if not started:
                    raise BenchProcessError(f"the bench process died before it could time anything (exit code "
                                            f"{msg[1]})")
                return (todo[0], "*", f"crashed: the bench process died (exit code {msg[1]})") if todo else None
            elif kind == "interrupted":
                raise KeyboardInterrupt
            elif kind == "config_error":
                raise ConfigError(msg[1])
            else:
                raise BenchProcessError(f"the bench process failed:\n{msg[1]}")
    if todo:
        raise BenchProcessError("the bench process ended without finishing its cases")
    return None
