"""Crash-safe resume: a replay run killed with SIGKILL 10 times, at seeded points between two writes (after a journal
record; after an MLflow child run, before the table lists it), and resumed each time ends in the same state as an
uninterrupted run of the same seed: the same candidates in the same order, none
evaluated twice, the same final population and hall of fame, and MLflow consistent with the journal."""
import json
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import write_synthetic_recording
from kernel_factory.evo import journal

CLI = [sys.executable, "-m", "kernel_factory.evo.tools.cli"]
FORKED = Path(__file__).with_name("forked_cli.py")   # the CLI, killed at a chosen point
KILLS = 10
# A part of the RMSNorm space (2304 genomes): every session reads its recording, so a small one keeps ten
# sessions quick, while the surrogate still has enough to refuse children.
PART = {"threads": [256, 1024], "rows_per_cta": [1, 2], "load": ["plain", "nc", "cp_async"], "unroll": [1, 2, 4],
        "stage_copy": ["cp_async"], "cluster": [1, 4], "persistent": [False], "tail": ["scalar"]}


@pytest.fixture(scope="module")
def part_recording(tmp_path_factory, rmsnorm, bench_cases) -> Path:
    return write_synthetic_recording(tmp_path_factory.mktemp("rec") / "rmsnorm_fwd-part.jsonl.gz", rmsnorm,
                                     bench_cases, choices=PART)


def write_config(folder: Path, recording: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"problem": "rmsnorm_fwd", "seed": 5, "out_dir": str(folder / "runs"),
           "search": {"population": 12, "generations": 12, "surrogate": {"enabled": True, "min_history": 12}},
           "evaluator": {"kind": "replay", "replay": {"recording": str(recording)}},
           # child runs on: these tests check that MLflow holds each journaled candidate once, as a run
           "tracking": {"store": str(folder / "runs" / "mlflow.db"), "artifacts": str(folder / "runs" / "art"),
                        "child_runs": True}}
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def final_state(folder: Path, run_id: str) -> dict:
    records = journal.records(folder / "runs" / run_id / "journal.jsonl")
    results = [r["candidate"]["id"] for r in records if r["event"] == "result"]
    refused = [r["candidate"]["id"] for r in records if r["event"] == "refused"]
    gens = {r["generation"]: r for r in records if r["event"] == "generation"}
    end = [r for r in records if r["event"] == "end"][-1]
    last = gens[max(gens)]
    return {"results": results, "refused": refused, "population": last["population"], "best": end["best"],
            "hall_of_fame": end["hall_of_fame"], "generations": sorted(gens),
            "probs": [gens[g]["operator_probs"] for g in sorted(gens)]}


