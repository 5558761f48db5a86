"""The MLflow store as the factory uses it: where a run writes (tracking URI or SQLite file), MLflow's size limits
kept on our side, the background writer that the observer queues its calls on, and the UI's command, tags and start
links. With evo/observers/mlflow.py (the observer) and evo/prior.py (the history reader), the only importers of
mlflow."""
from __future__ import annotations

import json
import logging
import os
import queue
import re
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence
from urllib.parse import urlsplit

from . import mlflow_view as view
from ..config import ConfigError
from ..prior import open_store   # before mlflow: prior sets MLflow's environment defaults
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

# A new store logs "Creating initial MLflow database tables..." at INFO from the writer thread, which would land in
# the middle of the console observer's progress line; and every failed write logs its SQL and a traceback at ERROR
# (tens of thousands of lines for a read-only store). The writer counts failures and reports them in one line.
logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)
# The system metrics monitor says at INFO when it starts, stops and finds no GPU; only its warnings matter here.
logging.getLogger("mlflow.system_metrics").setLevel(logging.WARNING)

# MLflow 3.17's limits (mlflow/utils/validation.py). Longer values would be truncated with a warning per value,
# and an oversized log_batch is rejected as a whole, so we stay inside them ourselves.
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
MAX_METRICS_PER_BATCH = 1000
MAX_PARAMS_OR_TAGS_PER_BATCH = 100
MAX_ENTITIES_PER_BATCH = 1000

# The server's background job runner costs ~1 GB of memory and nothing here uses it (api-notes 3c).
UI_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}

# Metric, param and tag names may hold alphanumerics, _ - . / and space everywhere. MLflow also takes ":" except on
# Windows, but an unquoted ":" breaks a search filter (`metrics.time_us.bfloat16:32768x256 < 6` is rejected), so a
# case key "bfloat16:32768x256" becomes "bfloat16_32768x256": valid everywhere and queryable without backticks.
_UNSAFE = re.compile(r"[^A-Za-z0-9_.\-/ ]")


def safe_key(text: str) -> str:
    """A metric/param/tag name MLflow accepts on every platform: unsafe characters become '_'."""
    return _UNSAFE.sub("_", text)[:MAX_KEY]


def tracking_uri(tracking: Any) -> str | None:
    """The tracking URI a run writes to: the config's tracking.uri, else MLFLOW_TRACKING_URI, else None (the
    SQLite file tracking.store, through open_store)."""
    return tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or None


def open_tracking(tracking: Any) -> tuple[MlflowClient, str]:
    """A client on the run's tracking backend (see tracking_uri)."""
    uri = tracking_uri(tracking)
    if uri is None:
        return open_store(tracking.store)
    return MlflowClient(tracking_uri=uri), uri


class TrackingError(ConfigError):
    """The tracking store cannot be written (read-only, unreachable, broken): one line, raised at the run's start."""


# How long the store may take to answer the check before the first candidate. MLflow retries a failing server for
# minutes, so the check runs on a thread it may outlive. A local SQLite file has no network to wait on (one that
# cannot be created fails at once in reachable()), but a new one runs MLflow's migrations, seconds on a loaded
# machine: it gets a hang guard only.
STORE_CHECK_S = 6.0
LOCAL_CHECK_S = 120.0
CONNECT_S = 3.0   # a tracking server's port, tried directly first (MLflow's own client retries for minutes)


def probe_store(tracking: Any, experiment: str, artifacts: Path, problem: str, run_id: str) -> str | None:
    """Open the store, create the experiment if needed and write its UI tags (a real write, which a run makes at its
    start anyway); return the out_dir recorded by the parent run of `run_id` if the store has one, else None."""
    reachable(tracking_uri(tracking))
    client, _ = open_tracking(tracking)
    exp = experiment_id(client, experiment, artifacts)
    prepare_ui(client, exp, problem)
    found = client.search_runs([exp], f"tags.`kf.run_id` = '{run_id}' and tags.`kf.kind` = 'evolution'",
                               max_results=1)
    return found[0].data.params.get("out_dir", "?") if found else None


def reachable(uri: str | None) -> None:
    """Fail fast, with the real reason, for the two stores MLflow would retry for minutes: a server whose port does
    not answer, and a SQLite file that cannot be created. Other URIs are left to the timed check."""
    if uri is None:
        return
    parts = urlsplit(uri)
    if parts.scheme in ("http", "https"):
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            socket.create_connection((parts.hostname or "localhost", port), timeout=CONNECT_S).close()
        except OSError as exc:
            raise ConnectionError(f"cannot connect to {parts.hostname}:{port}: {exc.strerror or exc}") from None
    elif parts.scheme == "sqlite" and uri.startswith("sqlite:///") and not uri.startswith("sqlite:///file:"):
        path = Path(uri[len("sqlite:///"):])
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)   # as open_store does for tracking.store
            with open(path, "x"):   # OSError names the path and why (a missing folder, a read-only one)
                pass
            path.unlink()


