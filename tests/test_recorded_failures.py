"""Recordings that hold failures outside the problem's rule (record --cpu-failures, record --outside-rule on a GPU):
the format keeps their status, log and rule reason; replay answers them as recorded and lets its search propose
them, unless told not to."""
from __future__ import annotations

import dataclasses

import pytest

from kernel_factory.evo import build, config
from kernel_factory.evo.evaluate import recording
from kernel_factory.evo.evaluate.replay import ReplayEvaluator
from kernel_factory.evo.protocols import EvaluatorInfo
from kernel_factory.evo.tools import record_gpu
from kernel_factory.evo.tools.record_cpu import rejected
from kernel_factory.evo.types import BuildInfo, Candidate, EvalResult, Status
from conftest import write_synthetic_recording

LOG = "rmsnorm_fwd.cu(88): error: identifier \"stage_buf\" is undefined"


SMALL = {"threads": [1024], "rows_per_cta": [1], "vec_bytes": [16], "load": ["plain", "cp_async"], "store": ["plain"],
         "keep_x": [False, True], "reduce": ["shfl"], "rsqrt": ["approx"], "unroll": [2, 4]}


def small_recording(tmp_path, rmsnorm, bench_cases):
    """A recording over a small space whose rule-rejected genomes include both kinds (shared memory, spills); the
    genes it does not name at their defaults, as a recording made before they existed reads."""
    fixed = {g.name: SMALL.get(g.name, [g.default]) for g in rmsnorm.space.genes}
    rec = recording.read(write_synthetic_recording(tmp_path / "small-all.jsonl.gz", rmsnorm, bench_cases,
                                                     choices=fixed))
    return recording.write(dataclasses.replace(rec, header={**rec.header, "space": SMALL}), tmp_path / "small.jsonl.gz")


def test_outside_rule_failures_round_trip_and_replay_answers_them(tmp_path, rmsnorm, bench_cases):
    rec = recording.read(small_recording(tmp_path, rmsnorm, bench_cases))
    space = rmsnorm.space.restricted(recording.covered_choices(rec.header, rmsnorm.space))
    genome, why = next(rejected(space))
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
    other = next(g for g, _ in rejected(space) if g.id != genome.id)
    assert replay.space.why_infeasible(other.gene_dict) is not None   # only what the recording answers

    strict = ReplayEvaluator(rmsnorm, bench_cases, "torch_eager", 0, str(tmp_path), recording=str(path),
                             recorded_failures=False)
    assert strict.space.why_infeasible(genome.gene_dict) == why


class FakeGpu:
    """Stands in for the GPU evaluator: a launch refuses static shared memory over 48 KiB, spilling kernels pass."""

    info = EvaluatorInfo("gpu", "fake H200", {"gpu": "fake H200"})

    def __init__(self, space):
        self.space, self.seen = space, []

    def evaluate(self, candidates):
        self.seen += [c.id for c in candidates]
        return [EvalResult(c.id, Status.CRASHED, message="cudaErrorInvalidValue: too much shared memory")
                if "shared memory" in (self.space.rule(c.genome.gene_dict) or "") else
                EvalResult(c.id, Status.OK, 1.0) for c in candidates]

    def close(self):
        pass


def test_outside_rule_on_gpu_keeps_the_failures_and_lists_the_passes(tmp_path, monkeypatch, rmsnorm, bench_cases):
    path = small_recording(tmp_path, rmsnorm, bench_cases)
    fake = FakeGpu(rmsnorm.space)
    monkeypatch.setattr(build, "need_gpu", lambda cfg, what: None)
    monkeypatch.setattr(build, "make_evaluator", lambda run, kind, race=True: fake)
    cfg = config.parse({"problem": "rmsnorm_fwd", "dtypes": ["bfloat16"], "shapes": "benchmark",
                        "out_dir": str(tmp_path / "runs")})
    written, measured, added = record_gpu.add_gpu_failures(cfg, path, tmp_path / "out.jsonl.gz")

    space = rmsnorm.space.restricted(recording.covered_choices({"space": SMALL}, rmsnorm.space))
    refused = {g.id: why for g, why in rejected(space)}
    assert measured == len(refused) == len(fake.seen) and 0 < added < measured   # both kinds are in the sample
    again = recording.read(written)
    smem = {gid for gid, why in refused.items() if "shared memory" in why}
    assert set(again.outside_rule) == smem and all(again.outside_rule[g] == refused[g] for g in smem)
    assert all(again.entries[g][1].status is Status.CRASHED for g in smem)
    note = again.header["gpu_outside_rule"]
    assert note["failures"] == added and sorted(note["passed"]) == sorted(set(refused) - smem)


def test_outside_rule_cut_short_keeps_what_it_measured_and_the_same_command_finishes(tmp_path, monkeypatch, rmsnorm,
                                                                                      bench_cases):
    """A time limit or a kill mid-way loses nothing: each result is in out's .partial.jsonl as it arrives, and the
    same command run again measures only the rest, then writes the same recording as one uninterrupted run."""
    path = small_recording(tmp_path, rmsnorm, bench_cases)
    monkeypatch.setattr(record_gpu, "CHUNK", 2)
    monkeypatch.setattr(build, "need_gpu", lambda cfg, what: None)
    cfg = config.parse({"problem": "rmsnorm_fwd", "dtypes": ["bfloat16"], "shapes": "benchmark",
                        "out_dir": str(tmp_path / "runs")})

    class Killed(FakeGpu):
        def evaluate(self, candidates):
            if len(self.seen) >= 4:
                raise KeyboardInterrupt   # the time limit, after two chunks
            return super().evaluate(candidates)

    first = Killed(rmsnorm.space)
    monkeypatch.setattr(build, "make_evaluator", lambda run, kind, race=True: first)
    out = tmp_path / "out.jsonl.gz"
    with pytest.raises(KeyboardInterrupt):
        record_gpu.add_gpu_failures(cfg, path, out)
    partial = tmp_path / "out.partial.jsonl"
    assert not out.exists() and set(recording.read(partial).entries) == set(first.seen) and len(first.seen) == 4

    second = FakeGpu(rmsnorm.space)
    monkeypatch.setattr(build, "make_evaluator", lambda run, kind, race=True: second)
    written, measured, added = record_gpu.add_gpu_failures(cfg, path, out)
    assert not set(first.seen) & set(second.seen), "nothing measured twice"
    assert measured == len(first.seen) + len(second.seen) and not partial.exists()
    whole = FakeGpu(rmsnorm.space)
    monkeypatch.setattr(build, "make_evaluator", lambda run, kind, race=True: whole)
    once = recording.read(record_gpu.add_gpu_failures(cfg, path, tmp_path / "once.jsonl.gz")[0])
    again = recording.read(written)
    assert again.outside_rule == once.outside_rule and set(again.entries) == set(once.entries)
    assert sorted(again.header["gpu_outside_rule"]["passed"]) == sorted(once.header["gpu_outside_rule"]["passed"])
    assert len(again.header["gpu_outside_rule"]["resumes"]) == 1 and added == once.header["gpu_outside_rule"]["failures"]
