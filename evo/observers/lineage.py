"""Candidate lineage as a graph (who was bred from whom, by which operator), drawn for MLflow and walked back as
a chain of changes, because MLflow has no view of a run's family tree (api-notes 3d)."""
from __future__ import annotations

import difflib
import html
import io
import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

import matplotlib
import networkx as nx
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import LinearSegmentedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from .. import journal
from ..protocols import replay_note
from ..types import Candidate, EvalResult, GeneValue

EXTERNAL = "external"   # the status of a parent that this run did not evaluate (e.g. a seed from an earlier run)
FAILURE_COLOURS = {"compile_error": "#d62728", "incorrect": "#ff7f0e", "crashed": "#9467bd",
                   "timeout": "#8c564b", "not_recorded": "#9e9e9e",
                   "suspect": "#e377c2", "infeasible": "#17becf"}
SHORT_OPERATOR = {"gene_mutation": "mut", "uniform_crossover": "xover", "ptx_mutation": "ptx"}
# Greens without its near-white end, so that the weakest correct kernel still reads as a filled node.
FITNESS_CMAP = LinearSegmentedColormap.from_list("kf_fitness", matplotlib.colormaps["Greens"](np.linspace(.3, 1, 64)))


# ---- the graph ----------------------------------------------------------------------------------------------------

def build(results: Iterable[tuple[Candidate, EvalResult]], run_id: str = "", best_id: str | None = None,
          replay: str = "") -> nx.DiGraph:
    """Node per candidate, edge parent -> child per parent (labelled with the child's operator). A parent that is
    not among the results is still a node, marked external, one column before its first child. `best_id` names
    the run's own verdict on its best (the hall of fame's pick among equal fitness); best() honours it. `replay`
    (protocols.replay_note) labels a graph whose fitness values were replayed from a recording."""
    pairs = list(results)
    graph = nx.DiGraph(run_id=run_id, best=best_id, replay=replay)
    for cand, res in pairs:
        graph.add_node(cand.id, generation=cand.generation, status=res.status.value, fitness=res.fitness,
                       operator=cand.operator, genes=cand.genome.gene_dict, patch=cand.genome.patch_dict,
                       external=False)
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
    """The lineage of the run whose journal (runs/<run id>/journal.jsonl) is at `path`, with the run's best as
    its journal last named it (a killed run has no end record, but each generation names its best)."""
    run = journal.read(path)
    evaluator = run.start.evaluator
    graph = build(run.outcomes(), run.run_id, run.latest_best(), replay_note(evaluator.kind, evaluator.label))
    graph.graph["warm_start_from"] = dict(run.start.warm_start_from)
    return graph


def with_origins(graph: nx.DiGraph, warm_from: Mapping[str, str], runs_dir: str | Path) -> nx.DiGraph:
    """The graph with each warm-start seed's ancestry in the run that bred it (from that run's journal under
    runs_dir), as earlier-run nodes left of generation 0; a seed whose run has no journal here stays a root."""
    out = graph.copy()
    for seed, origin in sorted(warm_from.items()):
        path = Path(runs_dir) / origin / journal.NAME
        if seed not in out or not path.is_file():
            continue
        earlier = from_journal(path)
        if seed not in earlier:
            continue
        shift = earlier.nodes[seed]["generation"] + 1
        for node in nx.ancestors(earlier, seed):
            if node not in out:
                data = earlier.nodes[node]
                out.add_node(node, **{**data, "generation": data["generation"] - shift, "external": True,
                                      "run": origin})
        for a, b, data in earlier.subgraph(nx.ancestors(earlier, seed) | {seed}).edges(data=True):
            out.add_edge(a, b, **data)
        out.nodes[seed]["run_origin"] = origin
    return out


def best(graph: nx.DiGraph) -> str | None:
    """The run's best: the one build() was told of, else the highest fitness (the first evaluated of equals)."""
    named = graph.graph.get("best")
    if named in graph and not graph.nodes[named]["external"]:
        return named
    evaluated = [n for n, d in graph.nodes(data=True) if not d["external"]]
    return max(evaluated, key=lambda n: graph.nodes[n]["fitness"]) if evaluated else None


