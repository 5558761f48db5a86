"""`kernel-factory gap TARGETS.yaml`: where a kernel stands against the targets that define its success, and the
evidence for why, read from committed bench results and run journals (no GPU needed).

A targets file names bench results (bench.py's JSON: every provider timed side by side in one process) and, per
report, the dtypes it covers, the geomean ratio to the best peer it must reach and the floor no row may fall below.
The best peer is the fastest of the problem's published peers (`peers`) that belong on the rows; a bench in which
one of them ran on no row of a dtype is refused, unless the report (`without:`) or the command (`--without`) goes on
without it, and then its headline says so. For each report the gap report gives:
- whether it is met: the geomean and the rows under the floor, worst first;
- the roofline of each row: the time a copy of the row's bytes takes at the copy bandwidth measured in the same
  process, our share of it and the best peer's, and the ratio we would reach at that bandwidth (the ceiling). A row
  whose ceiling is under the floor cannot meet it with a kernel that moves the same bytes, and the geomean of the
  ceilings bounds the report's geomean. Small copies do not reach the measured bandwidth, so at small rows the
  ceiling is loose. Rows whose ceiling is under the geomean target can give at most their ceiling; the report
  says what geomean the other rows would then need;
- what is needed: per row the speed-up that reaches the floor, and the factor the geomean is short by;
- what the searches found at each row's case (from run journals timed on a GPU): how many evaluations and
  distinct genomes, in which runs, the best search time, the closest variants (genomes within `close` of the best,
  with the genes in which they differ from it) and the gene values never timed there. Search times come from
  separate runs, not side by side with the peers: they say how the search's candidates rank, not how fast they
  are against a peer.
"""
from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import config
from . import bench_report, bench_suite, export, peers
from .peers import COPY, SUBJECT
from ..config import ConfigError
from .. import journal
from ..protocols import Problem, PublishedPeers

FORMAT = "kernel-factory-gap/1"
MAX_CLOSE = 5


@dataclass(frozen=True)
class ReportTarget:
    name: str                                # a label: "forward bf16"
    bench: str                               # a bench or suite result JSON (kernel-factory bench --out)
    geomean: float                           # geomean of best peer / ours to reach
    floor: float                             # no row below this ratio
    dtypes: tuple[str, ...] | None = None    # the bench rows counted (None: all)
    problem: str | None = None               # in a suite result, the part of this problem
    without: tuple[str, ...] = ()            # published peers the bench may lack (or that are not counted): said so


@dataclass(frozen=True)
class Targets:
    reports: tuple[ReportTarget, ...]
    runs: tuple[str, ...] = ()               # folders searched (recursively) for run journals
    close: float = 0.05                      # closest variants: within this fraction of the best search time


def load_targets(path: str | Path) -> Targets:
    """The targets file, checked: unknown keys, non-positive targets and missing files are errors that say so."""
    targets = config.build(Targets, config.load_mapping(path, "targets file"))
    if not targets.reports:
        raise ConfigError("targets key 'reports' must list at least one report")
    if not 0 < targets.close < 1:
        raise ConfigError(f"targets key 'close' must be between 0 and 1, got {targets.close}")
    for i, report in enumerate(targets.reports):
        for key in ("geomean", "floor"):
            if not getattr(report, key) > 0:
                raise ConfigError(f"targets key 'reports[{i}].{key}' must be > 0, got {getattr(report, key)}")
        if not Path(report.bench).is_file():
            raise ConfigError(f"targets key 'reports[{i}].bench': no file {report.bench!r}")
    for folder in targets.runs:
        if not Path(folder).is_dir():
            raise ConfigError(f"targets key 'runs': no folder {folder!r}")
    return targets


def read_bench(path: str | Path, problem: str | None = None,
               dtypes: Sequence[str] | None = None) -> dict[str, Any]:
    """A bench result; from a suite result, its one part of `problem` that benched all of `dtypes`."""
    result = bench_suite.read(path)
    if "parts" in result:
        parts = [p for p in result["parts"] if p["problem"] == problem
                 and set(dtypes or ()) <= {r["dtype"] for r in p["rows"]}]
        if len(parts) != 1:
            have = "; ".join(f"{p['problem']} ({', '.join(sorted({r['dtype'] for r in p['rows']}))})"
                             for p in result["parts"])
            raise ConfigError(f"{path} is a suite with parts {have}: a report target on it needs 'problem' and "
                              f"'dtypes' that pick exactly one (got {problem!r}, {list(dtypes or [])})")
        return parts[0]
    if problem is not None and result.get("problem") != problem:
        raise ConfigError(f"{path} benches {result.get('problem')!r}, not {problem!r}")
    return result


