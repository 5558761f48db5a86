"""A workload campaign: `kernel-factory run CONFIG` where the config has a `workload:` section.

1. Draw the problem's workload (narrowed by the config) into a training set and a disjoint held-out set; record
   both, with the buckets, in the campaign folder and in MLflow.
2. Search every bucket of the training set with the ordinary evolutionary run (its cases: that bucket's training
   shapes), in bucket order, each warm-started from the winners of the nearest buckets searched before, so that
   what works spreads across buckets and crossover mixes neighbours.
3. Time the best genomes of every bucket on every training shape of their dtype (the panel), in one evaluator.
4. Learn the dispatch rule per dtype from the panel (evo/tools/learn.py) and write it as a dispatch table, with
   the kernels built, that the op can load.
5. On a GPU, bench the table on the held-out set against the peers (evo/tools/heldout.py); elsewhere say how.

No search, panel or rule ever sees a held-out shape; tests/test_workload.py checks that on the journals.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import build, journal, registry
from ..config import ConfigError, RunConfig, WorkloadConfig
from ..evaluate.worker_process import parked_workers
from ..run import execute, new_run_id, run_folder, table_seeds
from ..types import Candidate, Case, Genome
from ..workload import ServesWorkload, by_bucket, distance, narrow, split
from . import dispatch, learn
from .workload_panels import (PLAN, Plan, earlier_panels, panel_cases, panel_results, panel_winners,  # noqa: F401
                              read_panel, table_genomes, twin_values, twins)

TABLE = "dispatch.json"
WINNERS = 2          # genomes of each bucket that seed its neighbours and join the panel


def plan(cfg: RunConfig) -> Plan:
    """The narrowed workload, its seeded split and the training buckets; ConfigError for a bad workload key."""
    problem = registry.load("problem", cfg.problem)
    if not isinstance(problem, ServesWorkload):
        raise ConfigError(f"config key 'workload': problem {cfg.problem!r} declares no workload (a `workload` "
                          f"attribute, evo/workload.py); drop the key or add one to the plugin")
    w: WorkloadConfig = cfg.workload
    try:
        served = narrow(problem.workload, dtypes=w.dtypes, m=w.m, n=w.n, small_m_share=w.small_m_share,
                        laws=dict(w.laws) or None, max_bytes=w.max_bytes)
        if w.train_more < 0:
            raise ValueError(f"train_more': {w.train_more} (a count of training shapes: 0 or more)")
        sets = split(served, w.seed, w.train, w.heldout)
        # the training streams drawn on: their first `train` cases are the training set's, the rest only panel shapes
        more = tuple(c for c in split(served, w.seed, w.train + w.train_more, w.heldout).train
                     if c not in set(sets.train)) if w.train_more else ()
    except ValueError as exc:
        raise ConfigError(f"config key 'workload.{exc}") from None
    buckets = by_bucket(sets.train, w.bucket_by_dtype)
    if w.buckets:
        unknown = [b for b in w.buckets if b not in buckets]
        if unknown:
            raise ConfigError(f"config key 'workload.buckets': {unknown[0]!r} holds no training shape; the training "
                              f"set fills {', '.join(buckets)}")
        buckets = {b: buckets[b] for b in w.buckets}
    names = [gene.name for gene in problem.space.genes]
    for name, value in w.panel_twins.items():
        if name not in names:
            raise ConfigError(f"config key 'workload.panel_twins.{name}': {cfg.problem} has no gene {name!r}; its "
                              f"genes: {', '.join(names)}")
        for v in twin_values(value):
            if v not in problem.space[name].choices:
                raise ConfigError(f"config key 'workload.panel_twins.{name}': {v!r} is not one of "
                                  f"{list(problem.space[name].choices)}")
    if not w.search and (w.searched_from or w.panels_from):
        raise ConfigError("config key 'workload.search': false already skips the searches; it excludes "
                          f"'workload.{'searched_from' if w.searched_from else 'panels_from'}'")
    if not w.search and not (w.panel_from or w.panel_winners_from):
        raise ConfigError("config key 'workload.search': false leaves the panels empty without "
                          "'workload.panel_from' (a dispatch table) or 'workload.panel_winners_from' (a campaign)")
    return Plan(served, sets, buckets, more)


def slug(bucket: str) -> str:
    return bucket.replace("/", ".").replace("<=", "le").replace("<", "lt").replace(">", "gt")


def winners(path: Path, count: int) -> list[Genome]:
    """The `count` fittest distinct genomes a bucket's run measured."""
    ranked = sorted((r.fitness, c.genome.id, c.genome) for c, r in journal.read(path).pairs()
                    if not r.status.failed and r.fitness > 0)
    out: list[Genome] = []
    for _, _, genome in reversed(ranked):
        if genome not in out:
            out.append(genome)
    return out[:count]


