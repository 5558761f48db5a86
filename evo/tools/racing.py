"""Racing against full timing on the same config and seeds: candidates gated per GPU-minute and the final best, with
search.racing off and on. On a replay the GPU time is the recording's, charged per leg (docs/racing.md).

    python -m kernel_factory.evo.tools.racing --config configs/quickstart.yaml --seeds 0-4 [-o KEY=VALUE ...]

Prints a markdown table, one row per seed and mode, and a last line with the medians. Exit status 0, or 1 when
racing ended below full timing's final best on some seed (its cuts cost the search), 2 on bad input.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from .. import build, journal
from .. import config as config_mod
from ..config import ConfigError
from ..run import execute
from ..types import Status


def seeds_of(text: str) -> list[int]:
    """"0-4" or "0,3,7"."""
    try:
        if "-" in text:
            low, high = (int(v) for v in text.split("-", 1))
            return list(range(low, high + 1))
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise ConfigError(f"--seeds {text!r} must be a range like 0-4 or a list like 0,3,7") from None


def row(cfg: config_mod.RunConfig, seed: int, raced: bool) -> dict[str, Any]:
    search = replace(cfg.search, racing=replace(cfg.search.racing, enabled=raced))
    summary = execute(replace(cfg, seed=seed, search=search, observers=("journal",)))
    minutes = summary.gpu_s / 60
    run = journal.read(Path(cfg.out_dir) / summary.run_id / journal.NAME)
    cut = sum(1 for e in run.results if e.result.status is Status.CUT)
    return {"seed": seed, "racing": raced, "evaluations": summary.evaluations, "gpu_min": minutes,
            "per_gpu_min": summary.evaluations / minutes if minutes > 0 else 0.0, "cut": cut,
            "best": summary.best[1].fitness if summary.best else 0.0,
            "best_id": summary.best[0].id if summary.best else ""}


def table(rows: list[dict[str, Any]], replay: bool) -> str:
    unit = "simulated GPU-min (recorded)" if replay else "GPU-min"
    out = [f"| seed | racing | candidates | cut | {unit} | candidates per {unit} | best |",
           "|---|---|---|---|---|---|---|"]
    out += [f"| {r['seed']} | {'on' if r['racing'] else 'off'} | {r['evaluations']} | {r['cut']} | "
            f"{r['gpu_min']:.3f} | {r['per_gpu_min']:.0f} | {r['best']:.4f}x `{r['best_id']}` |" for r in rows]
    off = [r for r in rows if not r["racing"]]
    on = [r for r in rows if r["racing"]]
    same = sum(a["best"] == b["best"] for a, b in zip(off, on))
    better = sum(b["best"] > a["best"] for a, b in zip(off, on))
    out.append(f"\nmedian candidates per {unit}: {statistics.median(r['per_gpu_min'] for r in off):.0f} full timing, "
               f"{statistics.median(r['per_gpu_min'] for r in on):.0f} racing; racing's final best: the same on "
               f"{same}, better on {better}, worse on {len(off) - same - better} of {len(off)} seeds")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernel_factory.evo.tools.racing", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--seeds", default="0-2")
    p.add_argument("-o", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)
    try:
        cfg = config_mod.load(args.config, tuple(args.overrides))
        replay = build.evaluator_kind(cfg)[0] == "replay"
        rows = [row(cfg, seed, raced) for seed in seeds_of(args.seeds) for raced in (False, True)]
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(table(rows, replay))
    worse = [b for a, b in zip(rows[::2], rows[1::2]) if b["best"] < a["best"]]
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