def journals(folders: Sequence[str | Path]) -> dict[str, Path]:
    """run id -> its journal under the folders. A run found twice (a live folder and its gzipped copy in the
    evidence) is read from the copy with the most results."""
    found: dict[str, tuple[int, Path]] = {}
    for folder in folders:
        for path in sorted(Path(folder).rglob("journal.jsonl*")):
            if path.name not in ("journal.jsonl", "journal.jsonl.gz"):
                continue
            try:
                run = journal.read(path)
            except journal.JournalError:
                continue   # not a run's journal (or not one this version reads): nothing to learn from it
            n, run_id = len(run.results), run.run_id
            if run_id not in found or n > found[run_id][0]:
                found[run_id] = (n, path)
    return {run_id: path for run_id, (_, path) in sorted(found.items())}


def search_index(problem: Problem, paths: Mapping[str, Path], gpu: str) -> dict[str, list[export.Measurement]]:
    """case key -> the measurements taken there by runs of this problem, live on this GPU model (replayed runs are
    left out: their times are a recording's)."""
    index: dict[str, list[export.Measurement]] = defaultdict(list)
    for path in paths.values():
        try:
            _, found, _ = export.read_source(str(path), problem)
        except export.ExportError:
            continue   # another problem's run
        for meas in found:
            if meas.evaluator != "gpu" or meas.source.gpu != gpu:
                continue
            for key, t in meas.times_us.items():
                if isinstance(t, (int, float)) and math.isfinite(t) and t > 0:
                    index[key].append(meas)
    return index


def searched(problem: Problem, key: str, found: Sequence[export.Measurement], close: float) -> dict[str, Any]:
    """What the searches found at one case: counts, the best, the closest variants and the untried gene values."""
    if not found:
        return {"evaluations": 0, "genomes": 0, "runs": []}
    best_per_genome: dict[str, export.Measurement] = {}
    for meas in found:
        have = best_per_genome.get(meas.genome.id)
        if have is None or meas.times_us[key] < have.times_us[key]:
            best_per_genome[meas.genome.id] = meas
    ranked = sorted(best_per_genome.values(), key=lambda m: (m.times_us[key], m.genome.id))
    best = ranked[0]
    top = best.genome.gene_dict
    variants = []
    for meas in ranked[1:]:
        rel = meas.times_us[key] / best.times_us[key]
        if rel > 1 + close or len(variants) == MAX_CLOSE:
            break
        genes = meas.genome.gene_dict
        variants.append({"genome": meas.genome.id, "us": round(meas.times_us[key], 3), "rel": round(rel, 4),
                         "run": meas.source.run_id,
                         "differs": {g: [top[g], genes[g]] for g in problem.space.names if genes[g] != top[g]}})
    near = [m for m in ranked if m.times_us[key] <= best.times_us[key] * (1 + close)]
    return {"evaluations": len(found), "genomes": len(ranked),
            "runs": sorted({m.source.run_id for m in found}),
            "best": {"us": round(best.times_us[key], 3), "genome": best.genome.id, "run": best.source.run_id,
                     "candidate": best.candidate_id, "timing": best.notes.get("timing", "search"), "genes": top},
            "within": len(near) - 1, "close": variants,
            # genes on which every genome within the margin agrees: where the plateau's shape is decided
            "settled": {g: top[g] for g in problem.space.names if len({m.genome.gene_dict[g] for m in near}) == 1}
            if len(near) > 1 else {},
            "untried": untried(problem, ranked)}


def untried(problem: Problem, measured: Sequence[export.Measurement]) -> dict[str, list[Any]]:
    """Per gene, the values no measured genome had (only genes with some)."""
    seen = defaultdict(set)
    for meas in measured:
        for gene, value in meas.genome.gene_dict.items():
            seen[gene].add(value)
    out = {g.name: [v for v in g.choices if v not in seen[g.name]] for g in problem.space.genes}
    return {g: v for g, v in out.items() if v}


