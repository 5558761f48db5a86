"""The loop end to end on the replay evaluator: budgets, elitism, reproducibility, lineage, failures as values."""
import json
from pathlib import Path

import pytest

from kernel_factory.evo.regions import regions as regions_of
from kernel_factory.evo import config
from kernel_factory.evo import journal
from kernel_factory.evo.run import execute
from kernel_factory.evo.types import Status


def run(cfg_dict, *overrides, observers=("journal",)):
    cfg = config.parse({**cfg_dict, "observers": list(observers)}, overrides)
    return execute(cfg), cfg


def journal_of(cfg, summary):
    return journal.records(Path(cfg.out_dir) / summary.run_id / "journal.jsonl")


def test_replay_run_improves_and_records_everything(replay_config):
    summary, cfg = run(replay_config)
    assert summary.stop_reason == "generations" and summary.generations == 4
    records = journal_of(cfg, summary)
    results = [r for r in records if r["event"] == "result"]
    assert len(results) == summary.evaluations     # (the rule's refusals are journalled apart: no evaluations)
    ids = [r["candidate"]["id"] for r in results]
    assert len(ids) == len(set(ids)), "a genome must never be evaluated twice"
    assert records[0]["event"] == "start" and records[0]["evaluator"]["kind"] == "replay"
    assert records[-1]["event"] == "end" and records[-1]["best"] == summary.best[0].id
    logbook = records[-1]["logbook"]
    assert [row["gen"] for row in logbook] == list(range(5)) and logbook[-1]["evals"] == summary.evaluations
    gens = [r for r in records if r["event"] == "generation"]
    best = [g["best_fitness"] for g in gens]
    assert best == sorted(best), "elitism: the best fitness never drops"
    first_gen = [r for r in results if r["generation"] == 0]
    assert any(r["candidate"]["operator"] == "defaults" for r in first_gen)
    later = [r for r in results if r["generation"] > 0]
    assert later and all(r["candidate"]["parents"] for r in later)
    assert {"gene_mutation", "uniform_crossover", "ptx_mutation"} <= {r["candidate"]["operator"] for r in later}
    crossover = [r for r in later if r["candidate"]["operator"] == "uniform_crossover"]
    assert any(len(r["candidate"]["parents"]) == 2 for r in crossover)
    failed = [r for r in results if r["result"]["status"] != Status.OK.value]
    assert all(r["result"]["fitness"] == 0.0 for r in failed)


def test_search_improves_on_the_template_defaults(replay_config, synthetic_recording):
    from kernel_factory.evo.evaluate import recording
    rec = recording.read(synthetic_recording)
    base = rec.header["baseline_us"]
    from kernel_factory.evo.types import geomean_speedup
    optimum = max(geomean_speedup(r.times_us, base) for _, r in rec.entries.values() if r.times_us)
    summary, cfg = run(replay_config, "search.init_random=0", "search.generations=10")
    results = [r for r in journal_of(cfg, summary) if r["event"] == "result"]
    assert [r["candidate"]["operator"] for r in results if r["generation"] == 0] == ["defaults"]
    defaults_fitness = results[0]["result"]["fitness"]
    assert summary.best[1].fitness > defaults_fitness
    assert summary.best[1].fitness >= 0.98 * optimum, (summary.best[1].fitness, optimum)


def test_same_seed_same_run(replay_config):
    a, cfg_a = run(replay_config)
    b, cfg_b = run(replay_config)
    c, cfg_c = run(replay_config, "seed=99")
    seq = lambda s, cfg: [(r["candidate"]["id"], r["candidate"]["operator"], r["result"]["fitness"])
                          for r in journal_of(cfg, s) if r["event"] == "result"]
    assert seq(a, cfg_a) == seq(b, cfg_b)
    assert seq(a, cfg_a) != seq(c, cfg_c)


