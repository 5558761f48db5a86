"""The run journal's one reader: what JournalObserver writes reads back as typed events, field for field; a journal
gzipped reads the same; a torn last line is dropped, and anything else that is wrong is one error naming the file
and line."""
from __future__ import annotations

import gzip
import json
import random

import pytest

from kernel_factory.evo import journal
from kernel_factory.evo.observers.journal import JournalObserver
from kernel_factory.evo.protocols import EvaluatorInfo, GenerationStats, RunInfo, RunSummary
from kernel_factory.evo.types import Candidate, Case, EvalResult, Genome, Status, geomean_speedup

CASES = (Case((4096, 256), "bfloat16"), Case((4096, 1024), "bfloat16"))


def fresh_run(tmp_path, rng: random.Random):
    """A journal written by the observer for a run of random candidates: (path, pairs, summary)."""
    obs = JournalObserver()
    info = RunInfo(f"run-{rng.getrandbits(32):08x}", "rmsnorm_fwd", rng.randrange(1000), {"seed": rng.random()},
                   EvaluatorInfo("replay", "a recording", {"gpu": "H200"}), CASES, str(tmp_path), "key",
                   ("warm1",), 7, warm_start_from={"warm1": f"run-{rng.getrandbits(32):08x}"},
                   warm_start_origin={"warm1": {"run": "run-earlier", "candidate": f"{rng.getrandbits(64):016x}",
                                                "generation": rng.randrange(50)}})
    obs.on_start(info)
    pairs = []
    for i in range(6):
        cand = Candidate(Genome.of({"block": rng.choice([64, 128, 256]), "vec": i}), ("p",) if i else (), "mut", i // 3)
        times = {c.key: rng.uniform(1, 9) for c in CASES}
        base = {c.key: rng.uniform(1, 9) for c in CASES}
        res = (EvalResult(cand.id, Status.OK, geomean_speedup(times, base), times, baseline_us=base, evaluator="replay")
               if i % 2 else EvalResult(cand.id, Status.INCORRECT, message=f"off by {rng.random()}"))
        pairs.append((cand, res))
    obs.on_results(0, pairs[:3])
    obs.on_generation(GenerationStats(0, 3, rng.random(), rng.random(), pairs[1][0].id, {"ok": 1, "incorrect": 2},
                                      rng.random(), {"mut": 1.0}, 2, (pairs[1][0].id,)))
    obs.on_results(1, pairs[3:])
    best = max(pairs, key=lambda p: p[1].fitness)
    finalist = {"candidate_id": best[0].id, "status": "ok", "reps": 100, "gpu_s": 1.5, "message": "",
                "times_us": {CASES[0].key: rng.uniform(1, 9)}, "iqr_us": {}, "baseline_us": {}, "baseline_iqr_us": {}}
    summary = RunSummary(info.run_id, 2, 6, "generations", rng.random(), 0.0, best, (best,),
                         ({"gen": 0, "best": 1.0},), "", (finalist,), 0.0)
    obs.on_end(summary)
    return obs.path, pairs, summary


def test_what_the_observer_writes_reads_back(tmp_path):
    rng = random.Random()
    path, pairs, summary = fresh_run(tmp_path, rng)
    run = journal.read(path)
    assert run.run_id == summary.run_id and run.start.prior_records == 7 and run.start.warm_start == ("warm1",)
    written = journal.records(path)[0]   # where the seed was bred: the run and its generation there
    assert set(written["warm_start_from"]) == set(written["warm_start_origin"]) == {"warm1"}
    assert run.start.warm_start_from == written["warm_start_from"]
    assert run.start.warm_start_origin == written["warm_start_origin"]
    assert set(run.start.warm_start_origin["warm1"]) == {"run", "candidate", "generation"}
    assert run.start.cases == tuple(c.key for c in CASES) and run.start.evaluator.fingerprint == {"gpu": "H200"}
    assert run.pairs() == pairs
    assert [r.result.message for r in run.results] == [r.message for _, r in pairs]
    assert run.known() == {c.id: r for c, r in pairs}
    assert [g.generation for g in run.generations] == [0]
    assert run.end is not None and run.end.best == summary.best[0].id == run.latest_best()
    final = run.finalists()[summary.best[0].id]
    assert final.reps == 100 and final.times_us == summary.finalists[0]["times_us"]
    # The typed records write back exactly what the observer wrote (the file format is theirs).
    raw = journal.records(path)
    assert run.start.to_json() == raw[0]
    assert [r.to_json() for r in run.results] == [r for r in raw if r["event"] == "result"]


def test_gzipped_reads_the_same_and_a_torn_last_line_is_dropped(tmp_path):
    path, pairs, _ = fresh_run(tmp_path, random.Random())
    text = path.read_text()
    gz = path.with_name("journal.jsonl.gz")
    gz.write_bytes(gzip.compress(text.encode()))
    assert journal.read(gz).pairs() == pairs
    torn = text.rsplit("\n", 2)[0] + "\n" + text.rsplit("\n", 2)[1][:17]    # the end record cut mid-write
    path.write_text(torn)
    run = journal.read(path)
    assert run.end is None and run.pairs() == pairs
    assert run.latest_best() == run.generations[-1].best_id   # a killed run: its last generation names the best


@pytest.mark.parametrize("damage, says", [
    (lambda lines: lines.insert(2, "{not json"), ":3: not JSON"),
    (lambda lines: lines.insert(1, json.dumps({"event": "restart"})), ":2: not a journal record: unknown event"),
    (lambda lines: lines.__setitem__(1, json.dumps({**json.loads(lines[1]), "colour": "red"})),
     ":2: not a journal record: result record has unknown keys colour"),
    (lambda lines: lines.__setitem__(1, json.dumps({k: v for k, v in json.loads(lines[1]).items() if k != "result"})),
     ":2: not a journal record: result record lacks result"),
    (lambda lines: lines.pop(0), "not a run journal"),
])
def test_a_bad_line_is_one_error_naming_file_and_line(tmp_path, damage, says):
    path, _, _ = fresh_run(tmp_path, random.Random())
    lines = path.read_text().splitlines()
    damage(lines)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(journal.JournalError) as err:
        journal.read(path)
    assert str(err.value).startswith(str(path)) and says in str(err.value)
