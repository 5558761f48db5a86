"""Scale-out on the CPU: the worker pool (keyed results, one ask per candidate, respawns), the replay evaluator
behind several simulated local workers, the same run for 1 and 4 workers, a worker killed mid-run, steady-state
search, and the run's accounting. The Ray backend's tests are in test_ray_backend.py."""
import os
import random
import signal
import threading
import time
from pathlib import Path

import pytest

from kernel_factory.evo import build, config
from kernel_factory.evo.evaluate.pool import Pool, WorkerDied
from kernel_factory.evo.journal import records as journal_records
from kernel_factory.evo.run import execute


class FakeWorker:
    """Answers in its own thread after a random short hold; dies (once per listed id) when told to."""

    def __init__(self, index, die_on=(), log=None):
        self.name, self.die_on, self.log = f"fake{index}", die_on, log if log is not None else []

    def ask(self, request):
        time.sleep(random.random() * 0.003)
        if request["id"] in self.die_on:
            self.die_on.discard(request["id"])
            raise WorkerDied("killed by the test")
        self.log.append(request["id"])
        return {"status": "ok", "value": request["value"] * 2, "gpu_s": 0.001}

    def close(self):
        pass


def test_pool_answers_by_key_and_asks_each_key_once():
    log, values = [], [random.randrange(10**6) for _ in range(40)]
    pool = Pool(lambda i: FakeWorker(i, log=log), 4, depth=3)
    items = [(f"k{i}", {"id": f"k{i}", "value": v}) for i, v in enumerate(values)]
    replies = pool.map(items + items[:10])   # asked again while in flight or answered: shared, not re-run
    assert [replies[k]["value"] for k, _ in items] == [2 * v for v in values]
    assert sorted(log) == sorted(k for k, _ in items), "each key reaches a worker exactly once"
    books = pool.accounting()
    assert sum(w["asked"] for w in books["workers"].values()) == 40 and books["queue_limit"] == 3
    assert max(d for _, d in books["queue_depth"]) <= 3
    pool.close()


def test_a_dead_worker_is_respawned_and_its_candidate_asked_again_then_classified():
    spawned = []
    dying = {"once", "twice"}

    def spawn(i):
        spawned.append(i)
        return FakeWorker(i, die_on=dying)
    pool = Pool(spawn, 2, retries=1)
    once = pool.submit("once", {"id": "once", "value": 3}).result()
    assert once["status"] == "ok" and once["value"] == 6 and len(spawned) == 3
    pool.spawn = lambda i: FakeWorker(i, die_on={"twice"})   # every new worker dies on "twice" too
    twice = pool.submit("twice", {"id": "twice", "value": 1}).result()
    assert twice["status"] == "crashed" and "died 2 times" in twice["message"]
    assert sum(w["respawns"] for w in pool.accounting()["workers"].values()) == 3
    pool.close()


def run(cfg_dict, *overrides):
    cfg = config.parse({**cfg_dict, "observers": ["journal"]}, overrides)
    return execute(cfg), cfg


def sequence(cfg, summary):
    records = journal_records(Path(cfg.out_dir) / summary.run_id / "journal.jsonl")
    results = [(r["candidate"]["id"], r["candidate"]["operator"], r["generation"], r["result"]["fitness"])
               for r in records if r["event"] == "result"]
    gens = [r["population"] for r in records if r["event"] == "generation"]
    return results, gens, summary.best[0].id


SMALL = ("search.population=8", "search.generations=3", "workers.time_scale=0.2")


