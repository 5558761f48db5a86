"""`kernel-factory bench --suite FILE`: several benches (problems, dtypes, subjects) in one command and one process,
written as one report: a summary per part and dtype, then each part's table, one CSV, one JSON and one chart.

Each part is a bench.run (its providers timed side by side, its own copy-bandwidth measurement). Every part is
checked before the first is timed, its peers' imports included, so that a typo or a peer that cannot load in the
last part costs no GPU time. A part times every peer its problem declares unless it names `baselines`, or leaves
peers out with `without` (the command's --without adds to every part's); the summary says so per part and dtype.
The JSON is rewritten after every case of every part; a suite stopped part-way keeps the parts and cases it
measured, marked partial.
`--from` takes a suite JSON, or several bench JSONs that it joins into a suite (each part still its own process).
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .. import config, registry
from . import bench, bench_compare, bench_report, peers
from ..config import ConfigError

FORMAT = "kernel-factory-bench-suite/1"


@dataclass(frozen=True)
class SuitePart:
    problem: str
    dtypes: tuple[str, ...]
    table: str | None = None                   # the subject: exactly one of table, op, run, genes
    op: bool = False
    run: str | None = None
    genes: Mapping[str, Any] | None = None
    shapes: str = "benchmark"
    baselines: tuple[str, ...] | None = None   # None: every peer the problem declares for these shapes
    without: tuple[str, ...] = ()              # declared peers left out (the report says so)
    reps: int | None = None                    # None: the suite's

    def subject(self) -> dict[str, str | None]:
        return {"table": self.table, "op": "op" if self.op else None, "run": self.run,
                "genes": json.dumps(dict(self.genes)) if self.genes is not None else None}


@dataclass(frozen=True)
class Suite:
    parts: tuple[SuitePart, ...]
    reps: int = 20
    repeat: int = 1
    graph_below_us: float = 30.0


def load(path: str | Path, without: Sequence[str] = (), **overrides: Any) -> Suite:
    """The suite file, every part checked against its problem (subject, dtypes, shapes, baselines, and that each
    peer to time loads here) before any GPU work. Overrides (reps, repeat, graph_below_us from the command line;
    None: not given) replace the file's; `without` (--without) is added to every part's."""
    suite = config.build(Suite, config.load_mapping(path, "bench suite"))
    if not suite.parts:
        raise ConfigError("bench suite key 'parts' must list at least one part")
    parts = tuple(dataclasses.replace(p, without=tuple(dict.fromkeys([*p.without, *without]))) for p in suite.parts)
    suite = dataclasses.replace(suite, **{k: v for k, v in overrides.items() if v is not None}, parts=parts)
    if suite.reps < 1 or suite.repeat < 1 or any(p.reps is not None and p.reps < 1 for p in suite.parts):
        raise ConfigError("bench suite: reps and repeat must be >= 1")
    from ..evaluate.gpu import gpu_unavailable_reason
    on_gpu = gpu_unavailable_reason() is None   # peers are imported where they will be timed
    for i, part in enumerate(suite.parts):
        where = f"bench suite part {i} ({part.problem})"
        try:
            problem = registry.load("problem", part.problem)
            bench.make_subject(problem, part.subject())
            bench.parse_cases(problem, part.shapes, part.dtypes)
            peers.choose(problem, part.shapes, part.baselines, part.without, part.op, imports=on_gpu)
        except (ConfigError, registry.PluginError) as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return suite


def read(name: str | Path) -> dict[str, Any]:
    """A bench or suite result written by `kernel-factory bench --out`, or a one-line error. Parts recorded before
    results named their peers get the problem's published peers."""
    try:
        result = json.loads(Path(name).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{str(name)!r}: cannot read a bench result ({exc})") from None
    found = result.get("parts", [result]) if isinstance(result, dict) else []
    if not found or not all(isinstance(p, dict) and "fingerprint" in p and "rows" in p for p in found):
        raise ConfigError(f"{str(name)!r} is not a bench or suite result (kernel-factory bench --out writes one)")
    for part in found:
        if "peers" not in part:
            try:
                part["peers"] = peers.published(registry.load("problem", part["problem"]), part["baselines"])
            except (ConfigError, registry.PluginError):
                pass   # a problem not installed here: every baseline counts
    return result


def combined(parts: Sequence[Mapping[str, Any]], total: int, source: str) -> dict[str, Any]:
    out = {"format": FORMAT, "suite": source, "parts": list(parts)}
    if len(parts) < total or any(p.get("partial") for p in parts):
        out["partial"] = f"{sum(not p.get('partial') for p in parts)} of {total} parts in full"
    return out


def run(suite: Suite, source: str, on_update: Callable[[dict[str, Any]], None] | None = None,
        run_part: Callable[..., dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every part in order in this process; on_update gets the suite so far after every case."""
    run_part = run_part or bench.run
    done: list[dict[str, Any]] = []
    for part in suite.parts:
        def on_row(partial: dict[str, Any]) -> None:
            if on_update is not None:
                on_update(combined([*done, partial], len(suite.parts), source))
        done.append(run_part(part.problem, part.subject(), part.shapes, list(part.dtypes),
                             list(part.baselines) if part.baselines is not None else None, part.reps or suite.reps,
                             suite.repeat, suite.graph_below_us, on_row=on_row, without=part.without))
        if on_update is not None and len(done) < len(suite.parts):
            on_update(combined(done, len(suite.parts), source))
    return combined(done, len(suite.parts), source)


def join(results: Sequence[Mapping[str, Any]], sources: Sequence[str]) -> dict[str, Any]:
    """Recorded bench JSONs as one suite (for --from with several files)."""
    return combined(results, len(results), "joined from " + ", ".join(sources))


def summary_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per part and dtype: rows, geomean vs the best peer, the worst row, and the % of copy range."""
    out = []
    for i, part in enumerate(result["parts"]):
        best_of = bench_report.peer_set(part)
        for dtype in sorted({r["dtype"] for r in part["rows"]}, key=[r["dtype"] for r in part["rows"]].index):
            rows = [r for r in part["rows"] if r["dtype"] == dtype]
            timed = [r for r in rows
                     if "us" in r["providers"].get(bench.SUBJECT, {}) and bench_report.best_peer(r, best_of)]
            ratios = [(bench_report.best_peer(r, best_of)[1] / r["providers"][bench.SUBJECT]["us"], r["case"])
                      for r in timed]
            pct = [r["providers"][bench.SUBJECT]["pct_copy"] for r in rows
                   if "pct_copy" in r["providers"].get(bench.SUBJECT, {})]
            worst = min(ratios) if ratios else None
            out.append({"part": i, "problem": part["problem"], "dtype": dtype, "rows": len(rows),
                        "compared": len(ratios), "geomean": bench_report.geomean([r for r, _ in ratios]),
                        "worst": worst and worst[0], "worst_case": worst and worst[1],
                        "pct_copy": (min(pct), max(pct)) if pct else None,
                        "peers": peers.account(part, dtype).note()})
    return out


def markdown(result: Mapping[str, Any]) -> str:
    lines = [f"# Bench suite: {result['suite']}", ""]
    if result.get("partial"):
        lines += [f"**Partial**: {result['partial']}; only what was measured is here.", ""]
    lines += ["Each part was timed side by side in its own bench (one process per command; a suite runs its parts "
              "one after another in the same process). Ratio = best peer µs / ours (above 1: ours is faster).", "",
              "| part | problem | dtype | rows | geomean vs best peer | worst row | ours % copy | peers |",
              "|---|---|---|---|---|---|---|---|"]
    for s in summary_rows(result):
        pct = f"{s['pct_copy'][0]:.0f}–{s['pct_copy'][1]:.0f}%" if s["pct_copy"] else "-"
        worst = f"{s['worst']:.3f} ({s['worst_case']})" if s["worst"] is not None else "-"
        lines.append(f"| {s['part']} | {s['problem']} | {s['dtype']} | {s['compared']} of {s['rows']} | "
                     f"{bench_report.fmt(s['geomean'])} | {worst} | {pct} | {s['peers'] or 'all ran'} |")
    if result.get("compared"):
        lines += bench_compare.section(result["compared"])
    for i, part in enumerate(result["parts"]):
        text = bench_report.markdown(part).replace("# Bench:", f"## Part {i}:", 1)
        lines += ["", text.rstrip()]
    return "\n".join(lines) + "\n"


def to_csv(result: Mapping[str, Any]) -> str:
    """One CSV: each part's rows (bench_report.to_csv) with the part and problem in front."""
    buf = io.StringIO()
    for i, part in enumerate(result["parts"]):
        buf.write(f"# part {i} {part['problem']}: " + json.dumps(part["fingerprint"], sort_keys=True) + "\n")
    w = csv.writer(buf)
    w.writerow(["part", "problem", *bench_report.CSV_HEADER])
    for i, part in enumerate(result["parts"]):
        w.writerows([[i, part["problem"], *r] for r in bench_report.csv_rows(part)])
    return buf.getvalue()


def chart(result: Mapping[str, Any], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    parts = result["parts"]
    width = max(8, 0.9 * max(len(p["rows"]) for p in parts))
    fig, axes = plt.subplots(len(parts), 1, figsize=(width, 4.2 * len(parts)), squeeze=False)
    for ax, part in zip(axes[:, 0], parts):
        bench_report.draw(ax, part)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(result: Mapping[str, Any], out_dir: str | Path, stem: str = "bench") -> dict[str, Path]:
    out = Path(out_dir)
    paths = {"json": bench_report.write_json(result, out, stem), "csv": out / f"{stem}.csv",
             "md": out / f"{stem}.md", "png": out / f"{stem}.png"}
    paths["csv"].write_text(to_csv(result))
    paths["md"].write_text(markdown(result))
    chart(result, paths["png"])
    return paths
