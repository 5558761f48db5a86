"""Candidate lineage as a graph (who was bred from whom, by which operator) and walked back as a chain of changes,
because MLflow has no view of a run's family tree (api-notes 3d). A run's ancestry is its own: a genome id recurs
across runs (ids are content hashes) with other parents in each, so a warm-start seed is linked to the run and
candidate that bred it, never merged with that run's history. lineage_image.py draws the graph."""
from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

import networkx as nx

from .. import journal
from ..protocols import replay_note
from ..types import Candidate, EvalResult, GeneValue, Status

EXTERNAL = "external"   # the status of a parent that this run did not evaluate
ORIGIN = "origin"       # the operator of a node that stands for an earlier run's candidate (a seed's origin)
SHORT_OPERATOR = {"gene_mutation": "mut", "uniform_crossover": "xover", "ptx_mutation": "ptx"}


# ---- the graph ----------------------------------------------------------------------------------------------------

def build(results: Iterable[tuple[Candidate, EvalResult]], run_id: str = "", best_id: str | None = None,
          replay: str = "") -> nx.DiGraph:
    """Node per candidate, edge parent -> child per parent (labelled with the child's operator). A parent that is
    not among the results is still a node, marked external, one column before its first child. `best_id` names
    the run's own verdict on its best (the hall of fame's pick among equal fitness); best() honours it. `replay`
    (protocols.replay_note) labels a graph whose fitness values were replayed from a recording."""
    pairs, seen = [], set()
    for cand, res in results:   # a candidate recorded twice keeps its first record (and that record's parents)
        if cand.id not in seen:
            seen.add(cand.id)
            pairs.append((cand, res))
    graph = nx.DiGraph(run_id=run_id, best=best_id, replay=replay)
    for cand, res in pairs:
        # A cut candidate (racing) has no fitness: only its evidence, never a number to compare.
        graph.add_node(cand.id, generation=cand.generation, status=res.status.value,
                       fitness=None if res.status is Status.CUT else res.fitness, operator=cand.operator,
                       genes=cand.genome.gene_dict, patch=cand.genome.patch_dict, external=False)
    for cand, _ in pairs:
        for parent in cand.parents:
            if parent not in graph:
                graph.add_node(parent, generation=cand.generation - 1, status=EXTERNAL, fitness=None,
                               operator=EXTERNAL, genes={}, patch={}, external=True)
            elif graph.nodes[parent]["external"]:
                graph.nodes[parent]["generation"] = min(graph.nodes[parent]["generation"], cand.generation - 1)
            graph.add_edge(parent, cand.id, operator=cand.operator)
    return graph


def from_journal(path: str | Path) -> nx.DiGraph:
    """The lineage of the run whose journal (runs/<run id>/journal.jsonl) is at `path`, its warm-start seeds
    marked, with the run's best as its journal last named it (a killed run has no end record, but each generation
    names its best)."""
    run = journal.read(path)
    evaluator = run.start.evaluator
    graph = build(run.outcomes(), run.run_id, run.latest_best(), replay_note(evaluator.kind, evaluator.label))
    return mark_seeds(graph, run.start.warm_start_from, run.start.warm_start_origin)


def origin_key(run_id: str, candidate_id: str) -> str:
    """The node of an earlier run's candidate: keyed by (run, candidate), never by the candidate id alone, which
    is this run's own candidate of that genome."""
    return f"{run_id}/{candidate_id}"


def mark_seeds(graph: nx.DiGraph, warm_from: Mapping[str, str],
               origins: Mapping[str, Mapping[str, Any]] | None = None) -> nx.DiGraph:
    """The graph with each warm-start seed linked to the candidate that bred it (`warm_from`: seed id -> run id;
    `origins`: seed id -> {run, candidate, generation}, which journals before it lack): the seed node gets
    `seed_from`, and a node for that run's candidate (origin_key) joins it by an edge marked `seed`. Nothing of
    that run's ancestry comes along. A seed that this run's journal gives parents is left as the journal says."""
    out = graph.copy()
    for seed, run in sorted(warm_from.items()):
        if seed not in out or out.nodes[seed]["external"] or run_parents(out, seed):
            continue
        data = out.nodes[seed]
        origin = {"run": run, "candidate": seed, "generation": None, **(origins or {}).get(seed, {})}
        data["seed_from"] = origin
        key = origin_key(origin["run"], origin["candidate"])
        out.add_node(key, generation=data["generation"] - 1, status=EXTERNAL, fitness=None, operator=ORIGIN,
                     genes=dict(data["genes"]), patch=dict(data["patch"]), external=True, run=origin["run"],
                     run_generation=origin["generation"], candidate=origin["candidate"])
        out.add_edge(key, seed, operator="seed", seed=True)
    return out


def run_parents(graph: nx.DiGraph, node: str) -> list[str]:
    """The node's parents in its own run (a seed's link to an earlier run is not a parent)."""
    return [p for p in graph.predecessors(node) if not graph.edges[p, node].get("seed")]


def seed_note(origin: Mapping[str, Any]) -> str:
    """`seed from run R (candidate C, gen N there)`: where a warm-start seed was bred."""
    where = f", gen {origin['generation']} there" if origin.get("generation") is not None else ""
    return f"seed from run {origin['run']} (candidate {origin['candidate']}{where})"


def best(graph: nx.DiGraph) -> str | None:
    """The run's best: the one build() was told of, else the highest fitness (the first evaluated of equals)."""
    named = graph.graph.get("best")
    if named in graph and not graph.nodes[named]["external"]:
        return named
    evaluated = [n for n, d in graph.nodes(data=True) if not d["external"]]
    return max(evaluated, key=lambda n: _known(graph.nodes[n]["fitness"])) if evaluated else None


