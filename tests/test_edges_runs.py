"""The edges of issue 33 where data went where it does not belong or a fault was reported late, on CPU: a run id the
MLflow store already holds, a lineage drawn to a file, the empty run folder of a run stopped at start-up, a store
that cannot be written or reached, a disk that fills mid-run, `resume` of a finished run, `check`'s output, and the
screenshot code writing only where it is told. Each drives the real CLI over a small replay run."""
import errno
import os
import re
import socket
import time
from pathlib import Path

import pytest

from conftest import config_writer
from kernel_factory.evo import build
from kernel_factory.evo.journal import records as journal_records
from kernel_factory.evo.observers import journal as journal_observer
from kernel_factory.evo import run as run_module
from kernel_factory.evo.tools import cli, screenshots

# The limit for a store that cannot be used: one line within 10 seconds of the run's start.
STORE_LIMIT_S = 10.0


@pytest.fixture
def write_config(tmp_path, replay_config):
    """Write the replay config, edited (keys a__b for a.b), and return its path."""
    return config_writer(tmp_path, replay_config)


def parents(store: Path, run_id: str) -> list:
    """The store's active parent runs of this run id."""
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{store}")
    exp = client.get_experiment_by_name("rmsnorm_fwd")
    return client.search_runs([exp.experiment_id], f"tags.`kf.run_id` = '{run_id}' and tags.`kf.kind` = 'evolution'")


def free_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- 1. a run id is unique in the store as in out_dir -------------------------------------------------------------

def test_a_run_id_the_store_holds_is_refused_whatever_the_out_dir(tmp_path, write_config, capsys):
    assert cli.main(["run", str(write_config()), "--run-id", "mynamed"]) == 0
    (before,) = parents(tmp_path / "runs" / "mlflow.db", "mynamed")
    capsys.readouterr()
    elsewhere = tmp_path / "elsewhere"
    assert cli.main(["run", str(write_config(out_dir=str(elsewhere))), "--run-id", "mynamed"]) == cli.EXIT_BAD_INPUT
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert "run id 'mynamed' already exists in the MLflow store" in err and f"--runs {tmp_path / 'runs'}" in err
    assert not elsewhere.exists(), "nothing of the refused run was written"
    (after,) = parents(tmp_path / "runs" / "mlflow.db", "mynamed")
    assert after.info.run_id == before.info.run_id and after.data.metrics == before.data.metrics


# ---- 3. lineage --out names a file or a folder --------------------------------------------------------------------

def test_lineage_out_writes_the_file_it_names_or_a_folder_and_refuses_other_suffixes(tmp_path, write_config,
                                                                                      capsys):
    assert cli.main(["run", str(write_config(search__generations=1)), "--run-id", "drawn"]) == 0
    lineage = ["lineage", "drawn", "--runs", str(tmp_path / "runs")]
    for name, magic in (("lin.png", b"\x89PNG"), ("lin.svg", b"<?xml"), ("lin.json", b"{")):
        assert cli.main([*lineage, "--out", str(tmp_path / "out" / name)]) == 0
        assert (tmp_path / "out" / name).is_file() and (tmp_path / "out" / name).read_bytes().startswith(magic)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["lin.json", "lin.png", "lin.svg"]
    assert cli.main([*lineage, "--out", str(tmp_path / "folder")]) == 0
    assert sorted(p.name for p in (tmp_path / "folder").iterdir()) == [f"lineage.{k}" for k in
                                                                         ("html", "json", "png", "svg")]
    capsys.readouterr()
    assert cli.main([*lineage, "--out", str(tmp_path / "lin.jpg")]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ".png, .svg, .html, .json" in err and not (tmp_path / "lin.jpg").exists()


# ---- 4. a run stopped at start-up leaves no empty run folder ------------------------------------------------------

def test_a_config_error_after_the_run_folder_exists_leaves_no_folder(tmp_path, write_config, capsys):
    missing = tmp_path / "no-table.json"
    assert cli.main(["run", str(write_config(search__seeds_from=str(missing))), "--run-id", "bad"]) == 2
    assert "search.seeds_from" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "bad").exists()


