"""`kernel-factory record CONFIG --outside-rule RECORDING`: measure on this GPU the genomes of a recording's space
that the problem's rule rejects, and add those that fail, with the gate's status and log. The rule's resource
limits are estimates: NVRTC compiles every one of them for the bundled rmsnorm_fwd recording (record_cpu.py found
no compile failure), so only a launch can say whether 50 KiB of static shared memory or a spilling kernel fails.
Genomes that pass are left out (a live run's rule never proposes them) and listed in the header's note."""
from __future__ import annotations

import sys
from datetime import datetime, timezone
from pathlib import Path

from .. import build
from ..config import ConfigError, RunConfig
from ..evaluate import recording
from ..types import Candidate
from .record import CHUNK
from .record_cpu import rejected

HOW = ("every genome of the recorded space that the problem's rule rejects was evaluated on the GPU by the same "
       "gate as the recording (compile, correctness, timing); those that failed are kept with the gate's status and "
       "log, those that passed are listed under 'passed' and left out")


def add_gpu_failures(cfg: RunConfig, path: str | Path, out: str | Path) -> tuple[Path, int, int]:
    """Returns (the recording written, genomes measured, failures added)."""
    run = build.prepare(cfg)
    kind, reason = build.evaluator_kind(cfg)
    if kind != "gpu":
        raise ConfigError(f"--outside-rule measures on a GPU, and this machine has none: {reason}")
    rec = recording.read(path)
    if rec.header.get("problem") != run.problem.name or rec.header.get("cases") != [c.key for c in run.cases]:
        raise ConfigError(f"--outside-rule: {path} records {rec.header.get('problem')!r} on other cases than "
                          f"{cfg.problem!r} with this config; use the config that made it")
    space = run.problem.space.restricted(recording.covered_choices(rec.header, run.problem.space))
    todo = [(g, why) for g, why in rejected(space) if g.id not in rec.entries]
    evaluator = build.make_evaluator(run, "gpu")
    entries, outside, passed = dict(rec.entries), dict(rec.outside_rule), []
    try:
        for i in range(0, len(todo), CHUNK):
            part = todo[i:i + CHUNK]
            for (genome, why), res in zip(part, evaluator.evaluate([Candidate(g, operator="record")
                                                                     for g, _ in part])):
                if res.status.failed:
                    entries[genome.id], outside[genome.id] = (genome, res), why
                else:
                    passed.append(genome.id)
            print(f"record --outside-rule: {min(i + CHUNK, len(todo))}/{len(todo)}", file=sys.stderr, flush=True)
        fingerprint = dict(evaluator.info.fingerprint)
    finally:
        evaluator.close()
    added = len(outside) - len(rec.outside_rule)
    note = {"how": HOW, "measured": len(todo), "failures": added, "passed": passed, "fingerprint": fingerprint,
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    written = recording.write(recording.Recording(rec.header, entries, rec.path, outside), out,
                              {"gpu_outside_rule": note})
    print(f"record --outside-rule: measured {len(todo)} rule-rejected genomes; {added} failed and were added, "
          f"{len(passed)} passed -> {written}", file=sys.stderr)
    return written, len(todo), added
