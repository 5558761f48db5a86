"""Run-to-run spread of the op's time on small batches (issue 29: under 10% at M <= 1025), measured on a GPU host:
`python3 tests/gpu/jitter.py [--problem rmsnorm_bwd] [--rounds 5] [--per-dtype 6]`.

On seeded shapes of the problem's workload with M <= 1025 (none a campaign's training or held-out shape), the op as
users call it (tuned on its first call, before the rounds) and every declared peer that loads are timed in ROUNDS
rounds; each round is the benches' measurement (CUDA graph replays where a call is short, the L2 flushed before
each sample, REPS samples interleaved across providers, the median). The spread of a provider on a shape is
(largest round median - smallest) / the median of the round medians. Writes $OUT/jitter-<problem>.json (raw) and
.txt after every shape. No assertion on times: a benchmark, not a test."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import random
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from kernel_factory.evo.tools import bench, peers
from kernel_factory.evo.types import Case
from kernel_factory.evo.workload import draw, narrow

ROOT = Path(__file__).resolve().parents[2]
CAMPAIGNS = sorted((ROOT / "docs/results/workload").glob("h200-*/workload.json"))
SEED, REPS = 41, 20
LEFT_OUT = {"quack_tuned": "autotunes per shape (tens of seconds each)"}


def shapes(problem: Any, per_dtype: int) -> list[Case]:
    seen = {Case.parse(k) for path in CAMPAIGNS for part in ("train", "heldout")
            for k in json.loads(path.read_text()).get(part, [])}
    few = narrow(problem.workload, m=(1, 1025))
    rng = random.Random(SEED)
    return [c for d in problem.dtypes for c in draw(few, d, per_dtype, rng, exclude=seen)]


def spread(values: list[float]) -> float:
    return (max(values) - min(values)) / statistics.median(values)


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--problem", default="rmsnorm_bwd")
    args.add_argument("--rounds", type=int, default=5)
    args.add_argument("--per-dtype", type=int, default=6)
    opts = args.parse_args()
    problem = importlib.import_module(f"kernel_factory.problems.{opts.problem}").problem
    wanted = [p.baseline for p in problem.declared_peers if p.baseline not in LEFT_OUT]
    loaded = [p.baseline for p in problem.declared_peers if p.baseline in wanted and peers.load_error(p) is None]
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    timer, _, _, head = bench.session(250.0)
    head.update(device=torch.cuda.get_device_name(), problem=opts.problem, peers=loaded,
                missing=[p for p in wanted if p not in loaded], left_out=LEFT_OUT, rounds=opts.rounds, reps=REPS)
    rows, text = [], [f"{opts.problem} run-to-run spread, {head['device']}, {opts.rounds} rounds of {REPS} samples; "
                      f"peers {loaded}" + (f" (did not load: {head['missing']})" if head["missing"] else "")]
    for case in shapes(problem, opts.per_dtype):
        inputs = problem.make_inputs(case, seed=2026, device="cuda")
        fns, failed = {}, {}
        for name in ("factory_op", *loaded):
            try:
                fn = problem.baseline(name, case, inputs)
                why = bench.check(problem, case, inputs, fn)
            except Exception as exc:   # a peer that refuses this shape
                why = bench.failure(exc)
            if why:
                failed[name] = why
            else:
                fns[name] = fn
        timed, _ = bench.graph_where_short(timer, fns)
        rounds: dict[str, list[float]] = {n: [] for n in timed}
        for _ in range(opts.rounds):
            for name, t in zip(timed, timer.time_interleaved(list(timed.values()), REPS)):
                rounds[name].append(t.median_us)
        rows.append({"case": case.key, "us": rounds, "failed": failed})
        text.append(f"{case.key:>22}: " + ", ".join(f"{n} {statistics.median(v):.2f} us spread {spread(v):.1%}"
                                                      for n, v in rounds.items())
                    + "".join(f"; {n}: {w[:60]}" for n, w in failed.items()))
        print(text[-1], flush=True)
        if out:
            (out / f"jitter-{opts.problem}.json").write_text(json.dumps({"head": head, "rows": rows}, indent=1))
    spreads = []
    for dtype in problem.dtypes:
        mine = [r for r in rows if r["case"].startswith(dtype + ":")]
        for name in ("factory_op", *loaded):
            got = [spread(r["us"][name]) for r in mine if name in r["us"]]
            if got:
                spreads.append(f"spread {opts.problem} {dtype} {name}: median {statistics.median(got):.1%}, largest "
                            f"{max(got):.1%} over {len(got)} shapes with M <= 1025")
    print("\n".join(spreads))
    if out:
        (out / f"jitter-{opts.problem}.txt").write_text("\n".join(text + spreads) + "\n")


if __name__ == "__main__":
    sys.exit(main())
