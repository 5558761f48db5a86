"""Racing on the CPU: the cut rule, replay's charge per leg, a raced replay run (cut candidates recorded with their
evidence, never as a fitness; less GPU time), resume's top-k, lessons, lineage and the candidate table, accounting's
compile wait, and the time-to-parity command."""
import json
from pathlib import Path

import pytest

from kernel_factory.evo import accounting, config, lessons
from kernel_factory.evo.evaluate import racing
from kernel_factory.evo.evaluate.replay import first_leg
from kernel_factory.evo.history import Record
from kernel_factory.evo.observers import lineage, mlflow_view
from kernel_factory.evo.run import JournalCache, execute
from kernel_factory.evo.tools import parity
from kernel_factory.evo.types import Candidate, EvalResult, Genome, Status

KEYS = ("bfloat16:1x64", "bfloat16:2x64")
BASE = {"bfloat16:1x64": 10.0, "bfloat16:2x64": 10.0, "bfloat16:4x64": 10.0}


def timed(cid, t, iqr=0.0, keys=KEYS):
    times = {k: t for k in keys}
    return EvalResult(cid, Status.OK, 10.0 / t, times, {k: iqr for k in keys}, BASE, gpu_s=1.0)


def test_a_candidate_is_cut_only_when_its_bound_stays_below_the_threshold():
    gaps = [0.0, 0.01, -0.01]   # the cheap cases predicted the full fitness well so far
    slow = racing.judge(timed("slow", 10.0, 0.05), 1.2, gaps, KEYS, 0.99)
    assert slow["cut"] and slow["bound_fitness"] < slow["threshold_fitness"] == 1.2
    assert slow["partial_fitness"] == pytest.approx(1.0) and slow["times_us"] == {k: 10.0 for k in KEYS}
    close = racing.judge(timed("close", 8.5, 0.05), 1.2, gaps, KEYS, 0.99)
    assert not close["cut"], "within the bound's reach: timed in full"
    noisy = racing.judge(timed("noisy", 10.0, 8.0), 1.2, gaps, KEYS, 0.99)
    assert not noisy["cut"], "a noisy timing widens the bound"
    misled = racing.judge(timed("slow", 10.0, 0.05), 1.2, [0.3, -0.3, 0.25, -0.2], KEYS, 0.99)
    assert not misled["cut"], "cheap cases that rank badly widen the bound"
    cut = racing.cut_result(timed("slow", 10.0), {**slow, "top_k": 3}, 3)
    assert cut.status is Status.CUT and cut.fitness == 0 and not cut.times_us and cut.race["cut"]
    assert not cut.status.failed and EvalResult.from_json(json.loads(json.dumps(cut.to_json()))) == cut


def test_replay_charges_the_gate_and_the_timed_cases_share_of_the_recorded_time():
    full = timed("a", 5.0, keys=tuple(BASE))
    full = EvalResult("a", Status.OK, 2.0, {"bfloat16:1x64": 1.0, "bfloat16:2x64": 1.0, "bfloat16:4x64": 8.0},
                      {}, BASE, gpu_s=1.0)
    first = first_leg(full, ["bfloat16:1x64"], 0.25)
    assert first.gpu_s == pytest.approx(0.25 + 0.75 * 0.1) and set(first.times_us) == {"bfloat16:1x64"}
    assert first.fitness == pytest.approx(10.0)
    failed = EvalResult("b", Status.INCORRECT, gpu_s=0.4)
    assert first_leg(failed, ["bfloat16:1x64"], 0.25) == failed


RACE = ("search.racing.enabled=true", "search.racing.cases=6", "search.racing.confidence=0.9",
        "search.population=12", "search.generations=10", "workers.count=1", "workers.time_scale=0.01")


def run(cfg_dict, *overrides):
    cfg = config.parse({**cfg_dict, "observers": ["journal"]}, overrides)
    summary = execute(cfg)
    rows = [json.loads(line) for line in open(Path(cfg.out_dir) / summary.run_id / "journal.jsonl")]
    return summary, [r for r in rows if r.get("event") == "result"]


