"""Recordings that hold failures outside the problem's rule (record --cpu-failures): the format keeps their status,
log and rule reason; replay answers them as recorded and lets its search propose them, unless told not to."""
from __future__ import annotations

import dataclasses

from kernel_factory.evo.evaluate import recording
from kernel_factory.evo.evaluate.replay import ReplayEvaluator
from kernel_factory.evo.tools.record_cpu import rejected
from kernel_factory.evo.types import BuildInfo, Candidate, EvalResult, Status

LOG = "rmsnorm_fwd.cu(88): error: identifier \"stage_buf\" is undefined"


def test_outside_rule_failures_round_trip_and_replay_answers_them(tmp_path, rmsnorm, bench_cases,
                                                                   synthetic_recording):
    rec = recording.read(synthetic_recording)
    genome, why = next(rejected(rmsnorm.space))
    assert rmsnorm.space.why_infeasible(genome.gene_dict) == why
    failed = EvalResult(genome.id, Status.COMPILE_ERROR, build={"bfloat16": BuildInfo(compile_s=0.4)},
                        message=f"bfloat16: {LOG}")
    extended = dataclasses.replace(rec, entries={**rec.entries, genome.id: (genome, failed)},
                                   outside_rule={genome.id: why})
    path = recording.write(extended, tmp_path / "rmsnorm_fwd-extended.jsonl.gz", {"cpu_failures": {"failures": 1}})

    again = recording.read(path)
    assert again.outside_rule == {genome.id: why} and again.header["cpu_failures"] == {"failures": 1}
    assert again.entries[genome.id][1].message == f"bfloat16: {LOG}" and "failures" in again.label
    assert len(again.entries) == len(rec.entries) + 1

    replay = ReplayEvaluator(rmsnorm, bench_cases, "torch_eager", 0, str(tmp_path), recording=str(path))
    assert replay.space.why_infeasible(genome.gene_dict) is None   # the search may propose it
    (result,) = replay.evaluate([Candidate(genome, operator="gene_mutation")])
    assert result.status is Status.COMPILE_ERROR and result.fitness == 0.0 and LOG in result.message
    assert result.message.startswith(f"outside the problem's rule ({why})")
    other = next(g for g, _ in rejected(rmsnorm.space) if g.id != genome.id)
    assert replay.space.why_infeasible(other.gene_dict) is not None   # only what the recording answers

    strict = ReplayEvaluator(rmsnorm, bench_cases, "torch_eager", 0, str(tmp_path), recording=str(path),
                             recorded_failures=False)
    assert strict.space.why_infeasible(genome.gene_dict) == why