def row_gap(row: Mapping[str, Any], peers: Sequence[str], copy_gbps: float, floor: float) -> dict[str, Any]:
    """One bench row against the floor and the roofline."""
    out: dict[str, Any] = {"case": row["case"], "bytes": row["bytes"]}
    mine = row["providers"].get(SUBJECT, {}).get("us")
    best = bench_report.best_peer(row, peers)
    if mine is None or best is None:
        out["missing"] = "ours" if mine is None else "every peer"
        return out
    peer, peer_us = best
    timed_copy = row["providers"].get(COPY, {}).get("us")   # benches since the per-row copy: the tight roofline
    copy_us = timed_copy or row["bytes"] / (copy_gbps * 1e3)
    ratio = peer_us / mine
    out.update({"copy": "timed at the row's size" if timed_copy else "row bytes at the measured copy bandwidth",
                "ours_us": round(mine, 3), "peer": peer, "peer_us": round(peer_us, 3), "ratio": round(ratio, 4),
                "below_floor": ratio < floor, "copy_us": round(copy_us, 3),
                "ours_pct_copy": round(100 * copy_us / mine, 1), "peer_pct_copy": round(100 * copy_us / peer_us, 1),
                "ceiling": round(peer_us / copy_us, 4),
                "speedup_to_floor": round(max(1.0, floor / ratio), 4)})
    return out


def peers_of(target: ReportTarget, result: Mapping[str, Any], rows: Sequence[Mapping[str, Any]], problem: Problem,
             without: Sequence[str] = ()) -> dict[str, Any]:
    """The report's peers: those the bench timed on its rows, the published ones the best peer is the fastest of,
    and those it goes on without (with why) for its headline. A published peer that ran on no row of a dtype is
    refused in one line, unless the report or the command says `without` it."""
    part = {**result, "rows": list(rows)}
    published = problem.peers if isinstance(problem, PublishedPeers) else None
    allowed = {*peers.parse_without(problem, target.without, f"targets report {target.name!r} 'without'"),
               *peers.parse_without(problem, without)}
    declared, _, labels = peers.recorded_peers(part, problem.name)
    best = [n for n in declared if published is None or n in published]
    timed, lacking, gone, crashed, failed = [], {}, {}, {}, {}
    for dtype in peers.dtypes_of(part):
        acct = peers.account(part, dtype, problem.name)
        timed += [n for n in acct.ran if n not in timed]
        for n in best:
            if n in acct.without and n not in allowed:
                lacking.setdefault(n, f"{dtype}: {acct.without[n]}")
            elif n in acct.without or n in allowed:
                gone.setdefault(n, acct.without.get(n, "left out by the targets (without)"))
        for counts, into in ((acct.crashed, crashed), (acct.failed, failed)):
            for n, k in counts.items():
                into[n] = into.get(n, 0) + k
    if lacking:
        names, it = ",".join(lacking), "them" if len(lacking) > 1 else "it"
        raise ConfigError(f"targets report {target.name!r}: {target.bench} lacks {'peers' if it == 'them' else 'peer'} "
                          f"{', '.join(lacking)} ({'; '.join(f'{n} {why[:100]}' for n, why in lacking.items())}), "
                          f"so its 'vs best peer' would leave {it} out unsaid; bench {it}, or add `without: [{names}]` "
                          f"to the report (or --without {names})")
    note = peers.Account(tuple(timed), gone, crashed, {}, labels).note()
    return {"timed": timed, "best_of": [n for n in bench_report.peer_set(result) if n not in allowed],
            "without": gone, "crashed": crashed, "failed": failed, "note": note}


def report_gap(target: ReportTarget, result: Mapping[str, Any], problem: Problem,
               index: Mapping[str, Sequence[export.Measurement]], close: float,
               without: Sequence[str] = ()) -> dict[str, Any]:
    """One target against its bench result (read_bench) and what the searches found at its rows."""
    rows = [r for r in result["rows"] if target.dtypes is None or r["dtype"] in target.dtypes]
    if not rows:
        have = sorted({r["dtype"] for r in result["rows"]})
        raise ConfigError(f"targets report {target.name!r}: {target.bench} has no rows of dtypes "
                          f"{list(target.dtypes or [])}; it has {', '.join(have)}")
    who = peers_of(target, result, rows, problem, without)
    gaps = [row_gap(r, who["best_of"], result["copy_gbps"], target.floor) for r in rows]
    for gap in gaps:
        gap["search"] = searched(problem, gap["case"], index.get(gap["case"], ()), close)
    timed = [g for g in gaps if "ratio" in g]
    gm = bench_report.geomean([g["ratio"] for g in timed])
    ceiling = bench_report.geomean([g["ceiling"] for g in timed])
    below = [g for g in timed if g["below_floor"]]
    # rows that cannot reach the geomean target even at copy bandwidth: at best at their ceiling, the others must
    # make up the rest
    capped = [g for g in timed if g["ceiling"] < target.geomean]
    free = len(timed) - len(capped)
    rest = ((target.geomean ** len(timed) / math.prod(g["ceiling"] for g in capped)) ** (1 / free)
            if capped and free else None)
    fp = result["fingerprint"]
    return {"name": target.name, "problem": result["problem"], "bench": target.bench, "subject": result["subject"],
            "gpu": fp.get("gpu", "?"), "date": str(fp.get("date", "?"))[:10], "copy_gbps": round(result["copy_gbps"]),
            "peers": who["best_of"], **{k: who[k] for k in ("timed", "without", "crashed", "failed", "note")},
            "partial": result.get("partial"), "copy": sorted({g["copy"] for g in timed}),
            "target": {"geomean": target.geomean, "floor": target.floor},
            "geomean": gm and round(gm, 4), "geomean_ceiling": ceiling and round(ceiling, 4),
            "rows_below_floor": len(below), "rows": len(gaps),
            "met": bool(timed) and len(timed) == len(gaps) and not below and gm >= target.geomean,
            "geomean_short_by": gm and round(max(1.0, target.geomean / gm), 4),
            "ceiling_below_floor": [g["case"] for g in timed if g["ceiling"] < target.floor],
            "ceiling_below_target": [g["case"] for g in capped],
            "rest_needed": rest and round(rest, 4),
            "gaps": sorted(gaps, key=lambda g: g.get("ratio", -1.0))}