@pytest.mark.parametrize("override, reason, limit", [
    ("search.max_evaluations=20", "max_evaluations", 20),
    ("search.wall_clock_s=0.0", "wall_clock", None),
])
def test_budgets_stop_the_run(replay_config, override, reason, limit):
    summary, _ = run(replay_config, override)
    assert summary.stop_reason == reason
    if limit:
        assert summary.evaluations == limit


def test_patched_genome_is_not_recorded_under_replay(replay_config, rmsnorm):
    from kernel_factory.evo import build
    from kernel_factory.evo.evaluate import render
    from kernel_factory.evo.types import Candidate, Genome
    prepared = build.prepare(config.parse(replay_config))
    ev = build.make_evaluator(prepared, "replay")
    plain = Candidate(Genome.of(rmsnorm.space.defaults()))
    # a patch that compiles to another binary (an identical one would be replayed; see test_patched_replay.py)
    second = regions_of(rmsnorm.template())["second_pass"].replace("rstd, w_vec);", "rstd * 1.0001f, w_vec);")
    patched = Candidate(Genome.of(rmsnorm.space.defaults(), {"second_pass": second}))
    r_plain, r_patched = ev.evaluate([plain, patched])
    assert r_plain.status is Status.OK and r_plain.fitness > 0 and r_plain.evaluator == "replay"
    assert r_patched.status is Status.NOT_RECORDED and r_patched.fitness == 0.0
    assert r_patched.message == "no recorded measurement for this binary"
    assert "SYNTHETIC" in ev.info.label or "SYNTHETIC" in json.dumps(dict(ev.info.fingerprint))
    ev.close()


def test_per_case_elites_keep_every_rows_champion(replay_config, synthetic_recording):
    from kernel_factory.evo.evaluate import recording
    from kernel_factory.evo.loop import case_champions
    summary, cfg = run(replay_config, "search.per_case_elites=true", "search.generations=3", "search.population=16")
    records = journal_of(cfg, summary)
    results = [r for r in records if r["event"] == "result" and r["result"]["times_us"]]
    gens = [r for r in records if r["event"] == "generation"]
    population = set(gens[-1]["population"])
    kept = [r for r in results if r["candidate"]["id"] in population]
    for case in results[0]["result"]["times_us"]:
        fastest = min(r["result"]["times_us"][case] for r in results)
        assert min(r["result"]["times_us"][case] for r in kept) == fastest, f"{case}: the fastest genome left"
    assert case_champions([]) == []
    assert summary.finalists == (), "a replay cannot re-time finalists"


class Retiming:
    """Wraps the replay evaluator with a retime() that answers from the recording's times (a stand-in)."""

    def __init__(self, inner):
        self.inner, self.info, self.asked = inner, inner.info, []
        self.space = inner.space

    def evaluate(self, candidates):
        return self.inner.evaluate(candidates)

    def retime(self, candidates):
        self.asked += [c.id for c in candidates]
        return [{"candidate_id": c.id, "status": "ok", "speedup": 1.0} for c in candidates]

    def close(self):
        self.inner.close()


def test_finalists_are_the_hall_of_fame_top_and_case_champions(replay_config, monkeypatch):
    from kernel_factory.evo import build
    made = {}

    def make(run, kind):
        made["ev"] = Retiming(original(run, kind))
        return made["ev"]
    original = build.make_evaluator
    monkeypatch.setattr(build, "make_evaluator", make)
    summary, cfg = run(replay_config, "search.finalists=2", "search.per_case_elites=true")
    asked = made["ev"].asked
    assert asked[:2] == [c.id for c, _ in summary.hall_of_fame[:2]]
    assert len(asked) == len(set(asked)) and len(asked) >= 2
    assert [f["candidate_id"] for f in summary.finalists] == asked
    end = journal_of(cfg, summary)[-1]
    assert [f["candidate_id"] for f in end["finalists"]] == asked