def best_ancestry(graph: nx.DiGraph) -> set[str]:
    """The best candidate and every candidate it descends from."""
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
    parents: tuple[str, ...]              # all parents (two for a crossover)
    fitness_change: float | None          # fitness - parent's fitness, when both are known
    gene_diff: dict[str, tuple[GeneValue | None, GeneValue | None]]   # gene -> (parent's value, this value)
    patch_diff: str                       # unified diff of the editable regions that changed
    run: str = ""                         # the earlier run it was evaluated in (a warm-start seed's ancestry)


def chain(graph: nx.DiGraph, candidate_id: str) -> list[Step]:
    """The ancestry of `candidate_id`, oldest first, following at each step back the parent with the best fitness."""
    path, node = [candidate_id], candidate_id
    while parents := [p for p in graph.predecessors(node) if p not in path]:
        node = max(parents, key=lambda p: _known(graph.nodes[p]["fitness"]))
        path.append(node)
    path.reverse()
    return [_step(graph, node, path[i - 1] if i else None) for i, node in enumerate(path)]


def against_parent(graph: nx.DiGraph, candidate_id: str) -> Step:
    """One candidate compared with its fittest parent (no parent: nothing to compare)."""
    parents = list(graph.predecessors(candidate_id))
    parent = max(parents, key=lambda p: _known(graph.nodes[p]["fitness"])) if parents else None
    return _step(graph, candidate_id, parent)


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
                tuple(graph.predecessors(node)), change,
                gene_diff(before["genes"], data["genes"]) if compare else {},
                patch_diff(before["patch"], data["patch"], parent, node) if compare else "", data.get("run", ""))


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


