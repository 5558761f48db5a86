"""The search's fitness against its own A/B re-time: the agreement of each finalist, the figure the run reports
(A/B, with a warning when they disagree), the baseline's measurements during a run, and the agreement table."""
import json
import math
import random
import threading
from multiprocessing import Pipe
from pathlib import Path

import pytest

from kernel_factory.evo import build, config
from kernel_factory.evo.agreement import NOISE_FLOOR, agreement, noise_band
from kernel_factory.evo.run import execute
from kernel_factory.evo.types import EvalResult, Status, geomean_speedup

QUICKSTART = Path(__file__).resolve().parents[1] / "configs" / "quickstart.yaml"


def result(rng, keys, iqr=0.01):
    times = {k: rng.uniform(5, 500) for k in keys}
    base = {k: t * rng.uniform(0.8, 1.4) for k, t in times.items()}
    return EvalResult("c0", Status.OK, geomean_speedup(times, base), times, {k: iqr * t for k, t in times.items()},
                      base)


def ab_record(search: EvalResult, factor: float, rng, iqr=0.01):
    """An A/B record whose geomean is `factor` x the search's (each case moved by factor, with jitter)."""
    times = {k: t * rng.uniform(0.97, 1.03) for k, t in search.times_us.items()}
    base = {k: times[k] * search.baseline_us[k] / search.times_us[k] * factor for k in times}
    return {"candidate_id": "c0", "status": "ok", "reps": 100, "times_us": times, "baseline_us": base,
            "iqr_us": {k: iqr * t for k, t in times.items()}, "baseline_iqr_us": {k: iqr * b for k, b in base.items()},
            "speedup": geomean_speedup(times, base)}


def test_agreement_flags_a_search_figure_off_by_more_than_the_noise():
    rng = random.Random()
    keys = [f"bfloat16:{rng.randrange(1, 9999)}x{n}" for n in (256, 1024, 4096, 8192, 65536)]
    search = result(rng, keys)
    close, far = ab_record(search, 1.0, rng), ab_record(search, 0.90, rng)
    a, b = agreement(close, search), agreement(far, search)
    assert a["agrees"] and a["search_fitness"] == search.fitness
    assert math.isclose(a["ab_over_search"], close["speedup"] / search.fitness)
    assert not b["agrees"] and b["ab_over_search"] < 0.93
    assert NOISE_FLOOR <= a["noise"] < 0.05
    # Noisy timings widen the band: a 10% gap within the noise of samples 60% apart is not flagged
    noisy = result(rng, keys, iqr=0.6)
    assert noise_band(noisy, ab_record(noisy, 0.9, rng, iqr=0.6)) > 0.1
    assert agreement(ab_record(noisy, 0.9, rng, iqr=0.6), noisy)["agrees"]
    failed = {"candidate_id": "c0", "status": "crashed", "message": "x"}
    assert agreement(failed, search) == failed


def test_the_table_says_which_side_moved_between_the_search_and_the_ab():
    """A search whose baseline ran 8% slow on one case (the candidate's times as in the A/B): the split puts the
    difference on the baseline side and names that case."""
    from kernel_factory.evo.tools.agreement import parts, split
    rng = random.Random()
    keys = [f"bfloat16:{rng.randrange(1, 9999)}x{n}" for n in (256, 1024, 4096)]
    search = result(rng, keys)
    fin = ab_record(search, 1.0, rng)
    fin["times_us"] = dict(search.times_us)
    fin["baseline_us"] = {**search.baseline_us, keys[1]: search.baseline_us[keys[1]] / 1.08}
    p = parts(search, fin)
    assert p["candidate"] == pytest.approx(1.0) and p["baseline"] == pytest.approx(1.08 ** (1 / 3))
    assert p["baseline_worst_case"] == keys[1] and p["baseline_worst"] == pytest.approx(1.08)
    assert f"most: {keys[1]} 1.080" in split(p) and split(None) == "-"


def test_baseline_log_keeps_every_measurement_relative_to_the_first():
    from kernel_factory.evo.evaluate.gpu import BaselineLog
    rng = random.Random()
    first = {f"bfloat16:{i}x4096": rng.uniform(10, 100) for i in range(1, 5)}
    log = BaselineLog(first)
    slower = {k: v * 1.10 for k, v in first.items()}
    log.note({"baseline_retimed_us": slower, "baseline_gpu_s": 0.25, "baseline_us": slower})
    log.note({"baseline_us": slower})                      # a reply that did not re-time adds nothing
    log.note({"baseline_error": "RuntimeError: boom"})
    books = log.books()
    assert books["measurements"] == 2 and books["gpu_s"] == 0.25 and books["errors"] == ["RuntimeError: boom"]
    assert books["relative_to_first"][0] == 1.0 and math.isclose(books["relative_to_first"][1], 1.10, rel_tol=1e-3)


