"""Whole CPU runs (replay evaluator) with LLM operators talking to the scripted server: every scripted reply ends
with the right status and the run goes on; LLM children enter the population with their lineage in MLflow; the API
key reaches the server and nothing else; with no usable endpoint the LLM operators are disabled in one line."""
import json
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from llm_server import ScriptedServer
from test_llm_operators import BROKEN, FIXED, GARBAGE, HOST, MISMATCH

from kernel_factory.evo import config
from kernel_factory.evo import journal
from kernel_factory.evo.run import execute

KEY = "sk-test-4f1c9a7e-never-log-me"
REWRITE, REPAIR = "TASK: rewrite", "TASK: repair"
# Only a comment changes: the binary is the recorded genome's, so replay answers it and the child can compete.
COMMENT = """REGION: reduce
<<<<<<< SEARCH
// Sum of v over the TPR threads of row group `grp`; every thread of the CTA must call it (it holds a barrier).
=======
// Row sum over the TPR threads of row group `grp` (all threads of the CTA call it: it holds a barrier).
>>>>>>> REPLACE
"""
SCRIPT = {"steps": [{"match": REWRITE, "status": 429, "retry_after": 0},
                    {"match": REWRITE, "reply": COMMENT},
                    {"match": REWRITE, "reply": MISMATCH},
                    {"match": REWRITE, "reply": GARBAGE},
                    # A timeout is retried (4 attempts in all): four slow answers in a row make an llm_error.
                    *[{"match": REWRITE, "reply": "too slow", "delay_s": 2.5}] * 4,
                    {"match": REWRITE, "reply": BROKEN},
                    {"match": REWRITE, "reply": HOST},
                    {"match": [REPAIR, 'expected a ";"'], "reply": FIXED}],
          "default": {"reply": COMMENT}}


def llm_config(replay_config, server, key_env="KF_TEST_LLM_KEY"):
    agent = {"name": "scripted-local", "base_url": server.base_url, "model": "scripted", "api_key_env": key_env,
             "timeout_s": 1.0, "price_in_per_mtok": 2.0, "price_out_per_mtok": 8.0,
             "max_concurrent": 1}   # one call at a time, so that the scripted steps meet the calls in order
    search = {"population": 8, "generations": 4, "policy": "static",
              "operators": {"gene_mutation": {"weight": 0.5},
                            "llm_rewrite": {"weight": 0.5, "agents": [agent], "budget_usd": 5.0},
                            "llm_repair": {"weight": 1.0, "agents": [agent], "max_attempts": 2}}}
    # child runs on: the test finds each operator's candidates as runs
    tracking = {**replay_config["tracking"], "child_runs": True}
    return config.parse({**replay_config, "search": search, "tracking": tracking,
                         "observers": ["console", "journal", "mlflow"]})


@pytest.fixture
def server():
    s = ScriptedServer(SCRIPT).start()
    yield s
    s.close()


def test_llm_run_records_every_outcome_lineage_and_never_the_key(replay_config, server, monkeypatch, capfd,
                                                                   tmp_path):
    monkeypatch.setenv("KF_TEST_LLM_KEY", KEY)
    cfg = llm_config(replay_config, server)
    summary = execute(cfg)
    assert summary.stop_reason == "generations"
    records = journal.records(Path(cfg.out_dir) / summary.run_id / "journal.jsonl")
    results = [r for r in records if r["event"] == "result"]
    by_op = {}
    for r in results:
        by_op.setdefault(r["candidate"]["operator"], []).append(r)
    statuses = {r["result"]["status"] for r in by_op["llm_rewrite"]}
    assert {"ok", "invalid_patch", "llm_error", "compile_error", "rejected"} <= statuses, statuses
    (timed_out,) = [r for r in by_op["llm_rewrite"] if r["result"]["status"] == "llm_error"]
    assert "timed out" in timed_out["result"]["message"]
    broken = next(r for r in by_op["llm_rewrite"] if r["result"]["status"] == "compile_error")
    (repair,) = [r for r in by_op["llm_repair"] if r["candidate"]["parents"] == [broken["candidate"]["id"]]]
    assert repair["result"]["status"] in ("ok", "not_recorded") and repair["generation"] == broken["generation"] + 1
    ok = [r["candidate"]["id"] for r in by_op["llm_rewrite"] if r["result"]["status"] == "ok"]
    survivors = set().union(*(r["population"] for r in records if r["event"] == "generation"))
    assert survivors & set(ok), "good LLM children enter the population"
    # The server got the key, in the Authorization header, on every request.
    assert server.requests and all({k.lower(): v for k, v in r["headers"].items()}["authorization"] == f"Bearer {KEY}"
                                   for r in server.requests)
    # ... and it is nowhere else: not in the MLflow store, its artifacts, the journal, or the console.
    out, err = capfd.readouterr()
    assert KEY not in out + err
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not leaks
    check_mlflow(cfg, ok[0])


def check_mlflow(cfg, ok_id):
    client = MlflowClient(tracking_uri=f"sqlite:///{Path(cfg.tracking.store).resolve()}")
    exp = client.get_experiment_by_name("rmsnorm_fwd").experiment_id
    (parent,) = client.search_runs([exp], "tags.kf.kind = 'evolution'")
    assert parent.data.metrics["llm_cost_usd_total"] > 0 and parent.data.metrics["llm_prompt_tokens_total"] > 0
    children = client.search_runs([exp], "tags.kf.operator = 'llm_rewrite'", max_results=1000)
    assert children and all(c.data.tags["kf.llm_model"] == "scripted" for c in children)
    (run,) = [c for c in children if c.data.tags["kf.candidate_id"] == ok_id]
    assert run.data.metrics["llm.prompt_tokens"] > 0 and "llm.cost_usd" in run.data.metrics
    names = {f.path for f in client.list_artifacts(run.info.run_id, "llm")}
    assert names == {"llm/prompt.md", "llm/reply.md", "llm/diff.patch", "llm/usage.json"}
    uri = f"{run.info.artifact_uri}/llm/diff.patch"
    assert "+// Row sum over" in Path(mlflow.artifacts.download_artifacts(artifact_uri=uri)).read_text()
    assert client.search_runs([exp], "tags.kf.operator = 'llm_repair'")


def test_without_a_usable_endpoint_the_llm_operators_are_disabled_in_one_line(replay_config, server, monkeypatch,
                                                                              capfd):
    monkeypatch.delenv("KF_TEST_UNSET_KEY", raising=False)
    cfg = llm_config(replay_config, server, key_env="KF_TEST_UNSET_KEY")
    summary = execute(cfg)
    assert summary.stop_reason == "generations" and summary.evaluations > 8
    _, err = capfd.readouterr()
    lines = [line for line in err.splitlines() if "disabled" in line]
    assert len(lines) == 1 and "llm_rewrite" in lines[0] and "llm_repair" in lines[0]
    assert "KF_TEST_UNSET_KEY is unset" in lines[0] and "gene_mutation" in lines[0]
    assert not server.requests
    records = journal.records(Path(cfg.out_dir) / summary.run_id / "journal.jsonl")
    assert not [r for r in records if r["event"] == "result" and r["candidate"]["operator"].startswith("llm")]
    assert json.dumps(records[0]["config"]).count("KF_TEST_UNSET_KEY") == 2   # the variable's name, never a key
