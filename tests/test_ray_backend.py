"""The Ray backend on a real local Ray cluster that the test starts on 127.0.0.1 with two fake GPUs: the replay
evaluator behind Ray actors (num_gpus=1 each) gives the run the local pool gives, an actor killed mid-run is
replaced with nothing lost or duplicated, and compiles run as Ray tasks."""
import threading
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="the Ray backend's tests need the ray extra (in the test extra)")

from kernel_factory.evo import build, config  # noqa: E402
from kernel_factory.evo.journal import records as journal_records  # noqa: E402
from kernel_factory.evo.run import execute  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(address="local", num_cpus=2, num_gpus=2, include_dashboard=False, _node_ip_address="127.0.0.1",
             log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


def run(cfg_dict, *overrides):
    cfg = config.parse({**cfg_dict, "observers": ["journal"]}, overrides)
    summary = execute(cfg)
    records = journal_records(Path(cfg.out_dir) / summary.run_id / "journal.jsonl")
    return summary, [(r["candidate"]["id"], r["result"]["fitness"]) for r in records if r["event"] == "result"]


SMALL = ("search.population=8", "search.generations=2", "workers.time_scale=0.2")


def test_ray_actors_give_the_same_run_and_survive_a_killed_actor(cluster, replay_config, monkeypatch):
    _, local = run(replay_config, *SMALL, "workers.count=2")
    made, killed = {}, []
    original = build.make_evaluator

    def make(run_, kind):
        made["ev"] = original(run_, kind)
        return made["ev"]

    def killer():
        while "ev" not in made or sum(lane.asked for lane in made["ev"].pool.lanes) < 4:
            time.sleep(0.01)
        worker = made["ev"].pool.lanes[0].worker
        killed.append(worker.name)
        ray.kill(worker.actor, no_restart=True)
    monkeypatch.setattr(build, "make_evaluator", make)
    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    summary, remote = run(replay_config, *SMALL, "workers.backend=ray", "workers.count=2")
    thread.join(5)
    assert killed, "the test did not get to kill an actor"
    assert remote == local, "the Ray backend (with a killed actor) changed the run"
    assert len({cid for cid, _ in remote}) == len(remote) == summary.evaluations
    books = summary.accounting
    assert books["backend"] == "ray" and books["workers"] == 2 and books["respawns"] >= 1
    assert set(books["gpu_s_per_worker"]) == {"ray0", "ray1"}


def test_compiles_run_as_ray_tasks(cluster, tmp_path, rmsnorm):
    from kernel_factory.evo.evaluate import render
    from kernel_factory.evo.evaluate.compile import CompileJob, Compiler
    from kernel_factory.evo.evaluate.ray_backend import RayCompiler
    from kernel_factory.evo.types import Candidate, Genome
    cand = Candidate(Genome.of(rmsnorm.space.defaults()))
    remote = RayCompiler(str(tmp_path / "ray-cache"), "auto")
    job = CompileJob(remote.key(render.body(rmsnorm, cand.genome, "bfloat16")),
                     render.render(rmsnorm, cand, "bfloat16"), "default.cu")
    bad = CompileJob("not-a-key", job.source.replace("{", "{ this is not C++;", 1), "bad.cu")
    outs = {o.key: o for o in remote.compile_many([job, bad])}
    assert outs[job.key].error is None and outs[job.key].cubin[:4] == b"\x7fELF"
    assert outs["not-a-key"].error and outs["not-a-key"].cubin is None
    assert remote.compiled == 2 and remote.compile_s > 0
    local = Compiler(tmp_path / "local-cache", 1)
    (here,) = local.compile_many([job])
    local.close()
    from kernel_factory.evo.evaluate import binary
    assert binary.identity(here.cubin) == binary.identity(outs[job.key].cubin)
    (again,) = remote.compile_many([job])
    assert again.info.cached, "a second ask is answered from the driver's cache"
