"""Where the forward loses on few rows (issue 28), measured on a GPU host:
`python3 tests/gpu/small_m_study.py [train|heldout|all] [--rules FILE]`.

Two seeded draws of small-batch shapes (M from 1 to 64) from the problem's workload, disjoint, and none of them a
training or held-out shape of the committed campaigns: TRAIN shapes and held-out shapes per dtype.
1. Training: every genome of a grid (threads, vec_bytes, keep_x, unroll, cluster, w_ahead; tail=peel) passes the
   correctness check on each training shape and is timed there; from those times a dispatch rule for M <= 64 is
   learned per dtype (a tree or nearest shapes, whichever does better on training shapes left out in turn, as a
   workload campaign learns; evo/tools/learn.py). Written to $OUT/small_m_rule.json with its panel.
2. Held out, per shape, in one process: the grid ranked again on the shape (check, one timing each); then side by side
   (interleaved sample by sample, CUDA graphs, L2 flushed before each call) the shipped op's genome for the shape (its
   dispatch table), that genome's w_ahead twins, the small-M rule's pick, the grid's three fastest, a copy of the
   row's bytes, and every peer that loads.
Prints the rows and per-dtype geomeans of the best peer's time over ours; writes them to $OUT/small_m.txt and the
raw times to $OUT/small_m.json when OUT is set (after every shape, so a cut call keeps what it measured). The grid's
best per held-out shape is an oracle (the most any rule could pick from the grid), not what any op runs. No
assertion on times: a benchmark, not a test.
The two parts may run in separate calls on one host (`train`, then `heldout` once every peer is installed): the
training writes its rules to --rules (default $OUT/small_m_rule.json) and, beside them, small_m_graft.json, which
`kernel-factory graft` adds to the op's table for M <= 64."""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch

from kernel_factory.evo.evaluate import launcher, measure
from kernel_factory.evo.tools import bench, dispatch, learn, peers
from kernel_factory.evo.types import Case, Genome
from kernel_factory.evo.workload import draw, narrow
from kernel_factory.kernels import dispatch_rule
from kernel_factory.problems.rmsnorm_fwd import problem

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "kernels/ops/rmsnorm_fwd.json"
CAMPAIGNS = sorted((ROOT / "docs/results/workload").glob("h200-fwd-workload*/workload.json"))
SEED, PER_DTYPE, TRAIN, TOP, REPS = 28, 10, 16, 3, 30
# Every declared peer but QuACK tuned, which autotunes per shape at its first call (tens of seconds a shape: the
# study's whole call for 30 shapes); its report line says so.
LEFT_OUT = {"quack_tuned": "autotunes per shape (tens of seconds each)"}
PEERS = tuple(p.baseline for p in problem.declared_peers if p.baseline not in LEFT_OUT)
GRID_CHOICES = dict(threads=(128, 256, 512), vec_bytes=(8, 16), keep_x=(False, True), unroll=(1, 4),
                    cluster=(1, 2, 4, 8, 16), w_ahead=("none", "l2", "regs"), tail=("peel",))


def shapes() -> tuple[list[Case], list[Case]]:
    """(training, held-out) shapes: TRAIN and PER_DTYPE per dtype, M in [1, 64], drawn from the workload by two
    seeded streams; disjoint, and the campaigns' shapes left out of both."""
    seen = {Case.parse(k) for path in CAMPAIGNS for part in ("train", "heldout")
            for k in json.loads(path.read_text())[part]}
    few = narrow(problem.workload, m=(1, 64), small_m_share=1.0)
    rng = random.Random(SEED)
    held = [c for d in problem.dtypes for c in draw(few, d, PER_DTYPE, rng, exclude=seen)]
    rng = random.Random(SEED + 1)
    train = [c for d in problem.dtypes for c in draw(few, d, TRAIN, rng, exclude=seen | set(held))]
    return train, held


def feasible(genes: dict) -> dict | None:
    full = {**problem.space.defaults(), **genes}
    return full if problem.space.why_infeasible(full) is None else None


RANKING = measure.TimingPolicy(warmup=1, min_reps=5, max_reps=10, target_ms=0.05, graph_below_us=250.0)
GRID = {Genome.of(f).id: f for values in itertools.product(*GRID_CHOICES.values())
        if (f := feasible(dict(zip(GRID_CHOICES, values))))}