def seeds_table(path: Path, problem: str, genomes: Sequence[Genome]) -> Path:
    """A selection-only table of a bucket's seeds, in the order to try them (`order`: the file's keys are sorted):
    the bucket's run reads it as search.seeds_from."""
    table = {"format": dispatch.OLD_FORMAT, "problem": problem, "dtypes": {},
             "genomes": {g.id: g.to_json() for g in genomes}, "order": [g.id for g in genomes]}
    path.write_text(dispatch.dumps(table))
    return path


def bucket_config(cfg: RunConfig, cases: Sequence[Case], seeds: Path | None,
                  wall_s: float | None = None) -> RunConfig:
    """The ordinary run config of one bucket's search: its training shapes, its evaluation budget (and its share of
    the campaign's search clock), its seeds."""
    budget = cfg.workload.per_bucket
    clock = min(x for x in (cfg.search.wall_clock_s, wall_s, math.inf) if x is not None)
    search = replace(cfg.search, max_evaluations=budget, generations=max(cfg.search.generations, budget),
                     seeds_from=str(seeds) if seeds else None, wall_clock_s=None if clock == math.inf else clock)
    return replace(cfg, dtypes=tuple(sorted({c.dtype for c in cases})), shapes=",".join(c.key for c in cases),
                   search=search, workload=None)


def search_buckets(cfg: RunConfig, campaign: str, folder: Path, p: Plan) -> dict[str, list[Genome]]:
    """Step 2: one run per bucket, in order; returns each bucket's winners."""
    found: dict[str, list[Genome]] = {}
    problem = registry.load("problem", cfg.problem)
    started = time.monotonic()
    for i, (b, cases) in enumerate(p.buckets.items()):
        share = None
        if cfg.workload.search_s is not None:   # what is left of the clock, shared by the buckets left
            share = max(1.0, (cfg.workload.search_s - (time.monotonic() - started)) / (len(p.buckets) - i))
        near = sorted((distance(b, other), other) for other in found if distance(b, other) < 10)
        # the genomes the op dispatches to for these shapes today first (the search sets out to beat them), then the
        # neighbours' winners
        seeds = table_seeds(cfg.workload.panel_from, problem, problem.space, "workload.panel_from", cases=cases)
        picked = len(seeds)
        seeds += [g for _, other in near[:cfg.workload.neighbours] for g in found[other] if g not in seeds]
        seed_file = seeds_table(folder / f"seeds-{slug(b)}.json", cfg.problem, seeds) if seeds else None
        run_id = f"{campaign}.{slug(b)}"
        print(f"workload: bucket {b}: {len(cases)} training shapes, {len(seeds)} seeds ({picked} the table picks "
              f"for them, the rest from {', '.join(o for _, o in near[:cfg.workload.neighbours]) or 'no bucket yet'})"
              f" -> run {run_id}", file=sys.stderr)
        execute(bucket_config(cfg, cases, seed_file, share), run_id)
        found[b] = winners(Path(cfg.out_dir) / run_id / journal.NAME, WINNERS)
    return found


def searched_winners(cfg: RunConfig, p: Plan) -> dict[str, list[Genome]]:
    """Step 2 of an earlier campaign: each of its buckets' winners, read from its folder's journals (gzipped, as
    committed) or from out_dir; the buckets must be this plan's."""
    folder = Path(cfg.workload.searched_from)
    try:
        earlier = json.loads((folder / PLAN).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"config key 'workload.searched_from': {str(folder)!r} is not a campaign folder ({exc})")
    if set(earlier["buckets"]) != set(p.buckets):
        raise ConfigError(f"config key 'workload.searched_from': {str(folder)!r} searched other buckets than this "
                          f"workload draws; use the same workload keys as that campaign")
    found = {}
    for b in p.buckets:
        name = f"{earlier['campaign']}.{slug(b)}"
        paths = [folder / "journals" / name / "journal.jsonl.gz", Path(cfg.out_dir) / name / journal.NAME]
        path = next((x for x in paths if x.is_file()), None)
        if path is None:
            raise ConfigError(f"config key 'workload.searched_from': no journal of bucket {b} ({name}) under "
                              f"{folder}/journals or {cfg.out_dir}")
        found[b] = winners(path, WINNERS)
    return found


