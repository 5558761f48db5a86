"""Lineage on CPU with real genes: the graph (every parent edge, crossovers and external parents included), the best
ancestry, the chain of changes, the four renderings, and a replay run that logs them to MLflow and explains its best
through `kernel-factory lineage`."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import networkx as nx
import pytest
from mlflow.tracking import MlflowClient

from kernel_factory.evo import config, journal
from kernel_factory.evo.observers import lineage, lineage_image
from kernel_factory.evo.observers import mlflow as mlflow_observer
from kernel_factory.evo.run import execute
from kernel_factory.evo.types import Candidate, EvalResult, Genome, Status, geomean_speedup

CASES = ("bfloat16:32768x256", "bfloat16:32768x1024")
EARLIER_RUN_SEED = "feedfacecafebeef"   # a parent from an earlier run: not among this run's results
SVG = "{http://www.w3.org/2000/svg}"


def ok(cand: Candidate, t: float) -> EvalResult:
    times, base = {k: t for k in CASES}, {k: 12.0 for k in CASES}
    return EvalResult(cand.id, Status.OK, geomean_speedup(times, base), times, baseline_us=base)


@pytest.fixture
def family(rmsnorm) -> dict[str, tuple[Candidate, EvalResult]]:
    """Two generations on top of three founders: mutations, a crossover, a patch, failures, an external parent."""
    d = rmsnorm.space.defaults()
    c = {"a": Candidate(Genome.of(d), operator="defaults"),
         "b": Candidate(Genome.of({**d, "threads": 512}), operator="random"),
         "s": Candidate(Genome.of({**d, "load": "plain"}), (EARLIER_RUN_SEED,), "seed")}
    c["f"] = Candidate(Genome.of({**d, "unroll": 4}), (c["a"].id,), "gene_mutation", 1)
    # b first: the chain must pick the fitter parent (a), not the first one.
    c["x"] = Candidate(Genome.of({**d, "threads": 512, "vec_bytes": 8}), (c["b"].id, c["a"].id),
                       "uniform_crossover", 1)
    c["p"] = Candidate(Genome.of({**d, "threads": 512, "vec_bytes": 8, "reduce": "smem"},
                                 {"reduce": "// fast reduce\nwarp_sum(v);\n"}), (c["x"].id,), "ptx_mutation", 2)
    c["t"] = Candidate(Genome.of({**d, "load": "plain", "keep_x": not d["keep_x"]}), (c["s"].id,),
                       "gene_mutation", 2)
    res = {"a": ok(c["a"], 12.0), "b": ok(c["b"], 13.0), "s": ok(c["s"], 11.0), "x": ok(c["x"], 10.0),
           "p": ok(c["p"], 8.0),
           "f": EvalResult(c["f"].id, Status.COMPILE_ERROR, message="ptxas: too many resources"),
           "t": EvalResult(c["t"].id, Status.TIMEOUT, message="watchdog")}
    return {name: (c[name], res[name]) for name in c}


def ids(family, names: str) -> list[str]:
    return [family[n][0].id for n in names]


def test_graph_has_every_parent_edge_and_external_parents(family):
    graph = lineage.build(family.values(), "run-1")
    assert set(graph) == set(ids(family, "absfxpt")) | {EARLIER_RUN_SEED}
    a, b, s, f, x, p, t = ids(family, "absfxpt")
    assert {(u, v, d["operator"]) for u, v, d in graph.edges(data=True)} == {
        (a, f, "gene_mutation"), (a, x, "uniform_crossover"), (b, x, "uniform_crossover"),
        (x, p, "ptx_mutation"), (s, t, "gene_mutation"), (EARLIER_RUN_SEED, s, "seed")}
    assert set(graph.predecessors(x)) == {a, b}
    external = graph.nodes[EARLIER_RUN_SEED]
    assert external["external"] and external["status"] == "external" and external["generation"] == -1
    assert graph.nodes[f]["status"] == "compile_error" and graph.nodes[f]["fitness"] == 0.0
    assert graph.nodes[p]["patch"] == {"reduce": "// fast reduce\nwarp_sum(v);\n"}
    assert graph.nodes[x]["genes"]["threads"] == 512 and graph.nodes[x]["generation"] == 1
    assert graph.nodes[p]["fitness"] == pytest.approx(1.5)


def test_best_ancestry_is_the_best_and_all_its_ancestors(family):
    graph = lineage.build(family.values())
    assert lineage.best(graph) == family["p"][0].id
    assert lineage.best_ancestry(graph) == set(ids(family, "pxab"))
    # The run's own verdict wins over a recount (the hall of fame breaks ties among equal fitness).
    named = lineage.build(family.values(), best_id=family["s"][0].id)
    assert lineage.best_ancestry(named) == {family["s"][0].id, EARLIER_RUN_SEED}
    assert lineage.best_ancestry(lineage.build([])) == set()


def test_chain_follows_the_fitter_parent_with_gene_and_patch_diffs(family):
    graph = lineage.build(family.values())
    steps = lineage.chain(graph, family["p"][0].id)
    assert [s.node for s in steps] == ids(family, "axp")   # a (1.0x) beats b (0.92x) as x's parent
    first, cross, last = steps
    assert first.parent is None and first.fitness_change is None and first.gene_diff == {}
    assert cross.parent == family["a"][0].id and cross.parents == tuple(ids(family, "ba"))
    assert cross.gene_diff == {"threads": (256, 512), "vec_bytes": (16, 8)}   # vs a, the template defaults
    assert cross.fitness_change == pytest.approx(1.2 - 1.0)
    assert last.operator == "ptx_mutation" and last.fitness_change == pytest.approx(1.5 - 1.2)
    assert last.gene_diff == {"reduce": ("shfl", "smem")}
    assert "+// fast reduce" in last.patch_diff and "+warp_sum(v);" in last.patch_diff
    assert f"+++ {last.node}:reduce" in last.patch_diff

    failed = lineage.chain(graph, family["t"][0].id)
    assert [s.node for s in failed] == [EARLIER_RUN_SEED, *ids(family, "st")]
    assert failed[0].operator == "external" and failed[0].fitness is None
    assert failed[1].gene_diff == {} and failed[1].fitness_change is None   # an external parent's genes are unknown
    assert failed[2].status == "timeout" and failed[2].fitness_change == pytest.approx(-12.0 / 11.0)
    assert list(failed[2].gene_diff) == ["keep_x"]

    text = lineage.format_chain(steps)
    assert text.splitlines()[0].startswith(f"gen 0  {family['a'][0].id}  defaults  ok")
    assert f"also bred from {family['b'][0].id}" in text and "    threads: 256 -> 512" in text


def node_titles(svg_text: str) -> dict[str, str]:
    root = ET.fromstring(svg_text)
    return {g.get("id"): g.find(f"{SVG}title").text for g in root.iter(f"{SVG}g")
            if (g.get("id") or "").startswith("kf-node-")}


def test_render_writes_four_files_with_node_titles(family, tmp_path):
    graph = lineage.build(family.values(), "run-1")
    paths = lineage_image.render(graph, tmp_path / "out")
    assert {k: p.name for k, p in paths.items()} == {
        "png": "lineage.png", "svg": "lineage.svg", "html": "lineage.html", "json": "lineage.json"}
    assert paths["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and paths["png"].stat().st_size > 20_000
    titles = node_titles(paths["svg"].read_text())
    assert len(titles) == graph.number_of_nodes()
    p = family["p"][0].id
    (title,) = [t for t in titles.values() if t.startswith(p)]
    assert "operator: ptx_mutation" in title and "status: ok" in title and "fitness: 1.5000x" in title
    assert any(t.startswith(family["f"][0].id) and "status: compile_error" in t for t in titles.values())

    page = paths["html"].read_text()
    body = page[page.index("<svg"):page.index("</svg>") + 6]
    assert node_titles(body) == titles
    assert "<script src" not in page and "<link" not in page and "<img" not in page   # no network

    back = nx.node_link_graph(json.loads(paths["json"].read_text()), edges="edges")
    assert set(back.edges) == set(graph.edges) and back.nodes[p]["genes"]["reduce"] == "smem"


def random_run(space, generations: int, per_generation: int, seed: int) -> list[tuple[Candidate, EvalResult]]:
    """A run's results with random genomes, parents from the generation before, and every status."""
    rng = random.Random(seed)
    pairs, previous, seen = [], [], set()
    for generation in range(generations):
        current = []
        while len(current) < per_generation:
            genome = Genome.of({g.name: rng.choice(g.choices) for g in space.genes})
            if genome.id in seen:
                continue
            seen.add(genome.id)
            drawn = [rng.choice(previous).id for _ in range(rng.choice((1, 2)))] if previous else []
            parents = tuple(dict.fromkeys(drawn))
            cand = Candidate(genome, parents,
                             "uniform_crossover" if len(parents) == 2 else "gene_mutation", generation)
            status = rng.choice([Status.OK] * 5 + list(Status))
            current.append(cand)
            pairs.append((cand, EvalResult(cand.id, status, rng.uniform(0.5, 1.2) if status is Status.OK else 0.0)))
        previous = current
    return pairs


