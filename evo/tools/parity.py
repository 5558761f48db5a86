"""Time to parity: how many GPU-minutes a search needs before its best fitness, confirmed by the A/B re-time,
reaches the best peer (fitness 1.0 against the run's baseline; --peer NAME makes that peer the baseline).

    python -m kernel_factory.evo.tools.parity --config configs/quickstart.yaml --budget-gpu-min 5 [--peer liger]
        [--target 1.0] [-o KEY=VALUE ...]

The run stops at the target or when the budget is spent (stop.target_fitness, stop.gpu_s). The GPU-minutes to
parity are the GPU time of every evaluation up to and including the first candidate that reached the target. A live
run confirms it with the finalists' A/B re-time; a replay has no A/B re-time, so the recording's times stand in for
it, and the output says so. Exit status 0 when reached, 1 when not, 2 on bad input.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from .. import config as config_mod
from .. import journal
from ..config import ConfigError
from ..run import execute


def to_parity(results: Sequence[Any], target: float) -> tuple[str, float] | None:
    """(candidate id, GPU seconds spent up to and including it) of the first result at or above target."""
    spent = 0.0
    for entry in results:
        spent += entry.result.gpu_s
        if entry.result.fitness >= target:
            return entry.candidate.id, spent
    return None


def confirmed(summary: Any, target: float, replay: bool) -> tuple[bool, str]:
    """Whether the best reaches the target by the A/B re-time (live), or by the recording's times (replay)."""
    if replay:
        return True, "replay: the recording's times stand in for the A/B re-time (no kernel ran)"
    ab = [f for f in summary.finalists if "speedup" in f]
    best = max((f["speedup"] for f in ab), default=None)
    if best is None:
        return False, "no finalist was A/B re-timed"
    return best >= target, f"A/B re-time {best:.4f}x"


def parity(cfg: config_mod.RunConfig, budget_min: float, target: float) -> tuple[bool, str]:
    """Run cfg until target or budget; (reached, the report line)."""
    from dataclasses import replace
    cfg = replace(cfg, stop=replace(cfg.stop, target_fitness=target, gpu_s=budget_min * 60),
                  search=replace(cfg.search, generations=10**6))
    summary = execute(cfg)
    run = journal.read(Path(cfg.out_dir) / summary.run_id / journal.NAME)
    replay = run.start.evaluator.kind == "replay"
    hit = to_parity(run.results, target)
    ok, how = confirmed(summary, target, replay) if hit else (False, "")
    what = "simulated GPU-minutes (recorded GPU time)" if replay else "GPU-minutes"
    if hit and ok:
        return True, (f"parity: {target:.3f}x reached after {hit[1] / 60:.3f} {what} by candidate {hit[0]} "
                      f"({how}; run {summary.run_id})")
    best = summary.best[1].fitness if summary.best else 0.0
    why = f"; the search reached it but {how}" if hit else ""
    return False, (f"parity: not reached in {budget_min:g} {what} (best {best:.4f}x of target {target:.3f}x{why}; "
                   f"run {summary.run_id})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kernel_factory.evo.tools.parity", description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True)
    p.add_argument("--budget-gpu-min", type=float, required=True)
    p.add_argument("--target", type=float, default=1.0, help="fitness to reach (default 1.0: as fast as the peer)")
    p.add_argument("--peer", help="the peer to reach (becomes evaluator.baseline); default: the config's baseline")
    p.add_argument("-o", dest="overrides", action="append", default=[])
    args = p.parse_args(argv)
    try:
        if not args.budget_gpu_min > 0 or not args.target > 0:
            raise ConfigError(f"--budget-gpu-min and --target must be > 0, got {args.budget_gpu_min}, {args.target}")
        extra = [f"evaluator.baseline={args.peer}"] if args.peer else []
        cfg = config_mod.load(args.config, tuple(args.overrides + extra))
        reached, line = parity(cfg, args.budget_gpu_min, args.target)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(line)
    return 0 if reached else 1


if __name__ == "__main__":
    sys.exit(main())
