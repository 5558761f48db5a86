"""What the MLflow UI shows of a run, as plain data: short run names, descriptions, run colours, the saved view that
the start link opens (parent runs, the columns that matter), the candidate table and the failure and lineage notes.
No mlflow import: mlflow.py writes these, and a user comparing runs reads them."""
from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any, Mapping, Sequence
from urllib.parse import urlencode

import networkx as nx

from . import lineage
from ..types import Candidate, EvalResult, Status

# MLflow 3.17's UI: an experiment tag `mlflow.sharedViewState.<key>` holds a runs-table view (filter, order,
# columns) that the URL parameter viewStateShareKey opens; `mlflow.experimentKind` picks the training-runs view
# over the GenAI overview; `mlflow.runColor` fixes a run's colour; `mlflow.note.content` is a description.
VIEW_KEY = "kernel-factory-runs"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"
KIND_TAG, KIND = "mlflow.experimentKind", "custom_model_development"
COLOUR_TAG, NOTE_TAG = "mlflow.runColor", "mlflow.note.content"
PARENTS_FILTER = "tags.`kf.kind` = 'evolution'"
TABLE = "candidates.json"
# Distinct at a glance and for colour-blind readers (Okabe-Ito first, then Tableau's darker hues).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#D55E00", "#56B4E9", "#F0E442", "#000000",
           "#8c564b", "#7f7f7f", "#bcbd22", "#17becf")
# The runs table's columns beyond name, start and duration, 100 pixels each: seven fit a 1500-pixel window beside
# MLflow's side bar (columns past the window's edge are not drawn until scrolled to). A run has one of gpu_s_total
# (live) and recorded_gpu_s_total (replay); the seed is in the run name, the best candidate in the description.
COLUMNS = (("metrics", "final_best_fitness"), ("metrics", "evaluations_total"), ("metrics", "failures_total"),
           ("tags", "kf.evaluator"), ("tags", "kf.warm_start_runs"), ("tags", "kf.stop_reason"),
           ("metrics", "gpu_s_total"), ("metrics", "recorded_gpu_s_total"))


def column_key(kind: str, name: str) -> str:
    return f"{kind}.`{name}`"


def view_state() -> dict[str, Any]:
    """The runs-table view the start link opens: parent runs only, best first, the columns that matter."""
    return {"searchFilter": PARENTS_FILTER, "orderByKey": column_key("metrics", "final_best_fitness"),
            "orderByAsc": False, "lifecycleFilter": "Active", "datasetsFilter": [],
            "selectedColumns": [column_key(k, n) for k, n in COLUMNS], "runListHidden": False}


def start_link(base_url: str, experiment_id: str) -> str:
    query = urlencode({"viewStateShareKey": VIEW_KEY, "workflowType": "machine_learning"})
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def run_name(seed: int, warm_runs: int, run_id: str, best: float | None = None) -> str:
    """`s0 cold 1.105x 857938`: seed, warm start (from how many runs), best fitness, the run id's tail."""
    warm = f"warm<{warm_runs}" if warm_runs else "cold"
    fitness = f" {best:.3f}x" if best else ""
    return f"s{seed} {warm}{fitness} {run_id.rsplit('-', 1)[-1]}"


def description(problem: str, run_id: str, evaluator: Mapping[str, str], graph: nx.DiGraph | None,
                warm_from: Mapping[str, str], failures: Mapping[str, int]) -> str:
    """The parent run's description (markdown): problem, data source, best candidate and its chain in one line."""
    source = (f"**replayed** from {evaluator.get('label', 'a recording')}: no kernel ran in this run"
              if evaluator.get("kind") == "replay" else f"**live** on {evaluator.get('gpu', 'a GPU')}")
    lines = [f"`{problem}` run `{run_id}`, {source}."]
    top = lineage.best(graph) if graph is not None else None
    if top is not None:
        lines.append(f"Best: `{top}` at {graph.nodes[top]['fitness']:.4f}x. Chain: {one_line(graph, top)}")
    if warm_from:
        lines.append(f"Warm start: {len(warm_from)} genomes from {', '.join(sorted(set(warm_from.values())))}.")
    if failures:
        lines.append("Failures: " + ", ".join(f"{n} {s}" for s, n in sorted(failures.items())) + " (failures.md).")
    return "\n\n".join(lines)


def one_line(graph: nx.DiGraph, node: str) -> str:
    """The ancestry in its run as `a (seed from run X (candidate a, gen 3 there)) -> mut (threads 256->512) b`,
    oldest first."""
    parts = []
    for step in lineage.chain(graph, node):
        if step.parent is None:
            note = lineage.seed_note(step.seed_from) if step.seed_from else step.operator
            note += f"; {lineage.cycle_note(step)}" if step.cycle else ""
            parts.append(f"`{step.node[:8]}` ({note})")
            continue
        diff = ", ".join(f"{g} {a}->{b}" for g, (a, b) in step.gene_diff.items()) or "same genes"
        parts.append(f"{lineage.SHORT_OPERATOR.get(step.operator, step.operator)} ({diff}) `{step.node[:8]}`")
    return " -> ".join(parts)


def experiment_description(problem: str) -> str:
    return (f"Evolutionary runs of `{problem}`: one run per search (child candidates are rows of its "
            f"`{TABLE}` table). Open a run for its description, `lineage.md`, the lineage image, `failures.md`.")


def why(result: EvalResult) -> str:
    """A failure's reason in one line: the first line that names an error, else the message's first line."""
    lines = [line.strip() for line in result.message.splitlines() if line.strip()]
    named = [line for line in lines if "error" in line.lower()]
    return ((named or lines or [""])[0])[:300]


