"""What the factory learns from history: operator credit and the bandit, lessons, the surrogate, warm start."""
import random

import pytest

from kernel_factory.evo import config, credit, lessons
from kernel_factory.evo.evaluate import recording
from kernel_factory.evo.history import History, Record
from kernel_factory.evo.run import execute
from kernel_factory.evo.surrogate import Surrogate, screen
from kernel_factory.evo.types import Candidate, Genome, Status


def rec(id, genes, status=Status.OK, fitness=1.0, parents=(), op="random", gpu_s=0.1):
    return Record(id, genes, False, tuple(parents), op, 1 if parents else 0, status, fitness, gpu_s, "r")


def test_outcomes_compare_with_the_best_parent():
    h = History([rec("a", {"x": 1, "y": 1}, fitness=1.0), rec("b", {"x": 2, "y": 1}, fitness=2.0)])
    h.add([rec("c", {"x": 2, "y": 2}, fitness=2.5, parents=("a", "b"), op="uniform_crossover"),
           rec("d", {"x": 1, "y": 2}, Status.COMPILE_ERROR, 0.0, parents=("a",), op="gene_mutation")])
    c, d = h.outcomes("current")
    assert c.parent_fitness == 2.0 and c.changed == ("y",) and c.improved and c.gain == pytest.approx(0.2231, 1e-3)
    assert not d.improved and d.gain == 0.0 and d.changed == ("y",)
    assert [o.record.id for o in h.outcomes("prior")] == []
    tallies = credit.by_operator(h.outcomes())
    assert tallies["gene_mutation"].rates()["rate_compile_error"] == 1.0
    assert tallies["uniform_crossover"].rates()["rate_improved"] == 1.0
    assert credit.by_gene(h.outcomes())["y"].n == 1.0   # only the mutation's child counts per gene



def test_a_genome_recurring_across_runs_keeps_each_runs_parents_and_its_first_run():
    """Ids are content hashes: the same genome in two runs, bred from other parents in each. A child is compared
    with its own run's parent record, and a seed links to the earliest run that evaluated it."""
    rng = random.Random()
    f1, f2, f3 = (rng.uniform(0.5, 2.0) for _ in range(3))

    def in_run(run, id, fitness, parents=(), op="random", generation=0):
        return Record(id, {"x": id}, False, tuple(parents), op, generation, Status.OK, fitness, 0.1, run)

    prior = [in_run("run-1", "p", f1), in_run("run-1", "c", f1 + 0.5, ("p",), "gene_mutation", 4),
             in_run("run-2", "p", f2), in_run("run-2", "c", f2 + 0.25, ("p",), "seed", 0)]
    h = History(prior)
    assert h.bred_in("c") is prior[1] and h.bred_in("p") is prior[0] and h.bred_in("nowhere") is None
    first, second = h.outcomes("prior")
    assert first.parent_fitness == f1 and second.parent_fitness == f2   # each run's own measurement of p
    h.add([in_run("run-3", "p", f3), in_run("run-3", "k", f3 * 1.5, ("p",), "gene_mutation", 1)])
    assert h.outcomes("current")[0].parent_fitness == f3
    assert h.bred_in("p") is prior[0]   # this run's record does not move where a genome was first bred

def test_bandit_shifts_toward_improvement_per_gpu_second():
    bandit = credit.Bandit(["good", "bad"], floor=0.05)
    assert bandit.probabilities([]) == {"good": 0.5, "bad": 0.5}
    h = History([rec("p", {"x": 0}, fitness=1.0)])
    h.add([rec(f"g{i}", {"x": i}, fitness=1.2, parents=("p",), op="good") for i in range(1, 30)])
    h.add([rec(f"b{i}", {"x": -i}, fitness=0.8, parents=("p",), op="bad") for i in range(1, 30)])
    probs = bandit.probabilities(h.outcomes("current"))
    assert probs["good"] > 0.6 > probs["bad"] >= 0.05 and sum(probs.values()) == pytest.approx(1.0)