def test_a_raced_replay_run_records_cuts_as_such_and_spends_less_gpu_time(replay_config):
    plain, _ = run(replay_config, *RACE[1:])
    raced, rows = run(replay_config, *RACE)
    cuts = [r["result"] for r in rows if r["result"]["status"] == "cut"]
    assert cuts, "the synthetic space has hopeless candidates to cut"
    for cut in cuts:
        assert cut["fitness"] == 0 and not cut["times_us"] and cut["gpu_s"] > 0
        ev = cut["race"]
        assert ev["cut"] and ev["bound_fitness"] < ev["threshold_fitness"] and len(ev["cases"]) == 6
    assert raced.evaluations == plain.evaluations and raced.gpu_s < plain.gpu_s
    assert raced.accounting["cut"] == len(cuts)
    assert all(res.status is Status.OK for _, res in raced.hall_of_fame if res.fitness > 0)
    assert raced.best[1].status is Status.OK


def test_a_bad_racing_setting_is_one_clear_error(replay_config):
    with pytest.raises(config.ConfigError, match="search.racing.confidence"):
        config.parse(replay_config, ("search.racing.confidence=1.5",))
    with pytest.raises(config.ConfigError, match="'search.racing.lanes' is unknown"):
        config.parse(replay_config, ("search.racing.lanes=2",))


def test_resume_hands_the_journals_results_to_the_race_with_their_batch():
    """JournalCache gives a racing evaluator each batch whole, with the journal's results for it, so that they take
    their places in the race order (the kill-and-resume test below checks the order end to end)."""
    class Inner:
        info = None

        def __init__(self):
            self.calls = []

        def evaluate_known(self, candidates, known):
            self.calls.append(([c.id for c in candidates], dict(known)))
            return [known.get(c.id) or EvalResult(c.id, Status.OK) for c in candidates]

    inner = Inner()
    cands = [Candidate(Genome.of({"a": 1})), Candidate(Genome.of({"a": 2}))]
    known = {cands[0].id: timed(cands[0].id, 5.0)}
    out = JournalCache(inner, known).evaluate(cands)
    assert inner.calls == [([c.id for c in cands], known)] and out[0] is known[cands[0].id]


def test_lessons_never_forbid_a_gene_for_being_cut():
    recs = [Record(f"c{i}", {"a": 1, "b": i}, False, (), "op", 1, Status.CUT, 0.0, 0.1, "r") for i in range(8)]
    assert not [lesson for lesson in lessons.learn(recs, []) if lesson.action == "forbid"]
    failed = [Record(f"f{i}", {"a": 1, "b": i}, False, (), "op", 1, Status.INCORRECT, 0.0, 0.1, "r") for i in range(8)]
    assert [lesson for lesson in lessons.learn(failed, []) if lesson.action == "forbid"], "the same as failures would"


def test_lineage_and_candidate_table_show_a_cut_candidate_without_fitness():
    ok = (Candidate(Genome.of({"a": 1})), timed(Genome.of({"a": 1}).id, 5.0))
    cut_cand = Candidate(Genome.of({"a": 2}), parents=(ok[0].id,), generation=1)
    ev = racing.judge(timed(cut_cand.id, 10.0, 0.01), 1.9, [0.0, 0.01], KEYS, 0.99)
    cut = racing.cut_result(timed(cut_cand.id, 10.0), {**ev, "top_k": 1}, 3)
    graph = lineage.build([ok, (cut_cand, cut)])
    assert graph.nodes[cut_cand.id]["status"] == "cut" and graph.nodes[cut_cand.id]["fitness"] is None
    assert lineage.best(graph) == ok[0].id
    table = mlflow_view.candidate_table([ok, (cut_cand, cut)], graph, 3000.0, list(KEYS))
    row = table["candidate"].index(cut_cand.id)
    assert table["status"][row] == "cut" and table["fitness"][row] in (None, "")
    assert "cut by racing" in table["why"][row]


