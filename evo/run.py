"""One evolutionary run from a validated config: build the parts, tell the observers, evolve, close everything
(the evaluator's worker, the compile pool, MLflow's writer) even when the run is interrupted."""
from __future__ import annotations

import random
import uuid
from dataclasses import replace
from datetime import datetime, timezone

from kernel_factory.evo import build
from kernel_factory.evo.config import RunConfig
from kernel_factory.evo.loop import evolve
from kernel_factory.evo.protocols import RunInfo, RunSummary


def new_run_id(problem: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{problem}-{stamp}-{uuid.uuid4().hex[:6]}"


def execute(cfg: RunConfig, run_id: str | None = None) -> RunSummary:
    run = build.prepare(cfg)
    kind, why_not_gpu = build.evaluator_kind(cfg)
    evaluator = build.make_evaluator(run, kind)
    observers = build.make_observers(run)
    run_id = run_id or new_run_id(run.problem.name)
    resolved = replace(cfg, dtypes=tuple(sorted({c.dtype for c in run.cases})),
                      evaluator=replace(cfg.evaluator, kind=kind, baseline=run.baseline))
    fingerprint = dict(evaluator.info.fingerprint)
    if why_not_gpu:
        fingerprint["why_replay"] = why_not_gpu
    info = RunInfo(run_id, run.problem.name, cfg.seed, resolved.to_json(),
                   replace(evaluator.info, fingerprint=fingerprint), run.cases, cfg.out_dir)
    summary = None
    try:
        for obs in observers:
            obs.on_start(info)
        summary = evolve(run.problem.space, run.operators, evaluator, observers, cfg.search,
                         random.Random(cfg.seed), run_id)
    finally:
        evaluator.close()
        if summary is None:   # interrupted: still close the observers with what was measured
            summary = RunSummary(run_id, 0, 0, "interrupted", 0.0, 0.0, None, ())
        for obs in observers:
            obs.on_end(summary)
    return summary
