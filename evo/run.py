"""One evolutionary run from a validated config, or the continuation of a killed one: build the parts, read what
earlier runs teach (MLflow), tell the observers, evolve, and close everything even when interrupted.

Resume re-executes the run from its start with the same seed and the same snapshot of earlier runs; candidates the
journal already holds are answered from it, so the re-execution follows the same path without evaluating anything
twice, and continues past the point where the run was killed."""
from __future__ import annotations

import json
import platform
import random
import re
import shutil
import uuid
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from ..kernels import table as op_table
from .evaluate import render
from . import build, config as config_mod
from .config import ConfigError, RunConfig
from .history import History, Record, cases_key
from .loop import Interrupted, evolve
from .steady import evolve_steady
from .lessons import to_markdown
from . import credit
from . import journal
from .protocols import Evaluator, EvaluatorInfo, GenerationStats, RecordedSpace, Retimes, RunInfo, RunSummary
from .types import Candidate, EvalResult, Status
from .variation import Proposer

PRIOR_FILE = "prior.jsonl"


# A run id names one folder under out_dir and one MLflow tag: letters, digits, '.', '_' and '-', starting with a
# letter or digit, at most 128 characters (so no '/', no '..', no hidden folder).
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def new_run_id(problem: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{problem}-{stamp}-{uuid.uuid4().hex[:6]}"


def check_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.fullmatch(run_id) or ".." in run_id:
        raise ConfigError(f"run id {run_id!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', starting "
                          "with a letter or digit, without '..'")
    return run_id


def refuse_existing(out_dir: str, run_id: str, resume: bool) -> Path:
    """The run's folder path, if a new run may have it: an existing run is continued only by resume."""
    folder = Path(out_dir) / check_run_id(run_id)
    if not resume and (folder / journal.NAME).exists():
        raise ConfigError(f"run {run_id!r} already exists in {folder}; continue it with `kernel-factory resume "
                          f"{run_id} --runs {out_dir}`, or choose another --run-id")
    return folder


def run_folder(out_dir: str, run_id: str, resume: bool) -> Path:
    """The run's folder, created now so that a path that cannot hold it fails before anything is evaluated.
    An existing run is continued only by resume: a second run under its id would corrupt its journal."""
    folder = refuse_existing(out_dir, run_id, resume)
    blocker = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise ConfigError(f"cannot use {str(folder)!r} as the run folder: {str(blocker)!r} is a file, not a folder "
                          f"(config key 'out_dir' is {out_dir!r})")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"cannot use {str(folder)!r} as the run folder (out_dir {out_dir!r}): "
                          f"{exc.strerror or exc}") from None
    return folder


class JournalCache:
    """An evaluator that answers from a killed run's journal first and evaluates only what it does not hold."""

    def __init__(self, inner: Evaluator, known: dict[str, EvalResult]):
        self.inner, self.known = inner, known
        self.info: EvaluatorInfo = inner.info
        if isinstance(inner, RecordedSpace):   # the cache offers what the evaluator it wraps offers
            self.space = inner.space
        if isinstance(inner, Retimes):
            self.retime = inner.retime
        if hasattr(inner, "accounting"):
            self.accounting = inner.accounting

    def evaluate(self, candidates: Sequence[Candidate]) -> list[EvalResult]:
        known = {c.id: self.known[c.id] for c in candidates if c.id in self.known}
        if hasattr(self.inner, "evaluate_known"):   # racing: the journal's results take their places in the race
            return self.inner.evaluate_known(candidates, known)
        todo = [c for c in candidates if c.id not in self.known]
        fresh = dict(zip((c.id for c in todo), self.inner.evaluate(todo) if todo else []))
        return [self.known.get(c.id) or fresh[c.id] for c in candidates]

    def close(self) -> None:
        self.inner.close()


def _prior(cfg: RunConfig, run: build.Run, kind: str, fingerprint: dict, key: str, run_id: str) -> list[Record]:
    """Earlier runs' candidates from the MLflow store (only when MLflow tracking is on and something uses them)."""
    s = cfg.search
    wanted = s.policy == "bandit" or s.lessons or s.surrogate.enabled or s.warm_start.enabled
    if "mlflow" not in cfg.observers or not wanted:
        return []
    from .prior import load_prior   # imports mlflow: only when earlier runs are read
    return load_prior(cfg.tracking.store, cfg.tracking.experiment or run.problem.name, run.problem.space,
                      fingerprint.get("gpu", ""), key, run_id, kind, fingerprint.get("recording", ""),
                      cfg.search.learn_from)


