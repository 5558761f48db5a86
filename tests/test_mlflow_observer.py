"""The MLflow observer against a real SQLite store: one parent run, a child run per candidate with its lineage,
metrics and sources, per-generation curves, failures that do not stop the run, and no environment secrets."""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
from pathlib import Path

import mlflow
import pytest
from mlflow.entities import Metric, Param, RunTag
from mlflow.tracking import MlflowClient

from kernel_factory.evo.config import parse
from kernel_factory.evo.observers.mlflow import MlflowObserver
from kernel_factory.evo.observers.mlflow_store import batches, flatten, safe_key, ui_command
from kernel_factory.evo.prior import open_store
from kernel_factory.evo.protocols import EvaluatorInfo, GenerationStats, RunInfo, RunSummary
from kernel_factory.evo.types import BuildInfo, Candidate, Case, EvalResult, Genome, Status, geomean_speedup

CASES = ("bfloat16:32768x256", "bfloat16:32768x1024")
SECRET = "sk-test-SECRET-1234"


@pytest.fixture(scope="session")
def empty_store(tmp_path_factory) -> Path:
    """A store with MLflow's schema in place: creating one takes ~3 s of migrations, copying it ~50 ms."""
    path = tmp_path_factory.mktemp("template") / "m.db"
    open_store(path)[0].search_experiments()
    return path


@pytest.fixture
def migrated(tmp_path, empty_store) -> None:
    shutil.copy(empty_store, tmp_path / "m.db")


def ok(cand: Candidate, t: float) -> EvalResult:
    times = {k: t for k in CASES}
    base = {k: 12.0 for k in CASES}
    return EvalResult(cand.id, Status.OK, geomean_speedup(times, base), times, {k: 0.1 for k in CASES}, base,
                      {k: 3000.0 for k in CASES}, {"bfloat16": BuildInfo(registers=40, compile_s=0.25)},
                      evaluator="gpu", gpu_s=0.05)


def drive(tmp_path: Path, problem, kind: str = "gpu", extra_patch: dict | None = None, db: str = "m.db",
          child_runs: bool = True, plan: tuple = ((0, "abc"), (1, "xp"))) -> tuple:
    """A two-generation run through the observer; returns (observer, config, candidates by name)."""
    cfg = parse({"problem": "rmsnorm_fwd", "tracking": {"store": str(tmp_path / db), "child_runs": child_runs,
                                                        "artifacts": str(tmp_path / "art")}})
    d = problem.space.defaults()
    c = {"a": Candidate(Genome.of(d)),
         "b": Candidate(Genome.of({**d, "threads": 512})),
         "c": Candidate(Genome.of({**d, "load": "plain"}))}
    c["x"] = Candidate(Genome.of({**d, "load": "plain", "threads": 128}), (c["a"].id, c["c"].id),
                       "uniform_crossover", 1)
    c["p"] = Candidate(Genome.of({**d, "reduce": "smem"}, extra_patch or {"reduce": "// patched reduce\n"}),
                       (c["a"].id,), "ptx_mutation", 1)
    res = {"a": ok(c["a"], 10.0),
           "b": EvalResult(c["b"].id, Status.COMPILE_ERROR,
                           build={"bfloat16": BuildInfo(log="ptxas error: too many resources requested")},
                           message="compile failed"),
           "c": EvalResult(c["c"].id, Status.INCORRECT, message="max abs error 3.1 at (0, 7)"),
           "x": ok(c["x"], 8.0), "p": ok(c["p"], 9.0)}
    info = EvaluatorInfo(kind, f"{kind} evaluator for tests", {"gpu": "NVIDIA H200", "driver": "580.95"})
    run = RunInfo("run-t1", "rmsnorm_fwd", 0, cfg.to_json(), info, tuple(Case.parse(k) for k in CASES),
                  str(tmp_path / "runs"))
    obs = MlflowObserver(problem=problem, config=cfg)
    obs.on_start(run)
    for gen, names in plan:
        obs.on_results(gen, [(c[n], res[n]) for n in names])
        obs.on_generation(GenerationStats(gen, 3 if gen == 0 else 5, res["a" if gen == 0 else "x"].fitness, 0.5,
                                          c["a" if gen == 0 else "x"].id, {"ok": 1}, 0.1))
    obs.on_end(RunSummary("run-t1", 1, 5, "generations", 1.0, 0.15, (c["x"], res["x"]),
                          ((c["x"], res["x"]), (c["p"], res["p"]), (c["a"], res["a"]))))
    return obs, cfg, c


