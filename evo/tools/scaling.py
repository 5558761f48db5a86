"""Throughput of the scale-out machinery, measured. Two uses, each writing raw JSON that docs quote:

  simulated (no GPU): the quickstart replayed with 1..8 simulated workers that hold each candidate for the time
  the recording measured on the GPU; the curve is throughput(N) / throughput(1) against the ideal N.
      python -m kernel_factory.evo.tools.scaling --out docs/results/scaling

  live (a GPU host): the quickstart measured on the GPU(s), first with today's inline worker, then with the
  worker pool (one worker per GPU, compiles ahead, steady-state search); the figure is timed candidates per
  GPU-minute, both per busy and per held GPU-minute.
      python -m kernel_factory.evo.tools.scaling --live --out docs/results/scaling
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from .. import config
from ..run import execute

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"


def one_run(cfg_path: str, overrides: Sequence[str], out_dir: str) -> dict[str, Any]:
    """One run with the overrides, into its own folder (so that no compile cache is shared); its books."""
    cfg = config.load(cfg_path, (*overrides, f"out_dir={out_dir}", f"tracking.store={out_dir}/mlflow.db",
                                 f"tracking.artifacts={out_dir}/artifacts", "observers=[journal]",
                                 "search.warm_start.enabled=false"))
    summary = execute(cfg)
    books = dict(summary.accounting)
    books.pop("queue_depth", None)
    return {"overrides": list(overrides), "evaluations": summary.evaluations, "stop": summary.stop_reason,
            "wall_s": round(summary.wall_s, 3), "best_fitness": summary.best[1].fitness if summary.best else 0.0,
            "throughput_per_min": books["timed"] / (summary.wall_s / 60) if summary.wall_s else 0.0,
            "queue_depth_mean": summary.accounting["queue_depth"]["mean"], **books}


def simulated(cfg_path: str, counts: Sequence[int], modes: Sequence[str], evaluations: int,
              time_scale: float) -> list[dict[str, Any]]:
    rows = []
    for mode in modes:
        base = None
        for n in counts:
            with tempfile.TemporaryDirectory(prefix="kf-scaling-") as tmp:
                row = one_run(cfg_path, ("evaluator.kind=replay", f"search.mode={mode}", f"workers.count={n}",
                                         f"workers.time_scale={time_scale}", f"search.max_evaluations={evaluations}",
                                         "search.generations=1000"), tmp)
            base = base or row["throughput_per_min"]
            row.update(mode=mode, n=n, speedup=row["throughput_per_min"] / base,
                       efficiency=row["throughput_per_min"] / base / n)
            print(f"{mode:12s} N={n}: {row['timed']} timed in {row['wall_s']:.1f} s, speedup "
                  f"{row['speedup']:.2f} (efficiency {row['efficiency']:.2f})", file=sys.stderr)
            rows.append(row)
    return rows


def live(cfg_path: str) -> list[dict[str, Any]]:
    variants = {"today (inline worker, generational)": ("evaluator.kind=gpu", "workers.backend=inline"),
                "pool (a worker per GPU, steady)": ("evaluator.kind=gpu", "workers.backend=local",
                                                    "search.mode=steady")}
    rows = []
    for name, overrides in variants.items():
        with tempfile.TemporaryDirectory(prefix="kf-live-") as tmp:
            row = {"variant": name, **one_run(cfg_path, overrides, tmp)}
        print(f"{name}: {row['timed_per_gpu_minute']:.0f} per busy GPU-minute, "
              f"{row['timed_per_held_gpu_minute']:.0f} per held GPU-minute", file=sys.stderr)
        rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = ["# Simulated scaling: the quickstart replayed with N simulated workers", "",
             "Each worker holds a candidate for the GPU time the recording measured on an H200 (recorded data, "
             "not a live measurement). Throughput = candidates timed per wall-clock minute.", "",
             f"Command: `{command}`", "",
             "| mode | N | timed | wall s | per minute | speedup | efficiency (speedup / N) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['n']} | {r['timed']} | {r['wall_s']:.1f} | {r['throughput_per_min']:.0f} | "
              f"{r['speedup']:.2f} | {r['efficiency']:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernel_factory.evo.tools.scaling", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(QUICKSTART))
    ap.add_argument("--out", required=True, help="folder for scaling.json / scaling.md (or live.json)")
    ap.add_argument("--live", action="store_true", help="measure on this host's GPU(s) instead of simulating")
    ap.add_argument("--workers", default="1,2,3,4,5,6,7,8", help="simulated worker counts, e.g. 1,2,4,8")
    ap.add_argument("--modes", default="steady,generational")
    ap.add_argument("--evaluations", type=int, default=240, help="candidates per simulated run")
    ap.add_argument("--time-scale", type=float, default=1.0, help="x the recorded latencies (1: as recorded)")
    args = ap.parse_args(argv)
    try:
        counts = [int(v) for v in args.workers.split(",")]
    except ValueError:
        print(f"--workers {args.workers!r}: expected a comma list of positive integers, e.g. 1,2,4,8", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m kernel_factory.evo.tools.scaling " + " ".join(argv if argv is not None else sys.argv[1:])
    meta = {"command": command, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(), "python": platform.python_version()}
    try:
        if args.live:
            (out / "live.json").write_text(json.dumps({**meta, "runs": live(args.config)}, indent=2) + "\n")
            return 0
        rows = simulated(args.config, counts, args.modes.split(","), args.evaluations, args.time_scale)
    except config.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    (out / "scaling.json").write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    (out / "scaling.md").write_text(markdown(rows, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