def test_accounting_reports_gpu_idle_waiting_for_compiles_and_cuts():
    class Books:
        def accounting(self):
            return {"compile_wait_s": 3.0}
    res = [EvalResult("a", Status.OK, 1.0, {"k": 1.0}, evaluator="gpu", gpu_s=6.0),
           EvalResult("b", Status.CUT, evaluator="gpu", gpu_s=3.0)]
    books = accounting.of(Books(), [(Candidate(Genome.of({"a": i})), r) for i, r in enumerate(res)], 20.0)
    assert books["gpu_idle_compile_s"] == 3.0 and books["gpu_idle_compile_fraction"] == pytest.approx(0.25)
    assert books["cut"] == 1 and books["evaluated_per_gpu_minute"] == pytest.approx(2 / (9 / 60))
    assert "GPU idle waiting for compiles 3.0 s (25%)" in accounting.headline(books)
    from kernel_factory.evo.observers.mlflow_numbers import accounting_metrics
    metrics = accounting_metrics(books, res, replay=False)
    assert metrics["cut_total"] == 1 and metrics["gpu_idle_compile_s"] == 3.0


def test_time_to_parity_in_replay(replay_config, tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({**replay_config, "observers": ["journal"]}))
    assert parity.main(["--config", str(path), "--budget-gpu-min", "5", "--target", "1.1"]) == 0
    out = capsys.readouterr().out
    assert "parity: 1.100x reached after" in out and "replay: the recording's times stand in" in out
    assert parity.main(["--config", str(path), "--budget-gpu-min", "0.05", "--target", "9"]) == 1
    assert "not reached in 0.05 simulated GPU-minutes" in capsys.readouterr().out
    assert parity.main(["--config", str(path), "--budget-gpu-min", "0"]) == 2


def test_the_comparison_command_prints_both_modes_per_seed(replay_config, tmp_path, capsys):
    from kernel_factory.evo.tools import racing as racing_tool
    path = tmp_path / "c.yaml"
    path.write_text(json.dumps({**replay_config, "search": {"population": 12, "generations": 6}}))
    code = racing_tool.main(["--config", str(path), "--seeds", "3", "-o", "search.racing.cases=6",
                             "-o", "search.racing.confidence=0.9"])
    out = capsys.readouterr().out
    assert code in (0, 1) and "| 3 | off | 84 | 0 |" in out and "| 3 | on | 84 |" in out
    assert "| 3 | on | 84 | 0 |" not in out, "racing cut some candidates"
    assert "simulated GPU-min (recorded)" in out and "racing's final best: the same on" in out
    assert racing_tool.main(["--config", str(path), "--seeds", "x"]) == 2


