"""The peers a report times beside ours. Before timing: which peers the problem declares for these shapes, which
the command leaves out (and why), and the import check that stops the command before anything is timed when a peer
cannot load. After: from a bench result, per dtype, which peers ran, which did not (left out, or ran on no row), and
on how many rows each crashed or failed; every headline carries that as its note, e.g. "(without QuACK; INT21
crashed on 1 row)". Results written before benches recorded their peers are read too: what ran comes from the rows.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from .. import registry
from ..config import ConfigError
from ..protocols import DeclaresPeers, Peer, Problem, PublishedPeers

SUBJECT = "factory"      # a bench row's provider names besides the baselines: ours,
COPY = "copy"            # and a device copy moving the row's bytes, timed with the providers (the row's roofline)
OWN_OP = "factory_op"    # the exported op as a baseline: never a peer of itself


def declared(problem: Problem) -> tuple[Peer, ...]:
    """The problem's declared peers; a problem that declares none has every baseline but its own op as a peer."""
    if isinstance(problem, DeclaresPeers):
        return tuple(problem.declared_peers)
    return tuple(Peer(b, b) for b in problem.baselines if b != OWN_OP)


def for_shapes(problem: Problem, shapes: str) -> list[Peer]:
    """The declared peers that belong on these shapes: one that tunes itself per shape on the benchmark rows only."""
    return [p for p in declared(problem) if shapes == "benchmark" or not p.tuned]


def parse_without(problem: Problem, names: Sequence[str], where: str = "--without") -> tuple[str, ...]:
    """Peer names to leave out, each one the problem declares."""
    known = [p.baseline for p in declared(problem)]
    bad = [n for n in names if n not in known]
    if bad:
        raise ConfigError(f"{where}: {problem.name} has no peer {bad[0]!r}; its peers are {', '.join(known)}")
    return tuple(dict.fromkeys(names))


def split_names(text: str | None) -> tuple[str, ...]:
    """A command line's comma list (--without quack,quack_tuned), or nothing."""
    return tuple(n.strip() for n in (text or "").split(",") if n.strip())


def first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [""])[0][:200]


def load_error(peer: Peer) -> str | None:
    """None when the peer's module imports here; else the error, in one line."""
    if peer.module is None:
        return None
    try:
        importlib.import_module(peer.module)
    except Exception as exc:   # not only ImportError: QuACK's DSL raises RuntimeError when its CUDA toolkit is missing
        return f"{type(exc).__name__}: {first_line(exc)}"
    return None


@dataclass(frozen=True)
class Choice:
    """What one bench times: the baselines, and the declared peers it leaves out with why."""

    timed: tuple[str, ...]
    declared: tuple[str, ...]                              # the peers that belong on these shapes
    without: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


def choose(problem: Problem, shapes: str, baselines: Sequence[str] | None, without: Sequence[str],
           subject_is_op: bool, how: str = "--without {}", imports: bool = True) -> Choice:
    """The baselines to time: those asked for (None: every declared peer for these shapes), less `without` and less
    the op when it is the subject. A declared peer not timed is recorded with why. Every peer to time must load
    here (unless `imports` is False: a machine that will time nothing), or one line names each that cannot, why,
    and how (`how`) to go on without it."""
    without = parse_without(problem, without)
    asked = list(baselines) if baselines is not None else [p.baseline for p in for_shapes(problem, shapes)]
    unknown = [b for b in asked if b not in problem.baselines]
    if unknown:
        raise ConfigError(f"--baselines: {problem.name} has no baseline {unknown[0]!r}; it has "
                          f"{', '.join(problem.baselines)}")
    timed = [b for b in dict.fromkeys(asked) if b not in without and not (subject_is_op and b == OWN_OP)]
    peers = for_shapes(problem, shapes)
    left = {p.baseline: "left out (--without)" if p.baseline in without else "not asked for (--baselines)"
            for p in peers if p.baseline not in timed}
    broken = {p.baseline: why for p in declared(problem)
              if imports and p.baseline in timed and (why := load_error(p))}
    if broken:
        raise ConfigError(cannot_load(problem, broken, how))
    return Choice(tuple(timed), tuple(p.baseline for p in peers), left,
                  {p.baseline: p.label for p in declared(problem)})


