"""The lineage graph (lineage.py) drawn for MLflow: PNG, SVG with a hover title per node, a self-contained HTML
page and the node-link JSON. What is drawn (each edge's kind and label, each node's label) is plain data first
(drawing()), so that a test can check it without reading pixels."""
from __future__ import annotations

import html
import io
import json
import os
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import matplotlib
import networkx as nx
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.collections import LineCollection
from matplotlib.colors import LinearSegmentedColormap, Normalize
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ..config import ConfigError
from .lineage import ORIGIN, SHORT_OPERATOR, best, best_ancestry, run_parents, seed_note

FAILURE_COLOURS = {"compile_error": "#d62728", "incorrect": "#ff7f0e", "crashed": "#9467bd",
                   "timeout": "#8c564b", "not_recorded": "#9e9e9e",
                   "suspect": "#e377c2", "infeasible": "#17becf", "cut": "#d9d9a0"}   # cut: outrun by racing
KINDS = ("png", "svg", "html", "json")   # the drawings, each a file lineage.<kind>
MAX_DRAWN = 400   # nodes drawn; past it the image shows a named subset (lineage.json still holds every node)
MAX_INCHES = (40.0, 24.0)   # figure width, height: at 110 dpi at most 4400 x 2640 pixels, whatever the run's size
SEED_COLOUR = "#0072B2"   # a seed's link to the run that bred it: blue and dashed, apart from parent edges
# Greens without its near-white end, so that the weakest correct kernel still reads as a filled node.
FITNESS_CMAP = LinearSegmentedColormap.from_list("kf_fitness", matplotlib.colormaps["Greens"](np.linspace(.3, 1, 64)))


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: str          # "parent" (bred in this run) or "seed" (a warm-start seed's link to the run that bred it)
    on_best: bool      # on the best candidate's ancestry: drawn bold with an arrow and its label
    label: str         # the operator, or "seed" ("" off the best's ancestry)


@dataclass(frozen=True)
class Drawing:
    """What the image shows, before any pixel: nodes in drawing order, edges, and the text beside nodes."""

    nodes: tuple[str, ...]
    edges: tuple[Edge, ...]
    labels: Mapping[str, str]


def drawing(graph: nx.DiGraph) -> Drawing:
    """The best's ancestry labelled (operators on its edges, ids beside its nodes), every seed's origin labelled
    with the run and generation that bred it, and each edge's kind, which sets its style."""
    ancestry, top = best_ancestry(graph), best(graph)
    edges = []
    for a, b, data in graph.edges(data=True):
        kind = "seed" if data.get("seed") else "parent"
        on_best = a in ancestry and b in ancestry
        op = data["operator"]
        edges.append(Edge(a, b, kind, on_best, (SHORT_OPERATOR.get(op, op) if kind == "parent" else "seed")
                          if on_best else ""))
    labels = {n: n[:8] for n in ancestry}
    for node, data in graph.nodes(data=True):
        if data["operator"] == ORIGIN:   # every seed's origin: the run's tail and the generation there
            there = "" if data.get("run_generation") is None else f" gen {data['run_generation']}"
            labels[node] = f"{data['candidate'][:8]} in run {data['run'].rsplit('-', 1)[-1]}{there}"
    if top is not None:
        labels[top] = f"best {top[:8]} {graph.nodes[top]['fitness']:.4f}x"
    return Drawing(tuple(_positions(graph)), tuple(edges), labels)


