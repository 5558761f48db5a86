"""The edges a user hits (issue 19), on CPU: file-system errors, interrupted runs, run ids, stopping rules, exit
codes, tracking anywhere MLflow goes. Each test drives the real CLI or run over a small replay run."""
import errno
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import config_writer
from kernel_factory.evo import config as config_mod
from kernel_factory.evo.journal import records as journal_records
from kernel_factory.evo.observers import journal
from kernel_factory.evo.prior import open_store
from kernel_factory.evo.run import execute
from kernel_factory.evo.tools import cli, exits


@pytest.fixture(scope="module")
def empty_store(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "m.db"
    open_store(path)[0].search_experiments()
    return path


@pytest.fixture
def run_yaml(tmp_path, replay_config, empty_store):
    """Write the replay config (with its store in place) and return a function that writes an edited copy."""
    (tmp_path / "runs").mkdir()
    shutil.copy(empty_store, tmp_path / "runs" / "mlflow.db")
    return config_writer(tmp_path, replay_config)


def parent_run(tmp_path: Path, run_id: str, db: str = "runs/mlflow.db"):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{tmp_path / db}")
    exp = client.get_experiment_by_name("rmsnorm_fwd")
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`kf.run_id` = '{run_id}' and "
                                                        "tags.`kf.kind` = 'evolution'")
    return parent


# ---- 1. file-system errors -------------------------------------------------------------------------------------