def panel(cfg: RunConfig, folder: Path, p: Plan, found: Mapping[str, list[Genome]]) -> dict[str, Path]:
    """Step 3: per dtype, the winners of its buckets (and a table's genomes) timed on all its training shapes by
    one evaluator."""
    out, earlier, known = {}, panel_winners(cfg, p), panel_results(cfg, p)
    for dtype in p.workload.dtypes:
        cases = panel_cases(cfg, p, dtype)
        genomes = panel_genomes(cfg, p, found, earlier, dtype)
        if not cases or not genomes:
            continue
        results, timed = timed_panel(cfg, cases, genomes, known.get(dtype, {}))
        path = out[dtype] = folder / f"panel-{dtype}.jsonl"
        path.write_text("".join(json.dumps({"genome": g.to_json(), "result": r}) + "\n"
                                for g, r in zip(genomes, results)))
        print(f"workload: panel {dtype}: {len(genomes)} genomes x {len(cases)} training shapes"
              + (f" ({timed} of {len(genomes) * len(cases)} timed here, the rest from {cfg.workload.panel_times_from})"
                 if dtype in known else ""), file=sys.stderr)
    return out


def panel_genomes(cfg: RunConfig, p: Plan, found: Mapping[str, list[Genome]],
                  earlier: Mapping[str, list[Genome]], dtype: str) -> list[Genome]:
    """The genomes a dtype's panel times: its buckets' winners (with panel_all_dtypes, the other dtypes' too), the
    table's genomes, an earlier campaign's panel winners (`earlier`, by dtype), and the twins of all of them."""
    space = registry.load("problem", cfg.problem).space
    genomes: list[Genome] = []
    for rank in range(WINNERS):   # every bucket's best first, then every bucket's second
        for b, gs in found.items():
            if b.split("/")[0] in (dtype, "any") and rank < len(gs) and gs[rank] not in genomes:
                genomes.append(gs[rank])
    genomes = genomes[:cfg.workload.panel]
    everywhere = cfg.workload.panel_all_dtypes
    if everywhere:   # the other dtypes' bucket winners, best first
        others = [gs[0] for b, gs in found.items() if b.split("/")[0] not in (dtype, "any") and gs]
        genomes += [g for g in dict.fromkeys(others) if g not in genomes][:cfg.workload.panel]
    for d in (dtype, *[d for d in p.workload.dtypes if d != dtype and everywhere]):
        genomes += [g for g in table_genomes(cfg, d) if g not in genomes]
        genomes += [g for g in earlier.get(d, []) if g not in genomes and space.why_infeasible(g.gene_dict) is None]
    return genomes + twins(space, genomes, cfg.workload.panel_twins)