def by_id(runs, candidate_id: str):
    return next(r for r in runs if r.data.tags["kf.candidate_id"] == candidate_id)


def client_for(tmp_path: Path, db: str = "m.db") -> tuple[MlflowClient, str]:
    """A fresh client, as a later process would open the store, and the problem's experiment id."""
    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / db).resolve()}")
    return client, client.get_experiment_by_name("rmsnorm_fwd").experiment_id


def text_artifact(client: MlflowClient, run_id: str, path: str, dst: Path) -> str:
    uri = f"{client.get_run(run_id).info.artifact_uri}/{path}"
    return Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=str(dst))).read_text()


@pytest.mark.usefixtures("migrated")
def test_run_parent_children_metrics_and_artifacts(tmp_path, rmsnorm):
    obs, cfg, c = drive(tmp_path, rmsnorm)
    assert obs.writer.failures == 0
    client, exp_id = client_for(tmp_path)
    assert client.get_experiment(exp_id).artifact_location == (tmp_path / "art").resolve().as_uri()

    (parent,) = client.search_runs([exp_id], "tags.kf.kind = 'evolution'")
    pid, tags = parent.info.run_id, parent.data.tags
    assert parent.info.run_name == f"s0 cold {ok(c['x'], 8.0).fitness:.3f}x t1" and parent.info.status == "FINISHED"
    assert {k: tags[k] for k in ("kf.run_id", "kf.problem", "kf.evaluator", "kf.env.gpu", "kf.stop_reason",
                                 "kf.best_candidate_id")} == {
        "kf.run_id": "run-t1", "kf.problem": "rmsnorm_fwd", "kf.evaluator": "gpu", "kf.env.gpu": "NVIDIA H200",
        "kf.stop_reason": "generations", "kf.best_candidate_id": c["x"].id}
    assert tags["kf.evaluator_label"] == "gpu evaluator for tests" and "kf.data" not in tags
    assert parent.data.params["search.population"] == "8" and parent.data.params["seed"] == "0"
    assert parent.data.params["search.operators.gene_mutation.weight"] == "0.5"
    assert parent.data.params["tracking.experiment"] == "null"
    assert [m.step for m in client.get_metric_history(pid, "best_fitness")] == [0, 1]
    assert [m.value for m in client.get_metric_history(pid, "this_gen.ok")] == [1, 1]
    assert "this_gen.timeout" not in parent.data.metrics and "lessons" not in parent.data.metrics   # zero-only
    assert parent.data.metrics["failures_total"] == 2 and parent.data.metrics["gpu_s_total"] == 0.15
    assert parent.data.metrics["evaluations_total"] == 5
    assert parent.data.metrics["final_best_fitness"] == round(ok(c["x"], 8.0).fitness, 4)
    summary = json.loads(text_artifact(client, pid, "summary.json", tmp_path / "dl"))
    assert summary["best"]["candidate_id"] == c["x"].id and summary["best"]["genes"]["threads"] == 128
    assert [h["candidate_id"] for h in summary["hall_of_fame"]] == [c[n].id for n in "xpa"]
    assert json.loads(text_artifact(client, pid, "config.json", tmp_path / "dl"))["problem"] == "rmsnorm_fwd"

    children = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{pid}'")
    runs = {r.data.tags["kf.candidate_id"]: r for r in children}
    assert set(runs) == {cand.id for cand in c.values()}
    by = {n: runs[c[n].id] for n in c}
    assert by["x"].data.tags["kf.parent_ids"] == f"{c['a'].id},{c['c'].id}"
    assert by["x"].data.tags["kf.operator"] == "uniform_crossover" and by["x"].data.tags["kf.generation"] == "1"
    assert by["a"].data.tags["kf.parent_ids"] == ""
    assert {n: r.data.tags["kf.status"] for n, r in by.items()} == {
        "a": "ok", "b": "compile_error", "c": "incorrect", "x": "ok", "p": "ok"}
    assert all(r.info.status == "FINISHED" and r.info.run_name == f"cand-{r.data.tags['kf.candidate_id'][:8]}"
               for r in children)
    assert f"#/experiments/{exp_id}/runs/{by_id(children, c['a'].id).info.run_id}" in \
        by_id(children, c["x"].id).data.tags["mlflow.note.content"]   # a child links its parents' runs
    assert by["a"].data.metrics["time_us.bfloat16_32768x256"] == 10.0
    assert by["a"].data.metrics["registers.bfloat16"] == 40 and by["x"].data.metrics["fitness"] == \
        ok(c["x"], 8.0).fitness
    assert "fitness" not in by["b"].data.metrics   # a failure measured no fitness (its 0 is the search's verdict)
    assert "gpu_s" not in by["b"].data.metrics   # zero-only
    assert by["x"].data.params["gene.threads"] == "128" and by["x"].data.params["patch"] == "none"
    assert by["p"].data.params["patch"] == "reduce"

    # The names we chose work in MLflow's filter grammar, numbers as metrics included.
    fast = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{pid}' and "
                                        "metrics.time_us.bfloat16_32768x256 < 9.5 and metrics.generation >= 1")
    assert {r.data.tags["kf.candidate_id"] for r in fast} == {c["x"].id, c["p"].id}

    names = {n: {a.path for a in client.list_artifacts(r.info.run_id)} for n, r in by.items()}
    assert names["a"] == {"kernel-bfloat16.cu.txt"}
    assert names["b"] == {"kernel-bfloat16.cu.txt", "ptxas-bfloat16.log", "message.txt"}
    assert names["c"] == {"kernel-bfloat16.cu.txt", "message.txt"}   # no build info: the run's dtype is rendered
    src = text_artifact(client, by["x"].info.run_id, "kernel-bfloat16.cu.txt", tmp_path / "dl")
    assert f"kernel-factory candidate {c['x'].id}" in src and "#define THREADS 128" in src
    assert "// patched reduce" in text_artifact(client, by["p"].info.run_id, "kernel-bfloat16.cu.txt",
                                                tmp_path / "dl")
    assert "too many resources" in text_artifact(client, by["b"].info.run_id, "ptxas-bfloat16.log",
                                                 tmp_path / "dl")


