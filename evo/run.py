"""One evolutionary run from a validated config, or the continuation of a killed one: build the parts, read what
earlier runs teach (MLflow), tell the observers, evolve, and close everything even when interrupted.

Resume re-executes the run from its start with the same seed and the same snapshot of earlier runs; candidates the
journal already holds are answered from it, so the re-execution follows the same path without evaluating anything
twice, and continues past the point where the run was killed."""
from __future__ import annotations

import json
import random
import uuid
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from . import build, config as config_mod
from .config import ConfigError, RunConfig
from .history import History, Record
from .loop import evolve
from .lessons import to_markdown
from . import credit
from .observers import journal
from .protocols import Evaluator, EvaluatorInfo, RunInfo, RunSummary
from .types import Candidate, EvalResult
from .variation import Proposer

PRIOR_FILE = "prior.jsonl"


def new_run_id(problem: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{problem}-{stamp}-{uuid.uuid4().hex[:6]}"


class JournalCache:
    """An evaluator that answers from a killed run's journal first and evaluates only what it does not hold."""

    def __init__(self, inner: Evaluator, known: dict[str, EvalResult]):
        self.inner, self.known = inner, known
        self.info: EvaluatorInfo = inner.info
        if hasattr(inner, "space"):
            self.space = inner.space
        if hasattr(inner, "retime"):
            self.retime = inner.retime

    def evaluate(self, candidates: Sequence[Candidate]) -> list[EvalResult]:
        todo = [c for c in candidates if c.id not in self.known]
        fresh = dict(zip((c.id for c in todo), self.inner.evaluate(todo) if todo else []))
        return [self.known.get(c.id) or fresh[c.id] for c in candidates]

    def close(self) -> None:
        self.inner.close()


def _prior(cfg: RunConfig, run: build.Run, gpu: str, key: str, run_id: str) -> list[Record]:
    """Earlier runs' candidates from the MLflow store (only when MLflow tracking is on and something uses them)."""
    s = cfg.search
    wanted = s.policy == "bandit" or s.lessons or s.surrogate.enabled or s.warm_start.enabled
    if "mlflow" not in cfg.observers or not wanted:
        return []
    from .observers.mlflow_store import load_prior
    return load_prior(cfg.tracking.store, cfg.tracking.experiment or run.problem.name, run.problem.space, gpu, key,
                      run_id)


def execute(cfg: RunConfig, run_id: str | None = None, resume: bool = False) -> RunSummary:
    run = build.prepare(cfg)
    kind, why_not_gpu = build.evaluator_kind(cfg)
    run_id = run_id or new_run_id(run.problem.name)
    folder = Path(cfg.out_dir) / run_id
    evaluator = build.make_evaluator(run, kind)
    from .observers.mlflow_store import cases_key
    key = cases_key(run.problem.name, run.cases, run.baseline)
    if resume:
        known = {r["candidate"]["id"]: EvalResult.from_json(r["result"])
                 for r in journal.read(folder / "journal.jsonl") if r["event"] == "result"}
        evaluator = JournalCache(evaluator, known)
        prior = [Record.from_json(json.loads(line)) for line in (folder / PRIOR_FILE).read_text().splitlines()]
    else:
        prior = _prior(cfg, run, evaluator.info.fingerprint.get("gpu", ""), key, run_id)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / PRIOR_FILE).write_text("".join(json.dumps(r.to_json()) + "\n" for r in prior))
    history = History(prior)
    warm = history.best(cfg.search.warm_start.count) if cfg.search.warm_start.enabled else []
    seeds = [r.genome for r in warm]
    # A replay searches what its recording covers; the config may narrow either.
    space = build.restrict_space(getattr(evaluator, "space", run.problem.space), cfg.search.space)
    seeds += table_seeds(cfg.search.seeds_from, run.problem, space)
    observers = build.make_observers(run)
    resolved = replace(cfg, dtypes=tuple(sorted({c.dtype for c in run.cases})),
                       evaluator=replace(cfg.evaluator, kind=kind, baseline=run.baseline))
    fingerprint = dict(evaluator.info.fingerprint) | ({"why_replay": why_not_gpu} if why_not_gpu else {})
    info = RunInfo(run_id, run.problem.name, cfg.seed, resolved.to_json(),
                   replace(evaluator.info, fingerprint=fingerprint), run.cases, cfg.out_dir, key,
                   tuple(g.id for g in seeds), len(prior), resume, {r.genome.id: r.run_id for r in warm})
    proposer = Proposer(space, run.operators, cfg.search, run.problem, fingerprint)
    summary = None
    try:
        for obs in observers:
            obs.on_start(info)
        summary = evolve(space, proposer, evaluator, observers, cfg.search, random.Random(cfg.seed),
                         run_id, history, seeds)
        summary = replace(summary, lessons=to_markdown(
            proposer.lessons, run.problem.name, fingerprint.get("gpu", "?"), len(history.records()),
            credit.report(credit.by_operator(history.outcomes()))))
    finally:
        evaluator.close()
        if summary is None:   # interrupted: still close the observers with what was measured
            summary = RunSummary(run_id, 0, 0, "interrupted", 0.0, 0.0, None, ())
        for obs in observers:
            obs.on_end(summary)
    return summary


def table_seeds(path: str | None, problem, space) -> list:
    """The genomes of a dispatch table that are feasible in this run's space (per-shape winners of earlier runs)."""
    if not path:
        return []
    from .tools import dispatch
    table = dispatch.load(path)
    if table.get("problem") != problem.name:
        raise ConfigError(f"config key 'search.seeds_from': {path!r} is a table for {table.get('problem')!r}, "
                          f"not {problem.name!r}")
    seeds = []
    for gid in sorted(table.get("genomes", {})):
        g = dispatch.genome(table, gid)   # a table from before a gene was added: that gene at its default
        adapted = render.adapt(g.gene_dict, g.patch_dict, problem)[0]
        if adapted is not None and space.why_infeasible(adapted.gene_dict) is None:
            seeds.append(adapted)
    return seeds


def resume(run_id: str, out_dir: str = "runs") -> RunSummary:
    """Continue a killed run from its journal (same config, seed and snapshot of earlier runs)."""
    path = Path(out_dir) / run_id / "journal.jsonl"
    if not path.is_file():
        runs = sorted(p.parent.name for p in Path(out_dir).glob("*/journal.jsonl"))
        raise ConfigError(f"no journal for run {run_id!r} under {out_dir}/; runs there: {', '.join(runs) or 'none'}")
    start = journal.read(path)[0]
    cfg = config_mod.parse(start["config"])
    return execute(cfg, run_id, resume=True)
