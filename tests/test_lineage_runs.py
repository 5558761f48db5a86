"""Lineage stays within its run. Three quickstart replays share one store (seed 0, seed 0 again, seed 1), so the
later two warm-start from genomes that the earlier ones bred, and a genome id recurs across runs with other parents.
Every chain step that `kernel-factory lineage`, the MLflow description, lineage.md and the image's graph data show
is checked against the runs' journals; a seed must be a marked step that links to the run that bred it."""
from __future__ import annotations

import json
import re
from pathlib import Path

import networkx as nx
import pytest
from mlflow.tracking import MlflowClient

from kernel_factory.evo import config, journal
from kernel_factory.evo.observers import lineage, lineage_image
from kernel_factory.evo.observers.mlflow_view import NOTE_TAG
from kernel_factory.evo.run import execute
from kernel_factory.evo.tools import cli

ROOT = Path(__file__).resolve().parent.parent
HEAD = re.compile(r"gen (?P<gen>-?\d+)  (?P<node>[0-9a-f]{16})  (?P<op>\S+)  (?P<status>\S+)  fitness \S+"
                  r"(?: \((?:[+-]\d+\.\d+ )?from (?P<parent>[0-9a-f]{16})"
                  r"(?:; also bred from (?P<others>[0-9a-f, ]+))?\))?"
                  r"(?:; seed from run (?P<run>\S+) \(candidate (?P<cand>[0-9a-f]{16}), gen (?P<there>\d+) there\))?$")


class Run:
    """What a run's journal says: each candidate's generation and parents, its warm-start seeds and its best."""

    def __init__(self, path: Path):
        record = journal.read(path)
        self.id, self.best = record.run_id, record.latest_best()
        self.generation = {c.id: c.generation for c, _ in record.outcomes()}
        self.parents = {c.id: c.parents for c, _ in record.outcomes()}
        self.seed_from = dict(record.start.warm_start_from)

    def full(self, prefix: str) -> str:
        found = [n for n in self.parents if n.startswith(prefix)]
        assert len(found) == 1, f"{prefix} is not one candidate of run {self.id}"
        return found[0]

    def ancestry(self, node: str) -> set[str]:
        """node and its ancestors by this journal's parent links alone."""
        seen, todo = set(), [node]
        while todo:
            n = todo.pop()
            if n not in seen:
                seen.add(n)
                todo += self.parents[n]
        return seen


@pytest.fixture(scope="module")
def three(tmp_path_factory) -> tuple[Path, dict[str, Run], list[str]]:
    root = tmp_path_factory.mktemp("three-runs")
    out = root / "runs"
    store = out / "mlflow.db"
    ids = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
        for seed in (0, 0, 1):
            cfg = config.load(ROOT / "configs" / "quickstart.yaml", (
                f"seed={seed}", "search.generations=3", f"out_dir={out}", f"tracking.store={store}",
                f"tracking.artifacts={out / 'artifacts'}"))
            ids.append(execute(cfg).run_id)
    runs = {i: Run(out / i / journal.NAME) for i in ids}
    return out, runs, ids


def check_seed(runs: dict[str, Run], run: Run, node: str, origin: str | None, cand: str | None,
               there: str | None) -> None:
    """A chain's first step: a seed of this run names the run, candidate and generation that bred it; nothing
    else does."""
    assert run.parents[node] == ()   # the journal gives it no parent in this run: the chain stops here
    if node not in run.seed_from:
        assert origin is None
        return
    assert origin == run.seed_from[node] and origin != run.id
    bred = runs[origin]
    assert cand == node and int(there) == bred.generation[node]   # one gene space: the genome keeps its id
    earlier = list(runs)[:list(runs).index(run.id)]
    assert origin == next(r for r in earlier if node in runs[r].parents)   # where it was bred, not copied


def check_text_chain(runs: dict[str, Run], run: Run, text: str) -> list[str]:
    """format_chain's text: each step is this run's candidate at its generation, bred from the step before."""
    heads = [block.splitlines()[0] for block in text.strip().split("\n\n")]
    steps = [HEAD.fullmatch(h) for h in heads]
    assert all(steps), heads
    nodes = [s["node"] for s in steps]
    for i, step in enumerate(steps):
        node = step["node"]
        assert int(step["gen"]) == run.generation[node]
        if i == 0:
            assert step["parent"] is None
            check_seed(runs, run, node, step["run"], step["cand"], step["there"])
            continue
        assert step["run"] is None and step["parent"] == nodes[i - 1]
        others = set(step["others"].split(", ")) if step["others"] else set()
        assert {step["parent"]} | others == set(run.parents[node])
    return nodes