def analyse(targets: Targets, without: Sequence[str] = ()) -> dict[str, Any]:
    """Every report against its bench; `without` (--without): published peers every bench may lack."""
    paths = journals(targets.runs)
    indexes: dict[tuple[str, str], tuple[Problem, dict[str, list[export.Measurement]]]] = {}
    reports = []
    for target in targets.reports:
        bench = read_bench(target.bench, target.problem, target.dtypes)
        key = (bench["problem"], bench["fingerprint"].get("gpu", "?"))
        if key not in indexes:
            problem = export.problem_plugin(key[0])
            indexes[key] = (problem, search_index(problem, paths, key[1]))
        reports.append(report_gap(target, bench, *indexes[key], targets.close, without))
    return {"format": FORMAT, "close": targets.close, "journals": {k: str(v) for k, v in paths.items()},
            "met": all(r["met"] for r in reports), "reports": reports}


def _f(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else f"{v:{spec}}"


def _verdict(rep: Mapping[str, Any]) -> str:
    t = rep["target"]
    note = f" ({rep['note']})" if rep.get("note") else ""
    if rep["met"]:
        return f"**met**{note}: geomean {_f(rep['geomean'])} ≥ {t['geomean']:g}, no row below {t['floor']:g}."
    parts = [f"**not met**{note}: geomean {_f(rep['geomean'])} (target {t['geomean']:g}, short by "
             f"{_f(rep['geomean_short_by'])}×), {rep['rows_below_floor']} of {rep['rows']} rows below "
             f"{t['floor']:g}."]
    if rep["geomean_ceiling"] is not None and rep["geomean_ceiling"] < t["geomean"]:
        parts.append(f"Out of reach by the roofline: at the measured copy bandwidth on every row the geomean would "
                     f"be {_f(rep['geomean_ceiling'])}.")
    else:
        parts.append(f"Not excluded by the roofline: at the measured copy bandwidth on every row the geomean would "
                     f"be {_f(rep['geomean_ceiling'])}.")
    if rep["rest_needed"] is not None:
        n = len(rep["ceiling_below_target"])
        parts.append(f"{n} row{'s' * (n > 1)} cannot reach {t['geomean']:g} even at copy bandwidth; at "
                     f"{'their ceilings' if n > 1 else 'its ceiling'}, the other {rep['rows'] - n} would need a "
                     f"geomean of {rep['rest_needed']:.3f}.")
    if rep["ceiling_below_floor"]:
        parts.append("Rows that cannot reach the floor even at copy bandwidth: "
                     f"{', '.join(rep['ceiling_below_floor'])}.")
    return " ".join(parts)


SUMMARY = ["| report | geomean vs best peer (target) | rows below the floor | worst row | geomean at copy bandwidth |",
           "|---|---|---|---|---|"]


def summary_row(rep: Mapping[str, Any], name: str | None = None) -> str:
    """One report in one table row (name: what its first cell shows). The README and the results page copy these
    rows with a link on the name, so that each copy's numbers stand in the same order on the row it links."""
    worst = next((g for g in rep["gaps"] if "ratio" in g), None)
    note = f"; {rep['note']}" if rep.get("note") else ""
    return (f"| {name or rep['name']} ({rep['date']}{note}) | **{_f(rep['geomean'])}** ({rep['target']['geomean']:g}) | "
            f"{rep['rows_below_floor']} of {rep['rows']} below {rep['target']['floor']:g} | "
            + (f"{worst['case']} {worst['ratio']:.3f}" if worst else "-") + f" | {_f(rep['geomean_ceiling'])} |")


def _search_line(s: Mapping[str, Any]) -> str:
    if not s["evaluations"]:
        return "not searched at this case"
    return (f"{s['evaluations']} evaluations, {s['genomes']} genomes, {len(s['runs'])} runs; best "
            f"{s['best']['us']:.1f} µs ({s['best']['run']}), {s['within']} more within the margin")


def markdown(analysis: Mapping[str, Any]) -> str:
    pct = round(100 * analysis["close"])
    lines = ["# Gap report: targets against the side-by-side benches", "",
             "Generated by `kernel-factory gap` from committed bench results and run journals; nothing was timed "
             "to write it. Ratio = best peer µs / ours (above 1: ours is faster). Copy µs = a copy of the row's "
             "bytes timed beside the providers where the bench did so, else the row's bytes at the copy bandwidth "
             "measured in the bench's process (loose at small rows, where a copy of that size does not reach it); "
             "ceiling = best peer µs / copy µs, the ratio a kernel as fast as that copy would reach. Search "
             f"columns come from the runs' journals (GPU-timed, not side by side with the peers); margin = {pct}% "
             "of the best search time.", "", "## Summary", "", *SUMMARY,
             *(summary_row(rep) for rep in analysis["reports"]), ""]
    for rep in analysis["reports"]:
        lines += [f"## {rep['name']} ({rep['problem']})", "",
                  f"Bench: `{rep['bench']}` ({rep['subject']}; {rep['gpu']}, {rep['date']}, copy {rep['copy_gbps']} "
                  f"GB/s){'; PARTIAL: ' + rep['partial'] if rep['partial'] else ''}. Peers timed: "
                  f"{', '.join(rep['timed']) or 'none'}; the best peer is the fastest of {', '.join(rep['peers'])}"
                  + "".join(f"; without {n}: {why}" for n, why in rep["without"].items())
                  + "".join(f"; {n} {what} on {k} of {rep['rows']} rows" for what in ("crashed", "failed")
                            for n, k in rep[what].items())
                  + f". Copy µs: {'; '.join(rep['copy'])}.",
                  "", _verdict(rep), "",
                  "| case | ours µs | best peer µs | ratio | to floor | ours % copy | peer % copy | ceiling | "
                  "search |", "|---|---|---|---|---|---|---|---|---|"]
        for g in rep["gaps"]:
            if "missing" in g:
                lines.append(f"| {g['case']} | no time for {g['missing']} | | | | | | | |")
                continue
            mark = " ⚠" if g["below_floor"] else ""
            lines.append(f"| {g['case']} | {g['ours_us']:.1f} | {g['peer']} {g['peer_us']:.1f} | "
                         f"{g['ratio']:.3f}{mark} "
                         f"| {_f(g['speedup_to_floor'])}× | {g['ours_pct_copy']:.0f}% | {g['peer_pct_copy']:.0f}% | "
                         f"{g['ceiling']:.3f} | {_search_line(g['search'])} |")
        lines += ["", "Closest variants at the rows below the floor (search times; genes that differ from the "
                  "best):", ""]
        for g in rep["gaps"]:
            if not g.get("below_floor"):
                continue
            s = g["search"]
            lines.append(f"- **{g['case']}** ({g['ratio']:.3f}): {_search_line(s)}.")
            for v in s.get("close", []):
                diff = ", ".join(f"{k} {a}→{b}" for k, (a, b) in v["differs"].items())
                lines.append(f"  - +{100 * (v['rel'] - 1):.1f}% {v['genome']} ({v['run']}): {diff}")
            if s.get("settled"):
                lines.append(f"  - all {s['within'] + 1} genomes within the margin share: "
                             + ", ".join(f"{k} {v}" for k, v in s["settled"].items()))
            if s.get("untried"):
                lines.append("  - never timed here: " + "; ".join(f"{k} {', '.join(map(str, v))}"
                                                                  for k, v in s["untried"].items()))
        lines.append("")
    lines += ["Journals read: " + ", ".join(f"{k}" for k in analysis["journals"]) + ".", ""]
    return "\n".join(lines)


def write(analysis: Mapping[str, Any], out_dir: str | Path, stem: str = "gap") -> list[Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.md", out / f"{stem}.json"]
    paths[0].write_text(markdown(analysis))
    paths[1].write_text(json.dumps(analysis, indent=1, default=str) + "\n")
    return paths