@pytest.mark.usefixtures("migrated")
def test_replay_runs_say_no_kernel_ran(tmp_path, rmsnorm):
    drive(tmp_path, rmsnorm, kind="replay")
    client, exp_id = client_for(tmp_path)
    (parent,) = client.search_runs([exp_id], "tags.kf.kind = 'evolution'")
    assert parent.data.tags["kf.evaluator"] == "replay"
    assert parent.data.tags["kf.data"].startswith("REPLAY: recorded measurements") and \
        parent.data.tags["kf.data"].endswith("no kernel ran in this run")
    children = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert len(children) == 5 and {r.data.tags["kf.evaluator"] for r in children} == {"replay"}


def test_no_environment_secret_reaches_the_store(tmp_path, rmsnorm, monkeypatch):
    # A fresh store (not a copy): its schema is created while the secret is in the environment.
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("KF_SECRET_TOKEN", SECRET)
    drive(tmp_path, rmsnorm, db="runs/m.db")   # the store's folder does not exist yet: the observer makes it
    client, exp_id = client_for(tmp_path, "runs/m.db")
    assert len(client.search_runs([exp_id], "")) == 6
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.name == "kernel-bfloat16.cu.txt" for p in files)
    assert [p for p in files if SECRET.encode() in p.read_bytes()] == []


