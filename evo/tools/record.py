"""`kernel-factory record`: measure every feasible genome of a problem's structured space on the GPU (or a
stated random sample of it), appending each result as it arrives, so that a killed recording resumes."""
from __future__ import annotations

import random
import sys
import time
from pathlib import Path

from .. import build
from ..config import ConfigError, RunConfig
from ..evaluate import recording
from ..evaluate.gpu import GpuEvaluator
from ..types import Candidate, GeneSpace, Genome

CHUNK = 48       # candidates per evaluate() call: big enough to keep the compile pool ahead of the GPU
REMEASURE = 12   # genomes re-timed when a recording resumes


def sampled_space(space: GeneSpace, sample: int | None, sample_seed: int) -> tuple[list[Genome], str]:
    every = [Genome.of(g) for g in space.enumerate()]
    if sample is None or sample >= len(every):
        return every, f"exhaustive: all {len(every)} feasible genomes of {space.size()} in the space"
    picked = random.Random(sample_seed).sample(every, sample)
    default = Genome.of(space.defaults())
    if default not in picked and default in every:
        picked[0] = default
    return picked, (f"uniform random sample of {sample} of {len(every)} feasible genomes "
                    f"(random.Random({sample_seed}).sample, template defaults always included)")


def resumed_space(space: GeneSpace, out: Path) -> GeneSpace:
    """The space a recording samples: for a resumed one, the space it began in (its partial file's header), so that
    the same sample comes out when a gene has gained choices since. Genes added or removed since are an error: the
    genomes recorded before would no longer be the same genomes."""
    partial = recording.partial_path(out)
    if not partial.exists():
        return space
    began = recording.read(partial).header.get("space", {})
    if set(began) != set(space.names):
        changed = sorted(set(began) ^ set(space.names))
        raise ConfigError(f"{partial}: began with another set of genes (now differing in {', '.join(changed)}); "
                          f"finish it with the code that began it, or move it away to record afresh")
    try:
        return space.restricted({name: tuple(choices) for name, choices in began.items()})
    except ValueError as exc:
        raise ConfigError(f"{partial}: its space no longer fits the problem's ({exc}); move it away to record "
                          f"afresh") from None


def remeasure(writer: recording.Writer, evaluator: GpuEvaluator, header: dict) -> dict:
    """This machine's fingerprint and baseline, and fresh times for a few genomes recorded before (drift check)."""
    before = recording.read(writer.partial)
    ok = [(g, r) for g, r in before.entries.values() if not r.status.failed][:REMEASURE]
    again = evaluator.evaluate([Candidate(g, operator="remeasure") for g, _ in ok])
    return {"fingerprint": header["fingerprint"], "baseline_us": header["baseline_us"],
            "copy_gbps": header["copy_gbps"], "recorded_before": len(writer.done),
            "remeasured": {g.id: {"before_us": dict(r.times_us), "now_us": dict(n.times_us), "status": n.status.value}
                           for (g, r), n in zip(ok, again)}}


def record(cfg: RunConfig, out: Path, sample: int | None = None, sample_seed: int = 0) -> Path:
    run = build.prepare(cfg)
    build.need_gpu(cfg, "record")
    # The config's search.space makes a sub-space recorded exhaustively: a landscape the efficiency benchmark and a
    # replay can search whole (a uniform sample of the full space cannot be searched: few neighbours are in it).
    space = build.restrict_space(resumed_space(run.problem.space, out), cfg.search.space)
    genomes, rule = sampled_space(space, sample, sample_seed)
    if cfg.search.space:
        rule += f", within the config's search.space {dict(cfg.search.space)}"
    evaluator = build.make_evaluator(run, "gpu", race=False)
    assert isinstance(evaluator, GpuEvaluator)
    header = {"problem": run.problem.name, "problem_version": run.problem.version,
              "space": {g.name: list(g.choices) for g in space.genes},
              "cases": [c.key for c in run.cases], "baseline": run.baseline,
              "baseline_us": evaluator.baseline_us, "copy_gbps": evaluator.copy_gbps,
              "fingerprint": dict(evaluator.info.fingerprint), "sampling": rule,
              "evaluator_options": dict(cfg.evaluator.gpu)}
    writer = recording.Writer(out, header)
    if writer.done:
        writer.add_resume(remeasure(writer, evaluator, header))
    todo = [g for g in genomes if g.id not in writer.done]
    print(f"record: {rule}; {len(writer.done)} already recorded, {len(todo)} to go -> {out}", file=sys.stderr)
    start = time.monotonic()
    try:
        for i in range(0, len(todo), CHUNK):
            batch = [Candidate(g, operator="record") for g in todo[i:i + CHUNK]]
            for cand, res in zip(batch, evaluator.evaluate(batch)):
                writer.add(cand.genome, res)
            done = min(i + CHUNK, len(todo))
            rate = done / (time.monotonic() - start)
            print(f"record: {done}/{len(todo)} ({rate:.1f}/s, worker restarts {evaluator.restarts})",
                  file=sys.stderr, flush=True)
    finally:
        evaluator.close()
    return writer.finish({"restarts": evaluator.restarts, "wall_s": round(time.monotonic() - start, 1)})