def test_lessons_forbid_failures_and_avoid_dead_ends():
    records = [rec(f"c{i}", {"load": "tma", "t": i}, Status.COMPILE_ERROR, 0.0) for i in range(3)]
    records += [rec(f"w{i}", {"load": "nc", "t": i}, Status.INCORRECT if i % 2 else Status.OK, 1.0) for i in range(4)]
    records += [rec(f"p{i}", {"load": "nc", "t": 9}, Status.CRASHED, 0.0) for i in range(3)]
    records += [rec("q", {"load": "plain", "t": 9})]   # t=9 works elsewhere: only the pair is to blame
    learned = lessons.learn(records, [])
    forbid = {l.genes: l for l in learned if l.action == "forbid"}
    assert forbid[(("load", "tma"),)].reason == "always compile_error"
    assert forbid[(("load", "nc"), ("t", 9))].reason == "always crashed"
    assert (("load", "nc"),) not in forbid and (("t", 9),) not in forbid
    assert not any(k == (("load", "tma"), ("t", 0)) for k in forbid), "a pair under a forbidden value is redundant"
    assert lessons.acceptance(learned, {"load": "tma", "t": 5})[0] == 0.0
    assert lessons.acceptance(learned, {"load": "nc", "t": 5})[0] == 1.0
    h = History([rec("p", {"u": 1}, fitness=2.0)])
    h.add([rec(f"k{i}", {"u": 4}, fitness=1.0, parents=("p",), op="gene_mutation") for i in range(12)])
    avoid = lessons.learn(h.records(), h.outcomes())
    assert [(l.action, l.genes) for l in avoid] == [("avoid", (("u", 4),))]
    assert lessons.acceptance(avoid, {"u": 4})[0] == lessons.AVOID_ACCEPT
    md = lessons.to_markdown(learned + avoid, "p", "GPU", 20, ["| op | 1 |"])
    assert "forbid load=tma: always compile_error (3 evaluations)" in md and "avoid u=4" in md


def test_surrogate_ranks_held_out_genomes(rmsnorm):
    """On the bundled H200 recording: trained on 150 genomes, it ranks 1000 others it has not seen."""
    import numpy as np
    from kernel_factory.evo.evaluate.replay import bundled_recordings
    from kernel_factory.evo.types import geomean_speedup
    rec_data = recording.read(bundled_recordings(rmsnorm)[0])
    base = rec_data.header["baseline_us"]
    rows = list(rec_data.entries.values())
    random.Random(0).shuffle(rows)
    records = [Record(g.id, g.gene_dict, False, (), "random", 0, r.status, geomean_speedup(r.times_us, base), 0.1,
                      "r") for g, r in rows]
    train, test = records[:150], records[150:1150]
    model = Surrogate(rmsnorm.space)
    assert not model.fit(train[:5], min_ok=24)
    assert model.fit(train, min_ok=24)
    pred = model.predict([dict(r.genes) for r in test])
    true = np.array([r.fitness for r in test])
    rank = lambda a: np.argsort(np.argsort(a))
    assert np.corrcoef(rank(pred), rank(true))[0, 1] > 0.8, "the model must rank unseen genomes usefully"
    assert true[np.argsort(-pred)[:50]].mean() > true.mean() + 0.2
    cands = [Candidate(Genome.of(r.genes)) for r in test[:40]]
    chosen = screen(cands, 10, model.predict, explore=0.0, rng=random.Random(0))
    scores = dict(zip((c.id for c in cands), model.predict([c.genome.gene_dict for c in cands])))
    assert sorted(scores[c.id] for c in chosen) == sorted(scores.values())[-10:]


def test_warm_start_and_policy_metrics_across_runs(replay_config):
    from mlflow.tracking import MlflowClient
    first = execute(config.parse(replay_config))
    second = execute(config.parse(replay_config, ("seed=11",)))
    client = MlflowClient(f"sqlite:///{replay_config['tracking']['store']}")
    exp = client.get_experiment_by_name("rmsnorm_fwd")
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`kf.run_id` = '{second.run_id}' and tags.`kf.kind` = 'evolution'")
    assert parent.data.tags["kf.warm_start"] == "8 genomes from earlier runs"
    assert int(parent.data.tags["kf.prior_records"]) == first.evaluations
    from kernel_factory.evo.prior import read_table   # candidates are a table on the parent run
    table = read_table(client, parent.info.run_id)
    seeds = [(c, g) for c, o, g in zip(table["candidate"], table["operator"], table["generation"]) if o == "seed"]
    assert len(seeds) == 8 and {int(g) for _, g in seeds} == {0}
    # the first run's best fitness is among the seeds (the synthetic space holds ties at the top: any of them)
    firsts = read_table(client, client.search_runs(
        [exp.experiment_id], f"tags.`kf.run_id` = '{first.run_id}' and tags.`kf.kind` = 'evolution'")[0].info.run_id)
    fitness_of = {c: f for c, f in zip(firsts["candidate"], firsts["fitness"]) if f is not None}   # measured
    assert max(fitness_of.get(c, 0.0) for c, _ in seeds) == pytest.approx(first.best[1].fitness, abs=1e-4)
    assert second.best[1].fitness >= first.best[1].fitness
    probs = client.get_metric_history(parent.info.run_id, "op_prob.gene_mutation")
    assert len(probs) == second.generations + 1
    assert len({round(m.value, 6) for m in probs}) > 1, "the bandit must move the probabilities"
    artifacts = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert "lessons.md" in artifacts
