"""Does a run's fitness agree with its own A/B re-time? The check behind every campaign's numbers: per run, the
best candidate's fitness as the search measured it, beside the same candidate re-timed interleaved with the
baseline (the run's finalists), the noise band, and how far the baseline moved while the run went.

  live (a GPU host): one run of CONFIG per baseline, then the table
      python -m kernel_factory.evo.tools.agreement --config configs/quickstart.yaml \\
          --baselines torch_eager,torch_compile,liger --out DIR [-o KEY=VALUE ...]
  from journals (no GPU): the same table from runs already made
      python -m kernel_factory.evo.tools.agreement --journals runs/A/journal.jsonl runs/B/journal.jsonl --out DIR
  re-render (no GPU): python -m kernel_factory.evo.tools.agreement --from DIR/agreement.json

Writes agreement.json (the raw rows) and agreement.md. Exit status 1 when a run's figures differ by more than
--tolerance (default 3%) or than the run's noise band, whichever is larger; 2 on bad input.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import config as config_mod
from .. import journal
from ..config import ConfigError

TOLERANCE = 0.03


def row_of(path: Path) -> dict[str, Any]:
    """One run's row from its journal: problem, baseline, the best candidate's search fitness and A/B re-time."""
    run = journal.read(path)
    if run.end is None:
        raise ValueError(f"{path}: the journal has no end record (a run that did not finish)")
    best = run.end.best
    fin = next((f.data for f in run.end.finalists if f.candidate_id == best), None)
    searched = next((r.result for r in run.results if r.candidate.id == best), None)
    base = (run.end.accounting.get("baseline") or {}).get("relative_to_first") or []
    row = {"journal": str(path), "run_id": run.start.run_id, "problem": run.start.problem,
           "baseline": run.start.config["evaluator"]["baseline"], "evaluator": run.start.evaluator.kind,
           "evaluations": run.end.evaluations, "best": best,
           "search_fitness": searched.fitness if searched else None,
           "ab_speedup": fin.get("speedup") if fin else None, "ab_reps": fin.get("reps") if fin else None,
           "noise": fin.get("noise") if fin else None,
           "baseline_measurements": len(base), "baseline_range": [min(base), max(base)] if base else None,
           "gpu_options": dict(run.start.config["evaluator"].get("gpu") or {}), "gpu_s": run.end.gpu_s,
           "timed_per_gpu_minute": run.end.timed_per_gpu_minute}
    if row["search_fitness"] and row["ab_speedup"]:
        row["ab_over_search"] = row["ab_speedup"] / row["search_fitness"]
    if searched and fin:
        row["parts"] = parts(searched, fin)
    return row


def parts(searched: Any, fin: Mapping[str, Any]) -> dict[str, Any] | None:
    """Where the search and the A/B part: per side (candidate, baseline), the geomean over cases of the search's
    time over the A/B's, and the case whose baseline moved most. Fitness is baseline over candidate, so the search
    flatters when its baseline time is above the A/B's or its candidate time below."""
    keys = [k for k in fin.get("times_us", {}) if k in searched.times_us and k in (searched.baseline_us or {})
            and k in fin.get("baseline_us", {})]
    if not keys:
        return None
    cand = {k: searched.times_us[k] / fin["times_us"][k] for k in keys}
    base = {k: searched.baseline_us[k] / fin["baseline_us"][k] for k in keys}
    worst = max(keys, key=lambda k: abs(math.log(base[k])))
    geo = lambda d: math.exp(sum(math.log(v) for v in d.values()) / len(d))   # noqa: E731
    return {"candidate": geo(cand), "baseline": geo(base), "baseline_worst_case": worst,
            "baseline_worst": base[worst], "cases": {k: {"candidate": cand[k], "baseline": base[k]} for k in keys}}


def verdict(row: Mapping[str, Any], tolerance: float) -> str:
    if row.get("error"):
        return f"did not run: {row['error'].splitlines()[-1][:200]}"
    if row.get("ab_over_search") is None:
        return "no A/B re-time"
    band = max(tolerance, row.get("noise") or 0.0)
    off = abs(row["ab_over_search"] - 1)
    return "agree" if off <= band else f"DISAGREE (off {off:.1%}, band {band:.1%})"