@pytest.mark.parametrize("where", ["evaluator", "observers"])
def test_ctrl_c_during_start_up_leaves_no_folder_and_frees_the_run_id(tmp_path, write_config, monkeypatch, where):
    """Before the journal exists (building the evaluator), and after its start record and the MLflow parent run
    (as the search begins): either way nothing was measured, so nothing stays and the id can be used again."""
    if where == "evaluator":
        def interrupted(*args, **kwargs):
            raise KeyboardInterrupt
        monkeypatch.setattr(build, "make_evaluator", interrupted)
    else:
        def interrupted(*args, **kwargs):   # every observer has started: the journal and the parent run exist
            assert (tmp_path / "runs" / "early" / "journal.jsonl").is_file()
            assert len(parents(tmp_path / "runs" / "mlflow.db", "early")) == 1
            raise KeyboardInterrupt
        monkeypatch.setattr(run_module, "evolve", interrupted)
    assert cli.main(["run", str(write_config()), "--run-id", "early"]) == 130
    assert not (tmp_path / "runs" / "early").exists()
    assert parents(tmp_path / "runs" / "mlflow.db", "early") == []
    monkeypatch.undo()
    assert cli.main(["run", str(write_config()), "--run-id", "early"]) == 0


def test_a_folder_that_was_there_before_is_kept(tmp_path, write_config, monkeypatch):
    (tmp_path / "runs" / "kept").mkdir(parents=True)
    (tmp_path / "runs" / "kept" / "notes.txt").write_text("mine")
    monkeypatch.setattr(build, "make_evaluator", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
    assert cli.main(["run", str(write_config()), "--run-id", "kept"]) == 130
    assert (tmp_path / "runs" / "kept" / "notes.txt").read_text() == "mine"


# ---- 5. a store that cannot be used is named first, fast ----------------------------------------------------------

@pytest.mark.parametrize("store", ["uri-sqlite-proc", "store-under-proc", "unreachable-server"])
def test_a_store_that_cannot_be_used_is_one_line_before_the_first_candidate(tmp_path, write_config, capsys,
                                                                            monkeypatch, store):
    edits, uri = {}, ""
    if store == "uri-sqlite-proc":
        uri = "sqlite:////proc/kf-test.db"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    elif store == "store-under-proc":
        uri = "/proc/kf-test/mlflow.db"
        edits["tracking__store"] = uri
    else:
        uri = f"http://127.0.0.1:{free_port()}/"
        monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    evaluated = []
    monkeypatch.setattr(build, "make_evaluator", lambda *a, **k: evaluated.append(1))
    started = time.monotonic()
    assert cli.main(["run", str(write_config(**edits)), "--run-id", "nostore"]) == cli.EXIT_BAD_INPUT
    took = time.monotonic() - started
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, err
    assert f"MLflow tracking at {uri} cannot be written" in err and "tracking.optional" in err
    assert "done:" not in err and "no candidate" not in err and evaluated == []
    assert not (tmp_path / "runs" / "nostore").exists()
    assert took < STORE_LIMIT_S, f"the store's error took {took:.1f} s"


def test_an_unreachable_optional_store_warns_once_and_runs_on_the_journal(tmp_path, write_config, capsys,
                                                                          monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}/")
    assert cli.main(["run", str(write_config(tracking__optional=True)), "--run-id", "offline"]) == 0
    err = capsys.readouterr().err
    assert err.count("cannot be written") == 1 and "Connection refused" in err and "journal only" in err
    end = journal_records(tmp_path / "runs" / "offline" / "journal.jsonl")[-1]
    assert end["event"] == "end" and end["best"] is not None


# ---- 6. a disk that fills mid-run ----------------------------------------------------------------------------------

class FillingFile:
    """A journal file on a disk with room for `room` more writes: the next fails as a full disk does, with an
    OSError that names no file."""

    room = 0

    def __init__(self, path, mode):
        self.inner = open(path, mode)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.inner.close()

    def write(self, text):
        if FillingFile.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        FillingFile.room -= 1
        return self.inner.write(text)

    def flush(self):
        self.inner.flush()

    def fileno(self):
        return self.inner.fileno()


def test_a_disk_that_fills_names_the_file_and_counts_what_was_evaluated(tmp_path, write_config, capsys,
                                                                       monkeypatch):
    FillingFile.room = 20   # the start record and 19 results
    monkeypatch.setattr(journal_observer, "open", FillingFile, raising=False)
    assert cli.main(["run", str(write_config()), "--run-id", "full"]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip().splitlines()
    path = tmp_path / "runs" / "full" / "journal.jsonl"
    assert err[-1].startswith("kernel-factory: error: cannot write") and repr(str(path)) in err[-1], err[-1]
    assert os.strerror(errno.ENOSPC) in err[-1] and not any("Traceback" in line for line in err)
    kept = [r for r in journal_records(path) if r["event"] == "result"]
    assert kept
    (stopped,) = [line for line in err if line.startswith("stopped by an error after")]
    assert int(stopped.split()[5]) >= len(kept), stopped
    assert not any(re.search(r"(?<!\d)0 candidates evaluated", line) or "no candidate passed" in line for line in err)
    (parent,) = parents(tmp_path / "runs" / "mlflow.db", "full")
    assert parent.info.status == "FAILED" and parent.data.metrics["evaluations_total"] >= len(kept)


# ---- 13. resume of a finished run ----------------------------------------------------------------------------------

def test_resume_of_a_finished_run_says_so_and_runs_nothing(tmp_path, write_config, capsys):
    assert cli.main(["run", str(write_config(search__generations=1)), "--run-id", "over"]) == 0
    path = tmp_path / "runs" / "over" / "journal.jsonl"
    before = path.read_text()
    capsys.readouterr()
    assert cli.main(["resume", "over", "--runs", str(tmp_path / "runs")]) == 0
    out, err = capsys.readouterr()
    assert out.count("\n") == 1 and "run 'over' is finished (stopped by generations" in out and err == ""
    assert path.read_text() == before, "nothing was re-run"


# ---- 12. check says each line once ------------------------------------------------------------------------------

def test_check_prints_each_line_once_on_stdout(capsys):
    assert cli.main(["check", "softmax_fwd", "--sample", "2", "--shapes", "1", "--jobs", "1"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert err == "" and len(lines) == len(set(lines)) > 2 and lines[-1] == "softmax_fwd: ok"


# ---- 2. screenshots go only where they are told --------------------------------------------------------------------

class FakePage:
    """Stands in for the browser's page: a screenshot is a small RGB PNG of more colours than a palette holds."""

    def __init__(self, shots: list):
        self.shots = shots

    def screenshot(self, path: str) -> None:
        from PIL import Image
        image = Image.new("RGB", (64, 48))
        image.putdata([(x * 4, y * 5, (x * y) % 256) for y in range(48) for x in range(64)])
        image.save(path)
        self.shots.append(Path(path))


def test_the_screenshot_code_writes_only_under_the_folder_it_is_given(tmp_path, monkeypatch):
    import contextlib
    shots: list[Path] = []
    monkeypatch.chdir(tmp_path)   # a relative path written by mistake would land here, outside `out`
    monkeypatch.setattr(screenshots, "make_store", lambda where, config: where)
    monkeypatch.setattr(screenshots, "ui_server", lambda runs: contextlib.nullcontext(("link", 1, None)))
    monkeypatch.setattr(screenshots, "browser", lambda: contextlib.nullcontext(FakePage(shots)))
    for step in ("runs_table", "lineage_image", "candidate_table", "failures"):
        monkeypatch.setattr(screenshots, step, lambda *args, **kwargs: None)
    monkeypatch.setattr(screenshots, "parent_run", lambda *args: "run-url")
    out = tmp_path / "shots"
    paths = screenshots.shoot(out, Path("configs/quickstart.yaml"))
    assert shots == paths and [p.name for p in paths] == list(screenshots.SHOTS)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        p.relative_to(tmp_path) for p in paths)
    from PIL import Image
    for path in paths:   # each kept with a palette of at most 256 colours, at the browser's size
        with Image.open(path) as image:
            assert image.mode == "P" and image.size == (64, 48) and len(image.getcolors(256) or ()) > 1


def test_the_browser_tests_take_their_screenshots_into_tmp_path():
    """The suite's own screenshots (tests/test_ui_browser.py) go to the test's temporary folder, never docs/img:
    every screenshot call in tests/ names tmp_path."""
    calls = [(p.name, line.strip()) for p in Path(__file__).parent.glob("test_*.py")
             for line in p.read_text().splitlines() if ".screenshot(path=" in line and p.name != Path(__file__).name]
    assert calls and all("tmp_path" in line for _, line in calls), calls
