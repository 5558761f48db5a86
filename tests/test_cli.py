"""The command line as a user meets it: the quickstart in a subprocess (replay on this GPU-less machine), the
MLflow UI serving its runs, and one-line errors (no traceback, non-zero exit) for bad input."""
import json
import os
import socket
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "kernel_factory.evo.tools.cli"]


def kf(*args, cwd, timeout=300):
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("qs")
    out = kf("run", str(ROOT / "configs" / "quickstart.yaml"), cwd=cwd)
    return cwd, out


def test_quickstart_replays_and_says_so(quickstart):
    cwd, out = quickstart
    assert out.returncode == 0, out.stderr[-3000:]
    err = out.stderr
    assert "evaluator: replay - replay of NVIDIA H200 measurements recorded 2026-11-30" in err
    assert "no kernel runs in this session" in err
    assert err.count("\ngen ") == 9 and "216/216 evaluated" in err
    assert "best " in err and "Traceback" not in err
    assert (cwd / "runs" / "mlflow.db").is_file()
    journals = list((cwd / "runs").glob("rmsnorm_fwd-*/journal.jsonl"))
    assert len(journals) == 1


def test_quickstart_is_in_mlflow_with_lineage(quickstart):
    cwd, _ = quickstart
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{cwd / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rmsnorm_fwd")
    (parent,) = client.search_runs([exp.experiment_id], "tags.`kf.kind` = 'evolution'")
    assert parent.data.tags["kf.evaluator"] == "replay" and "kf.data" in parent.data.tags
    # Candidates are a table on the parent (child runs are off by default: docs/mlflow-ui.md says why).
    from kernel_factory.evo.prior import read_table
    table = read_table(client, parent.info.run_id)
    # 216 evaluations, and the 9 children that the rule refused, each with its reason (docs/mlflow-ui.md); the
    # surrogate, on by default, breeds 4 proposals per child, so more are drawn and refused than children sent.
    refused = [w for st, w in zip(table["status"], table["why"]) if st == "infeasible"]
    assert len(table["candidate"]) == 216 + len(refused) and len(refused) == 9
    assert all(w.startswith("refused by the problem's rule before compiling: ") for w in refused)
    ids = set(table["candidate"])
    later = [p for p, g in zip(table["parents"], table["generation"]) if int(g) != 0]
    assert later and all(set(p.split(",")) <= ids for p in later if p)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ui_serves_the_run_store(quickstart):
    cwd, _ = quickstart
    port = free_port()
    proc = subprocess.Popen([*CLI, "ui", "--port", str(port)], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True, text=True)
    try:
        base = f"http://127.0.0.1:{port}"
        said = [""]
        while "listening on" not in said[-1]:   # the command says so once the server accepts connections
            said.append(proc.stdout.readline())
            assert said[-1] or proc.poll() is None, "mlflow ui did not come up:\n" + "".join(said[-20:])
        threading.Thread(target=proc.stdout.read, daemon=True).start()   # the server logs on: keep the pipe open
        assert urllib.request.urlopen(f"{base}/health", timeout=10).read() == b"OK"
        assert b"<title>MLflow</title>" in urllib.request.urlopen(base, timeout=10).read()
        exp = json.load(urllib.request.urlopen(
            f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=rmsnorm_fwd", timeout=10))
        body = json.dumps({"experiment_ids": [exp["experiment"]["experiment_id"]],
                           "filter": "tags.`kf.kind` = 'evolution'", "max_results": 500}).encode()
        req = urllib.request.Request(f"{base}/api/2.0/mlflow/runs/search", body,
                                     {"Content-Type": "application/json"})
        (parent,) = json.load(urllib.request.urlopen(req, timeout=20))["runs"]   # the server serves the run store
        tags = {t["key"]: t["value"] for t in parent["data"]["tags"]}
        assert tags["kf.evaluator"] == "replay"
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(20)


def test_problems_lists_plugins(tmp_path):
    out = kf("problems", cwd=tmp_path)
    assert out.returncode == 0
    lines = out.stdout.splitlines()
    assert any(l.startswith("rmsnorm_fwd") for l in lines) and any(l.startswith("softmax_fwd") for l in lines)


@pytest.mark.parametrize("overrides, needle", [
    (["-o", "serach.population=3"], "config key 'serach' is unknown"),
    (["-o", "search.population=many"], "config key 'search.population' must be an int, got 'many'"),
    (["-o", "problem=layernorm"], "unknown problem 'layernorm'; installed: kda_fwd, rmsnorm_bwd, rmsnorm_faults, rmsnorm_fwd"),
    (["-o", "search.operators={warp_drive: {}}"], "unknown operator 'warp_drive'"),
    (["-o", "evaluator.kind=gpu"], "config key 'evaluator.kind' is 'gpu', but no GPU was found here"),
])
def test_bad_input_is_one_line(tmp_path, overrides, needle):
    out = kf("run", str(ROOT / "configs" / "quickstart.yaml"), *overrides, cwd=tmp_path, timeout=120)
    assert out.returncode == 2
    assert out.stderr.startswith("kernel-factory: error: ") and needle in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "Traceback" not in out.stderr
    assert not (tmp_path / "runs").exists(), "nothing may run before the config is valid"


def test_gpu_only_config_and_record_without_gpu(tmp_path):
    for args in (["run", str(ROOT / "configs" / "rmsnorm_fwd_bf16.yaml")],
                 ["record", str(ROOT / "configs" / "rmsnorm_fwd_record.yaml")]):
        out = kf(*args, cwd=tmp_path, timeout=120)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert "no NVIDIA driver or GPU found" in out.stderr, out.stderr


def test_softmax_plugin_runs_on_its_recording(tmp_path):
    cfg = tmp_path / "softmax.yaml"
    cfg.write_text("problem: softmax_fwd\nsearch: {population: 8, generations: 3}\n")
    out = kf("run", str(cfg), cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "softmax_fwd" in out.stderr and "evaluator: replay" in out.stderr and "best " in out.stderr
