"""Compare a live GPU run's journal with the bundled recording: per-case time ratios for genomes in both, the
baselines of both sessions, and where the live run's best genome ranks in the recorded space.

    python runs/evidence/h200-2026-11-30/compare.py runs/evidence/h200-2026-11-30/live_journal.jsonl
"""
import json
import math
import statistics
import sys

from kernel_factory.evo.evaluate import recording
from kernel_factory.evo.observers import journal

REC = "problems/recorded/rmsnorm_fwd-bfloat16-h200.jsonl.gz"


def fitness(times, base):
    return math.exp(statistics.mean(math.log(base[k] / t) for k, t in times.items()))


def main(path: str) -> None:
    rec = recording.read(REC)
    base = rec.header["baseline_us"]
    records = journal.read(path)
    results = [r for r in records if r["event"] == "result" and r["result"]["status"] == "ok"]
    live_base = results[0]["result"]["baseline_us"]
    print("torch eager, live / recorded:", {k.split(":")[1]: f"{live_base[k] / base[k] - 1:+.2%}" for k in base})
    ratios = sorted(t / rec.entries[r["candidate"]["id"]][1].times_us[k] - 1
                    for r in results if r["candidate"]["id"] in rec.entries
                    for k, t in r["result"]["times_us"].items())
    q = lambda p: ratios[round(p * (len(ratios) - 1))]
    print(f"{len(ratios) // len(base)} genomes in both, {len(ratios)} case times, live/recorded - 1: median "
          f"{q(.5):+.2%}, p5 {q(.05):+.2%}, p95 {q(.95):+.2%}, min {ratios[0]:+.2%}, max {ratios[-1]:+.2%}")
    space = sorted((fitness(res.times_us, base) for _, res in rec.entries.values()), reverse=True)
    best = max(results, key=lambda r: r["result"]["fitness"])
    recorded = fitness(rec.entries[best["candidate"]["id"]][1].times_us, base)
    rank = 1 + sum(f > recorded for f in space)
    end = next(r for r in records if r["event"] == "end")
    print(f"live best {best['candidate']['id']}: {best['result']['fitness']:.4f}x live, {recorded:.4f}x recorded, rank "
          f"{rank} of {len(space)} recorded genomes (space optimum {space[0]:.4f}x); {end['evaluations']} "
          f"evaluations, {end['wall_s']:.1f} s wall, {end['gpu_s']:.1f} GPU-s "
          f"({60 * end['evaluations'] / end['gpu_s']:.0f} candidates per GPU-minute)")


if __name__ == "__main__":
    main(sys.argv[1])
