"""What the MLflow UI shows are true numbers: a fitness only where one was measured, a fitness change only between
measured candidates, numbers that MLflow's table viewer sorts by value, no metric that stays zero, and GPU and
compile seconds that a replay did not spend named recorded_*."""
from __future__ import annotations

import itertools
import json
import random
import re

from kernel_factory.evo import accounting
from kernel_factory.evo.evaluate.replay import ReplayEvaluator
from kernel_factory.evo.observers import lineage, mlflow_view as view
from kernel_factory.evo.observers.mlflow_numbers import accounting_metrics, candidate_metrics
from kernel_factory.evo.types import BuildInfo, Candidate, Case, EvalResult, Genome, Status

CASE = "bfloat16:32768x256"
REFUSED = "refused by the problem's rule before compiling: 53248 B of static shared memory exceeds 49152 B"


def ui_order(cell) -> list[tuple[int, object]]:
    """How MLflow 3.17's table viewer orders a cell: it shows every cell as text (JSON for a non-string) and sorts
    text that holds digits with runs of digits compared as integers, other runs as text, text before a number."""
    text = cell if isinstance(cell, str) else json.dumps(cell)
    return [(1, int(part)) if part.isdigit() else (0, part) for part in re.split(r"(\d+)", text.lower()) if part]


def genomes(problem, n: int) -> list[Genome]:
    genes = problem.space.genes
    combos = itertools.product(*(g.choices for g in genes[:4]))
    return [Genome.of({**problem.space.defaults(), **dict(zip((g.name for g in genes[:4]), c))})
            for c in itertools.islice(combos, n)]


def measured(cand: Candidate, fitness: float, rng: random.Random) -> EvalResult:
    t = rng.uniform(5, 50)
    return EvalResult(cand.id, Status.OK, fitness, {CASE: t}, {CASE: 0.01 * t}, {CASE: t * fitness}, {CASE: 2e3},
                      {"bfloat16": BuildInfo(registers=rng.randint(20, 90), compile_s=rng.uniform(0.1, 2))},
                      evaluator="replay", gpu_s=rng.uniform(0.01, 0.5))


def test_the_candidate_table_has_only_measured_numbers_that_sort_by_value(rmsnorm):
    rng = random.Random()
    g = genomes(rmsnorm, 12)
    parent, failed = Candidate(g[0]), Candidate(g[1])
    refused = Candidate(g[2], (parent.id,), "gene_mutation", 1)
    orphan = Candidate(g[3], (failed.id,), "gene_mutation", 1)      # bred from a failure
    kids = [Candidate(x, (parent.id,), "gene_mutation", 1) for x in g[4:]]
    # 1.105 and 1.0234 are the pair that a viewer comparing "105" with "234" puts the wrong way round.
    fits = [1.105, 1.0234] + [rng.uniform(0.2, 12.0) for _ in kids[2:]]
    results = [(parent, measured(parent, rng.uniform(0.5, 2), rng)),
               (failed, EvalResult(failed.id, Status.COMPILE_ERROR, message="ptxas error: too many resources")),
               (refused, EvalResult(refused.id, Status.INFEASIBLE, message=REFUSED, evaluator="replay")),
               (orphan, measured(orphan, rng.uniform(0.5, 2), rng))]
    results += [(k, measured(k, f, rng)) for k, f in zip(kids, fits)]
    graph = lineage.build(results, "run-t")
    table = view.candidate_table(results, graph, 0.0, [CASE], replay=True)
    rows = {cid: dict(zip(table, values)) for cid, values in zip(table["candidate"], zip(*table.values()))}

    for cand in (failed, refused):   # no fitness and no fitness change where nothing was measured
        assert rows[cand.id]["fitness"] == "" and rows[cand.id]["fitness_change"] == ""
    assert rows[refused.id]["why"] == REFUSED and rows[refused.id]["status"] == "infeasible"
    assert rows[orphan.id]["fitness"] != "" and rows[orphan.id]["fitness_change"] == ""   # its parent: no number
    base = results[0][1].fitness
    for kid, (_, res) in zip(kids, results[4:]):
        assert float(rows[kid.id]["fitness_change"]) == round(res.fitness - base, 4)

    # MLflow's viewer sorts these cells as their numbers sort; empty cells go to one end.
    for column in ("fitness", f"speedup {CASE}", "recorded_gpu_s"):
        cells = [c for c in table[column] if c != ""]
        assert sorted(cells, key=ui_order) == sorted(cells, key=float), column
    assert "gpu_s" not in table   # a replay's GPU seconds are the recording's

    back = view.table_numbers(table)   # as prior.read_table returns it
    assert back["fitness"][table["candidate"].index(refused.id)] is None
    for cand, res in results:
        if res.status is Status.OK:
            assert abs(back["fitness"][table["candidate"].index(cand.id)] - res.fitness) <= 5e-5


def test_candidate_metrics_name_what_this_run_did_not_spend():
    rng = random.Random()
    compile_s, gpu_s = rng.uniform(0.1, 3), rng.uniform(0.01, 1)
    built = {"bfloat16": BuildInfo(registers=40, compile_s=compile_s, cached=True)}
    ok = EvalResult("a", Status.OK, rng.uniform(0.5, 2), {CASE: 7.0}, build=built, gpu_s=gpu_s)
    replayed = candidate_metrics(3, ok, replay=True)
    assert replayed["recorded_gpu_s"] == gpu_s and replayed["recorded_compile_s.bfloat16"] == compile_s
    assert "gpu_s" not in replayed and "compile_s.bfloat16" not in replayed and replayed["fitness"] == ok.fitness
    fresh = {"bfloat16": BuildInfo(registers=40, compile_s=compile_s)}
    live = candidate_metrics(3, EvalResult("a", Status.OK, ok.fitness, {CASE: 7.0}, build=fresh, gpu_s=gpu_s))
    assert live["gpu_s"] == gpu_s and live["compile_s.bfloat16"] == compile_s
    failed = candidate_metrics(3, EvalResult("b", Status.INFEASIBLE, message=REFUSED))
    assert failed == {"generation": 3}   # no fitness: nothing was measured


def test_a_replay_logs_no_zero_and_its_compile_seconds_as_recorded(rmsnorm, tmp_path):
    """The bundled recording's answers through the run's accounting into the parent's metrics."""
    cases = [Case(s, "bfloat16") for s in rmsnorm.shape_sets["benchmark"]]
    with_build = []
    replay = ReplayEvaluator(rmsnorm, cases, "torch_eager", 0, str(tmp_path))
    try:
        entries = [genome for genome, res in replay.rec.entries.values() if res.build and not genome.patch]
        picked = [Candidate(genome) for genome in random.Random().sample(entries, 12)]
        with_build = list(zip(picked, replay.evaluate(picked)))
    finally:
        replay.close()
    results = [r for _, r in with_build]
    recorded = sum(info.compile_s for r in results for info in r.build.values())
    assert recorded > 0 and all(info.cached for r in results for info in r.build.values())
    books = accounting.of(replay, with_build, wall_s=random.uniform(1, 9))
    assert books["compile_s_host"] == 0   # the recording's compiles, not this run's
    metrics = accounting_metrics(books, results, replay=True)
    assert metrics == {"recorded_compile_s_host": recorded}   # every other figure of a replay is zero