def table(rows: Sequence[Mapping[str, Any]], tolerance: float) -> str:
    lines = ["# Search fitness against its A/B re-time", "",
             f"Per run: the best candidate's fitness as the search timed it, and the same candidate re-timed "
             f"interleaved with the baseline at the run's end. They agree when they differ by at most "
             f"{tolerance:.0%} or the run's noise band, whichever is larger. The baseline column is how far the "
             f"baseline's geomean moved over its measurements during the run (relative to its first). Search over "
             f"A/B times: per side, the geomean over cases of the time the search measured over the A/B's (the "
             f"search flatters when its baseline is above 1 or its candidate below), and the case whose baseline "
             f"differs most.", "",
             "| run | problem | baseline | evaluations | best | search | A/B | A/B / search | noise | baseline moved | "
             "search / A/B times | verdict |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        moved = (f"{r['baseline_range'][0]:.3f} to {r['baseline_range'][1]:.3f} over {r['baseline_measurements']}"
                 if r.get("baseline_range") else "-")
        fmt = lambda v, f: "-" if v is None else format(v, f)   # noqa: E731
        lines.append(f"| {r['run_id']} | {r.get('problem', '-')} | {r['baseline']} | {r.get('evaluations', '-')} | "
                     f"{r.get('best', '-')} | "
                     f"{fmt(r.get('search_fitness'), '.4f')} | {fmt(r.get('ab_speedup'), '.4f')} | "
                     f"{fmt(r.get('ab_over_search'), '.4f')} | {fmt(r.get('noise'), '.1%')} | {moved} | "
                     f"{split(r.get('parts'))} | {verdict(r, tolerance)} |")
    return "\n".join(lines + cost(rows)) + "\n"


def cost(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """What each run's timing cost: its evaluator.gpu options as the run's config set them (the others at their
    defaults of the commit that ran it) and its timed candidates per GPU-minute. Rows recorded before these were
    kept have none, and then the section is left out."""
    timed = [r for r in rows if r.get("timed_per_gpu_minute")]
    if not timed:
        return []
    lines = ["", "| run | evaluator.gpu as set | GPU s | timed candidates per GPU-minute |", "|---|---|---|---|"]
    for r in timed:
        opts = ", ".join(f"{k}: {v}" for k, v in sorted(r.get("gpu_options", {}).items())) or "defaults"
        lines.append(f"| {r['run_id']} | {opts} | {r['gpu_s']:.1f} | {r['timed_per_gpu_minute']:.1f} |")
    return lines


def split(p: Mapping[str, Any] | None) -> str:
    if not p:
        return "-"
    return (f"candidate {p['candidate']:.3f}, baseline {p['baseline']:.3f} (most: {p['baseline_worst_case']} "
            f"{p['baseline_worst']:.3f})")


def live(cfg_path: str, baselines: Sequence[str], overrides: Sequence[str], out: Path) -> list[Path]:
    """One run per baseline, into one out_dir (one compile cache): the journals made."""
    from ..run import execute
    made: list[Path | dict[str, Any]] = []
    for name in baselines:
        run_id = f"agreement-{Path(cfg_path).stem}-{name}"
        cfg = config_mod.load(cfg_path, (*overrides, f"evaluator.baseline={name}", f"out_dir={out}/runs",
                                         f"tracking.store={out}/runs/mlflow.db",
                                         f"tracking.artifacts={out}/runs/artifacts", "search.warm_start.enabled=false"))
        try:
            execute(cfg, run_id)
        except ConfigError:
            raise
        except Exception as exc:   # the baseline cannot run here (a peer refusing a row, a worker that failed)
            made.append({"run_id": run_id, "baseline": name, "error": f"{type(exc).__name__}: {exc}"[:600]})
            continue
        made.append(out / "runs" / run_id / "journal.jsonl")
    return made


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernel_factory.evo.tools.agreement", description=__doc__.splitlines()[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="live: run this config once per --baselines on this GPU")
    src.add_argument("--journals", nargs="+", metavar="JOURNAL", help="the table from these run journals")
    src.add_argument("--from", dest="from_json", metavar="JSON", help="re-render a recorded agreement.json")
    p.add_argument("--baselines", help="with --config: comma list of the problem's baselines")
    p.add_argument("-o", "--override", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--out", help="folder for agreement.json and agreement.md")
    p.add_argument("--tolerance", type=float, default=TOLERANCE)
    args = p.parse_args(argv)
    try:
        if args.from_json:
            recorded = json.loads(Path(args.from_json).read_text())
            rows, args.tolerance = recorded["rows"], float(recorded.get("tolerance", args.tolerance))
        else:
            if args.config:
                if not args.baselines or not args.out:
                    raise ConfigError("--config needs --baselines (e.g. torch_eager,torch_compile) and --out")
                paths = live(args.config, [b for b in args.baselines.split(",") if b], args.override, Path(args.out))
            else:
                paths = [Path(j) for j in args.journals]
            missing = [str(j) for j in paths if isinstance(j, Path) and not j.is_file()]
            if missing:
                raise ConfigError(f"no journal at {', '.join(missing)}")
            rows = [row_of(j) if isinstance(j, Path) else j for j in paths]
    except (ConfigError, ValueError, KeyError, OSError) as exc:
        print(f"agreement: {exc}", file=sys.stderr)
        return 2
    text = table(rows, args.tolerance)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "agreement.json").write_text(json.dumps({"tolerance": args.tolerance, "rows": rows}, indent=1) + "\n")
        (out / "agreement.md").write_text(text)
    print(text)
    return 0 if all(verdict(r, args.tolerance) in ("agree",) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