def test_a_raced_run_killed_and_resumed_races_as_the_uninterrupted_one(tmp_path, synthetic_recording):
    """Resume answers cut candidates from the journal and puts the journal's full timings back into the race, so
    the re-executed run cuts exactly what the uninterrupted one cut, with the same evidence."""
    import signal
    import subprocess
    import sys
    import yaml
    cli = [sys.executable, "-m", "kernel_factory.evo.tools.cli"]
    forked = Path(__file__).with_name("forked_cli.py")

    def cfg(folder):
        folder.mkdir(parents=True)
        data = {"problem": "rmsnorm_fwd", "seed": 4, "out_dir": str(folder / "runs"), "observers": ["journal"],
                "search": {"population": 12, "generations": 8,
                           "racing": {"enabled": True, "cases": 6, "confidence": 0.9}},
                "evaluator": {"kind": "replay", "replay": {"recording": str(synthetic_recording)}}}
        (folder / "run.yaml").write_text(yaml.safe_dump(data))
        return folder / "run.yaml"

    def outcomes(folder):
        rows = [json.loads(line) for line in open(folder / "runs" / "raced" / "journal.jsonl")]
        return [(r["candidate"]["id"], r["result"]["status"], r["result"].get("race")) for r in rows
                if r.get("event") == "result"]
    ref = subprocess.run([*cli, "run", str(cfg(tmp_path / "ref")), "--run-id", "raced"], capture_output=True,
                         text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]
    killed = cfg(tmp_path / "killed")
    for point, args in (("journal:40", ["run", str(killed), "--run-id", "raced"]),
                        ("journal:45", ["resume", "raced", "--runs", str(tmp_path / "killed" / "runs")])):
        died = subprocess.run([sys.executable, str(forked), point, *args], capture_output=True, text=True,
                              timeout=300)
        assert died.returncode == -signal.SIGKILL, died.stderr[-2000:]
    done = subprocess.run([*cli, "resume", "raced", "--runs", str(tmp_path / "killed" / "runs")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    want = outcomes(tmp_path / "ref")
    assert any(status == "cut" for _, status, _ in want)
    assert outcomes(tmp_path / "killed") == want


def test_the_gpu_evaluator_counts_the_time_its_worker_waits_for_compiles():
    import time
    from kernel_factory.evo.evaluate.gpu import GpuEvaluator
    ev = GpuEvaluator.__new__(GpuEvaluator)   # no GPU here: only the counting is under test
    ev.compile_wait_s = 0.0

    def slow_compiles():
        for i in range(3):
            time.sleep(0.02)
            yield i
    assert list(ev._waited(slow_compiles())) == [0, 1, 2]
    assert ev.compile_wait_s >= 0.06   # each sleep is at least what it asked for


class LegsHandle:
    """Stands in for worker_process.WorkerHandle without a GPU: answers every eval request with the cases it asks for, and
    keeps the requests, so that a test sees what each racing leg sent."""

    made: list = []

    def __init__(self, setup, setup_timeout_s=600.0, env=None):
        self.setup = setup
        self.ready = {"baseline_us": {k: 10.0 for k in setup["bench_cases"]}, "copy_gbps": 3000.0,
                      "fingerprint": {"gpu": "fake"}}
        self.restarts, self.requests = 0, []
        LegsHandle.made.append(self)

    def ask(self, request, deadline_s):
        self.requests.append(request)
        cases = request.get("cases", self.setup["bench_cases"])
        return {"op": "result", "status": "ok", "times_us": {k: 5.0 for k in cases}, "iqr_us": {k: 0.1 for k in cases},
                "gpu_s": 0.01 * len(cases)}

    def close(self):
        pass


@pytest.mark.parametrize("pooled", [False, True])
def test_the_gpu_evaluators_legs_gate_once_and_time_each_case_once(monkeypatch, tmp_path, rmsnorm, bench_cases, pooled):
    from kernel_factory.evo.evaluate import gpu, gpu_pool
    monkeypatch.setattr(gpu, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(gpu, "WorkerHandle", LegsHandle)
    monkeypatch.setattr(gpu_pool, "WorkerHandle", LegsHandle)
    monkeypatch.setattr(gpu_pool, "local_devices", lambda gpus: ["0"])
    LegsHandle.made = []
    cases = bench_cases[:3]
    if pooled:
        ev = gpu_pool.PooledGpuEvaluator(rmsnorm, cases, "torch_eager", 0, str(tmp_path),
                                         workers=config.WorkersConfig(backend="local"))
    else:
        ev = gpu.GpuEvaluator(rmsnorm, cases, "torch_eager", 0, str(tmp_path))
    try:
        cand = Candidate(Genome.of(next(rmsnorm.space.enumerate())))
        keys = [cases[0].key]
        (first,) = ev.time_first([cand], keys)
        (rest,) = ev.time_rest([cand], [first])
        plain = ev.evaluate([Candidate(Genome.of(list(rmsnorm.space.enumerate())[1]))])[0]
    finally:
        ev.close()
    sent = [r for h in LegsHandle.made for r in h.requests if r["id"] == cand.id]
    assert [r.get("cases") for r in sent] == [keys, [c.key for c in cases[1:]]]
    assert [r.get("gate", True) for r in sent] == [True, False], "the second leg is not gated again"
    assert set(first.times_us) == set(keys) and set(rest.times_us) == {c.key for c in cases}
    assert rest.fitness == pytest.approx(2.0) and rest.gpu_s == pytest.approx(0.02)
    assert set(plain.times_us) == {c.key for c in cases}, "outside a race, every case is timed"
