"""The search-efficiency report, rendered from the benchmark's raw JSON alone (what each method did on each seed),
so that `--from FILE.json` and the claims test re-make the committed markdown exactly, on any machine.

A run that ends without a hit is written "none in N", N being the distinct genomes it evaluated: the budget, or
fewer where the method stopped by itself (Kernel Tuner's GA). A quantile that reaches such a run is "no hit"."""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

from . import efficiency_stats

FORMAT = "kernel-factory-efficiency/1"
FULL_BOTH = "loop-full + earlier run"   # loop-full counted together with the run it starts from
LOOPS = ("loop-defaults", "loop-before", "loop-cold", "loop-bandit", "loop-surrogate", "loop-full")


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between order statistics; a miss (inf) censors every quantile that touches it."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return math.inf if math.isinf(xs[hi]) else xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def both_runs(run: Mapping[str, Any]) -> dict[str, Any]:
    """loop-full's seed counted with the earlier run it starts from: that run's evaluations up to its hit, or all of
    them and then loop-full's."""
    if run["prior_hit"] is not None:
        hit = run["prior_hit"]
    else:
        hit = None if run["hit"] is None else run["prior_spent"] + run["hit"]
    return {"seed": run["seed"], "hit": hit, "spent": run["prior_spent"] + run["spent"]}


def columns(methods: Mapping[str, Any]) -> dict[str, list[Mapping[str, Any]]]:
    """Each method that ran (a string is why one could not), with loop-full's row counted with its earlier run."""
    out: dict[str, list[Mapping[str, Any]]] = {}
    for method, runs in methods.items():
        if isinstance(runs, str):
            continue
        out[method] = runs
        if method == "loop-full":
            out[FULL_BOTH] = [both_runs(r) for r in runs]
    return out


def hits(runs: Sequence[Mapping[str, Any]]) -> list[float]:
    return [math.inf if r["hit"] is None else float(r["hit"]) for r in runs]


def fmt(x: float) -> str:
    return "no hit" if math.isinf(x) else f"{x:.0f}" if x == int(x) else f"{x:.1f}"


def cell(run: Mapping[str, Any]) -> str:
    return f"none in {run['spent']}" if run["hit"] is None else str(run["hit"])


def ratio(a: float, b: float | None) -> str:
    if b is None or math.isinf(a) or math.isinf(b):
        return "n/a"
    return f"{a / b:.{2 if a / b >= 0.1 else 3}f}x"


def table(methods: Mapping[str, Any]) -> list[str]:
    cols = columns(methods)
    med = {m: quantile(hits(runs), 0.5) for m, runs in cols.items()}
    lines = ["| method | median evaluations to target | IQR | min to max | reached | median evaluations spent "
             "| vs random | vs kt-ga |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {m} | {why} | | | | | | |" for m, why in methods.items() if isinstance(why, str)]
    for method, runs in cols.items():
        h = hits(runs)
        lines.append(f"| {method} | {fmt(med[method])} | {fmt(quantile(h, 0.25))} to {fmt(quantile(h, 0.75))} | "
                     f"{fmt(min(h))} to {fmt(max(h))} | {sum(map(math.isfinite, h))}/{len(h)} | "
                     f"{quantile([r['spent'] for r in runs], 0.5):.0f} | {ratio(med[method], med.get('random'))} | "
                     f"{ratio(med[method], med.get('kt-ga'))} |")
    seeds = [r["seed"] for r in next(iter(cols.values()), [])]
    lines += ["", "Per seed, evaluations to target:", "", "| seed | " + " | ".join(cols) + " |",
              "|---:|" + "---:|" * len(cols)]
    lines += [f"| {seed} | " + " | ".join(cell(runs[i]) for runs in cols.values()) + " |"
              for i, seed in enumerate(seeds)]
    return lines


def against_kt(methods: Mapping[str, Any]) -> list[str]:
    """Each method's evaluations to target against Kernel Tuner's GA's (two samples; a seed of one method is no
    pair of the same seed of the other): the ratio of medians, and the one-sided p-value that the method needs
    fewer (a miss counts as worse than any hit)."""
    cols = columns(methods)
    kt = hits(cols["kt-ga"])
    lines = [f"Each method against kt-ga: one-sided Mann-Whitney U over {len(kt)} seeds (normal approximation, "
             "tie-corrected) that the method needs fewer evaluations to target, a run without a hit counted as "
             "worse than any hit:", "", "| method | median / kt-ga median | p (fewer than kt-ga) |", "|---|---:|---:|"]
    for method, runs in cols.items():
        if method != "kt-ga":
            h = hits(runs)
            lines.append(f"| {method} | {ratio(quantile(h, 0.5), quantile(kt, 0.5))} | "
                         f"{efficiency_stats.fewer_p_value(h, kt):.2g} |")
    return lines


STOPS = {"empty": "population empty", "maxiter": "maxiter", "max_fevals": "max_fevals (the budget)"}