def render(graph: nx.DiGraph, out_dir: str | Path) -> dict[str, Path]:
    """lineage.png, .svg, .html (the SVG with a hover title per node) and .json (node-link data) in out_dir."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    return draw(graph, {kind: out / f"lineage.{kind}" for kind in KINDS})


def draw(graph: nx.DiGraph, paths: Mapping[str, Path]) -> dict[str, Path]:
    """The drawings named in paths ({kind: file}, kinds from KINDS), written there."""
    if "json" in paths:
        paths["json"].write_text(json.dumps(nx.node_link_data(graph, edges="edges"), indent=1))
    if paths.keys() <= {"json"}:
        return dict(paths)
    shown = drawn(graph)
    fig, nodes = _draw(shown)
    if "png" in paths:
        fig.savefig(paths["png"], dpi=110)
    buf = io.StringIO()
    # Text as <text>, not glyph outlines: a smaller file whose ids can be searched in the browser.
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, format="svg")
    svg = _with_titles(buf.getvalue(), shown, nodes)
    if "svg" in paths:
        paths["svg"].write_text(svg)
    if "html" in paths:
        paths["html"].write_text(_page(graph, svg))
    return dict(paths)


def write(graph: nx.DiGraph, out: str) -> list[Path]:
    """`kernel-factory lineage --out`: a path ending in .png, .svg, .html or .json is that one file; an existing
    folder, a path ending in '/' or one without a suffix is a folder that gets all four (lineage.*); any other
    suffix is refused, naming the valid ones (docs/edges.md)."""
    path = Path(out)
    if path.is_dir() or out.endswith(("/", os.sep)) or not path.suffix:
        return list(render(graph, path).values())
    kind = path.suffix.lower().lstrip(".")
    if kind not in KINDS:
        raise ConfigError(f"--out {out!r}: a lineage file ends in {', '.join('.' + k for k in KINDS)}; a path "
                          "without a suffix, or ending in '/', is a folder that gets all four")
    path.parent.mkdir(parents=True, exist_ok=True)
    return list(draw(graph, {kind: path}).values())


def drawn(graph: nx.DiGraph) -> nx.DiGraph:
    """The graph to draw: all of it up to MAX_DRAWN nodes. Past that a subset, named on the image: the best, the
    fittest of each generation, the best's ancestry (nearest generations first: in a long run it can be most of
    the graph), every earlier run's candidate, then the next fittest of each generation in turn."""
    if len(graph) <= MAX_DRAWN:
        return graph
    top, ancestry = best(graph), best_ancestry(graph)
    data = graph.nodes
    fitness = {n: -1.0 if data[n]["fitness"] is None else data[n]["fitness"] for n in graph}
    rank, taken = {}, Counter[int]()
    for node in sorted(graph, key=lambda n: (-fitness[n], n)):   # its place in its generation, fittest first
        rank[node] = taken[data[node]["generation"]]
        taken[data[node]["generation"]] += 1
    by_rank = sorted(graph, key=lambda n: (rank[n], -fitness[n], n))
    ranked = ([top] if top is not None else []) + [n for n in by_rank if rank[n] == 0]
    ranked += sorted(ancestry, key=lambda n: (-data[n]["generation"], n))
    ranked += sorted((n for n in graph if data[n]["operator"] == ORIGIN), key=str)
    ranked += by_rank
    keep = list(dict.fromkeys(ranked))[:MAX_DRAWN]
    sub = graph.subgraph(keep).copy()
    sub.graph["whole"] = graph   # the title counts every candidate, not only those drawn
    sub.graph["subset"] = (f"showing {len(keep)} of {len(graph)} nodes: the best, the fittest of each generation, "
                           "the best's ancestry and earlier runs' candidates (lineage.json holds every node)")
    return sub


def _positions(graph: nx.DiGraph) -> dict[str, np.ndarray]:
    """One column per generation, the fittest at the top of its column (failures and externals at the bottom)."""
    columns: dict[int, list[str]] = {}
    fitness = {n: -1.0 if d["fitness"] is None else d["fitness"] for n, d in graph.nodes(data=True)}
    for node in sorted(graph, key=lambda n: (fitness[n], n)):
        columns.setdefault(graph.nodes[node]["generation"], []).append(node)
    return nx.multipartite_layout(graph, subset_key=columns) if columns else {}


def _draw(graph: nx.DiGraph) -> tuple[Figure, list[str]]:
    """The figure and its nodes in drawing order (the i-th marker in the SVG is the i-th node)."""
    pos, plan = _positions(graph), drawing(graph)
    per_generation = Counter(d["generation"] for _, d in graph.nodes(data=True))
    generations, tallest = sorted(per_generation), max(per_generation.values(), default=1)
    fig = Figure(figsize=(min(MAX_INCHES[0], max(12.0, 1.4 * len(generations) + 3)),
                          min(MAX_INCHES[1], max(5.0, 0.2 * tallest + 2))))
    FigureCanvasAgg(fig)   # Agg without pyplot: no global backend state, safe on MLflow's writer thread
    ax = fig.add_axes((0.03, 0.07, 0.86, 0.76))
    ancestry, top = best_ancestry(graph), best(graph)
    norm = _fitness_norm(graph)
    _draw_edges(ax, plan.edges, pos)
    _draw_nodes(ax, graph, pos, ancestry, norm)
    for node, text in plan.labels.items():
        if node == top:   # above, clear of the label on its incoming edge
            ax.annotate(text, pos[node], xytext=(0, 8), textcoords="offset points", fontsize=9, fontweight="bold",
                        ha="center", zorder=4)
        else:   # up and left: clear of a horizontal incoming edge and of the column
            colour = SEED_COLOUR if graph.nodes[node]["operator"] == ORIGIN else "black"
            ax.annotate(text, pos[node], xytext=(-4, 4), textcoords="offset points", fontsize=8, ha="right",
                        va="bottom", zorder=4, color=colour,
                        bbox={"boxstyle": "square,pad=0.05", "fc": "white", "ec": "none", "alpha": 0.8})
    xs = {graph.nodes[n]["generation"]: p[0] for n, p in pos.items()}
    ax.set_xticks([xs[g] for g in generations], [f"gen {g}" if g >= 0 else "earlier" for g in generations])
    ax.set_yticks([])
    # room on the left for the labels of an earlier run's candidates
    left = 0.25 if any(d["operator"] == ORIGIN for _, d in graph.nodes(data=True)) else 0.05
    ax.set_xlim(min(xs.values(), default=0) - left, max(xs.values(), default=0) + 0.12)
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    _decorate(fig, graph, norm, top)
    return fig, list(plan.nodes)