def compile_all(genomes: dict[tuple[str, str], dict]) -> dict[tuple[str, str], launcher.Module]:
    """(genome id, dtype) -> loaded module, compiled together on the host's CPUs (tests/gpu/grid_study.py)."""
    from grid_study import compile_pairs
    return compile_pairs(problem, genomes)


def ours(module: launcher.Module, genes: dict, case: Case, inputs: dict, stream: Any) -> Callable[[], Any]:
    from grid_study import runner
    return runner(problem, module, genes, case, inputs, stream)


def rank(case: Case, inputs: dict, modules: dict, timer: measure.Timer, stream: Any) -> tuple[dict, dict]:
    """Every grid genome on the case: checked, then timed once (CUDA graph replays). (times by id, failures by id)"""
    times, failed = {}, {}
    for gid, full in GRID.items():
        fn = ours(modules[gid, case.dtype], full, case, inputs, stream)
        why = bench.check(problem, case, inputs, fn)
        if why:
            failed[gid] = why
            continue
        times[gid] = timer.time(fn, graphs=True).median_us
    return times, failed


def learn_rules(panel: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Per dtype, the small-M rule learned from the training panel (times[case][genome id]): a tree or nearest
    shapes, whichever does better on training shapes left out in turn; with both fits."""
    learners = {"tree": lambda t: learn.fit(t, depth=3), "near": learn.fit_near}
    rules = {}
    for dtype in problem.dtypes:
        times = {k: row for k, row in panel.items() if k.startswith(dtype + ":") and row}
        if not times:
            continue
        outs = {name: learn.left_out(times, fn) for name, fn in learners.items()}
        kind = min(outs, key=lambda name: outs[name][0])
        fitted = learners[kind](times)
        rules[dtype] = {"rule": kind, "tree": fitted.tree, "training": fitted.slowdown,
                        "left_out": {name: list(o) for name, o in outs.items()}}
    return rules


def measure_case(case: Case, table: dict, rules: dict, modules: dict, timers: tuple[measure.Timer, measure.Timer],
                 stream: Any, loaded: list[str]) -> dict[str, Any]:
    inputs = problem.make_inputs(case, seed=2026, device="cuda")
    row: dict[str, Any] = {"case": case.key, "bytes": problem.bytes_moved(case)}
    shipped = dispatch.lookup(table, case.dtype, case.shape[1], case.shape[0])[0].gene_dict
    shipped = {**problem.space.defaults(), **shipped}
    twins = {f"shipped w_ahead={w}": g for w in ("l2", "regs") if (g := feasible({**shipped, "w_ahead": w}))}
    row["rank_us"], row["failed"] = rank(case, inputs, modules, timers[0], stream)
    timer = timers[1]
    top = sorted(row["rank_us"], key=row["rank_us"].get)[:TOP]
    picked = ({"small-M rule": GRID[learn.chosen(rules[case.dtype]["tree"], case)]}
              if case.dtype in rules else {})
    fns: dict[str, Callable[[], Any]] = {}
    genes_of = {"shipped": shipped, **twins, **picked, **{f"grid {gid}": GRID[gid] for gid in top}}
    for name, genes in genes_of.items():
        fn = ours(modules[Genome.of(genes).id, case.dtype], genes, case, inputs, stream)
        why = bench.check(problem, case, inputs, fn)
        if why:
            row["failed"][name] = why
        else:
            fns[name] = fn
    for name in loaded:
        try:
            fn = problem.baseline(name, case, inputs)
            why = bench.check(problem, case, inputs, fn)
        except Exception as exc:   # a peer that refuses this shape
            why = bench.failure(exc)
        if why and not why.startswith("incorrect"):
            row["failed"][name] = why
            if why.startswith("crashed"):
                raise RuntimeError(f"{name} crashed on {case.key}: {why}")
            continue
        fns[name] = fn
    fns["copy"] = bench.row_copy(row["bytes"])
    timed, graphed = bench.graph_where_short(timer, fns)
    times = timer.time_interleaved(list(timed.values()), REPS)
    row["us"] = {n: t.median_us for n, t in zip(timed, times)}
    row["graphed"] = sorted(graphed)
    row["genes"] = genes_of
    return row


def summary(rows: list[dict], loaded: list[str]) -> list[str]:
    out = []
    for dtype in problem.dtypes:
        mine = [r for r in rows if r["case"].startswith(dtype)]
        ratios: dict[str, list[float]] = {}
        for r in mine:
            best = min((r["us"][p] for p in loaded if p in r["us"]), default=None)
            if best is None:
                continue
            grid = min((t for n, t in r["us"].items() if n.startswith("grid ")), default=math.inf)
            twin = min((t for n, t in r["us"].items() if n.startswith("shipped")), default=math.inf)
            for label, t in (("shipped", r["us"].get("shipped", math.inf)), ("shipped or its w_ahead twin", twin),
                             ("small-M rule", r["us"].get("small-M rule", math.inf)),
                             ("grid's best (oracle)", grid)):
                ratios.setdefault(label, []).append(best / t)
        # a best peer is the best of those that ran: the line names each one that failed on some of its shapes
        absent = {p: sum(p not in r["us"] for r in mine) for p in loaded}
        note = "".join(f"; {p} did not run on {k} of them" for p, k in absent.items() if k)
        for label, vals in ratios.items():
            geo = math.exp(sum(map(math.log, vals)) / len(vals))
            out.append(f"small-M fwd {dtype}: {label}: geomean {geo:.2f}x best peer over {len(vals)} shapes, "
                       f"worst {min(vals):.2f}x{note}")
        winners = [r["genes"][n]["w_ahead"] for r in mine for n in r["genes"] if n.startswith("grid ")
                   and n in r["us"] and r["us"][n] == min(r["us"][m] for m in r["us"] if m.startswith("grid "))]
        out.append(f"small-M fwd {dtype}: w_ahead of the grid's fastest per shape: "
                   + ", ".join(f"{w} {winners.count(w)}" for w in ("none", "l2", "regs")))
    return out


def lines_of(row: dict, loaded: list[str]) -> list[str]:
    us = row["us"]
    best = min((p for p in loaded if p in us), key=us.get, default=None)
    head = f"{row['case']:>22}  best peer {best} {us[best]:.2f} us" if best else f"{row['case']:>22}  no peer ran"
    out = [head + f", copy {us['copy']:.2f} us"]
    for name in us:
        if name in loaded or name == "copy":
            continue
        genes = row["genes"][name]
        diff = {k: v for k, v in genes.items() if v != problem.space.defaults()[k]}
        ratio = f"{us[best] / us[name]:.3f}x" if best else "-"
        out.append(f"{'':>24}{name:<30} {us[name]:8.2f} us  {ratio:>7} best peer  {json.dumps(diff)}")
    out.append(f"{'':>24}peers: " + ", ".join(f"{p} {us[p]:.2f}" for p in loaded if p in us)
               + "".join(f"; {n}: {w[:90]}" for n, w in row["failed"].items() if n not in GRID))
    return out


def graft_file(rules: dict[str, dict[str, Any]], head: dict) -> dict[str, Any]:
    """The rules as `kernel-factory graft` reads them: for calls of M <= 64, with the genes of every genome named."""
    named = {gid for r in rules.values() for gid in dispatch_rule.leaves(r["tree"])}
    return {"region": {"feature": "log2_m", "le": math.log2(64)},
            "rules": {d: {"tree": r["tree"], "rule": r["rule"], "left_out": r["left_out"]} for d, r in rules.items()},
            "genomes": {gid: GRID[gid] for gid in sorted(named)},
            "source": f"tests/gpu/small_m_study.py train on {head['device']}, seed {SEED + 1}, "
                      f"{len(head['training_shapes'])} training shapes with M <= 64"}


def train_rules(train: list[Case], out: Path | None, rules_path: Path, budget_s: float) -> dict[str, dict[str, Any]]:
    """Part 1: the grid timed on the training shapes and the rules learned from it, written to rules_path. Past
    budget_s, the rules are learned from the shapes timed so far (dtypes interleaved, so each keeps some)."""
    start = time.monotonic()
    modules = compile_all({(gid, case.dtype): full for case in train for gid, full in GRID.items()})
    _, stream, _, head = bench.session(250.0)
    head.update(device=torch.cuda.get_device_name(), seed=SEED)
    ranker = measure.Timer(RANKING)
    panel = {}
    by_dtype = [[c for c in train if c.dtype == d] for d in problem.dtypes]
    for case in (c for row in itertools.zip_longest(*by_dtype) for c in row if c is not None):
        if time.monotonic() - start > budget_s:
            print(f"training cut at {budget_s:.0f} s: {len(panel)} of {len(train)} shapes timed", flush=True)
            break
        panel[case.key] = rank(case, problem.make_inputs(case, seed=2026, device="cuda"), modules, ranker, stream)[0]
    head["training_shapes"] = sorted(panel)
    rules = learn_rules(panel)
    rules_path.parent.mkdir(parents=True, exist_ok=True)
    rules_path.write_text(json.dumps({"head": head, "grid": GRID, "panel": panel, "rules": rules}, indent=1))
    (rules_path.parent / "small_m_graft.json").write_text(json.dumps(graft_file(rules, head), indent=1))
    if out and out != rules_path.parent:
        (out / "small_m_graft.json").write_text(json.dumps(graft_file(rules, head), indent=1))
    return rules


def rule_lines(rules: dict[str, dict[str, Any]]) -> list[str]:
    return [f"small-M rule {d}: {r['rule']}, on its training shapes {r['training']:.3f}x the grid's best; each left "
            f"out in turn: " + ", ".join(f"{k} {v[0]:.3f}x (worst {v[1]:.3f}x at {v[2]})" for k, v in
                                         r["left_out"].items()) for d, r in rules.items()]


def held_out(cases: list[Case], rules: dict[str, dict[str, Any]], out: Path | None) -> None:
    """Part 2: on the held-out shapes, side by side with every peer that loads."""
    loaded = [p for p in PEERS if peers.load_error(next(x for x in problem.declared_peers if x.baseline == p)) is None]
    missing = [p for p in PEERS if p not in loaded]
    table = dispatch.load(str(TABLE))
    genomes = {}
    for case in cases:
        shipped = {**problem.space.defaults(), **dispatch.lookup(table, case.dtype, case.shape[1],
                                                                  case.shape[0])[0].gene_dict}
        for genes in [shipped, *[{**shipped, "w_ahead": w} for w in ("l2", "regs")], *GRID.values()]:
            if (full := feasible(genes)) is not None:
                genomes[Genome.of(full).id, case.dtype] = full
    print(f"{len(cases)} held-out shapes, {len(genomes)} (genome, dtype) builds; peers {loaded}"
          + (f"; NOT LOADED: {missing}" if missing else ""), flush=True)
    modules = compile_all(genomes)
    timer, stream, _, head = bench.session(250.0)
    ranker = measure.Timer(RANKING)
    head.update(device=torch.cuda.get_device_name(), peers=loaded, missing=missing, left_out=LEFT_OUT, seed=SEED)
    rows: list[dict] = []
    text = [f"RMSNorm forward, M <= 64, {head['device']}: median us, side by side; peers {loaded}"
            + (f" (without {', '.join(missing)}: did not load)" if missing else "")
            + "".join(f"; {name} left out: {why}" for name, why in LEFT_OUT.items()), *rule_lines(rules)]
    for case in cases:
        rows.append(measure_case(case, table, rules, modules, (ranker, timer), stream, loaded))
        text += lines_of(rows[-1], loaded)
        print("\n".join(lines_of(rows[-1], loaded)), flush=True)
        if out:
            (out / "small_m.json").write_text(json.dumps({"head": head, "rows": rows}, indent=1))
    text += summary(rows, loaded)
    print("\n".join(summary(rows, loaded)))
    if out:
        (out / "small_m.txt").write_text("\n".join(text) + "\n")


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("part", nargs="?", choices=("train", "heldout", "all"), default="all")
    args.add_argument("--rules", help="the training's rules file (default: $OUT/small_m_rule.json)")
    args.add_argument("--budget", type=float, default=math.inf, metavar="SECONDS",
                      help="training: learn from the shapes timed within this many seconds")
    opts = args.parse_args()
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    rules_path = Path(opts.rules) if opts.rules else (out or Path(tempfile.mkdtemp())) / "small_m_rule.json"
    train, cases = shapes()
    print(f"{len(train)} training and {len(cases)} held-out shapes, {len(GRID)} grid genomes", flush=True)
    if opts.part in ("train", "all"):
        rules = train_rules(train, out, rules_path, opts.budget)
        print("\n".join(rule_lines(rules)), flush=True)
    else:
        try:
            rules = json.loads(rules_path.read_text())["rules"]
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"no training rules at {rules_path}: run the `train` part first ({exc})")
    if opts.part in ("heldout", "all"):
        held_out(cases, rules, out)


if __name__ == "__main__":
    sys.exit(main())
