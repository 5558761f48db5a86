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
    """Returns (the recording written, genomes measured, failures added). Each result is appended as it arrives to
    out's `.partial.jsonl` (recording.Writer), so that the same command, run again after a kill or a time limit,
    measures only what is left."""
    run = build.prepare(cfg)
    build.need_gpu(cfg, "record --outside-rule")
    rec = recording.read(path)
    if rec.header.get("problem") != run.problem.name or rec.header.get("cases") != [c.key for c in run.cases]:
        raise ConfigError(f"--outside-rule: {path} records {rec.header.get('problem')!r} on other cases than "
                          f"{cfg.problem!r} with this config; use the config that made it")
    space = run.problem.space.restricted(recording.covered_choices(rec.header, run.problem.space))
    rejected_here = [(g, why) for g, why in rejected(space) if g.id not in rec.entries]
    try:
        progress = recording.Writer(out, {"problem": rec.header["problem"], "cases": rec.header["cases"],
                                          "outside_rule_of": str(path)})
    except ValueError as exc:
        raise ConfigError(f"--outside-rule: {exc}") from None
    todo = [(g, why) for g, why in rejected_here if g.id not in progress.done]
    if progress.done:
        print(f"record --outside-rule: {len(progress.done)} measured before ({progress.partial}), "
              f"{len(todo)} to go", file=sys.stderr)
    evaluator = build.make_evaluator(run, "gpu", race=False)
    if progress.done:   # this session's machine, beside the earlier one's (the note's fingerprint)
        progress.add_resume({"fingerprint": dict(evaluator.info.fingerprint), "recorded_before": len(progress.done)})
    try:
        for i in range(0, len(todo), CHUNK):
            part = todo[i:i + CHUNK]
            for (genome, why), res in zip(part, evaluator.evaluate([Candidate(g, operator="record")
                                                                     for g, _ in part])):
                progress.add(genome, res, why)
            print(f"record --outside-rule: {min(i + CHUNK, len(todo))}/{len(todo)}", file=sys.stderr, flush=True)
        fingerprint = dict(evaluator.info.fingerprint)
    finally:
        evaluator.close()
    measured = recording.read(progress.partial)
    entries, outside, passed = dict(rec.entries), dict(rec.outside_rule), []
    for gid, (genome, res) in measured.entries.items():
        if res.status.failed:
            entries[gid], outside[gid] = (genome, res), measured.outside_rule[gid]
        else:
            passed.append(gid)
    added = len(outside) - len(rec.outside_rule)
    note = {"how": HOW, "measured": len(measured.entries), "failures": added, "passed": passed,
            "fingerprint": fingerprint, "resumes": measured.header.get("resumes", []),
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    written = recording.write(recording.Recording(rec.header, entries, rec.path, outside), out,
                              {"gpu_outside_rule": note})
    progress.partial.unlink()
    print(f"record --outside-rule: measured {len(measured.entries)} rule-rejected genomes; {added} failed and were "
          f"added, {len(passed)} passed -> {written}", file=sys.stderr)
    return written, len(measured.entries), added