def _draw_nodes(ax: Any, graph: nx.DiGraph, pos: Mapping[str, np.ndarray], ancestry: set[str],
                norm: Normalize) -> None:
    """All nodes in one scatter (hundreds of artists would take seconds). Each marker gets a URL only so that the
    SVG backend writes it as its own element, which _with_titles turns into a group with a tooltip."""
    nodes = list(pos)
    data = [graph.nodes[n] for n in nodes]

    def edge(node: str, d: Mapping[str, Any]) -> str:
        if d["operator"] == ORIGIN:
            return SEED_COLOUR
        return "black" if node in ancestry else "#666666" if d["external"] else "white"

    markers = ax.scatter([pos[n][0] for n in nodes], [pos[n][1] for n in nodes], zorder=3,
                         s=[90 if n in ancestry else 38 for n in nodes], c=[_colour(d, norm) for d in data],
                         edgecolors=[edge(n, d) for n, d in zip(nodes, data)],
                         linewidths=[1.8 if n in ancestry else 0.6 for n in nodes],
                         linestyles=["--" if d["external"] else "-" for d in data])
    markers.set_urls([f"#kf-node-{i}" for i in range(len(nodes))])


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


def _draw_edges(ax: Any, edges: tuple[Edge, ...], pos: Mapping[str, np.ndarray]) -> None:
    """Parent edges thin and grey in one collection (fast for hundreds), seed links dashed and blue; the best
    ancestry's with arrows and their labels."""
    plain = [(pos[e.source], pos[e.target]) for e in edges if not e.on_best and e.kind == "parent"]
    ax.add_collection(LineCollection(plain, colors="#c4c4c4", linewidths=0.5, alpha=0.7, zorder=1))
    seeds = [(pos[e.source], pos[e.target]) for e in edges if not e.on_best and e.kind == "seed"]
    ax.add_collection(LineCollection(seeds, colors=SEED_COLOUR, linewidths=0.8, linestyles="--", alpha=0.7,
                                     zorder=1))
    for e in edges:
        if e.on_best:
            a, b = pos[e.source], pos[e.target]
            colour = SEED_COLOUR if e.kind == "seed" else "#202020"
            ax.annotate("", b, a, zorder=2, arrowprops={"arrowstyle": "-|>", "color": colour, "lw": 2.0,
                                                        "shrinkA": 5, "shrinkB": 6,
                                                        "linestyle": "--" if e.kind == "seed" else "-"})
            # Nearer the parent: the child's id label sits just left of the child.
            ax.text(*(0.6 * a + 0.4 * b), e.label, fontsize=8, ha="center", va="center", zorder=4, color=colour,
                    bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": colour, "lw": 0.5})


def _decorate(fig: Figure, graph: nx.DiGraph, norm: Normalize, top: str | None) -> None:
    """Title, the status legend and the fitness colour bar."""
    run = graph.graph.get("run_id") or "run"
    evaluated = [d for _, d in graph.graph.get("whole", graph).nodes(data=True) if not d["external"]]
    title = f"lineage of {run}: {len(evaluated)} candidates, {len({d['generation'] for d in evaluated})} generations"
    if top is not None:
        title += f"; best {top} at {graph.nodes[top]['fitness']:.4f}x (bold path: its ancestry)"
    fig.suptitle(title, fontsize=11.5, y=0.985)
    if graph.graph.get("subset"):   # a summary of a large run: say so on the image, not only in the JSON
        fig.text(0.01, 0.04, graph.graph["subset"], fontsize=10, color="#b00000", va="bottom")   # above replay's
    if graph.graph.get("replay"):   # replayed fitness: say so on the image itself, not only in the run's tags
        fig.text(0.01, 0.01, graph.graph["replay"], fontsize=10, color="#b00000", weight="bold", va="bottom")

    def marker(colour: str, label: str, edge: str = "white") -> Line2D:
        return Line2D([], [], marker="o", ls="", markersize=7, markerfacecolor=colour, markeredgecolor=edge,
                      label=label)

    handles = [marker(FITNESS_CMAP(0.8), "ok (shade = fitness)")]
    handles += [marker(colour, status) for status, colour in FAILURE_COLOURS.items()]
    handles += [marker("white", "external parent", "#666666"),
                marker("white", "earlier run's candidate", SEED_COLOUR),
                Line2D([], [], color="#202020", lw=2, label="best ancestry (op on edge)"),
                Line2D([], [], color="#c4c4c4", lw=1, label="other parent -> child"),
                Line2D([], [], color=SEED_COLOUR, lw=1.5, ls="--", label="warm-start seed <- run that bred it")]
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
        parents = ", ".join(run_parents(graph, node)) or "none"
        genes = "\n".join(f"  {k}={v}" for k, v in sorted(data["genes"].items()))
        where = f"\nrun: {data['run']}" if data.get("run") else ""
        where += f"\n{seed_note(data['seed_from'])}" if data.get("seed_from") else ""
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