def execute(cfg: RunConfig, run_id: str | None = None, resume: bool = False) -> RunSummary:
    run = build.prepare(cfg)
    kind, why_not_gpu = build.evaluator_kind(cfg)
    run_id = new_run_id(run.problem.name) if run_id is None else run_id
    created = not refuse_existing(cfg.out_dir, run_id, resume).exists()
    observers = build.make_observers(run)
    # Stores are checked before the run folder exists and before anything is evaluated (observers that can).
    tracked = all([obs.preflight(run_id, resume) for obs in observers if hasattr(obs, "preflight")])
    folder = run_folder(cfg.out_dir, run_id, resume)
    try:
        return _execute(cfg, run, kind, why_not_gpu, run_id, folder, observers, resume, tracked)
    except BaseException:
        if created:
            discard_if_empty(folder)
        raise


def discard_if_empty(folder: Path) -> None:
    """Remove a run folder this process created when its journal holds no result and no generation (an error or
    Ctrl-C during start-up), so that no empty run is left behind; a journal that cannot be read is kept."""
    path = folder / journal.NAME
    if path.exists():
        try:
            events = journal.read(path).events
        except ConfigError:
            return
        if any(isinstance(e, (journal.Result, GenerationStats)) for e in events):
            return
    shutil.rmtree(folder, ignore_errors=True)


def _unfinished(run_id: str, history: History, interrupted: bool) -> RunSummary:
    """The summary of a run stopped by an error or by Ctrl-C outside the loop: what it evaluated so far, not zero."""
    mine = [r for r in history.records(prior=False) if r.status is not Status.INFEASIBLE]
    return RunSummary(run_id, max((r.generation for r in mine), default=0), len(mine),
                      "interrupted" if interrupted else "error", 0.0, 0.0, None, ())


def _close(observers: Sequence, summary: RunSummary) -> Exception | None:
    """Every started observer's on_end, even when one of them fails (a full disk fails the journal's, and MLflow
    must still close its run); the first failure is returned."""
    first = None
    for obs in observers:
        try:
            obs.on_end(summary)
        except Exception as exc:   # noqa: BLE001 - re-raised by the caller unless an earlier error is on its way
            first = first or exc
    return first


def _execute(cfg: RunConfig, run: build.Run, kind: str, why_not_gpu: str | None, run_id: str, folder: Path,
             observers: list, resume: bool, tracked: bool) -> RunSummary:
    evaluator = build.make_evaluator(run, kind)
    key = cases_key(run.problem.name, run.cases, run.baseline)
    if resume:
        evaluator = JournalCache(evaluator, journal.read(folder / journal.NAME).known())
        prior = [Record.from_json(json.loads(line)) for line in (folder / PRIOR_FILE).read_text().splitlines()]
    else:
        prior = _prior(cfg, run, kind, dict(evaluator.info.fingerprint), key, run_id) if tracked else []
        (folder / PRIOR_FILE).write_text("".join(json.dumps(r.to_json()) + "\n" for r in prior))
    history = History(prior)
    warm = history.best(cfg.search.warm_start.count) if cfg.search.warm_start.enabled else []
    seeds = [r.genome for r in warm]
    # A replay searches what its recording covers; the config may narrow either.
    space = build.restrict_space(evaluator.space if isinstance(evaluator, RecordedSpace) else run.problem.space,
                                 cfg.search.space)
    seeds += table_seeds(cfg.search.seeds_from, run.problem, space)
    resolved = replace(cfg, dtypes=tuple(sorted({c.dtype for c in run.cases})),
                       evaluator=replace(cfg.evaluator, kind=kind, baseline=run.baseline))
    fingerprint = dict(evaluator.info.fingerprint) | ({"why_replay": why_not_gpu} if why_not_gpu else {})
    fingerprint["ran_on_host"] = platform.node()   # a replay's other keys describe the recording's machine
    # Where each seed was bred, not copied. Its id here is its genome's: a gene added since changes the id.
    origins = {r.genome.id: history.bred_in(r.id) or r for r in warm}
    info = RunInfo(run_id, run.problem.name, cfg.seed, resolved.to_json(),
                   replace(evaluator.info, fingerprint=fingerprint), run.cases, cfg.out_dir, key,
                   tuple(g.id for g in seeds), len(prior), resume, {k: r.run_id for k, r in origins.items()},
                   {k: {"run": r.run_id, "candidate": r.id, "generation": r.generation} for k, r in origins.items()})
    proposer = Proposer(space, run.operators, cfg.search, run.problem, fingerprint)
    summary, started, interrupt, failed = None, [], None, None
    try:
        for obs in observers:
            obs.on_start(info)
            started.append(obs)
        if cfg.search.mode == "steady":
            summary = evolve_steady(space, proposer, evaluator, observers, cfg.search, cfg.workers,
                                    random.Random(cfg.seed), run_id, history, seeds)
        else:
            summary = evolve(space, proposer, evaluator, observers, cfg.search, random.Random(cfg.seed),
                             run_id, history, seeds, cfg.stop)
        summary = replace(summary, lessons=to_markdown(
            proposer.lessons, run.problem.name, fingerprint.get("gpu", "?"), len(history.records()),
            credit.report(credit.by_operator(history.outcomes())), info.evaluator.replay_note()))
    except Interrupted as exc:   # the observers close with what was measured; the interrupt goes on to the CLI
        summary, interrupt = exc.summary, exc.__cause__
    except BaseException as exc:
        failed = exc   # this goes on to the CLI; an error from closing the observers would hide it
        raise
    finally:
        evaluator.close()
        # stopped before the loop began, or by an error: close with what was evaluated so far
        summary = summary or _unfinished(run_id, history, isinstance(failed, KeyboardInterrupt))
        late = _close(started, summary)
        if late is not None and failed is None and interrupt is None:
            raise late
    if interrupt is not None:
        raise interrupt
    return summary