def cli_chain(capsys, out: Path, run_id: str, *candidate: str) -> str:
    assert cli.main(["lineage", run_id, *candidate, "--runs", str(out), "--store", str(out / "mlflow.db")]) == 0
    label, text = capsys.readouterr().out.split("\n", 1)
    assert label.startswith("REPLAY: recorded measurements")
    return text


@pytest.mark.parametrize("index", [1, 2, 0])
def test_cli_chains_follow_the_journal(three, capsys, index):
    out, runs, ids = three
    run = runs[ids[index]]
    assert (index == 0) == (not run.seed_from)   # the later runs warm-start, and the test needs them to
    nodes = check_text_chain(runs, run, cli_chain(capsys, out, run.id))
    assert nodes[-1] == run.best
    # And a candidate bred in the run from the largest ancestry (one with a seed in it, in a warm run).
    deepest = max(run.parents, key=lambda n: (bool(run.ancestry(n) & set(run.seed_from)), len(run.ancestry(n)), n))
    nodes = check_text_chain(runs, run, cli_chain(capsys, out, run.id, deepest[:10]))
    assert nodes[-1] == deepest and len(nodes) >= 2


def parent_run(client: MlflowClient, run_id: str):
    exp = client.get_experiment_by_name("rmsnorm_fwd")
    (found,) = client.search_runs([exp.experiment_id], f"tags.`kf.run_id` = '{run_id}' and tags.`kf.kind` = "
                                                       "'evolution'")
    return found


@pytest.mark.parametrize("index", [1, 2])
def test_mlflow_description_and_lineage_md_follow_the_journal(three, tmp_path, index):
    out, runs, ids = three
    run = runs[ids[index]]
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    parent = parent_run(client, run.id)

    chain = re.search(r"Chain: (.*)", parent.data.tags[NOTE_TAG])[1].split(" -> ")
    first = re.fullmatch(r"`([0-9a-f]{8})` \((.*)\)", chain[0])
    node = run.full(first[1])
    seed = re.fullmatch(r"seed from run (\S+) \(candidate ([0-9a-f]{16}), gen (\d+) there\)", first[2])
    assert (seed is not None) == (node in run.seed_from)
    check_seed(runs, run, node, seed and seed[1], seed and seed[2], seed and seed[3])
    for part in chain[1:]:
        step = re.fullmatch(r"\S+ \(.*\) `([0-9a-f]{8})`", part)
        child = run.full(step[1])
        assert node in run.parents[child]
        node = child
    assert node == run.best

    md = Path(client.download_artifacts(parent.info.run_id, "lineage.md", str(tmp_path))).read_text()
    block = md.split("```")[1]
    nodes = check_text_chain(runs, run, block)
    assert nodes[-1] == run.best and f"`kernel-factory lineage {run.id}`" in md
    if nodes[0] in run.seed_from:
        assert f"`kernel-factory lineage {run.seed_from[nodes[0]]} {nodes[0]}`" in md


@pytest.mark.parametrize("index", [1, 2])
def test_image_graph_is_the_journal_with_marked_seed_links(three, tmp_path, index):
    out, runs, ids = three
    run = runs[ids[index]]
    client = MlflowClient(f"sqlite:///{out / 'mlflow.db'}")
    parent = parent_run(client, run.id)
    folder = Path(client.download_artifacts(parent.info.run_id, "lineage", str(tmp_path)))
    assert (folder / "lineage.png").stat().st_size > 20_000
    graph = nx.node_link_graph(json.loads((folder / "lineage.json").read_text()), edges="edges")
    drawn = lineage_image.drawing(graph)

    links = {(p, child) for child, parents in run.parents.items() for p in parents}
    assert {(e.source, e.target) for e in drawn.edges if e.kind == "parent"} == links
    origins = {s: lineage.origin_key(r, s) for s, r in run.seed_from.items() if s in run.parents}
    assert {(e.source, e.target) for e in drawn.edges if e.kind == "seed"} == {(o, s) for s, o in origins.items()}
    assert set(drawn.nodes) == set(run.parents) | set(origins.values())
    for seed, key in origins.items():   # each origin is labelled with the run and generation that bred the seed
        bred = runs[run.seed_from[seed]]
        assert drawn.labels[key] == f"{seed[:8]} in run {bred.id.rsplit('-', 1)[-1]} gen {bred.generation[seed]}"

    # The bold path is the best's ancestry by this run's journal, plus the link of the seed it starts from.
    ancestry = run.ancestry(run.best)
    ancestry |= {origins[n] for n in ancestry if n in origins}
    bold = {(e.source, e.target): e for e in drawn.edges if e.on_best}
    assert set(bold) == {(a, b) for a, b in graph.edges if a in ancestry and b in ancestry}
    assert all(e.label == "seed" for e in bold.values() if e.kind == "seed")
    assert any(e.kind == "seed" for e in bold.values()) == any(n in origins for n in ancestry)