class FakeBench:
    """Stands in for worker.Bench in serve(): a baseline that is due every other request."""

    def __init__(self):
        self.baseline_us = {"bfloat16:8x8": 10.0}
        self.n = 0

    def baseline_due(self):
        self.n += 1
        return self.n % 2 == 0

    def retime_baseline(self):
        self.baseline_us = {"bfloat16:8x8": 10.0 + self.n}
        return {"baseline_retimed_us": dict(self.baseline_us), "baseline_gpu_s": 0.5}

    def evaluate(self, msg):
        return {"status": "ok", "times_us": {"bfloat16:8x8": 5.0}}

    def retime(self, msg):
        return {"status": "ok", "baseline_us": {"bfloat16:8x8": 9.0}}


def test_the_worker_retimes_its_baseline_between_candidates_and_says_so(monkeypatch):
    from kernel_factory.evo.evaluate import worker
    bench = FakeBench()
    monkeypatch.setattr(worker, "start", lambda msg: (bench, {"op": "ready"}))
    parent, child = Pipe()
    t = threading.Thread(target=worker.serve, args=(child,))
    t.start()
    parent.send({"op": "setup"})
    assert parent.recv()["op"] == "ready"
    replies = []
    for i in range(4):
        parent.send({"op": "eval", "id": f"c{i}"})
        replies.append(parent.recv())
    parent.send({"op": "retime", "id": "f"})
    final = parent.recv()
    parent.send({"op": "stop"})
    t.join(5)
    assert [("baseline_retimed_us" in r) for r in replies] == [False, True, False, True]
    assert replies[1]["baseline_us"] == replies[1]["baseline_retimed_us"] == replies[2]["baseline_us"]
    assert replies[3]["baseline_us"] != replies[0]["baseline_us"]
    assert all(r["gpu_s"] < 0.5 for r in replies), "a re-time's GPU time is its own, not the candidate's"
    assert final["baseline_us"] == {"bfloat16:8x8": 9.0}, "an A/B re-time keeps its own interleaved baseline"


class Retiming:
    """The replay evaluator with a retime() that answers each finalist at `factor` x its search fitness."""

    def __init__(self, inner, factor):
        self.inner, self.info, self.space, self.factor = inner, inner.info, inner.space, factor
        self.fitness = {}

    def evaluate(self, candidates):
        out = self.inner.evaluate(candidates)
        self.fitness.update({r.candidate_id: r for r in out})
        return out

    def retime(self, candidates):
        recs = []
        for c in candidates:
            r = self.fitness[c.id]
            base = {k: b * self.factor for k, b in r.baseline_us.items()}
            recs.append({"candidate_id": c.id, "status": "ok", "reps": 100, "times_us": dict(r.times_us),
                         "baseline_us": base, "iqr_us": {k: 0.002 * t for k, t in r.times_us.items()},
                         "baseline_iqr_us": {k: 0.002 * b for k, b in base.items()},
                         "speedup": geomean_speedup(r.times_us, base)})
        return recs

    def close(self):
        self.inner.close()


def quickstart(tmp_path, monkeypatch, factor, capsys):
    original = build.make_evaluator
    monkeypatch.setattr(build, "make_evaluator", lambda run, kind: Retiming(original(run, kind), factor))
    cfg = config.load(str(QUICKSTART), (f"out_dir={tmp_path}/runs", f"tracking.store={tmp_path}/runs/mlflow.db",
                                        f"tracking.artifacts={tmp_path}/runs/artifacts", "search.generations=2",
                                        "search.population=8", "search.finalists=2", "observers=[journal,console]"))
    summary = execute(cfg, f"agree-{factor}")
    return summary, capsys.readouterr().out