@pytest.mark.parametrize("mode", ["generational", "steady"])
def test_one_and_four_workers_give_the_same_run(replay_config, mode):
    unpooled, cfg0 = run(replay_config, *SMALL, f"search.mode={mode}")
    one, cfg1 = run(replay_config, *SMALL, f"search.mode={mode}", "workers.count=1")
    four, cfg4 = run(replay_config, *SMALL, f"search.mode={mode}", "workers.count=4")
    assert sequence(cfg1, one) == sequence(cfg4, four) == sequence(cfg0, unpooled)
    ids = [r[0] for r in sequence(cfg4, four)[0]]
    assert len(ids) == len(set(ids)) and len(ids) == four.evaluations
    books = four.accounting
    assert books["simulated"] and books["workers"] == 4 and books["timed"] > 0
    assert set(books["gpu_s_per_worker"]) == {"sim0", "sim1", "sim2", "sim3"}
    assert sum(books["gpu_s_per_worker"].values()) > 0 and books["timed_per_held_gpu_minute"] > 0
    assert books["queue_depth"]["limit"] == 8 and 0 < books["queue_depth"]["max"] <= 8


def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(replay_config, monkeypatch):
    reference, cfg_ref = run(replay_config, *SMALL, "workers.count=3")
    made, killed = {}, []
    original = build.make_evaluator

    def make(run_, kind):
        made["ev"] = original(run_, kind)
        return made["ev"]

    def killer():
        while "ev" not in made or sum(lane.asked for lane in made["ev"].pool.lanes) < 5:
            time.sleep(0.01)
        lane = made["ev"].pool.lanes[1]
        killed.append(lane.worker.pid)
        os.kill(lane.worker.pid, signal.SIGKILL)
    monkeypatch.setattr(build, "make_evaluator", make)
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    summary, cfg = run(replay_config, *SMALL, "workers.count=3")
    thread.join(5)
    assert killed, "the test did not get to kill a worker"
    assert summary.accounting["respawns"] >= 1
    assert sequence(cfg, summary) == sequence(cfg_ref, reference), "a kill changed the run"


def test_steady_state_converges_on_the_recorded_space(replay_config, synthetic_recording):
    from kernel_factory.evo.evaluate import recording
    from kernel_factory.evo.types import geomean_speedup
    rec = recording.read(synthetic_recording)
    optimum = max(geomean_speedup(r.times_us, rec.header["baseline_us"]) for _, r in rec.entries.values()
                  if r.times_us)
    summary, cfg = run(replay_config, "search.mode=steady", "search.init_random=0", "search.generations=10",
                       "workers.in_flight=6")
    results, gens, _ = sequence(cfg, summary)
    assert summary.stop_reason == "generations" and len(gens) == 11
    assert results[0][1] == "defaults" and summary.best[1].fitness > results[0][3]
    assert summary.best[1].fitness >= 0.98 * optimum, (summary.best[1].fitness, optimum)


@pytest.mark.parametrize("override, message", [
    ("workers.backend=slurm", "'workers.backend' must be one of inline, local, ray"),
    ("workers.gpus=some", "'workers.gpus' must be all or a list"),
    ("workers.gpus=[0, 0]", "'workers.gpus' must be all or a list"),
    ("workers.count=-1", "'workers.count' must be >= 0"),
    ("search.mode=async", "'search.mode' must be one of generational, steady"),
])
def test_bad_worker_settings_are_one_clear_error(replay_config, override, message):
    with pytest.raises(config.ConfigError, match=message):
        config.parse(replay_config, (override,))


class FakeHandle:
    """Stands in for worker_process.WorkerHandle on a machine without a GPU: each "GPU" has its own baseline, and a
    candidate's time depends on its genes only, so fitness shows which baseline it was divided by."""

    made = []

    def __init__(self, setup, setup_timeout_s=600.0, env=None):
        self.device = env["CUDA_VISIBLE_DEVICES"]
        self.scale = 1.0 + int(self.device)      # GPU 1's baseline is twice GPU 0's
        base = {k: 10.0 * self.scale for k in setup["bench_cases"]}
        self.setup = {**setup, "baseline_us": base}
        self.ready = {"baseline_us": base, "copy_gbps": 3000.0, "fingerprint": {"gpu": f"fake {self.device}"}}
        self.restarts, self.asked = 0, []
        assert "known_good" in setup and "baseline_us" not in setup, "each GPU measures its own baseline"
        FakeHandle.made.append(self)

    def ask(self, request, deadline_s):
        self.asked.append(request["id"])
        t = 5.0 * self.scale * (1 + request["genes"]["unroll"] / 10)
        return {"op": "result", "status": "ok", "times_us": {k: t for k in self.setup["bench_cases"]},
                "iqr_us": {}, "gpu_s": 0.01}

    def close(self):
        pass