def test_out_dir_that_is_a_file_or_cannot_be_created_is_one_line(tmp_path, run_yaml, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for out_dir in (blocker, blocker / "sub"):
        assert cli.main(["run", str(run_yaml(out_dir=str(out_dir))), "--run-id", "r1"]) == cli.EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"{str(blocker)!r} is a file, not a folder" in err, err
        assert str(out_dir) in err and "Traceback" not in err


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_a_full_disk_or_read_only_folder_mid_run_is_one_line_and_keeps_what_was_written(
        tmp_path, run_yaml, capsys, monkeypatch, code):
    write, calls = journal.JournalObserver._write, []

    def failing(self, record):
        calls.append(record["event"])
        if len(calls) > 8:   # the start and some results are written first
            raise OSError(code, __import__("os").strerror(code), str(self.path))
        write(self, record)
    monkeypatch.setattr(journal.JournalObserver, "_write", failing)
    assert cli.main(["run", str(run_yaml()), "--run-id", "full"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("kernel-factory: error: cannot write") and "journal.jsonl" in err[-1]
    assert __import__("os").strerror(code) in err[-1] and not any("Traceback" in line for line in err)
    kept = journal_records(tmp_path / "runs" / "full" / "journal.jsonl")
    assert len(kept) == 8 and kept[0]["event"] == "start" and kept[1]["event"] == "result"


def test_a_read_only_mlflow_store_fails_once_clearly_or_runs_on_the_journal_when_optional(tmp_path, run_yaml,
                                                                                       capsys, monkeypatch):
    ro = f"sqlite:///file:{tmp_path / 'runs' / 'mlflow.db'}?mode=ro&uri=true"
    # MLflow makes the folder of a SQLite URI's path before it opens it, here `file:/tmp/...` under the CWD
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", str(run_yaml(tracking__uri=ro)), "--run-id", "ro"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert "cannot be written" in last and "readonly database" in last and "tracking.optional" in last, err
    assert err.count("readonly database") == 1 and "Traceback" not in err and "SQL" not in err, err
    assert cli.main(["run", str(run_yaml(tracking__uri=ro, tracking__optional=True)), "--run-id", "ro2"]) == 0
    err = capsys.readouterr().err
    assert err.count("cannot be written") == 1 and "journal only" in err
    end = journal_records(tmp_path / "runs" / "ro2" / "journal.jsonl")[-1]
    assert end["event"] == "end" and end["best"] is not None


# ---- 2. an interrupted run keeps what it measured ---------------------------------------------------------------

def test_an_interrupted_recording_says_where_its_genomes_are_and_how_to_go_on(monkeypatch, capsys):
    """Stopped by `timeout` mid-recording: the hint names the partial file and the same command, not a run id."""
    def stopped(args):
        raise exits.Terminated
    monkeypatch.setattr(cli, "_dispatch", stopped)
    assert cli.main(["record", "configs/rmsnorm_fwd_record.yaml"]) == 143
    err = capsys.readouterr().err
    assert ".partial.jsonl" in err and "same `record` command resumes" in err and "RUN_ID" not in err


@pytest.mark.parametrize("signal_exc, code", [(KeyboardInterrupt, 130), (exits.Terminated, 143)])
def test_an_interrupted_run_keeps_its_measurements(tmp_path, run_yaml, capsys, monkeypatch, signal_exc, code):
    from kernel_factory.evo.evaluate.replay import ReplayEvaluator
    evaluate, batches = ReplayEvaluator.evaluate, []

    def interrupted(self, candidates):
        batches.append(len(candidates))
        if len(batches) == 3:   # during the third generation's evaluation
            raise signal_exc
        return evaluate(self, candidates)
    monkeypatch.setattr(ReplayEvaluator, "evaluate", interrupted)
    assert cli.main(["run", str(run_yaml()), "--run-id", "stopped"]) == code
    records = journal_records(tmp_path / "runs" / "stopped" / "journal.jsonl")
    measured = [r for r in records if r["event"] == "result"]
    end = records[-1]
    assert end["event"] == "end" and end["stop_reason"] == "interrupted" and end["generations"] == 1
    assert end["evaluations"] == len(measured) == sum(batches[:2]) and end["best"] is not None
    parent = parent_run(tmp_path, "stopped")
    assert parent.info.status == "KILLED" and parent.data.metrics["evaluations_total"] == len(measured)
    assert parent.data.tags["kf.best_candidate_id"] == end["best"]


# ---- 3. run ids ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["a/b", "../escape", "x..y", ".hidden", "", "a" * 129, "sp ace"])
def test_run_ids_outside_the_pattern_are_refused(tmp_path, run_yaml, capsys, bad):
    assert cli.main(["run", str(run_yaml()), "--run-id", bad]) == cli.EXIT_BAD_INPUT
    assert "is not valid: use 1-128 letters, digits" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["mlflow.db"], "nothing was created"


def test_an_existing_run_id_is_refused_unless_resumed(tmp_path, run_yaml, capsys):
    cfg = run_yaml()
    assert cli.main(["run", str(cfg), "--run-id", "once"]) == 0
    before = (tmp_path / "runs" / "once" / "journal.jsonl").read_text()
    assert cli.main(["run", str(cfg), "--run-id", "once"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "run 'once' already exists" in err and "kernel-factory resume once" in err
    assert (tmp_path / "runs" / "once" / "journal.jsonl").read_text() == before, "the first run is untouched"


# ---- 7. stopping rules ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("stop, reason", [({"target_fitness": 0.01}, "target_fitness"),
                                          ({"patience": 1}, "patience"),
                                          ({"gpu_s": 1e-9}, "gpu_seconds"),
                                          ({"wall_clock_s": 1e-9}, "wall_clock")])
def test_each_stop_rule_ends_the_run_and_is_named(replay_config, stop, reason):
    cfg = config_mod.parse({**replay_config, "observers": ["journal"], "stop": stop,
                            "search": {"population": 6, "generations": 30}})
    summary = execute(cfg, f"stop-{reason}")
    assert summary.stop_reason == reason and summary.generations < 30
    end = journal_records(Path(cfg.out_dir) / f"stop-{reason}" / "journal.jsonl")[-1]
    assert end["stop_reason"] == reason


def test_stop_values_are_checked():
    with pytest.raises(config_mod.ConfigError, match="'stop.patience' must be > 0"):
        config_mod.parse({"problem": "rmsnorm_fwd", "stop": {"patience": 0}})
    with pytest.raises(config_mod.ConfigError, match="'stop.budget' is unknown"):
        config_mod.parse({"problem": "rmsnorm_fwd", "stop": {"budget": 3}})


# ---- 5. tracking anywhere MLflow goes ------------------------------------------------------------------------------

def test_mlflow_tracking_uri_is_honoured_and_git_is_tagged(tmp_path, run_yaml, empty_store, monkeypatch):
    other = tmp_path / "elsewhere.db"
    shutil.copy(empty_store, other)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{other}")
    assert cli.main(["run", str(run_yaml()), "--run-id", "moved"]) == 0
    parent = parent_run(tmp_path, "moved", "elsewhere.db")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(cli.__file__).parent, capture_output=True,
                          text=True).stdout.strip()
    assert parent.data.tags["kf.git_commit"] == head and parent.data.tags["kf.git_dirty"] in ("true", "false")
    from mlflow.tracking import MlflowClient
    assert MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}").get_experiment_by_name("rmsnorm_fwd") is None


def test_system_metrics_are_watched_on_gpu_runs_only(monkeypatch):
    from mlflow.system_metrics import system_metrics_monitor
    from kernel_factory.evo.observers.mlflow import MlflowObserver
    started = []

    class Monitor:
        def __init__(self, run_id, **kw):
            started.append(run_id)

        def start(self):
            pass
    monkeypatch.setattr(system_metrics_monitor, "SystemMetricsMonitor", Monitor)
    obs = MlflowObserver.__new__(MlflowObserver)
    obs.parent_id, obs.monitor = "p1", None
    for kind in ("replay", "gpu"):
        obs.run = type("Run", (), {"evaluator": type("E", (), {"kind": kind})(), "resumed": False})()
        obs._monitor("sqlite:///x")
    assert started == ["p1"] and isinstance(obs.monitor, Monitor)
    import pynvml  # noqa: F401  - MLflow's GPU monitor reads the GPU through nvidia-ml-py: it must be installed


# ---- 8. exit codes ---------------------------------------------------------------------------------------------

def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--version"])
    assert stop.value.code == 0
    from importlib.metadata import version
    assert capsys.readouterr().out.strip() == f"kernel-factory {version('ptx-kernel-factory')}"


# ---- 9. output conventions ----------------------------------------------------------------------------------------

def test_results_go_to_stdout_and_progress_to_stderr_for_the_shipped_softmax_config(tmp_path, capsys):
    assert cli.main(["run", "configs/softmax.yaml", "--run-id", "soft", "-o", f"out_dir={tmp_path}",
                     "-o", "observers=[console, journal]", "-o", "search.generations=2"]) == 0
    out, err = capsys.readouterr()
    (line,) = out.splitlines()
    end = journal_records(tmp_path / "soft" / "journal.jsonl")[-1]
    assert line.startswith(f"best {end['best']}: fitness ") and "genes {" in line
    assert "/s, ETA" in err and "evaluated" in err and "gen   0 |" in err and "best " not in err.split("done:")[1]


def test_progress_states_rate_and_eta():
    from kernel_factory.evo.observers.console import progress
    assert progress(12, 48, 4.0) == "[######..................] 12/48 evaluated, 3.0/s, ETA 12 s"
    assert progress(48, 48, 4.0).endswith("48/48 evaluated, 12.0/s, ETA -")