def table_seeds(path: str | None, problem, space, key: str = "search.seeds_from", dtype: str | None = None,
                cases: Sequence | None = None) -> list:
    """The genomes of a dispatch table (all, those one dtype dispatches to, or those it picks for these cases, in
    their order) that are feasible in this space (per-shape winners of earlier runs); `key` names the config key in
    errors."""
    if not path:
        return []
    try:
        table = op_table.Table(path, runnable=False)
    except op_table.TableError as exc:
        raise ConfigError(f"config key '{key}': {exc}") from None
    if table.problem != problem.name:
        raise ConfigError(f"config key '{key}': {path!r} is a table for {table.problem!r}, not {problem.name!r}")
    genomes = table.data.get("genomes", {})
    if cases is not None:
        picks = (table.choose(c.dtype, c.shape[1], c.shape[0]) for c in cases)
        ids = list(dict.fromkeys(pick[0] for pick in picks if pick))
    elif dtype is None:
        ids = list(table.data.get("order") or sorted(genomes))   # a seeds table lists those to try first first
    else:
        entry = table.data.get("dtypes", {}).get(dtype)
        ids = list(dict.fromkeys(op_table.chosen_genomes(entry))) if entry else []
    seeds = []
    for gid in ids:
        # a table from before a gene was added: that gene at its default
        adapted = render.adapt(genomes[gid]["genes"], genomes[gid].get("patch", {}), problem)[0]
        if adapted is not None and space.why_infeasible(adapted.gene_dict) is None and adapted not in seeds:
            seeds.append(adapted)
    return seeds


# Stop reasons that leave work to do: Ctrl-C or SIGTERM, and an error (a full disk). Any other one is final.
UNFINISHED = ("interrupted", "error")


class Finished(Exception):
    """`resume` of a run whose journal ends with a final stop reason: nothing is re-run (the message says so)."""


def resume(run_id: str, out_dir: str = "runs") -> RunSummary:
    """Continue a killed run from its journal (same config, seed and snapshot of earlier runs)."""
    path = Path(out_dir) / check_run_id(run_id) / journal.NAME
    if not path.is_file():
        runs = sorted(p.parent.name for p in Path(out_dir).glob(f"*/{journal.NAME}"))
        raise ConfigError(f"no journal for run {run_id!r} under {out_dir}/; runs there: {', '.join(runs) or 'none'}")
    done = journal.read(path)
    if done.end is not None and done.end.stop_reason not in UNFINISHED:
        end = done.end
        raise Finished(f"run {run_id!r} is finished (stopped by {end.stop_reason} after {end.evaluations} "
                       f"evaluations, best {end.best or 'none'}); there is nothing to resume: start a new run with "
                       f"`kernel-factory run CONFIG`")
    return execute(config_mod.parse(done.config), run_id, resume=True)