def cannot_load(problem: Problem, broken: Mapping[str, str], how: str = "--without {}") -> str:
    """One line: the peers that cannot load, why (their import error's first line), and how to go on without."""
    names = ", ".join(broken)
    whys = "; ".join(f"{n}: {why}" for n, why in broken.items())
    return (f"{problem.name}: {'peers' if len(broken) > 1 else 'peer'} {names} cannot load here ({whys}); install "
            f"{'them' if len(broken) > 1 else 'it'}, or time the rest and say so with {how.format(','.join(broken))}")


def published(problem: Problem, baselines: Sequence[str]) -> list[str]:
    """Those of the baselines that the problem names as its published peers (`peers`, the kernels its targets are
    set against); every baseline but the op itself when it names none or none of them was benched."""
    peers = problem.peers if isinstance(problem, PublishedPeers) else ()
    return [b for b in peers if b in baselines] or [b for b in baselines if b != OWN_OP]


def peer_set(result: Mapping[str, Any]) -> list[str]:
    """The baselines that define the best peer in a bench result: the problem's published peers that were benched
    (run() records them), else every baseline."""
    return list(result.get("peers") or result["baselines"])


# ---- after timing: what a bench result says about its peers -----------------------------------------------------

def _problem(name: str) -> Problem | None:
    try:
        return registry.load("problem", name)
    except (ConfigError, registry.PluginError):
        return None   # a problem not installed here: the result's own records are all there is


def recorded_peers(part: Mapping[str, Any], problem: str | None = None) -> tuple[list[str], list[str], dict]:
    """(declared peers for the part's shapes, the baselines it asked for, labels), from the result. A result older
    than those records gets them from its problem (tuned peers belong to it only if every row is a benchmark row)
    and from its rows."""
    asked = list(part.get("baselines") or dict.fromkeys(n for r in part["rows"] for n in r["providers"]
                                                        if n not in (SUBJECT, COPY, OWN_OP)))
    plugin = None if "declared" in part and "labels" in part else _problem(part.get("problem") or problem or "")
    labels = dict(part.get("labels") or {}) or ({p.baseline: p.label for p in declared(plugin)} if plugin else {})
    if "declared" in part:
        return list(part["declared"]), asked, labels
    if plugin is None:
        return [b for b in asked if b != OWN_OP], asked, labels
    bench_rows = {tuple(s) for s in plugin.shape_sets["benchmark"]}
    on_bench = all(tuple(r["shape"]) in bench_rows for r in part["rows"])
    return [p.baseline for p in for_shapes(plugin, "benchmark" if on_bench else "heldout")], asked, labels


def comparable(ours: Mapping[str, Any], peer: Mapping[str, Any]) -> bool:
    """Whether a peer's time in a bench row can stand against ours. A graph replay times the kernel; an eager call
    times the kernel or, when its host path is slower, the host path: an upper bound. So a peer timed eagerly beside
    our graph replay counts only where it is faster even so; any other pair of modes can only count against ours."""
    return not (ours.get("graph") and not peer.get("graph") and peer["us"] >= ours["us"])


def host_inside(entry: Mapping[str, Any], flush_us: float | None) -> bool:
    """Whether part of a provider's host path may be inside its time: timed eagerly, its host time per call (the
    bench records it from 2026-12-07 on) was longer than the L2 flush and the hold (the GPU's wait before the start
    event, from 2026-12-08 on) that the GPU runs while the host enqueues the call, so the GPU waited on the host
    between the events. Such a time is an upper bound of the kernel's, and it moves with the host's load (a busy CPU,
    a compile beside it). The hold is sized to cover the host path, so since then only a path longer than the hold's
    cap (measure.HOLD_MAX_US) or one that grew past it between samples is inside."""
    host = entry.get("host_us")
    return bool(flush_us) and host is not None and not entry.get("graph") and \
        host > flush_us + (entry.get("hold_us") or 0.0)