def candidate_table(results: Sequence[tuple[Candidate, EvalResult]], graph: nx.DiGraph, copy_gbps: float,
                    cases: Sequence[str], replay: bool = False) -> dict[str, list]:
    """One row per candidate: genes, operator, parents, status, fitness, gene diff and fitness change against its
    fittest parent, speedup per case and percent of copy bandwidth (median over cases). Only a measured candidate
    (status ok) has a fitness, and a fitness change only against a measured parent: a failure's 0 is the search's
    verdict, not a number it measured. A replay's GPU seconds are the recording's: recorded_gpu_s."""
    gpu_s = "recorded_gpu_s" if replay else "gpu_s"
    # What a user sorts by and reads first: the viewer shows about six columns at a time (scroll for the rest).
    columns: dict[str, list] = {name: [] for name in (
        "candidate", "status", "fitness", "fitness_change", "gene_diff", "operator", "generation", "parents", "why",
        "copy_bw_pct", "genes", "patch", gpu_s)}
    columns |= {f"speedup {case}": [] for case in cases}
    for cand, res in results:
        step = lineage.against_parent(graph, cand.id)
        measured = res.status is Status.OK
        against = measured and step.parent is not None and graph.nodes[step.parent]["status"] == Status.OK.value
        row = {"candidate": cand.id, "generation": cand.generation, "operator": cand.operator,
               "parents": ",".join(cand.parents), "status": res.status.value,
               "fitness": cell(res.fitness if measured else None),
               "fitness_change": cell(step.fitness_change if against else None),
               "gene_diff": "; ".join(f"{g}: {a} -> {b}" for g, (a, b) in step.gene_diff.items()),
               "copy_bw_pct": cell(_copy_pct(res, copy_gbps), 1), "why": "" if measured else why(res),
               "genes": " ".join(f"{k}={v}" for k, v in cand.genome.genes),
               "patch": ",".join(name for name, _ in cand.genome.patch) or "none", gpu_s: cell(res.gpu_s or None)}
        row |= {f"speedup {case}": cell(_speedup(res, case)) for case in cases}
        for name, value in row.items():
            columns[name].append(value)
    return columns


def cell(value: float | None, places: int = 4) -> str:
    """A number as the table's text: fixed decimals, '' for none. MLflow's table viewer shows every cell as text and
    sorts text with runs of digits compared as integers, so "1.105" would sort as less than "1.0234" (105 < 234); with
    the same number of decimals in every row its order is the numeric one (for values >= 0)."""
    return "" if value is None else f"{value:.{places}f}"


def table_file(table: Mapping[str, list]) -> str:
    """The candidate table ({column: values}) as the file MLflow's table viewer reads: pandas' "split" layout,
    written whole by us rather than appended by MLflow's log_table, whose round trip through pandas turns "1.1030"
    back into 1.103 in the rows it re-reads (and downloads the table again every generation)."""
    return json.dumps({"columns": list(table), "data": [list(row) for row in zip(*table.values())]})


def table_numbers(table: Mapping[str, list]) -> dict[str, list]:
    """A candidate table read back ({column: values}) with its number columns as floats (None for an empty cell);
    tables logged before the numbers became text hold floats already."""
    def number(v: Any) -> float | None:
        return None if v is None or v == "" else float(v)
    numeric = {"fitness", "fitness_change", "copy_bw_pct", "gpu_s", "recorded_gpu_s"}
    return {name: [number(v) for v in values] if name in numeric or name.startswith("speedup ") else list(values)
            for name, values in table.items()}


def _speedup(result: EvalResult, case: str) -> float | None:
    t, base = result.times_us.get(case), result.baseline_us.get(case)
    return base / t if t and base else None


def _copy_pct(result: EvalResult, copy_gbps: float) -> float | None:
    values = sorted(100 * v / copy_gbps for v in result.gbps.values() if v and math.isfinite(v)) if copy_gbps else []
    return values[len(values) // 2] if values else None


def failures_md(results: Sequence[tuple[Candidate, EvalResult]]) -> str:
    """What failed and why: a count per status, then each failure with its reason and log."""
    failed = [(c, r) for c, r in results if r.status.failed]
    if not failed:
        return "# Failures\n\nNo candidate failed in this run.\n"
    counts = Counter(r.status.value for _, r in failed)
    out = ["# Failures", "", ", ".join(f"{n} {s}" for s, n in sorted(counts.items())), ""]
    for cand, res in failed:
        out += [f"## `{cand.id}` {res.status.value} (gen {cand.generation}, {cand.operator})", "",
                f"genes: {cand.genome.gene_dict}", "", "```", res.message.strip()[:3000] or "(no log)", "```", ""]
    return "\n".join(out)


def lineage_md(graph: nx.DiGraph, run_id: str) -> str:
    """lineage.md: the best candidate's chain in this run as `kernel-factory lineage` prints it, and where to
    follow a warm-start seed it starts from."""
    top = lineage.best(graph)
    if top is None:
        return f"# Lineage of {run_id}\n\nNo candidate was evaluated.\n"
    text = [f"# Lineage of {run_id}", "", f"The best candidate `{top}` and how it came about in this run, oldest "
            f"first (`kernel-factory lineage {run_id}` prints the same).", ""]
    steps = lineage.chain(graph, top)
    origin = steps[0].seed_from
    if origin is not None:
        text += [f"It starts from a warm-start seed, bred in run `{origin['run']}`: "
                 f"`kernel-factory lineage {origin['run']} {origin['candidate']}` shows how it came about there.", ""]
    text += ["```", lineage.format_chain(steps), "```", ""]
    return "\n".join(text)