@pytest.mark.parametrize("factor", [1.0, 0.88])
def test_the_best_line_prints_the_ab_figure_and_warns_when_the_search_was_off(tmp_path, monkeypatch, capsys, factor):
    summary, out = quickstart(tmp_path, monkeypatch, factor, capsys)
    cand, res = summary.best
    fin = next(f for f in summary.finalists if f["candidate_id"] == cand.id)
    assert math.isclose(fin["speedup"], res.fitness * factor, rel_tol=1e-9)
    best = [line for line in out.splitlines() if line.startswith("best ")]
    assert len(best) == 1 and f"fitness {fin['speedup']:.4f}x vs baseline (A/B re-time" in best[0]
    assert f"the search measured {res.fitness:.4f}x" in best[0]
    assert ("off by more than the noise" in best[0]) == (factor != 1.0)
    assert fin["agrees"] == (factor == 1.0)
    # the agreement table from the run's journal says the same, and exits 1 on a disagreement
    from kernel_factory.evo.tools import agreement as tool
    journal = tmp_path / "runs" / f"agree-{factor}" / "journal.jsonl"
    code = tool.main(["--journals", str(journal), "--out", str(tmp_path / "agreement")])
    rows = json.loads((tmp_path / "agreement" / "agreement.json").read_text())["rows"]
    assert code == (0 if factor == 1.0 else 1)
    assert rows[0]["best"] == cand.id and math.isclose(rows[0]["ab_speedup"], fin["speedup"])
    md = (tmp_path / "agreement" / "agreement.md").read_text()
    assert ("DISAGREE" in md) == (factor != 1.0)
    # below the verdicts, what the timing cost: the options as the config set them and the run's throughput
    # (a replay's run has no GPU time, so its table has none; rows recorded before these fields neither)
    assert rows[0]["timed_per_gpu_minute"] == summary.timed_per_gpu_minute and rows[0]["gpu_options"] == {}
    assert "timed candidates per GPU-minute" not in md
    rate = random.uniform(50, 500)
    live = [{**rows[0], "gpu_s": 41.25, "timed_per_gpu_minute": rate}, {**rows[0], "run_id": "b", "gpu_s": 2.0,
            "timed_per_gpu_minute": rate, "gpu_options": {"paired": False, "max_reps": 20}}]
    cost = tool.table(live, tool.TOLERANCE).split("timed candidates per GPU-minute |")[1]
    assert f"| agree-{factor} | defaults | 41.2 | {rate:.1f} |" in cost
    assert f"| b | max_reps: 20, paired: False | 2.0 | {rate:.1f} |" in cost
    capsys.readouterr()
    assert tool.main(["--from", str(tmp_path / "agreement" / "agreement.json")]) == code
    assert capsys.readouterr().out == md + "\n"


def test_the_agreement_tool_refuses_what_it_cannot_read(tmp_path, capsys):
    from kernel_factory.evo.tools import agreement as tool
    assert tool.main(["--journals", str(tmp_path / "nope.jsonl")]) == 2
    assert "no journal at" in capsys.readouterr().err
    assert tool.main(["--config", str(QUICKSTART)]) == 2
    assert "--config needs --baselines" in capsys.readouterr().err


def test_a_baseline_that_cannot_run_is_a_row_of_its_own_and_the_check_fails(tmp_path, monkeypatch, capsys):
    """Live: one run per baseline; one whose worker cannot start (a peer refusing a row) is reported, not raised."""
    from kernel_factory.evo import run as run_mod
    from kernel_factory.evo.evaluate.gpu import WorkerError
    from kernel_factory.evo.tools import agreement as tool
    real = run_mod.execute

    def execute(cfg, run_id=None, resume=False):
        if cfg.evaluator.baseline == "liger":
            raise WorkerError("the GPU worker failed during setup:\nthe baseline 'liger' cannot run "
                              "bfloat16:16384x131072: RuntimeError: n = 131072 exceeds the blocksize")
        return real(cfg, run_id, resume)
    monkeypatch.setattr(run_mod, "execute", execute)
    code = tool.main(["--config", str(QUICKSTART), "--baselines", "torch_eager,liger", "--out", str(tmp_path),
                      "-o", "search.generations=1", "-o", "search.population=4", "-o", "observers=[journal]"])
    rows = json.loads((tmp_path / "agreement.json").read_text())["rows"]
    assert code == 1 and [r["baseline"] for r in rows] == ["torch_eager", "liger"]
    assert rows[0]["evaluator"] == "replay" and rows[0].get("ab_speedup") is None   # a replay has no A/B
    assert "cannot run bfloat16:16384x131072" in rows[1]["error"]
    md = (tmp_path / "agreement.md").read_text()
    assert "no A/B re-time" in md and "did not run: the baseline 'liger' cannot run" in md


def test_a_paired_fitness_is_taken_against_the_baseline_timed_beside_it():
    """The parent's side of evaluator.gpu.paired: the reply's paired baseline overrides the worker's latest
    measurement case by case, in the fitness and in the result's baseline."""
    from types import SimpleNamespace
    from kernel_factory.evo.evaluate.gpu import BaselineLog, GpuEvaluator
    from kernel_factory.problems.rmsnorm_fwd import problem
    rng = random.Random()
    keys = [f"bfloat16:{rng.randrange(1, 999)}x{n}" for n in (512, 4096)]
    latest = {k: rng.uniform(10, 90) for k in keys}
    fake = SimpleNamespace(problem=problem, baseline_us=latest, baselines=BaselineLog(latest))
    times = {k: rng.uniform(10, 90) for k in keys}
    paired = {k: rng.uniform(10, 90) for k in keys}
    reply = {"status": "ok", "times_us": times, "iqr_us": {k: 0.1 for k in keys}, "baseline_us": latest,
             "paired_baseline_us": paired}
    res = GpuEvaluator.result(fake, "c0", reply, {})
    assert res.baseline_us == paired and math.isclose(res.fitness, geomean_speedup(times, paired))
    unpaired = GpuEvaluator.result(fake, "c1", {k: v for k, v in reply.items() if k != "paired_baseline_us"}, {})
    assert unpaired.baseline_us == latest and math.isclose(unpaired.fitness, geomean_speedup(times, latest))
