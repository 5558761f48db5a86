"""The run journal's format and its one reader. JournalObserver (observers/journal.py) writes these records, one JSON
line each, to runs/<run id>/journal.jsonl; resume, export, gap, bench and lineage read them back through read(),
which checks every line once and names the file and line of anything it cannot take. A gzipped copy
(journal.jsonl.gz, as results folders keep them) reads the same."""
from __future__ import annotations

import gzip
import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

from .config import ConfigError
from .protocols import EvaluatorInfo, GenerationStats, RunInfo, RunSummary
from .types import Candidate, EvalResult, Status

NAME = "journal.jsonl"


class JournalError(ConfigError):
    """A file that is not a readable run journal (the message names the file and line)."""


@dataclass(frozen=True)
class Start:
    """The first record: what the run is, so that resume can rebuild it and tools can label its numbers."""

    run_id: str
    problem: str
    seed: int
    config: Mapping[str, Any]          # the resolved config (config.parse accepts it again)
    evaluator: EvaluatorInfo
    cases: tuple[str, ...]             # case keys
    cases_key: str = ""
    warm_start: tuple[str, ...] = ()
    prior_records: int = 0
    warm_start_from: Mapping[str, str] = field(default_factory=dict)   # seed genome id -> the run that bred it
    warm_start_origin: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)   # ... -> run, candidate, gen

    @staticmethod
    def of(run: RunInfo) -> "Start":
        return Start(run.run_id, run.problem, run.seed, run.config, run.evaluator, tuple(c.key for c in run.cases),
                     run.cases_key, tuple(run.warm_start), run.prior_records, dict(run.warm_start_from),
                     dict(run.warm_start_origin))

    def to_json(self) -> dict[str, Any]:
        ev = self.evaluator
        return {"event": "start", "run_id": self.run_id, "problem": self.problem, "seed": self.seed,
                "cases_key": self.cases_key, "warm_start": list(self.warm_start),
                "warm_start_from": dict(self.warm_start_from),
                "warm_start_origin": {k: dict(v) for k, v in self.warm_start_origin.items()},
                "prior_records": self.prior_records,
                "config": self.config,
                "evaluator": {"kind": ev.kind, "label": ev.label, "fingerprint": dict(ev.fingerprint)},
                "cases": list(self.cases)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "Start":
        ev = _keys(d["evaluator"], {"kind", "label"}, {"fingerprint"}, "start's evaluator")
        return Start(str(d["run_id"]), str(d["problem"]), int(d["seed"]), _mapping(d["config"], "config"),
                     EvaluatorInfo(str(ev["kind"]), str(ev["label"]), dict(ev.get("fingerprint") or {})),
                     tuple(d["cases"]), str(d.get("cases_key", "")), tuple(d.get("warm_start", ())),
                     int(d.get("prior_records", 0)), dict(d.get("warm_start_from") or {}),
                     {k: dict(_mapping(v, "warm_start_origin")) for k, v in (d.get("warm_start_origin") or {}).items()})


@dataclass(frozen=True)
class Resume:
    """Written when `kernel-factory resume` continues the run: how many results the journal already held."""

    known_results: int

    def to_json(self) -> dict[str, Any]:
        return {"event": "resume", "known_results": self.known_results}


@dataclass(frozen=True)
class Result:
    """One candidate and its outcome, in the generation that evaluated it."""

    EVENT = "result"   # a class constant, not a field

    generation: int
    candidate: Candidate
    result: EvalResult

    def to_json(self) -> dict[str, Any]:
        return {"event": self.EVENT, "generation": self.generation, "candidate": self.candidate.to_json(),
                "result": self.result.to_json()}


class Refusal(Result):
    """A child the problem's rule refused (status infeasible): kept with its reason, but no evaluation, so it is an
    event of its own and never among a run's results."""

    EVENT = "refused"


def entry(generation: int, candidate: Candidate, result: EvalResult) -> Result:
    """The journal event of one outcome: a refusal or an evaluated result."""
    kind = Refusal if result.status is Status.INFEASIBLE else Result
    return kind(generation, candidate, result)


@dataclass(frozen=True)
class Finalist:
    """A top candidate re-timed at the end against the baseline, interleaved (GPU runs only). Its record is the
    evaluator's: the fields below are the ones readers use, `data` keeps all of it."""

    candidate_id: str
    status: str                                  # a Status value
    reps: int = 0
    times_us: Mapping[str, float] = field(default_factory=dict)
    data: Mapping[str, Any] = field(default_factory=dict)

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "Finalist":
        d = _mapping(d, "finalist")
        return Finalist(str(d["candidate_id"]), str(d["status"]), int(d.get("reps", 0)),
                        dict(d.get("times_us") or {}), dict(d))


@dataclass(frozen=True)
class End:
    """The last record of a run that closed (also after Ctrl-C): its summary, best and finalists."""

    generations: int
    evaluations: int
    stop_reason: str
    wall_s: float
    gpu_s: float
    best: str | None                             # the best candidate's id
    hall_of_fame: tuple[str, ...] = ()
    logbook: tuple[Mapping[str, Any], ...] = ()
    timed_per_gpu_minute: float = 0.0
    finalists: tuple[Finalist, ...] = ()
    accounting: Mapping[str, Any] = field(default_factory=dict)   # accounting.of(): GPU time, compiles, baseline

    @staticmethod
    def json_of(summary: RunSummary) -> dict[str, Any]:
        """The end record of a summary, as written (finalists are the evaluator's records, kept whole)."""
        return {"event": "end", "generations": summary.generations, "evaluations": summary.evaluations,
                "stop_reason": summary.stop_reason, "wall_s": summary.wall_s, "gpu_s": summary.gpu_s,
                "best": summary.best[0].id if summary.best else None,
                "hall_of_fame": [c.id for c, _ in summary.hall_of_fame],
                "logbook": [dict(row) for row in summary.logbook],
                "timed_per_gpu_minute": summary.timed_per_gpu_minute, "finalists": list(summary.finalists),
                "accounting": dict(summary.accounting)}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> "End":
        return End(int(d["generations"]), int(d["evaluations"]), str(d["stop_reason"]), float(d["wall_s"]),
                   float(d["gpu_s"]), None if d["best"] is None else str(d["best"]),
                   tuple(d.get("hall_of_fame", ())), tuple(dict(r) for r in d.get("logbook", ())),
                   float(d.get("timed_per_gpu_minute", 0.0)),
                   tuple(Finalist.from_json(f) for f in d.get("finalists", ())), dict(d.get("accounting") or {}))


def generation_json(stats: GenerationStats) -> dict[str, Any]:
    """A generation record: the loop's GenerationStats, field for field."""
    return {"event": "generation", **stats.__dict__, "counts": dict(stats.counts),
            "operator_probs": dict(stats.operator_probs), "population": list(stats.population)}


def _generation(d: Mapping[str, Any]) -> GenerationStats:
    every = {f.name for f in fields(GenerationStats)}
    required = {f.name for f in fields(GenerationStats) if f.default is MISSING and f.default_factory is MISSING}
    d = _keys(d, required, every - required, "generation")
    return GenerationStats(**{**d, "counts": dict(d["counts"]), "operator_probs": dict(d.get("operator_probs", {})),
                              "population": tuple(d.get("population", ()))})


def _start(d: Mapping[str, Any]) -> Start:
    return Start.from_json(_keys(d, {"run_id", "problem", "seed", "config", "evaluator", "cases"},
                                 {"cases_key", "warm_start", "warm_start_from", "warm_start_origin",
                                  "prior_records"}, "start"))


def _resume(d: Mapping[str, Any]) -> Resume:
    return Resume(int(_keys(d, {"known_results"}, set(), "resume")["known_results"]))


def _result(d: Mapping[str, Any], kind: type = Result) -> Result:
    d = _keys(d, {"generation", "candidate", "result"}, set(), kind.EVENT)
    return kind(int(d["generation"]), Candidate.from_json(d["candidate"]), EvalResult.from_json(d["result"]))


def _end(d: Mapping[str, Any]) -> End:
    return End.from_json(_keys(d, {"generations", "evaluations", "stop_reason", "wall_s", "gpu_s", "best"},
                               {"hall_of_fame", "logbook", "timed_per_gpu_minute", "finalists", "accounting"},
                               "end"))


Event = Union[Start, Resume, Result, GenerationStats, End]
PARSERS: dict[str, Callable[[Mapping[str, Any]], Event]] = {
    "start": _start, "resume": _resume, "result": _result, "refused": lambda d: _result(d, Refusal),
    "generation": _generation, "end": _end}


def _mapping(value: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{what} is {type(value).__name__}, not an object")
    return value


def _keys(d: Any, required: set[str], optional: set[str], what: str) -> Mapping[str, Any]:
    """d, after checking that it has every required key and no unknown one."""
    d = _mapping(d, what)
    missing = sorted(required - set(d))
    if missing:
        raise ValueError(f"{what} record lacks {', '.join(missing)}")
    unknown = sorted(set(d) - required - optional)
    if unknown:
        raise ValueError(f"{what} record has unknown keys {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(required | optional))})")
    return d


def parse(record: Any) -> Event:
    """One record as its typed event; ValueError/KeyError/TypeError says what is wrong with it."""
    record = _mapping(record, "line")
    kind = record.get("event")
    if kind not in PARSERS:
        raise ValueError(f"unknown event {kind!r} (known: {', '.join(PARSERS)})")
    return PARSERS[kind]({k: v for k, v in record.items() if k != "event"})


def records(path: str | Path) -> list[dict[str, Any]]:
    """The journal's records as plain JSON, in order. A torn last line (a kill mid-write) is dropped; a broken line
    anywhere else is an error."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        text = (gzip.decompress(raw) if path.suffix == ".gz" else raw).decode()
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise JournalError(f"{path}: cannot read the journal: {exc}") from None
    lines = text.splitlines()
    out = []
    for number, line in enumerate(lines, start=1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break
            raise JournalError(f"{path}:{number}: not JSON ({exc.msg}); only the last line may be torn") from None
    return out


@dataclass(frozen=True)
class Journal:
    """A run's journal, read and checked: its start, then every later event in file order."""

    path: Path
    start: Start
    events: tuple[Event, ...]

    @property
    def run_id(self) -> str:
        return self.start.run_id

    @property
    def config(self) -> Mapping[str, Any]:
        return self.start.config

    @property
    def results(self) -> tuple[Result, ...]:
        return tuple(e for e in self.events if isinstance(e, Result) and not isinstance(e, Refusal))

    def outcomes(self) -> list[tuple[Candidate, EvalResult]]:
        """Every candidate the run produced, refused ones included, in file order (what a lineage draws)."""
        return [(e.candidate, e.result) for e in self.events if isinstance(e, Result)]

    @property
    def refusals(self) -> tuple[Result, ...]:
        """The children the rule refused, each once, with the rule's reason in its result's message."""
        return tuple(e for e in self.events if isinstance(e, Refusal))

    def pairs(self) -> list[tuple[Candidate, EvalResult]]:
        """Every evaluated candidate with its result, in the order they were evaluated."""
        return [(r.candidate, r.result) for r in self.results]

    def known(self) -> dict[str, EvalResult]:
        """candidate id -> its result (what resume answers from)."""
        return {r.candidate.id: r.result for r in self.results}

    @property
    def generations(self) -> tuple[GenerationStats, ...]:
        return tuple(e for e in self.events if isinstance(e, GenerationStats))

    @property
    def end(self) -> End | None:
        """The last end record (a resumed run has one per session), or None for a run that was killed."""
        ends = [e for e in self.events if isinstance(e, End)]
        return ends[-1] if ends else None

    def latest_best(self) -> str | None:
        """The best as the journal last named it: a killed run has no end record, but each generation names its
        best."""
        best = None
        for e in self.events:
            if isinstance(e, GenerationStats):
                best = e.best_id or best
            elif isinstance(e, End):
                best = e.best or best
        return best

    def finalists(self) -> dict[str, Finalist]:
        """candidate id -> its finalist re-timing, from every end record (a later one wins)."""
        return {f.candidate_id: f for e in self.events if isinstance(e, End) for f in e.finalists}


def read(path: str | Path) -> Journal:
    """The journal at `path`, every record checked; JournalError names the file and line of the first bad one."""
    return of_records(Path(path), records(path))


def of_records(path: Path, raw: Sequence[Mapping[str, Any]]) -> Journal:
    """The journal of records already read from `path` (see records())."""
    events: list[Event] = []
    for number, record in enumerate(raw, start=1):
        try:
            events.append(parse(record))
        except (ValueError, KeyError, TypeError) as exc:
            what = f"lacks {exc}" if isinstance(exc, KeyError) else str(exc)
            raise JournalError(f"{path}:{number}: not a journal record: {what}") from None
    if not events or not isinstance(events[0], Start):
        raise JournalError(f"{path}: not a run journal (its first record is not the run's start)")
    if any(isinstance(e, Start) for e in events[1:]):
        raise JournalError(f"{path}: more than one start record")
    return Journal(path, events[0], tuple(events[1:]))