def timed_panel(cfg: RunConfig, cases: Sequence[Case], genomes: Sequence[Genome],
                known: Mapping[str, Mapping[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """Each genome's panel result (as JSON) on `cases`, and how many (genome, case) pairs were timed: a genome
    `known` (an earlier panel's correct results by genome id) keeps the times it has there and is timed on the
    cases it lacks; genomes lacking the same cases are timed together by one evaluator."""
    lacking: dict[tuple[Case, ...], list[Genome]] = {}
    for g in genomes:
        have = known.get(g.id, {}).get("times_us", {})
        lacking.setdefault(tuple(c for c in cases if c.key not in have), []).append(g)
    fresh: dict[str, dict[str, Any]] = {}
    for todo, group in lacking.items():
        if not todo:
            continue
        pcfg = bucket_config(cfg, todo, None)
        evaluator = build.make_evaluator(build.prepare(pcfg), build.evaluator_kind(pcfg)[0])
        try:
            results = evaluator.evaluate([Candidate(g, operator="panel") for g in group])
        finally:
            evaluator.close()
        fresh.update({g.id: r.to_json() for g, r in zip(group, results)})
    keys = {c.key for c in cases}
    out = []
    for g in genomes:
        old = {k: v for k, v in known.get(g.id, {}).get("times_us", {}).items() if k in keys}
        new = fresh.get(g.id)
        out.append(dict(known[g.id], times_us=old) if new is None else
                   new if new["status"] != "ok" else dict(new, times_us={**old, **new["times_us"]}))
    return out, sum(len(todo) * len(group) for todo, group in lacking.items())


def learn_table(problem_name: str, panels: Mapping[str, Path], depth: int, campaign: str,
                rule: str = "tree") -> dict[str, Any]:
    """Step 4: the dispatch table (selection: genomes and a rule per dtype) learned from the panels: a decision tree
    of `depth`, nearest shapes, or per dtype whichever of the two does better on each training case left out of its
    learning in turn (`rule`: tree, near, auto); with its fit on the training set and on the cases left out."""
    table: dict[str, Any] = {"format": dispatch.OLD_FORMAT, "problem": problem_name, "genomes": {}, "dtypes": {},
                             "learned": {"campaign": campaign, "from": "panel times of the training set",
                                         "rule": rule}}
    learners = {"tree": lambda t: learn.fit(t, depth=depth), "near": learn.fit_near}
    for dtype, path in sorted(panels.items()):
        genomes, times = read_panel(path)
        if not times:
            continue
        outs = {name: learn.left_out(times, learners[name]) for name in (learners if rule == "auto" else [rule])}
        kind = min(outs, key=lambda name: outs[name][0])
        fitted, out = learners[kind](times), outs[kind]
        general = learn.fit(times, depth=0).tree["leaf"]
        table["dtypes"][dtype] = {"rule": fitted.tree, "general": {"genome": general}, "by_n": {},
                                  "fit": {"cases": len(times), "slowdown": fitted.slowdown,
                                          "worst": fitted.worst, "worst_case": fitted.worst_case,
                                          "left_out": {"slowdown": out[0], "worst": out[1], "worst_case": out[2]},
                                          "rule": kind, **({"left_out_of": {n: o[0] for n, o in outs.items()}}
                                                           if len(outs) > 1 else {})}}
        named = set(dispatch.op_table.chosen_genomes(table["dtypes"][dtype]))
        table["dtypes"][dtype]["candidates"] = [g for g in learn.winners(times) if g not in named]
        for gid in {general, *dispatch.op_table.chosen_genomes(table["dtypes"][dtype])}:
            table["genomes"][gid] = genomes[gid].to_json()
        print(f"workload: rule {dtype} ({kind}): {len(set(dispatch.op_table.chosen_genomes(table['dtypes'][dtype])))} "
              f"genomes, on the training set {fitted.slowdown:.3f}x the fastest measured genome per shape (geomean)"
              f", worst {fitted.worst:.3f}x at {fitted.worst_case}; each case left out of the learning "
              f"{out[0]:.3f}x, worst {out[1]:.3f}x at {out[2]}", file=sys.stderr)
    return table


def track(cfg: RunConfig, campaign: str, folder: Path, p: Plan, mlflow_run: str | None = None,
          status: str = "FINISHED") -> str | None:
    """The campaign's own MLflow run: opened with the plan (training and held-out sets, buckets) as an artifact and
    its counts as params; closed with the learned table and the held-out report. None when MLflow is off."""
    if "mlflow" not in cfg.observers:
        return None
    from ..observers.mlflow_store import experiment_id, open_tracking
    client, _ = open_tracking(cfg.tracking)
    if mlflow_run is None:
        exp = experiment_id(client, cfg.tracking.experiment or cfg.problem, Path(cfg.tracking.artifacts).resolve())
        note = (f"Workload campaign {campaign}: {len(p.split.train)} training and {len(p.split.heldout)} held-out "
                f"shapes of {cfg.problem} ({', '.join(p.workload.dtypes)}), {len(p.buckets)} bucket searches (runs "
                f"{campaign}.<bucket>). The held-out shapes are in workload.json; no search saw them.")
        mlflow_run = client.create_run(exp, run_name=f"workload {campaign}", tags={
            "kf.kind": "workload", "kf.campaign": campaign, "mlflow.note.content": note}).info.run_id
        for key, value in (("workload.train", len(p.split.train)), ("workload.heldout", len(p.split.heldout)),
                           ("workload.buckets", len(p.buckets)), ("workload.seed", cfg.workload.seed),
                           ("workload.dtypes", ",".join(p.workload.dtypes))):
            client.log_param(mlflow_run, key, str(value))
        client.log_artifact(mlflow_run, str(folder / PLAN))
        return mlflow_run
    for path in (folder / "kernels" / TABLE, folder / "heldout.md", *sorted(folder.glob("panel-*.jsonl"))):
        if path.is_file():
            client.log_artifact(mlflow_run, str(path))
    client.set_terminated(mlflow_run, status)
    return mlflow_run


def run_campaign(cfg: RunConfig, campaign: str | None = None) -> Path:
    """Steps 1-5; returns the campaign folder (workload.json, seeds, panels, the table kernels/dispatch.json with
    its cubins and sources beside it, and on a GPU the held-out report)."""
    p = plan(cfg)
    problem = registry.load("problem", cfg.problem)
    if cfg.workload.validate:   # a peer the held-out bench cannot load stops the campaign now, not after the searches
        from .heldout import check_peers
        check_peers(problem, cfg.workload.without)
    campaign = campaign or new_run_id(f"{cfg.problem}-workload")
    folder = run_folder(cfg.out_dir, campaign, resume=False)
    (folder / PLAN).write_text(json.dumps({"campaign": campaign, "config": cfg.to_json(), **p.to_json()}, indent=1))
    print(f"workload {campaign}: {len(p.split.train)} training and {len(p.split.heldout)} held-out shapes over "
          f"{', '.join(p.workload.dtypes)}; " + (f"learned again from {cfg.workload.panels_from}'s panels"
                                                  if cfg.workload.panels_from else
                                                  f"{len(p.buckets)} buckets to search" if cfg.workload.search else
                                                  "no search (workload.search is false)"), file=sys.stderr)
    mlflow_run = track(cfg, campaign, folder, p)
    status = "FAILED"
    try:
        if cfg.workload.panels_from:   # no search and no timing: the rule learned again from recorded panels
            panels = earlier_panels(cfg, folder, p)
        else:
            with parked_workers():   # one GPU worker process serves every bucket's run and the panels
                found = ({} if not cfg.workload.search else searched_winners(cfg, p) if cfg.workload.searched_from
                         else search_buckets(cfg, campaign, folder, p))
                panels = panel(cfg, folder, p, found)
        table = learn_table(cfg.problem, panels, cfg.workload.rule_depth, campaign, cfg.workload.rule)
        dispatch.build(problem, table, folder / "kernels" / dispatch.CUBIN_FOLDER)
        (folder / "kernels" / TABLE).write_text(dispatch.dumps(table))
        if cfg.workload.validate:
            from .heldout import validate   # the held-out bench needs a GPU; it says so and how to run it elsewhere
            validate(cfg, folder, p, cfg.workload.without)
        else:
            print(f"workload: held-out bench skipped (workload.validate is false); `kernel-factory heldout {folder}` "
                  f"runs it", file=sys.stderr)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if mlflow_run:
            track(cfg, campaign, folder, p, mlflow_run, status)
    return folder


def left_out_report(paths: Sequence[str], depth: int = 4) -> str:
    """Per panel file and learner (a tree of `depth`, nearest shapes): the fit on its training shapes and on each
    shape left out of the learning in turn, by the rule's pick and by first-call tuning among the table's genomes
    (the rule's and the other shapes' winners).
    `python -m kernel_factory.evo.tools.workload PANEL.jsonl ...`"""
    lines = []
    for path in paths:
        _, times = read_panel(Path(path))
        for name, learner in (("tree", lambda t: learn.fit(t, depth=depth)), ("near", learn.fit_near)):
            fitted, out = learner(times), learn.left_out(times, learner)
            tuned = learn.left_out(times, learner, tuned=True)
            lines.append(f"{Path(path).name} {name}: training {fitted.slowdown:.3f}x, worst {fitted.worst:.3f}x; "
                         f"left out {out[0]:.3f}x, worst {out[1]:.3f}x at {out[2]}; tuned among the table's "
                         f"genomes, left out {tuned[0]:.3f}x, worst {tuned[1]:.3f}x at {tuned[2]}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(left_out_report(sys.argv[1:]))