def best_ancestry(graph: nx.DiGraph) -> set[str]:
    """The best candidate and every candidate it descends from (a seed's origin node included)."""
    top = best(graph)
    return set() if top is None else {top} | nx.ancestors(graph, top)


# ---- the chain of changes -----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Step:
    """One candidate on an ancestry chain, compared with the parent the chain came through."""

    node: str
    generation: int
    operator: str
    status: str
    fitness: float | None
    parent: str | None                    # the best-fitness parent; None for the chain's oldest ancestor
    parents: tuple[str, ...]              # all parents in this run (two for a crossover)
    fitness_change: float | None          # fitness - parent's fitness, when both are known
    gene_diff: dict[str, tuple[GeneValue | None, GeneValue | None]]   # gene -> (parent's value, this value)
    patch_diff: str                       # unified diff of the editable regions that changed
    seed_from: Mapping[str, Any] | None = None   # a warm-start seed: the run, candidate and generation that bred it
    cycle: str | None = None              # a recorded parent already later on the chain: the chain stopped here


def chain(graph: nx.DiGraph, candidate_id: str) -> list[Step]:
    """The ancestry of `candidate_id` in its run, oldest first, following at each step back the parent with the
    best fitness. It ends at a candidate with no parent in the run (a founder, or a warm-start seed, whose step
    says where it was bred), or at one whose recorded parent is already on the chain: a cycle, which the records
    of one run cannot hold, is marked on that step instead of being followed round or shown as a parent."""
    path, node, cycle = [candidate_id], candidate_id, None
    while parents := run_parents(graph, node):
        looped = [p for p in parents if p in path]
        if looped:
            cycle = looped[0]
            break
        node = _fittest(graph, parents)
        path.append(node)
    path.reverse()
    steps = [_step(graph, node, path[i - 1] if i else None) for i, node in enumerate(path)]
    return [replace(steps[0], cycle=cycle), *steps[1:]]


def against_parent(graph: nx.DiGraph, candidate_id: str) -> Step:
    """One candidate compared with its fittest parent in its run (no parent: nothing to compare)."""
    parents = [p for p in run_parents(graph, candidate_id) if p != candidate_id]
    return _step(graph, candidate_id, _fittest(graph, parents) if parents else None)


def _fittest(graph: nx.DiGraph, nodes: list[str]) -> str:
    return max(nodes, key=lambda p: _known(graph.nodes[p]["fitness"]))


def _known(fitness: float | None) -> float:
    return -1.0 if fitness is None else fitness


def _step(graph: nx.DiGraph, node: str, parent: str | None) -> Step:
    data = graph.nodes[node]
    before = graph.nodes[parent] if parent is not None else None
    change = None
    if before is not None and before["fitness"] is not None and data["fitness"] is not None:
        change = data["fitness"] - before["fitness"]
    compare = before is not None and bool(before["genes"])   # an external parent's genes may be unknown
    return Step(node, data["generation"], data["operator"], data["status"], data["fitness"], parent,
                tuple(run_parents(graph, node)), change,
                gene_diff(before["genes"], data["genes"]) if compare else {},
                patch_diff(before["patch"], data["patch"], parent, node) if compare else "", data.get("seed_from"))


def gene_diff(old: Mapping[str, GeneValue], new: Mapping[str, GeneValue]
              ) -> dict[str, tuple[GeneValue | None, GeneValue | None]]:
    """gene -> (old, new) for each gene whose value differs (None where a side lacks the gene)."""
    return {g: (old.get(g), new.get(g)) for g in sorted(set(old) | set(new)) if old.get(g) != new.get(g)}


def patch_diff(old: Mapping[str, str], new: Mapping[str, str], old_id: str = "a", new_id: str = "b") -> str:
    """A unified diff of each editable region that differs, its files named <candidate id>:<region>."""
    lines: list[str] = []
    for region in sorted(set(old) | set(new)):
        before, after = old.get(region, ""), new.get(region, "")
        if before != after:
            lines += difflib.unified_diff(before.splitlines(), after.splitlines(), f"{old_id}:{region}",
                                          f"{new_id}:{region}", lineterm="")
    return "\n".join(lines)


def cycle_note(step: Step) -> str:
    if step.cycle == step.node:
        return "cycle: recorded as its own parent; the chain stops here"
    return f"cycle: its recorded parent {step.cycle} is already later on this chain; the chain stops here"


def format_chain(steps: list[Step]) -> str:
    """The chain as text, one block per step: what the operator changed and what it did to fitness; the oldest
    step says where a seed came from, or that the records loop."""
    blocks = []
    for step in steps:
        fitness = "-" if step.fitness is None else f"{step.fitness:.4f}x"
        head = f"gen {step.generation}  {step.node}  {step.operator}  {step.status}  fitness {fitness}"
        if step.parent is not None:
            change = "" if step.fitness_change is None else f"{step.fitness_change:+.4f} "
            others = [p for p in step.parents if p != step.parent]
            head += f" ({change}from {step.parent}" + (f"; also bred from {', '.join(others)})" if others else ")")
        if step.seed_from is not None:
            head += f"; {seed_note(step.seed_from)}"
        if step.cycle is not None:
            head += f"; {cycle_note(step)}"
        lines = [head] + [f"    {g}: {old!r} -> {new!r}" for g, (old, new) in step.gene_diff.items()]
        lines += [f"    {line}" for line in step.patch_diff.splitlines()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)
