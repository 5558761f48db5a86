"""What earlier runs teach, read back from the MLflow store: their candidates as history records, for credit,
lessons, the surrogate and warm start (history.py holds the records; this module reads them). It also opens the
store for the MLflow observer (observers/mlflow.py, its plumbing in observers/mlflow_store.py), which writes it and
reads what a killed run had already logged. Only these three modules import mlflow."""
from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import Any, Iterator

from .history import Record
from .observers.mlflow_view import TABLE, table_numbers
from .types import GeneSpace, Status

# MLflow reads this when it loads; a user's own setting wins.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

from mlflow.tracking import MlflowClient  # noqa: E402

PAGE = 1000


def open_store(store: str | os.PathLike[str]) -> tuple[MlflowClient, str]:
    """A client on the SQLite store at `store` (relative paths from the CWD) and its tracking URI."""
    path = Path(store).resolve()
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        _create_store(path)
    uri = f"sqlite:///{path}"   # the path is absolute, so the URI has four slashes
    return MlflowClient(tracking_uri=uri), uri


def _create_store(path: Path) -> None:
    """Build a new store's schema in a temporary file and move it into place: MLflow's migrations are not atomic,
    and a run killed during them (seen with kill -9) leaves a store that no later run can open."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.init")
    MlflowClient(tracking_uri=f"sqlite:///{tmp}").search_experiments(max_results=1)
    try:
        os.link(tmp, path)     # fails if another process created the store meanwhile; theirs is complete too
    except FileExistsError:
        pass
    finally:
        tmp.unlink()


def search_all(client: Any, experiment_id: str, filter_string: str) -> list[Any]:
    out, token = [], None
    while True:
        page = client.search_runs([experiment_id], filter_string, max_results=PAGE, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _typed_genes(params: dict[str, str], space: GeneSpace) -> dict | None:
    genes = {}
    for gene in space.genes:
        raw = params.get(f"gene.{gene.name}", str(gene.default))   # a gene added since: that run had its default
        match = [v for v in gene.choices if str(v) == raw]
        if not match:
            return None    # logged under another version of the space: not comparable
        genes[gene.name] = match[0]
    return genes


def _record(run: Any, space: GeneSpace, parent_run_id: str) -> Record | None:
    tags, params, metrics = run.data.tags, run.data.params, run.data.metrics
    genes = _typed_genes(params, space)
    if genes is None or "kf.candidate_id" not in tags or run.info.status != "FINISHED":
        return None
    parents = tuple(p for p in tags.get("kf.parent_ids", "").split(",") if p)
    return Record(tags["kf.candidate_id"], genes, params.get("patch", "none") != "none", parents,
                  tags.get("kf.operator", ""), int(tags.get("kf.generation", "0")), Status(tags["kf.status"]),
                  float(metrics.get("fitness", 0.0)), float(metrics.get("gpu_s", metrics.get("recorded_gpu_s", 0.0))),
                  parent_run_id)


def source_filter(kind: str, gpu: str, recording: str, learn_from: str = "same_kind") -> str:
    """Which earlier runs may teach a run of this evaluator kind: live runs learn from live runs on the same GPU
    model, replays only from replays of the same recording (a replay measured nothing here, so it must never teach
    a live run). learn_from="any" drops the condition (cases and baseline still have to match)."""
    if learn_from == "any":
        return ""
    if kind == "replay":
        return f" and tags.`kf.evaluator` = 'replay' and tags.`kf.recording` = '{recording}'"
    return f" and tags.`kf.evaluator` = '{kind}' and tags.`kf.env.gpu` = '{gpu}'"


PROGRESS_BAR = "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"
_QUIET = threading.Lock()


@contextlib.contextmanager
def _no_progress_bar() -> Iterator[None]:
    """MLflow draws a progress bar on stderr for every artifact download, and we read a table per earlier run (warm
    start) and on resume: bars that pile up in the console's progress lines. MLflow reads this variable at each
    download, so it is switched off around our own reads only; a program that embeds us keeps its own setting.
    One read at a time, so that reads from two threads never restore the setting under each other."""
    with _QUIET:
        before = os.environ.get(PROGRESS_BAR)
        os.environ[PROGRESS_BAR] = "false"
        try:
            yield
        finally:
            if before is None:
                os.environ.pop(PROGRESS_BAR, None)
            else:
                os.environ[PROGRESS_BAR] = before


def read_table(client: Any, run_id: str, numbers: bool = True) -> dict[str, list]:
    """A parent run's candidate table (candidates.json) as {column: values} ({} when it has none), its numbers as
    floats (None where a candidate has none: a failure's fitness), or as the text it holds (numbers=False)."""
    import json
    import tempfile
    if TABLE not in {a.path for a in client.list_artifacts(run_id)}:
        return {}
    with tempfile.TemporaryDirectory(prefix="kf-table-") as tmp, _no_progress_bar():
        data = json.loads(Path(client.download_artifacts(run_id, TABLE, tmp)).read_text())
    table = {name: [row[i] for row in data["data"]] for i, name in enumerate(data["columns"])}
    return table_numbers(table) if numbers else table


def _table_records(client: Any, parent: Any, space: GeneSpace, run_id: str) -> list[Record | None]:
    """A run logged without child runs: its candidates from the parent's candidate table."""
    table = read_table(client, parent.info.run_id)
    out = []
    for row in (dict(zip(table, values)) for values in zip(*table.values())):
        params = {f"gene.{k}": v for k, v in (pair.split("=", 1) for pair in row["genes"].split())}
        genes = _typed_genes(params, space)
        out.append(None if genes is None else Record(
            row["candidate"], genes, row["patch"] != "none", tuple(p for p in row["parents"].split(",") if p),
            row["operator"], int(row["generation"]), Status(row["status"]), row["fitness"] or 0.0,
            row.get("gpu_s", row.get("recorded_gpu_s")) or 0.0, run_id))
    return out


def load_prior(store: str | Path, experiment: str, space: GeneSpace, gpu: str, key: str,
               exclude_run: str, kind: str = "gpu", recording: str = "", learn_from: str = "same_kind"
               ) -> list[Record]:
    """Candidates of earlier runs of this experiment on the same cases and baseline, and of the same evaluator kind
    (source_filter), oldest run first."""
    if not Path(store).is_file():
        return []
    client, _ = open_store(store)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    parents = search_all(client, exp.experiment_id,
                         f"tags.`kf.kind` = 'evolution' and tags.`kf.cases_key` = '{key}'"
                         + source_filter(kind, gpu, recording, learn_from))
    out: list[Record] = []
    for parent in sorted(parents, key=lambda r: r.info.start_time):
        run_id = parent.data.tags.get("kf.run_id", "")
        if run_id == exclude_run:
            continue
        children = search_all(client, exp.experiment_id, f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
        records = [_record(c, space, run_id) for c in children] or _table_records(client, parent, space, run_id)
        # a refusal (status infeasible) was never evaluated, and the rule already is its lesson: not history
        out.extend(sorted((r for r in records if r and r.status is not Status.INFEASIBLE), key=lambda r: r.generation))
    return out