def test_pooled_gpu_evaluator_times_each_candidate_against_its_own_gpus_baseline(monkeypatch, tmp_path, rmsnorm,
                                                                                 bench_cases):
    from kernel_factory.evo.evaluate import gpu, gpu_pool
    from kernel_factory.evo.types import Candidate, Genome
    monkeypatch.setattr(gpu, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(gpu_pool, "WorkerHandle", FakeHandle)
    monkeypatch.setattr(gpu_pool, "local_devices", lambda gpus: ["0", "1"])
    FakeHandle.made = []
    workers = config.WorkersConfig(backend="local", queue_depth=1)
    ev = gpu_pool.PooledGpuEvaluator(rmsnorm, bench_cases[:2], "torch_eager", 0, str(tmp_path), workers=workers)
    genomes = [g for g in rmsnorm.space.enumerate()][:6]
    cands = [Candidate(Genome.of(g)) for g in genomes]
    results = ev.evaluate(cands + cands[:1])
    assert [r.candidate_id for r in results] == [c.id for c in cands + cands[:1]]
    for cand, r in zip(cands, results):
        assert r.status.value == "ok" and r.evaluator == "gpu"
        # time / baseline is the same on both fake GPUs only when each is divided by its own GPU's baseline
        assert r.fitness == pytest.approx(2.0 / (1 + cand.genome.gene_dict["unroll"] / 10))
    asked = [cid for h in FakeHandle.made for cid in h.asked]
    assert sorted(asked) == sorted(c.id for c in cands), "each candidate reached one GPU once"
    books = ev.accounting()
    assert set(books["workers"]) == {"gpu0", "gpu1"} and books["queue_limit"] == 1
    import inspect
    assert {"timeout_floor_s", "max_reps", "workers"} <= set(inspect.signature(gpu_pool.PooledGpuEvaluator).parameters)
    ev.close()


def test_accounting_reaches_mlflow_and_counts_llm_tokens(replay_config):
    from mlflow.tracking import MlflowClient
    from kernel_factory.evo import accounting
    from kernel_factory.evo.types import Candidate, Genome
    cfg = config.parse({**replay_config, "observers": ["journal", "mlflow"]}, (*SMALL, "workers.count=2"))
    summary = execute(cfg)
    client = MlflowClient(f"sqlite:///{cfg.tracking.store}")
    exp = client.get_experiment_by_name("rmsnorm_fwd")
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`kf.run_id` = '{summary.run_id}' and "
                                                        f"tags.`kf.kind` = 'evolution'")
    metrics = parent.data.metrics
    # A simulated pool's workers held no GPU: their numbers carry their source in the name
    assert summary.accounting["simulated"]
    assert metrics["simulated_workers"] == 2
    assert metrics["simulated_gpu_s.sim0"] > 0 and metrics["simulated_gpu_s.sim1"] > 0
    assert not {"workers", "gpu_s.sim0", "timed_per_held_gpu_minute"} & set(metrics)
    assert metrics["simulated_timed_per_held_gpu_minute"] == \
        pytest.approx(summary.accounting["timed_per_held_gpu_minute"])
    usage = '{"prompt_tokens": 120, "completion_tokens": 30}'
    made = [Candidate(Genome.of({"a": i}), notes={accounting.LLM_USAGE_NOTE: usage}) for i in range(3)]
    assert accounting.llm_tokens(made + [Candidate(Genome.of({"a": 9}))]) == {"prompt": 360, "completion": 90,
                                                                               "calls": 3}