def check_store(tracking: Any, experiment: str, artifacts: Path, problem: str, run_id: str) -> str | None:
    """probe_store within its time (STORE_CHECK_S, LOCAL_CHECK_S): its answer, the exception it raised, or
    TimeoutError."""
    uri = tracking_uri(tracking)
    timeout_s = LOCAL_CHECK_S if uri is None or uri.startswith("sqlite:") else STORE_CHECK_S
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["out_dir"] = probe_store(tracking, experiment, artifacts, problem, run_id)
        except Exception as exc:   # noqa: BLE001 - handed to the caller, who says what failed in one line
            box["error"] = exc
    thread = threading.Thread(target=work, name="kf-store-check", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no answer within {timeout_s:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["out_dir"]


def ui_command(store: str | os.PathLike[str], artifacts: str | os.PathLike[str], host: str = "127.0.0.1",
               port: int = 5000) -> list[str]:
    """argv for the MLflow UI on our store; run it with UI_ENV added to the environment."""
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", f"sqlite:///{Path(store).resolve()}",
            "--default-artifact-root", str(Path(artifacts).resolve()), "--host", host, "--port", str(port),
            "--workers", "1"]


def experiment_id(client: MlflowClient, name: str, artifacts: Path) -> str:
    """The experiment's id, creating it with its artifact root on first use (MLflow fixes the root then)."""
    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, artifact_location=artifacts.as_uri())
        except MlflowException:
            exp = client.get_experiment_by_name(name)   # another run against the same store won the race
            if exp is None:
                raise
    if exp.artifact_location != artifacts.as_uri():
        print(f"mlflow: experiment {name!r} keeps its artifact root {exp.artifact_location}; "
              f"tracking.artifacts ({artifacts}) applies only to new experiments", file=sys.stderr)
    return exp.experiment_id


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested config -> {"search.population": "24", ...}; non-string leaves as JSON, so None reads 'null'."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, f"{name}."))
        else:
            out[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    return out


def batches(metrics: Sequence[Metric], params: Sequence[Param], tags: Sequence[RunTag]
            ) -> Iterator[tuple[list[Metric], list[Param], list[RunTag]]]:
    """Split one run's data into as few log_batch calls as MLflow's per-call limits allow (usually one)."""
    metrics, params, tags = list(metrics), list(params), list(tags)
    while metrics or params or tags:
        p, params = params[:MAX_PARAMS_OR_TAGS_PER_BATCH], params[MAX_PARAMS_OR_TAGS_PER_BATCH:]
        t, tags = tags[:MAX_PARAMS_OR_TAGS_PER_BATCH], tags[MAX_PARAMS_OR_TAGS_PER_BATCH:]
        room = min(MAX_METRICS_PER_BATCH, MAX_ENTITIES_PER_BATCH - len(p) - len(t))
        m, metrics = metrics[:room], metrics[room:]
        yield m, p, t


def params_of(values: Mapping[str, str]) -> list[Param]:
    return [Param(safe_key(k), v[:MAX_PARAM_VALUE]) for k, v in values.items()]


def tags_of(values: Mapping[str, str]) -> dict[str, str]:
    return {safe_key(k): str(v)[:MAX_TAG_VALUE] for k, v in values.items()}


def metrics_of(values: Mapping[str, float], step: int) -> list[Metric]:
    now = int(time.time() * 1000)
    return [Metric(safe_key(k), float(v), now, step) for k, v in values.items()]


class Writer:
    """One thread runs queued MLflow calls in order. A failing call is counted and the first one kept; the
    calls after it still run, so one bad record never stops the rest (or the run)."""

    def __init__(self) -> None:
        self.jobs: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.failures = 0
        self.first_error: BaseException | None = None
        self.thread = threading.Thread(target=self._work, name="kf-mlflow-writer", daemon=True)
        self.thread.start()

    def submit(self, job: Callable[[], None]) -> None:
        self.jobs.put(job)

    def drain(self) -> None:
        self.jobs.join()

    def close(self) -> None:
        self.jobs.put(None)   # queued after every job, so they all run first
        self.thread.join()

    def _work(self) -> None:
        while (job := self.jobs.get()) is not None:
            try:
                job()
            except Exception as exc:   # noqa: BLE001 - recorded and reported in on_end, never fatal to the run
                self.failures += 1
                if self.first_error is None:
                    self.first_error = exc
            finally:
                self.jobs.task_done()
        self.jobs.task_done()


def log_table_file(client: MlflowClient, run_id: str, text: str, path: str) -> None:
    """Write a table file (mlflow_view.table_file) whole, marked as a table as log_table marks its own (the tag
    mlflow.loggedArtifacts), so that the artifact viewer shows it as a table and the Evaluation view compares it."""
    client.log_text(run_id, text, path)
    tags = client.get_run(run_id).data.tags
    logged = json.loads(tags.get("mlflow.loggedArtifacts", "[]"))
    if {"path": path, "type": "table"} not in logged:
        client.set_tag(run_id, "mlflow.loggedArtifacts", json.dumps(logged + [{"path": path, "type": "table"}]))


def prepare_ui(client: MlflowClient, experiment_id: str, problem: str) -> None:
    """The experiment's UI tags: open in the training-runs view, the start link's saved view, a description."""
    tags = {view.KIND_TAG: view.KIND, view.VIEW_TAG: json.dumps(view.view_state()),
            view.NOTE_TAG: view.experiment_description(problem)}
    for key, value in tags.items():
        client.set_experiment_tag(experiment_id, key, value)


def ui_links(store: str | os.PathLike[str], base_url: str) -> list[tuple[str, str]]:
    """(experiment name, start link) for each experiment of the store that holds runs of the factory, after
    setting its UI tags (stores made before these tags existed get them here)."""
    client, _ = open_store(store)
    out = []
    for exp in client.search_experiments():
        parents = client.search_runs([exp.experiment_id], view.PARENTS_FILTER, max_results=1)
        if parents:
            prepare_ui(client, exp.experiment_id, parents[0].data.tags.get("kf.problem", exp.name))
            out.append((exp.name, view.start_link(base_url, exp.experiment_id)))
    return out


def kf_run_id(store: str | os.PathLike[str], mlflow_run_id: str) -> str | None:
    """The factory's run id of the parent run with this MLflow run id, or None (no such run, or not a parent)."""
    if not re.fullmatch(r"[0-9a-f]{32}", mlflow_run_id):
        return None
    try:
        return open_store(store)[0].get_run(mlflow_run_id).data.tags.get("kf.run_id")
    except MlflowException:
        return None
