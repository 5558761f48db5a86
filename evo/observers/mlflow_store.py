"""Reading the MLflow store back: earlier runs' candidates as history records (for credit, lessons, the surrogate
and warm start), and what a killed run had already logged (for resume). The writing side is mlflow.py; MLflow is
imported only in these two modules."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Sequence

from ..history import Record
from .mlflow import open_store
from ..types import Case, GeneSpace, Status

PAGE = 1000


def cases_key(problem: str, cases: Sequence[Case], baseline: str) -> str:
    """Fitness is comparable between runs only over the same cases and baseline: this names that combination."""
    text = "|".join([problem, baseline, *sorted(c.key for c in cases)])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


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
                  float(metrics.get("fitness", 0.0)), float(metrics.get("gpu_s", 0.0)), parent_run_id)


def _table_records(client: Any, parent: Any, space: GeneSpace, run_id: str) -> list[Record | None]:
    """A run logged without child runs: its candidates from the parent's candidate table (candidates.json)."""
    from .mlflow import read_table
    table = read_table(client, parent.info.run_id)
    out = []
    for row in (dict(zip(table, values)) for values in zip(*table.values())):
        params = {f"gene.{k}": v for k, v in (pair.split("=", 1) for pair in row["genes"].split())}
        genes = _typed_genes(params, space)
        out.append(None if genes is None else Record(
            row["candidate"], genes, row["patch"] != "none", tuple(p for p in row["parents"].split(",") if p),
            row["operator"], int(row["generation"]), Status(row["status"]), float(row["fitness"]),
            float(row["gpu_s"] or 0.0), run_id))
    return out


def load_prior(store: str | Path, experiment: str, space: GeneSpace, gpu: str, key: str,
               exclude_run: str) -> list[Record]:
    """Candidates of earlier runs of this experiment on the same GPU model, cases and baseline, oldest run first."""
    if not Path(store).is_file():
        return []
    client, _ = open_store(store)
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    parents = search_all(client, exp.experiment_id,
                         f"tags.`kf.kind` = 'evolution' and tags.`kf.cases_key` = '{key}' "
                         f"and tags.`kf.env.gpu` = '{gpu}'")
    out: list[Record] = []
    for parent in sorted(parents, key=lambda r: r.info.start_time):
        run_id = parent.data.tags.get("kf.run_id", "")
        if run_id == exclude_run:
            continue
        children = search_all(client, exp.experiment_id, f"tags.mlflow.parentRunId = '{parent.info.run_id}'")
        records = [_record(c, space, run_id) for c in children] or _table_records(client, parent, space, run_id)
        out.extend(sorted((r for r in records if r), key=lambda r: r.generation))
    return out