def kt_table(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Kernel Tuner's GA as it ran on each seed: its generations, what it evaluated, and what ended it."""
    lines = ["| seed | generations (size x how many) | evaluated, repeats included | distinct | first hit | "
             "stopped by |", "|---:|---|---:|---:|---:|---|"]
    for r in runs:
        gens = ", ".join(f"{size} x {count}" for size, count in r["generations"])
        lines.append(f"| {r['seed']} | {gens} | {r['evaluated']} | {r['spent']} | {cell(r)} | {STOPS[r['stop']]} |")
    return lines


def notes(data: Mapping[str, Any]) -> list[str]:
    ran = columns(data["methods"])
    n, k, s = data["genomes"], data["hits"], data["search"]
    out = [f"- **random**: a seeded shuffle of the {n} feasible genomes, read in order; the expected evaluations "
           f"to the first of {k} hits are (n+1)/(k+1) = {(n + 1) / (k + 1):.0f}."] if "random" in ran else []
    if set(ran) & set(LOOPS):
        changed = "".join(f", {key} {value} (set for this report)" for key, value in data["overrides"].items())
        out.append("- **loop-\\***: `evo.loop.evolve` composed as `evo/run.py` does (Proposer, History, warm-start "
                   f"seeds), on the replay evaluator, with the search defaults of `evo/config.py` (population "
                   f"{s['population']}, tournament {s['tournament']}, elitism {s['elitism']}, operator weights "
                   f"{s['weights']}, surrogate {s['surrogate']}){changed} except generations = max_evaluations = "
                   "budget. loop-defaults: those settings as they are (no earlier run, so no warm start); "
                   "loop-before: the defaults before issue 32, population 12 and surrogate off; loop-cold: policy "
                   "static, lessons, "
                   "surrogate and warm start off; loop-bandit: policy bandit only; loop-surrogate: surrogate only; "
                   f"loop-full: all four on, starting from the {data['prior']['evaluations']} results of one "
                   f"loop-cold run with seed + {data['prior']['seed_offset']}, whose evaluations are not counted. "
                   "Counted: every candidate the loop sent to the evaluator (failures included), in order.")
    if "kt-ga" in ran:
        kt = data["kt"]
        out.append(f"- **kt-ga**: Kernel Tuner {kt['version']}, `tune_kernel(..., strategy='genetic_algorithm', "
                   f"strategy_options={{'max_fevals': {data['budget']}}}, simulation_mode=True, cache=<export>)` "
                   f"with the GA's default options ({kt['options']}). Objective `time` = 1/fitness, minimised. Our "
                   f"feasibility rule is a KT restriction: KT's search space holds {kt['space']} configurations, "
                   f"{kt['cached']} of them in the cache of {n} entries. Seeds: `random.seed(s)` and "
                   "`numpy.random.seed(s)` before each call (KT draws from both). Counted: distinct configurations "
                   "in the order KT returned results, which is what its simulation runner charges to max_fevals "
                   "(a repeat served from the cache costs nothing).")
        out.append("- **How kt-ga ran** (table below): the GA evaluates one generation at a time. Where its popsize "
                   "option exceeds half the space, KT sets the population to the smaller of popsize and "
                   "max(round(3 x space / maxiter), 2). It breeds a new generation only while the configurations it has evaluated, repeats included, "
                   "number fewer than the space holds; after that every generation is empty and the GA runs out its "
                   "maxiter generations evaluating nothing (stopped by: population empty). Otherwise it ends after "
                   "maxiter generations, or when max_fevals distinct configurations have been charged.")
    if "loop-full" in ran:
        found = sum(r["prior_hit"] is not None for r in ran["loop-full"])
        out.append(f"- **{FULL_BOTH}**: the earlier run had itself evaluated a hit in {found}/{len(ran['loop-full'])} "
                   "seeds, and warm start puts it into loop-full's first population. This row counts the earlier "
                   f"run's evaluations up to its hit, or all {data['prior']['evaluations']} plus loop-full's when it "
                   "found none.")
    out += [f"- {m} evaluated exactly what loop-cold did on every seed: its settings had no effect in this build."
            for m in data["same_as_cold"]]
    return out


def markdown(data: Mapping[str, Any]) -> str:
    if data.get("format") != FORMAT:
        raise ValueError(f"not a search-efficiency result (format {data.get('format')!r}, expected {FORMAT!r})")
    changed = "".join(f" except {key} {value} (set for this report)" for key, value in data["overrides"].items())
    held = ("**This is that recording: the loop's rows are in-sample, not a held-out measure.**"
            if data["in_sample"] else "This recording was not used to tune them (held out).")
    lines = [f"# Search efficiency: {data['problem']} ({data['dtype']}) on recorded {data['device']} measurements", "",
             f"- Problem `{data['problem']}`, dtype `{data['dtype']}`. Recording `{data['recording']}` (sha256 "
             f"`{data['sha256']}`): {data['label']}. Replayed: no kernel ran.",
             f"- Search settings: the defaults of `evo/config.py`{changed}, tuned on the {data['tuned_on']} "
             f"recording. {held}",
             f"- Target: fitness >= {data['target_fraction']} x the space's optimum {data['optimum']:.4f}, i.e. >= "
             f"{data['target']:.4f} ({data['hits']} of {data['genomes']} genomes).",
             f"- Measure: distinct genomes evaluated until the first hit is evaluated; budget {data['budget']} per "
             f"run; seeds 0-{data['seeds'] - 1}. A run that ends without a hit is \"none in N\", N being the distinct "
             "genomes it evaluated (the budget, or fewer where the method stopped by itself); a quantile that "
             "reaches such a run is \"no hit\".",
             f"- Command: `{data['command']}` ({data['wall_s']:.0f} s with {data['jobs']} processes; "
             f"`--from` the JSON beside this file renders it again).", "",
             *table(data["methods"]), "", "How each method was run and counted:", "", *notes(data)]
    if isinstance(data["methods"].get("kt-ga"), list):
        lines += ["", "Kernel Tuner's GA, per seed:", "", *kt_table(data["methods"]["kt-ga"]), "",
                  *against_kt(data["methods"])]
    return "\n".join(lines) + "\n"