def format_chain(steps: list[Step]) -> str:
    """The chain as text, one block per step: what the operator changed and what it did to fitness."""
    blocks = []
    for step in steps:
        fitness = "-" if step.fitness is None else f"{step.fitness:.4f}x"
        where = f"run {step.run} " if step.run else ""
        head = f"{where}gen {step.generation}  {step.node}  {step.operator}  {step.status}  fitness {fitness}"
        if step.parent is not None:
            change = "" if step.fitness_change is None else f"{step.fitness_change:+.4f} "
            others = [p for p in step.parents if p != step.parent]
            head += f" ({change}from {step.parent}" + (f"; also bred from {', '.join(others)})" if others else ")")
        lines = [head] + [f"    {g}: {old!r} -> {new!r}" for g, (old, new) in step.gene_diff.items()]
        lines += [f"    {line}" for line in step.patch_diff.splitlines()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


# ---- rendering ----------------------------------------------------------------------------------------------------

def render(graph: nx.DiGraph, out_dir: str | Path) -> dict[str, Path]:
    """lineage.png, .svg, .html (the SVG with a hover title per node) and .json (node-link data) in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig, nodes = _draw(graph)
    paths = {kind: out / f"lineage.{kind}" for kind in ("png", "svg", "html", "json")}
    fig.savefig(paths["png"], dpi=110)
    buf = io.StringIO()
    # Text as <text>, not glyph outlines: a smaller file whose ids can be searched in the browser.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg")
    svg = _with_titles(buf.getvalue(), graph, nodes)
    paths["svg"].write_text(svg)
    paths["html"].write_text(_page(graph, svg))
    paths["json"].write_text(_json(graph))
    return paths


def _json(graph: nx.DiGraph) -> str:
    return json.dumps(nx.node_link_data(graph, edges="edges"), indent=1)


def _positions(graph: nx.DiGraph) -> dict[str, np.ndarray]:
    """One column per generation, the fittest at the top of its column (failures and externals at the bottom)."""
    columns: dict[int, list[str]] = {}
    for node in sorted(graph, key=lambda n: (_known(graph.nodes[n]["fitness"]), n)):
        columns.setdefault(graph.nodes[node]["generation"], []).append(node)
    return nx.multipartite_layout(graph, subset_key=columns) if columns else {}


def _draw(graph: nx.DiGraph) -> tuple[Figure, list[str]]:
    """The figure and its nodes in drawing order (the i-th marker in the SVG is the i-th node)."""
    pos = _positions(graph)
    per_generation = Counter(d["generation"] for _, d in graph.nodes(data=True))
    generations, tallest = sorted(per_generation), max(per_generation.values(), default=1)
    fig = Figure(figsize=(max(12.0, 1.4 * len(generations) + 3), max(5.0, 0.2 * tallest + 2)))
    FigureCanvasAgg(fig)   # Agg without pyplot: no global backend state, safe on MLflow's writer thread
    ax = fig.add_axes((0.03, 0.07, 0.86, 0.76))
    ancestry, top = best_ancestry(graph), best(graph)
    norm = _fitness_norm(graph)
    _draw_edges(ax, graph, pos, ancestry)
    nodes = _draw_nodes(ax, graph, pos, ancestry, norm)
    if top is not None:   # its label goes above, clear of the label on its incoming edge
        ax.annotate(f"best {top[:8]} {graph.nodes[top]['fitness']:.4f}x", pos[top], xytext=(0, 8),
                    textcoords="offset points", fontsize=9, fontweight="bold", ha="center", zorder=4)
    for node in ancestry - {top}:   # up and left: clear of a horizontal incoming edge and of the column
        ax.annotate(node[:8], pos[node], xytext=(-4, 4), textcoords="offset points", fontsize=8, ha="right",
                    va="bottom", zorder=4, bbox={"boxstyle": "square,pad=0.05", "fc": "white", "ec": "none",
                                                 "alpha": 0.8})
    xs = {graph.nodes[n]["generation"]: p[0] for n, p in pos.items()}
    ax.set_xticks([xs[g] for g in generations], [f"gen {g}" if g >= 0 else "earlier" for g in generations])
    ax.set_yticks([])
    ax.set_xlim(min(xs.values(), default=0) - 0.05, max(xs.values(), default=0) + 0.12)
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    _decorate(fig, ax, graph, norm, top)
    return fig, nodes


def _draw_nodes(ax: Any, graph: nx.DiGraph, pos: Mapping[str, np.ndarray], ancestry: set[str],
                norm: Normalize) -> list[str]:
    """All nodes in one scatter (hundreds of artists would take seconds). Each marker gets a URL only so that the
    SVG backend writes it as its own element, which _with_titles turns into a group with a tooltip."""
    nodes = list(pos)
    data = [graph.nodes[n] for n in nodes]
    markers = ax.scatter([pos[n][0] for n in nodes], [pos[n][1] for n in nodes], zorder=3,
                         s=[90 if n in ancestry else 38 for n in nodes], c=[_colour(d, norm) for d in data],
                         edgecolors=["black" if n in ancestry else "#666666" if d["external"] else "white"
                                     for n, d in zip(nodes, data)],
                         linewidths=[1.8 if n in ancestry else 0.6 for n in nodes],
                         linestyles=["--" if d["external"] else "-" for d in data])
    markers.set_urls([f"#kf-node-{i}" for i in range(len(nodes))])
    return nodes


def _fitness_norm(graph: nx.DiGraph) -> Normalize:
    """Shades spread over the top 90% of correct kernels: the few slow outliers would otherwise leave the
    candidates that matter in one dark green."""
    ok = [d["fitness"] for _, d in graph.nodes(data=True) if d["status"] == "ok"]
    low, high = (float(np.percentile(ok, 10)), max(ok)) if ok else (0.0, 1.0)
    return Normalize(low, high if high > low else low + 1e-9, clip=True)


def _colour(data: Mapping[str, Any], norm: Normalize) -> Any:
    if data["external"]:
        return "white"
    if data["status"] == "ok":
        return FITNESS_CMAP(norm(data["fitness"]))
    return FAILURE_COLOURS.get(data["status"], "black")


def _draw_edges(ax: Any, graph: nx.DiGraph, pos: Mapping[str, np.ndarray], ancestry: set[str]) -> None:
    """Every edge thin and grey in one collection (fast for hundreds); the best ancestry's with arrows and labels."""
    plain = [(pos[a], pos[b]) for a, b in graph.edges if not (a in ancestry and b in ancestry)]
    ax.add_collection(LineCollection(plain, colors="#c4c4c4", linewidths=0.5, alpha=0.7, zorder=1))
    for a, b, data in graph.edges(data=True):
        if a in ancestry and b in ancestry:
            ax.annotate("", pos[b], pos[a], zorder=2, arrowprops={"arrowstyle": "-|>", "color": "#202020",
                                                                  "lw": 2.0, "shrinkA": 5, "shrinkB": 6})
            op = data["operator"]
            # Nearer the parent: the child's id label sits just left of the child.
            ax.text(*(0.6 * pos[a] + 0.4 * pos[b]), SHORT_OPERATOR.get(op, op), fontsize=8, ha="center", va="center",
                    zorder=4, bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "#202020", "lw": 0.5})


