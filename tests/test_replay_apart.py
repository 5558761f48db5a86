"""Replay kept apart from live learning and labelled wherever its numbers appear: a replay's candidates teach only
replays of the same recording, and its tags, summary.json, lessons.md, lineage drawings, console and `lineage`
command all say the numbers were recorded elsewhere."""
import json
import platform
import subprocess
import sys

from mlflow.tracking import MlflowClient

from kernel_factory.evo import config
from kernel_factory.evo.prior import load_prior
from kernel_factory.evo.run import execute
from kernel_factory.problems import rmsnorm_fwd


def parent_run(client, run_id):
    exp = client.get_experiment_by_name("rmsnorm_fwd")
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`kf.run_id` = '{run_id}' and tags.`kf.kind` = "
                                                        "'evolution'")
    return parent


def test_a_replay_teaches_replays_of_its_recording_only(replay_config, synthetic_recording):
    first = execute(config.parse(replay_config, ("search.generations=1",)))
    store = replay_config["tracking"]["store"]
    client = MlflowClient(f"sqlite:///{store}")
    tags = parent_run(client, first.run_id).data.tags
    key, name = tags["kf.cases_key"], synthetic_recording.name
    gpu = tags["kf.recorded.gpu"]
    space = rmsnorm_fwd.problem.space

    def prior(**kw):
        return load_prior(store, "rmsnorm_fwd", space, gpu, key, "another-run", **kw)
    assert len(prior(kind="replay", recording=name)) == first.evaluations
    assert prior(kind="gpu") == [], "a live run on the recording's GPU must not learn from its replay"
    assert prior(kind="replay", recording="another-recording.jsonl.gz") == []
    assert len(prior(kind="gpu", learn_from="any")) == first.evaluations   # only when the config asks

    # End to end: a second replay warm-starts from the first, unless told to learn from live runs only (none).
    second = execute(config.parse(replay_config, ("search.generations=1", "seed=5")))
    assert parent_run(client, second.run_id).data.tags["kf.prior_records"] == str(first.evaluations)


def test_replay_is_labelled_wherever_its_numbers_appear(replay_config, tmp_path, capsys):
    summary = execute(config.parse(replay_config, ("search.generations=1", "tracking.child_runs=true")))
    lines = capsys.readouterr().out.strip().splitlines()   # the best line is a result: stdout
    assert lines[-1].startswith(f"best {summary.best[0].id}") and "REPLAY: recorded measurements" in lines[-1]

    client = MlflowClient(f"sqlite:///{replay_config['tracking']['store']}")
    parent = parent_run(client, summary.run_id)
    tags = parent.data.tags
    assert tags["kf.evaluator"] == "replay" and tags["kf.host"] == platform.node()
    assert "kf.env.gpu" not in tags and tags["kf.recorded.gpu"], "the recording's GPU is not this run's environment"
    kids = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
    assert {k.data.tags["kf.evaluator"] for k in kids} == {"replay"}
    assert {k.data.tags["kf.host"] for k in kids} == {platform.node()}
    assert "recorded_gpu_s_total" in parent.data.metrics and "gpu_s_total" not in parent.data.metrics

    got = tmp_path / "got"
    for name in ("summary.json", "lessons.md", "lineage"):
        client.download_artifacts(parent.info.run_id, name, str(got))
    record = json.loads((got / "summary.json").read_text())
    assert record["evaluator"] == "replay" and record["data"].startswith("REPLAY")
    assert "gpu_s" not in record and "recorded_gpu_s" in record and "recorded_times_us" in record["best"]
    assert "REPLAY: recorded measurements" in (got / "lessons.md").read_text()
    assert "REPLAY: recorded measurements" in (got / "lineage" / "lineage.html").read_text()
    assert "REPLAY: recorded measurements" in (got / "lineage" / "lineage.svg").read_text()

    out = subprocess.run([sys.executable, "-m", "kernel_factory.evo.tools.cli", "lineage", summary.run_id,
                          "--runs", replay_config["out_dir"]], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("REPLAY: recorded measurements")


def test_learn_from_is_strict():
    import pytest
    with pytest.raises(config.ConfigError, match="search.learn_from"):
        config.parse({"problem": "rmsnorm_fwd", "search": {"learn_from": "everything"}})