def mlflow_state(folder: Path, run_id: str) -> tuple[int, list[str], list[str]]:
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{folder / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rmsnorm_fwd")
    parents = client.search_runs([exp.experiment_id],
                                 f"tags.`kf.run_id` = '{run_id}' and tags.`kf.kind` = 'evolution'")
    kids = client.search_runs([exp.experiment_id], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'",
                              max_results=2000)
    assert all(k.info.status == "FINISHED" for k in kids)
    from kernel_factory.evo.prior import read_table
    table = read_table(client, parents[0].info.run_id)["candidate"]   # written whole, from the resumed table on
    return len(parents), [k.data.tags["kf.candidate_id"] for k in kids], table


def test_kill_9_and_resume_matches_an_uninterrupted_run(tmp_path, part_recording):
    run_id = "resume-test"
    ref_dir, killed_dir = tmp_path / "reference", tmp_path / "killed"
    ref = subprocess.run([*CLI, "run", str(write_config(ref_dir, part_recording)), "--run-id", run_id],
                         capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]
    records = len(journal.records(ref_dir / "runs" / run_id / "journal.jsonl"))

    # Each session dies at a seeded point: after its K-th journal record, or after its K-th finished MLflow child
    # run (before the table lists it). K stays below records / KILLS, so every kill lands before the run ends.
    cfg = write_config(killed_dir, part_recording)
    rng = random.Random(1234)
    for kill in range(KILLS):
        started = (killed_dir / "runs" / run_id / "journal.jsonl").is_file()
        args = ["resume", run_id, "--runs", str(killed_dir / "runs")] if started else \
               ["run", str(cfg), "--run-id", run_id]
        point = f"{('journal', 'child')[kill % 2]}:{rng.randint(2, records // KILLS)}"
        died = subprocess.run([sys.executable, str(FORKED), point, *args], capture_output=True, text=True,
                              timeout=300)
        assert died.returncode == -signal.SIGKILL, f"{point}: {died.stderr[-2000:]}"
    done = subprocess.run([*CLI, "resume", run_id, "--runs", str(killed_dir / "runs")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    want, got = final_state(ref_dir, run_id), final_state(killed_dir, run_id)
    assert len(got["results"]) == len(set(got["results"])), "a candidate was evaluated twice"
    assert len(got["refused"]) == len(set(got["refused"])), "a refusal was journaled twice"
    assert got == want
    n_parents, kids, table = mlflow_state(killed_dir, run_id)
    assert n_parents == 1 and sorted(table) == sorted(kids), "the candidate table must hold each candidate once"
    # MLflow holds every candidate, the rule's refusals included (journaled as events of their own)
    assert sorted(kids) == sorted(want["results"] + want["refused"]), "MLflow must hold each journaled candidate exactly once"
    records = journal.records(killed_dir / "runs" / run_id / "journal.jsonl")
    assert sum(r["event"] == "resume" for r in records) >= 1
    json.dumps(records)   # the journal stays plain JSON throughout


def test_sigterm_closes_the_run_and_resume_finishes_it(tmp_path, part_recording):
    """`timeout` and job schedulers stop with SIGTERM: the run ends as after Ctrl-C (exit 143, an `end` record that
    says interrupted and holds what was measured, MLflow's parent run KILLED with its metrics and summary), and
    resume carries on from there."""
    run_id = "sigterm-test"
    cfg = write_config(tmp_path, part_recording)
    path = tmp_path / "runs" / run_id / "journal.jsonl"
    # stopped after a refusal too: resume re-executes the run and must not journal that refusal again
    stopped = subprocess.run([sys.executable, str(FORKED), "term:result=3,refused=1", "run", str(cfg), "--run-id",
                              run_id], capture_output=True, text=True, timeout=300)
    err = stopped.stderr
    assert stopped.returncode != 0, "the run ended before it journaled 3 results and a refusal: make it longer"
    assert stopped.returncode == 143, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err
    records = journal.records(path)
    end = records[-1]
    measured = [r for r in records if r["event"] == "result"]
    assert end["event"] == "end" and end["stop_reason"] == "interrupted"
    assert end["evaluations"] == len(measured) >= 3 and end["best"] is not None
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rmsnorm_fwd")
    (parent,) = client.search_runs([exp.experiment_id],
                                   f"tags.`kf.run_id` = '{run_id}' and tags.`kf.kind` = 'evolution'")
    assert parent.info.status == "KILLED" and parent.data.tags["kf.stop_reason"] == "interrupted"
    assert parent.data.metrics["evaluations_total"] == len(measured) and parent.data.metrics["final_best_fitness"] > 0
    done = subprocess.run([*CLI, "resume", run_id, "--runs", str(tmp_path / "runs")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    records = journal.records(path)
    results = [r["candidate"]["id"] for r in records if r["event"] == "result"]
    refused = [r["candidate"]["id"] for r in records if r["event"] == "refused"]
    assert len(results) == len(set(results)), "a candidate was evaluated twice"
    assert refused and len(refused) == len(set(refused)), "a refusal was journaled twice"
    assert records[-1]["event"] == "end" and records[-1]["stop_reason"] != "interrupted"
    n_parents, kids, table = mlflow_state(tmp_path, run_id)
    assert n_parents == 1 and sorted(table) == sorted(kids), "the candidate table must hold each candidate once"
    assert sorted(kids) == sorted(results + refused), "MLflow must hold each journaled candidate exactly once"