def _decorate(fig: Figure, ax: Any, graph: nx.DiGraph, norm: Normalize, top: str | None) -> None:
    """Title, the status legend and the fitness colour bar."""
    run = graph.graph.get("run_id") or "run"
    evaluated = [d for _, d in graph.nodes(data=True) if not d["external"]]
    title = f"lineage of {run}: {len(evaluated)} candidates, {len({d['generation'] for d in evaluated})} generations"
    if top is not None:
        title += f"; best {top} at {graph.nodes[top]['fitness']:.4f}x (bold path: its ancestry)"
    fig.suptitle(title, fontsize=11.5, y=0.985)
    if graph.graph.get("replay"):   # replayed fitness: say so on the image itself, not only in the run's tags
        fig.text(0.01, 0.01, graph.graph["replay"], fontsize=10, color="#b00000", weight="bold", va="bottom")

    def marker(colour: str, label: str, edge: str = "white") -> Line2D:
        return Line2D([], [], marker="o", ls="", markersize=7, markerfacecolor=colour, markeredgecolor=edge,
                      label=label)

    handles = [marker(FITNESS_CMAP(0.8), "ok (shade = fitness)")]
    handles += [marker(colour, status) for status, colour in FAILURE_COLOURS.items()]
    handles += [marker("white", "external parent", "#666666"),
                Line2D([], [], color="#202020", lw=2, label="best ancestry (op on edge)"),
                Line2D([], [], color="#c4c4c4", lw=1, label="other parent -> child")]
    fig.legend(handles=handles, loc="upper center", ncol=5, fontsize=8.5, frameon=False,
               bbox_to_anchor=(0.5, 0.96))
    bar = fig.colorbar(ScalarMappable(norm, FITNESS_CMAP), cax=fig.add_axes((0.92, 0.07, 0.012, 0.76)),
                       extend="min")
    bar.set_label("fitness of ok candidates (x baseline)", fontsize=9)
    bar.ax.tick_params(labelsize=8)


def _with_titles(svg: str, graph: nx.DiGraph, nodes: list[str]) -> str:
    """Each node's marker as a group with a <title>, which browsers show as a tooltip on hover."""
    def titled(match: re.Match[str]) -> str:
        node = nodes[int(match.group(1))]
        data = graph.nodes[node]
        fitness = "-" if data["fitness"] is None else f"{data['fitness']:.4f}x"
        parents = ", ".join(graph.predecessors(node)) or "none"
        genes = "\n".join(f"  {k}={v}" for k, v in sorted(data["genes"].items()))
        where = f"\nrun: {data['run']}" if data.get("run") else ""
        text = (f"{node}\noperator: {data['operator']}\nstatus: {data['status']}\nfitness: {fitness}\n"
                f"generation: {data['generation']}\nparents: {parents}{where}" + (f"\ngenes:\n{genes}" if genes else ""))
        return f'<g id="kf-node-{match.group(1)}"><title>{html.escape(text)}</title>{match.group(2)}</g>'

    return re.sub(r'<a xlink:href="#kf-node-(\d+)"[^>]*>(.*?)</a>', titled, svg, flags=re.DOTALL)


def _page(graph: nx.DiGraph, svg: str) -> str:
    """A self-contained page: the inline SVG (no network), its node titles as tooltips and a hover outline."""
    inline = svg[svg.index("<svg"):]   # drop the XML prolog and doctype, which do not belong inside HTML
    run = html.escape(graph.graph.get("run_id") or "run")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">"
            f"<title>lineage of {run}</title><style>"
            "body{font-family:sans-serif;margin:12px} svg{max-width:100%;height:auto}"
            " g[id^=kf-node-]:hover path{stroke:#e41a1c;stroke-width:3px;cursor:pointer}"
            "</style></head><body>"
            + (f"<p style=\"color:#b00000;font-weight:bold\">{html.escape(graph.graph['replay'])}</p>\n"
               if graph.graph.get("replay") else "")
            + f"<p>Lineage of {run}. Hover a node for its id, operator, status, fitness and parents.</p>\n"
            f"{inline}</body></html>\n")