def test_seeds_from_a_dispatch_table_join_generation_zero(replay_config, tmp_path, synthetic_recording):
    from kernel_factory.evo.tools import export
    table_path = tmp_path / "table.json"
    export.export("rmsnorm_fwd", [str(synthetic_recording)], table_path)
    table = json.loads(table_path.read_text())
    summary, cfg = run(replay_config, f"search.seeds_from={table_path}")
    first = {r["candidate"]["id"] for r in journal_of(cfg, summary) if r["event"] == "result" and r["generation"] == 0}
    assert set(table["genomes"]) <= first


def test_seeds_from_an_older_table_take_new_genes_at_their_defaults(tmp_path, synthetic_recording):
    """A table exported before the problem gained a gene still seeds a run: the gene at its default."""
    from kernel_factory.evo import run as run_mod
    from kernel_factory.evo.tools import export
    from kernel_factory.evo import registry
    problem = registry.load("problem", "rmsnorm_fwd")
    table_path = tmp_path / "table.json"
    export.export("rmsnorm_fwd", [str(synthetic_recording)], table_path)
    table = json.loads(table_path.read_text())
    for entry in table["genomes"].values():
        del entry["genes"]["cluster"]
    table_path.write_text(json.dumps(table))
    seeds = run_mod.table_seeds(str(table_path), problem, problem.space)
    assert len(seeds) == len(table["genomes"]) and all(g.gene_dict["cluster"] == 1 for g in seeds)
    narrow = problem.space.restricted({"cluster": (2, 4)})   # a run narrowed away from them gets none
    assert run_mod.table_seeds(str(table_path), problem, narrow) == []


def test_children_the_rule_refuses_are_shown_with_its_reason_and_never_evaluated(replay_config, rmsnorm):
    summary, cfg = run(replay_config, "search.generations=8")
    records = journal_of(cfg, summary)
    results = [r for r in records if r["event"] in ("result", "refused")]
    refused = [r for r in records if r["event"] == "refused"]
    assert refused, "the operators propose some children that the rule refuses"
    assert all(r["result"]["status"] == Status.INFEASIBLE.value for r in refused)
    assert len(results) - len(refused) == summary.evaluations
    for r in refused:
        why = rmsnorm.space.why_infeasible(r["candidate"]["genome"]["genes"])
        assert why and r["result"]["message"] == f"refused by the problem's rule before compiling: {why}"
        assert r["result"]["evaluator"] == "rule" and r["candidate"]["parents"] and r["generation"] > 0
    ids = [r["candidate"]["id"] for r in results]
    assert len(ids) == len(set(ids)), "each refusal is shown once, and never as a child too"


def test_ctrl_c_while_results_are_told_waits_until_every_observer_has_them():
    """A result is in the journal and MLflow and the summary, or in none: Ctrl-C (or SIGTERM) that lands while the
    observers are being told is raised once the last one has it."""
    import os
    import signal
    from kernel_factory.evo.config import SearchConfig
    from kernel_factory.evo.history import History
    from kernel_factory.evo.loop import RunState
    from kernel_factory.evo.types import Candidate, EvalResult, Genome

    told: list[str] = []

    class Teller:
        def __init__(self, name, interrupt=False):
            self.name, self.interrupt = name, interrupt

        def on_results(self, generation, results):
            if self.interrupt:
                os.kill(os.getpid(), signal.SIGINT)
            told.append(self.name)

    state = RunState(None, [Teller("journal", interrupt=True), Teller("mlflow")], None, History(), SearchConfig(),
                     "ctrl-c")
    cand = Candidate(Genome.of({"block": 128}))
    # Python's own Ctrl-C handler, as in a terminal: a process started in the background by a non-interactive shell
    # inherits SIGINT ignored, and then no KeyboardInterrupt comes at all
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            state.record([cand], [EvalResult(cand.id, Status.OK, fitness=1.5)], 0)
        assert told == ["journal", "mlflow"] and list(state.seen) == [cand.id]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "the usual Ctrl-C handler is back"
    finally:
        signal.signal(signal.SIGINT, inherited)