def memory_short(row: Mapping[str, Any]) -> str:
    """Why a row's per-call allocations may be inside its times ('' if not): torch's allocator had to free its cache
    and retry a cudaMalloc while the row was timed (the bench records it from 2026-12-07 on), so GPU memory was short,
    another process holding it, say. Each retry synchronizes; the providers that allocate per call pay for it."""
    n = row.get("alloc_retries") or 0
    return (f"the allocator retried {n} cudaMalloc(s) while timing ({row.get('gpu_free_gib', 0):.1f} GiB free at "
            f"the start)" if n > 0 else "")


NOISY_IQR = 0.25   # a time whose samples' IQR is above this share of its median is marked noisy in the reports


def noisy(entry: Mapping[str, Any]) -> bool:
    us, iqr = entry.get("us"), entry.get("iqr_us")
    return bool(us) and iqr is not None and iqr > NOISY_IQR * us


def crashed(entry: Mapping[str, Any]) -> bool:
    return bool(entry.get("crashed")) or str(entry.get("error", "")).startswith("crashed")


@dataclass(frozen=True)
class Account:
    """The peers of one part and dtype: which ran, which did not (why), and per peer the rows it crashed or
    failed on."""

    ran: tuple[str, ...]
    without: Mapping[str, str]
    crashed: Mapping[str, int]
    failed: Mapping[str, int]
    labels: Mapping[str, str]

    def label(self, name: str) -> str:
        return self.labels.get(name, name)

    def note(self) -> str:
        """The headline's note: "without QuACK; INT21 crashed on 1 row", or "" when every peer ran (rows where a
        peer refused the shape are in details(), not in the headline)."""
        parts = ["without " + ", ".join(self.label(n) for n in self.without)] if self.without else []
        parts += [f"{self.label(n)} crashed on {k} row{'s' * (k > 1)}" for n, k in self.crashed.items()]
        return "; ".join(parts)

    def details(self) -> list[str]:
        """One line per peer that did not run everywhere: left out or ran on no row (why), crashed or failed rows."""
        out = [f"{self.label(n)} ({n}): {why}" for n, why in self.without.items()]
        out += [f"{self.label(n)} ({n}): crashed on {k} row{'s' * (k > 1)} (the best peer there is "
                f"the fastest of the others)" for n, k in self.crashed.items()]
        out += [f"{self.label(n)} ({n}): failed on {k} row{'s' * (k > 1)}" for n, k in self.failed.items()]
        return out


def account(part: Mapping[str, Any], dtype: str | None = None, problem: str | None = None) -> Account:
    """The peers of a bench result's rows of one dtype (None: all its rows); `problem` for a result that does not
    name its own."""
    rows = [r for r in part["rows"] if dtype is None or r["dtype"] == dtype]
    peers, asked, labels = recorded_peers(part, problem)
    asked = [b for b in asked if b in peers]
    ran = [n for n in asked if any("us" in r["providers"].get(n, {}) for r in rows)]
    if "without" in part:
        without = {n: why for n, why in part["without"].items() if n in peers}
    else:   # a result older than the record: a declared peer it never asked for was not timed
        without = {n: "not timed by this bench" for n in peers if n not in asked}
    for n in asked:
        if n not in ran:
            errors = [r["providers"][n]["error"] for r in rows if "error" in r["providers"].get(n, {})]
            without[n] = f"ran on no row: {errors[0][:160]}" if errors else "ran on no row"
    without = {n: without[n] for n in sorted(without, key=peers.index)}   # in the declared order
    count = lambda test: {n: k for n in ran if (k := sum(test(r["providers"].get(n, {})) for r in rows))}
    return Account(tuple(ran), without, count(crashed),
                   count(lambda e: "error" in e and not crashed(e)), labels)


def dtypes_of(part: Mapping[str, Any]) -> list[str]:
    """The part's dtypes in the order its rows hold them."""
    return list(dict.fromkeys(r["dtype"] for r in part["rows"]))


def not_run(part: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(peer, dtype, why) for every peer the bench asked for that ran on no row of a dtype: a peer that fails to
    run is an error unless the command left it out."""
    out = []
    for dtype in dtypes_of(part):
        acct = account(part, dtype)
        out += [(n, dtype, why) for n, why in acct.without.items() if why.startswith("ran on no row")]
    return out