@pytest.mark.usefixtures("migrated")
def test_a_failing_write_is_reported_and_the_rest_is_kept(tmp_path, rmsnorm, capsys):
    # A patch for a region the template lacks cannot be rendered: that candidate's artifact write fails.
    obs, _, c = drive(tmp_path, rmsnorm, extra_patch={"no_such_region": "x"})
    assert obs.writer.failures == 1 and "no_such_region" in str(obs.writer.first_error)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "1 write(s)" in err[0] and "PatchError" in err[0]
    client, exp_id = client_for(tmp_path)
    (parent,) = client.search_runs([exp_id], "tags.kf.kind = 'evolution'")
    assert parent.info.status == "FINISHED" and parent.data.metrics["evaluations_total"] == 5
    children = client.search_runs([exp_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    status = {r.data.tags["kf.candidate_id"]: r.info.status for r in children}
    assert status.pop(c["p"].id) == "FAILED" and set(status.values()) == {"FINISHED"} and len(status) == 4


def test_batches_respect_mlflow_limits():
    metrics = [Metric(f"m{i}", 1.0, 0, 0) for i in range(2500)]
    params = [Param(f"p{i}", "v") for i in range(150)]
    tags = [RunTag(f"t{i}", "v") for i in range(5)]
    calls = list(batches(metrics, params, tags))
    assert all(len(m) <= 1000 and len(p) <= 100 and len(t) <= 100 and len(m) + len(p) + len(t) <= 1000
               for m, p, t in calls)
    assert [x for m, _, _ in calls for x in m] == metrics and [x for _, p, _ in calls for x in p] == params
    assert len(calls) == 3 and list(batches([], [], [])) == []


def test_names_config_store_and_ui_command(tmp_path, empty_store):
    assert safe_key("time_us.bfloat16:32768x256") == "time_us.bfloat16_32768x256"
    assert flatten({"a": {"b": 1, "c": {}}, "d": None, "e": ["x"], "f": "s"}) == {
        "a.b": "1", "a.c": "{}", "d": "null", "e": '["x"]', "f": "s"}
    client, uri = open_store(empty_store)
    assert uri == f"sqlite:///{empty_store.resolve()}" and uri.startswith("sqlite:////")
    assert client.get_experiment_by_name("Default") is not None
    argv = ui_command(tmp_path / "m.db", tmp_path / "art", port=5123)
    assert argv[:4] == [sys.executable, "-m", "mlflow", "ui"]
    assert argv[4:] == ["--backend-store-uri", f"sqlite:///{(tmp_path / 'm.db').resolve()}", "--default-artifact-root",
                        str((tmp_path / "art").resolve()), "--host", "127.0.0.1", "--port", "5123", "--workers", "1"]


@pytest.mark.usefixtures("migrated")
def test_default_logs_a_candidate_table_and_ui_notes_on_the_parent(tmp_path, rmsnorm):
    obs, _, c = drive(tmp_path, rmsnorm, kind="replay", child_runs=False)
    assert obs.writer.failures == 0
    client, exp_id = client_for(tmp_path)
    runs = client.search_runs([exp_id], "")
    assert len(runs) == 1   # no child runs: the runs table holds parents only
    (parent,) = runs
    pid, tags = parent.info.run_id, parent.data.tags
    assert tags["mlflow.runColor"].startswith("#") and tags["kf.warm_start_runs"] == "none"
    note = tags["mlflow.note.content"]
    assert "**replayed**" in note and f"Best: `{c['x'].id}`" in note and "1 compile_error, 1 incorrect" in note
    assert "recorded_gpu_s_total" in parent.data.metrics and "gpu_s_total" not in parent.data.metrics
    exp = client.get_experiment(exp_id)
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    view = json.loads(exp.tags["mlflow.sharedViewState.kernel-factory-runs"])
    assert view["searchFilter"] == "tags.`kf.kind` = 'evolution'" and "metrics.`final_best_fitness`" in \
        view["selectedColumns"]

    from kernel_factory.evo.prior import read_table
    table = read_table(client, pid)
    rows = {cid: dict(zip(table, values)) for cid, values in zip(table["candidate"], zip(*table.values()))}
    assert set(rows) == {cand.id for cand in c.values()}
    x = rows[c["x"].id]
    assert x["operator"] == "uniform_crossover" and x["parents"] == f"{c['a'].id},{c['c'].id}"
    assert x["gene_diff"] == "load: nc -> plain; threads: 256 -> 128"
    assert x["fitness_change"] == pytest.approx(ok(c["x"], 8.0).fitness - ok(c["a"], 10.0).fitness, abs=1e-4)
    assert x["speedup bfloat16:32768x256"] == 1.5 and x["copy_bw_pct"] is None   # no copy bandwidth measured
    assert rows[c["b"].id]["status"] == "compile_error" and rows[c["b"].id]["why"] == "compile failed"
    assert rows[c["b"].id]["fitness"] is None and rows[c["b"].id]["fitness_change"] is None   # nothing measured
    # The file holds the cells as written, generation 0's included (MLflow's log_table append would turn "1.1030"
    # back into 1.103 in the rows it re-reads); the UI shows it as a table because of the tag log_table sets.
    assert json.loads(tags["mlflow.loggedArtifacts"]) == [{"path": "candidates.json", "type": "table"}]
    files = {a.path for a in client.list_artifacts(pid)}
    assert {"candidates.json", "lineage.md", "failures.md", "images", "kernels"} <= files
    assert "max abs error 3.1" in text_artifact(client, pid, "failures.md", tmp_path / "dl")
    assert c["x"].id in text_artifact(client, pid, "lineage.md", tmp_path / "dl")


@pytest.mark.usefixtures("migrated")
def test_the_factorys_table_reads_draw_no_progress_bar_and_leave_the_setting(tmp_path, monkeypatch, capfd):
    """MLflow draws a bar on stderr for each artifact download, and the factory reads a table per earlier run (warm
    start) and on resume: those reads draw none, while the process's own setting (an embedding program's) stays."""
    from kernel_factory.evo.prior import PROGRESS_BAR, read_table
    monkeypatch.setenv(PROGRESS_BAR, "true")
    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / 'm.db').resolve()}")
    exp = client.create_experiment("bars", artifact_location=(tmp_path / "art").as_uri())
    run_id = client.create_run(exp).info.run_id
    (tmp_path / "candidates.json").write_text(json.dumps({"columns": ["fitness"], "data": [["1.5000"]]}))
    client.log_artifact(run_id, str(tmp_path / "candidates.json"))
    capfd.readouterr()
    assert read_table(client, run_id) == {"fitness": [1.5]}
    err = capfd.readouterr().err
    assert "Downloading" not in err and "it/s" not in err, err
    assert os.environ[PROGRESS_BAR] == "true"
    with_bar = client.download_artifacts(run_id, "candidates.json", str(tmp_path))   # not ours: MLflow's own way
    assert Path(with_bar).is_file() and "Downloading" in capfd.readouterr().err   # proves the test can see a bar


@pytest.mark.usefixtures("migrated")
def test_the_table_keeps_its_numbers_as_written(tmp_path, rmsnorm):
    """Each generation's rows stay as written, with as many decimals as the viewer needs to sort them by value.
    (MLflow's log_table appends through pandas, which turns a column of "1.1030" it re-reads into 1.103.)"""
    _, _, c = drive(tmp_path, rmsnorm, kind="replay", child_runs=False, plan=((0, "a"), (1, "xp")))
    client, exp_id = client_for(tmp_path)
    (parent,) = client.search_runs([exp_id], "")
    from kernel_factory.evo.prior import read_table
    raw = read_table(client, parent.info.run_id, numbers=False)
    assert raw["candidate"] == [c[n].id for n in "axp"]
    assert all(re.fullmatch(r"\d+\.\d{4}", f) for f in raw["fitness"] + raw["speedup bfloat16:32768x256"])