def test_render_of_300_candidates_draws_every_node(tmp_path, rmsnorm):
    """300 candidates over 10 generations: every node in the SVG. (Its wall time is printed, not asserted: a
    timing threshold fails on a loaded machine without any defect.)"""
    pairs = random_run(rmsnorm.space, 10, 30, seed=5)
    lineage_image.render(lineage.build(pairs[:5]), tmp_path / "warm")   # fonts and caches, once per process
    graph = lineage.build(pairs)
    started = time.perf_counter()
    paths = lineage_image.render(graph, tmp_path / "big")
    print(f"rendered {graph.number_of_nodes()} nodes in {time.perf_counter() - started:.2f} s")
    assert len(node_titles(paths["svg"].read_text())) == graph.number_of_nodes() == 300


def test_a_large_lineage_draws_a_named_subset_in_a_bounded_image(tmp_path, rmsnorm):
    """A run far past the node limit (here 1500 candidates over 60 generations; the issue's asked for a 124-Mpixel
    image) draws the best, the fittest of each generation and as much of the best's ancestry as fits, says so on the image, and stays within
    the figure's size cap; the JSON keeps every node."""
    from PIL import Image
    graph = lineage.build(random_run(rmsnorm.space, 60, 25, seed=7))
    shown = lineage_image.drawn(graph)
    assert graph.number_of_nodes() == 1500 and shown.number_of_nodes() == lineage_image.MAX_DRAWN
    generations = {d["generation"] for _, d in graph.nodes(data=True)}
    assert {d["generation"] for _, d in shown.nodes(data=True)} == generations   # every generation keeps its fittest
    assert lineage.best(graph) in shown
    # the best's ancestry fills what is left, nearest generations first (here it is most of the run)
    ancestry = lineage.best_ancestry(graph)
    kept = ancestry & set(shown)
    assert len(kept) >= min(len(ancestry), lineage_image.MAX_DRAWN - len(generations) - 1)
    nearest = sorted(ancestry, key=lambda n: -graph.nodes[n]["generation"])[:len(kept) // 2]
    assert set(nearest) <= kept
    paths = lineage_image.render(graph, tmp_path / "huge")
    width, height = Image.open(paths["png"]).size
    assert width <= 110 * lineage_image.MAX_INCHES[0] and height <= 110 * lineage_image.MAX_INCHES[1]
    svg = paths["svg"].read_text()
    assert len(node_titles(svg)) == lineage_image.MAX_DRAWN and "showing 400 of 1500 nodes" in svg
    assert "1500 candidates" in svg   # the title counts the whole run, not the subset drawn
    assert len(json.loads(paths["json"].read_text())["nodes"]) == 1500


def test_replay_run_logs_lineage_and_the_cli_explains_its_best(replay_config, tmp_path, monkeypatch):
    drawn = []
    real_render = mlflow_observer.lineage_image.render

    def counting(graph, out_dir):
        drawn.append(graph.number_of_nodes())
        return real_render(graph, out_dir)

    monkeypatch.setattr(mlflow_observer.lineage_image, "render", counting)
    summary = execute(config.parse(replay_config))
    # after generation 3, and at the end: every evaluated candidate, and every child the rule refused (shown once)
    refused = journal.read(tmp_path / "runs" / summary.run_id / journal.NAME).refusals
    assert len(drawn) == 2 and drawn[0] < drawn[1] == summary.evaluations + len(refused)

    client = MlflowClient(f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}")
    exp = client.get_experiment_by_name("rmsnorm_fwd")
    (parent,) = client.search_runs([exp.experiment_id], f"tags.`kf.run_id` = '{summary.run_id}'"
                                                        " and tags.`kf.kind` = 'evolution'")
    names = {a.path for a in client.list_artifacts(parent.info.run_id, "lineage")}
    assert names == {f"lineage/lineage.{kind}" for kind in ("png", "svg", "html", "json")}

    cli = [sys.executable, "-m", "kernel_factory.evo.tools.cli", "lineage"]
    out = subprocess.run([*cli, summary.run_id, "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "drawn")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    label, chain = out.stdout.strip().split("\n", 1)   # a replay's lineage says so first
    assert label.startswith("REPLAY: recorded measurements")
    blocks = chain.split("\n\n")
    assert blocks[-1].startswith(f"gen {summary.best[0].generation}  {summary.best[0].id}  ")
    assert blocks[0].startswith("gen 0  ") and (tmp_path / "drawn" / "lineage.html").is_file()

    wrong = subprocess.run([*cli, "no-such-run", "--runs", str(tmp_path / "runs")], capture_output=True, text=True,
                           timeout=120)
    assert wrong.returncode == 2 and wrong.stdout == ""
    assert wrong.stderr.count("\n") == 1 and "'no-such-run'" in wrong.stderr and summary.run_id in wrong.stderr


def test_a_seed_links_to_the_run_that_bred_it_and_brings_none_of_its_history(rmsnorm, tmp_path):
    rng, d = random.Random(), rmsnorm.space.defaults()
    earlier = f"rmsnorm_fwd-20260101-000000-{rng.getrandbits(24):06x}"
    there = rng.randrange(1, 9)
    c = {"x": Candidate(Genome.of({**d, "threads": 512}), (), "seed"),
         "d": Candidate(Genome.of(d), (), "defaults")}
    # w was a seed too, but this run's journal says it was bred here: the journal wins.
    c["w"] = Candidate(Genome.of({**d, "unroll": 4}), (c["d"].id,), "gene_mutation", 1)
    c["y"] = Candidate(Genome.of({**d, "threads": 512, "vec_bytes": 8}), (c["x"].id,), "gene_mutation", 1)
    c["z"] = Candidate(Genome.of({**d, "threads": 512, "vec_bytes": 8, "load": "plain"}), (c["y"].id, c["d"].id),
                       "uniform_crossover", 2)
    times = dict(zip("dwxyz", sorted((rng.uniform(6, 12) for _ in range(5)), reverse=True)))
    graph = lineage.build([(c[k], ok(c[k], times[k])) for k in "xdwyz"], "run-now")
    # The earlier run's id of the genome differs when a gene was added to the space since (its default filled in).
    bred = f"{rng.getrandbits(64):016x}"
    marked = lineage.mark_seeds(graph, {c["x"].id: earlier, c["w"].id: earlier, "0123456789abcdef": earlier},
                                {c["x"].id: {"run": earlier, "candidate": bred, "generation": there}})
    x, y, z, w = (c[k].id for k in "xyzw")
    key = lineage.origin_key(earlier, bred)
    assert set(marked) == set(graph) | {key} and key != x
    assert marked.nodes[key]["run"] == earlier and marked.nodes[key]["run_generation"] == there
    assert marked.edges[key, x]["seed"] and "seed_from" not in marked.nodes[w]
    assert lineage.best(marked) == z and key in lineage.best_ancestry(marked)

    steps = lineage.chain(marked, z)
    assert [s.node for s in steps] == [x, y, z] and steps[0].parent is None and steps[0].parents == ()
    assert steps[0].seed_from == {"run": earlier, "candidate": bred, "generation": there}
    assert lineage.against_parent(marked, x).parent is None
    text = lineage.format_chain(steps)
    assert text.splitlines()[0].endswith(f"; seed from run {earlier} (candidate {bred}, gen {there} there)")
    assert text.count("seed from run") == 1

    drawn = lineage_image.drawing(marked)
    (seed_edge,) = [e for e in drawn.edges if e.kind == "seed"]
    assert (seed_edge.source, seed_edge.target, seed_edge.on_best, seed_edge.label) == (key, x, True, "seed")
    assert drawn.labels[key] == f"{bred[:8]} in run {earlier[-6:]} gen {there}"
    assert {(e.source, e.target) for e in drawn.edges if e.kind == "parent"} == set(graph.edges)
    titles = node_titles(lineage_image.render(marked, tmp_path)["svg"].read_text())
    assert any(t.startswith(x) and f"seed from run {earlier}" in t for t in titles.values())


def test_a_cycle_in_the_records_stops_the_chain_with_a_mark(rmsnorm, tmp_path):
    """One run's records cannot loop, but a broken journal could: the chain must stop and say so, not go round
    nor name a candidate as its own parent."""
    from kernel_factory.evo.observers.mlflow_view import one_line
    rng, d = random.Random(), rmsnorm.space.defaults()
    a, b, s = (Genome.of({**d, "threads": t}) for t in (128, 512, 1024))
    c = {"a": Candidate(a, (b.id,), "gene_mutation", 1), "b": Candidate(b, (a.id,), "gene_mutation", 2),
         "s": Candidate(s, (s.id,), "gene_mutation", 1)}
    c["c"] = Candidate(Genome.of({**d, "threads": 128, "unroll": 4}), (a.id,), "gene_mutation", 3)
    graph = lineage.build([(v, ok(v, rng.uniform(6, 12))) for v in c.values()])

    steps = lineage.chain(graph, c["c"].id)
    assert [st.node for st in steps] == [b.id, a.id, c["c"].id]
    assert steps[0].cycle == a.id and steps[0].parent is None and all(st.cycle is None for st in steps[1:])
    text = lineage.format_chain(steps)
    assert f"cycle: its recorded parent {a.id} is already later on this chain" in text.splitlines()[0]
    assert one_line(graph, c["c"].id).startswith(f"`{b.id[:8]}` (gene_mutation; cycle: ")

    (alone,) = lineage.chain(graph, s.id)
    assert alone.cycle == s.id and alone.parent is None
    line = lineage.format_chain([alone])
    assert "recorded as its own parent" in line and f"from {s.id}" not in line
    assert lineage.against_parent(graph, s.id).parent is None
    assert len(node_titles(lineage_image.render(graph, tmp_path)["svg"].read_text())) == 4
