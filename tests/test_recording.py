"""The recording format: append, survive a torn line, resume with a drift record, compress, read back."""
import gzip
import json

import pytest

from kernel_factory.evo.evaluate import recording
from kernel_factory.evo.types import BuildInfo, EvalResult, Genome, Status

HEADER = {"problem": "p", "cases": ["bfloat16:4x8"], "baseline": "torch_eager", "baseline_us": {"bfloat16:4x8": 2.0}}


def result(gid, t):
    return EvalResult(gid, Status.OK, 1.0, {"bfloat16:4x8": t}, {"bfloat16:4x8": 0.1},
                      build={"bfloat16": BuildInfo(registers=32, log="ptxas info ...")}, gpu_s=0.2)


def test_write_resume_finish(tmp_path):
    final = tmp_path / "p-bf16.jsonl.gz"
    w = recording.Writer(final, HEADER)
    g1, g2, g3 = (Genome.of({"a": i}) for i in range(3))
    w.add(g1, result(g1.id, 1.0))
    w.add(g2, EvalResult(g2.id, Status.INCORRECT, message="off by one"))
    with open(w.partial, "a") as fh:          # a kill mid-write leaves a torn line
        fh.write('{"genome": {"genes": {"a"')
    w2 = recording.Writer(final, HEADER)
    assert w2.done == {g1.id, g2.id}
    w2.add_resume({"fingerprint": {"gpu": "other"}, "remeasured": {}})
    w2.add(g3, result(g3.id, 3.0))
    path = w2.finish({"wall_s": 1.0})
    assert path == final and not w2.partial.exists()
    rec = recording.read(final)
    assert rec.header["format"] == recording.FORMAT and rec.header["wall_s"] == 1.0
    assert rec.header["resumes"] == [{"fingerprint": {"gpu": "other"}, "remeasured": {}}]
    assert set(rec.entries) == {g1.id, g2.id, g3.id}
    assert rec.entries[g3.id][1].times_us == {"bfloat16:4x8": 3.0}
    assert rec.entries[g2.id][1].status is Status.INCORRECT and rec.entries[g2.id][1].message == "off by one"
    raw = gzip.open(final, "rt").read()
    assert "ptxas info" not in raw, "compile logs stay out of recordings (size)"


def test_resume_refuses_another_problem(tmp_path):
    final = tmp_path / "p.jsonl.gz"
    recording.Writer(final, HEADER).add(Genome.of({"a": 1}), result("x", 1.0))
    with pytest.raises(ValueError, match="another problem or case list"):
        recording.Writer(final, {**HEADER, "cases": ["bfloat16:8x8"]})


def test_not_a_recording(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text(json.dumps({"hello": 1}) + "\n")
    with pytest.raises(ValueError, match="not a kernel-factory recording"):
        recording.read(bad)


def test_a_resumed_sample_is_drawn_from_the_space_it_began_in(tmp_path):
    """A gene that gained a choice since the recording began: the resumed sample is the same sample (genomes
    recorded before are still in it, none of the new choice's); a gene added since is refused, by name."""
    from kernel_factory.evo.config import ConfigError
    from kernel_factory.evo.tools.record import resumed_space, sampled_space
    from kernel_factory.evo.types import Gene, GeneSpace
    before = GeneSpace((Gene("a", (1, 2, 4), 1), Gene("b", (0, 1), 0)), lambda g: None)
    final = tmp_path / "p.jsonl.gz"
    space = {g.name: list(g.choices) for g in before.genes}
    first, _ = sampled_space(before, 4, 0)
    w = recording.Writer(final, {**HEADER, "space": space})
    w.add(first[1], result(first[1].id, 1.0))
    grown = GeneSpace((Gene("a", (1, 2, 4, 8, 16), 1), Gene("b", (0, 1), 0)), lambda g: None)
    again, _ = sampled_space(resumed_space(grown, final), 4, 0)
    assert again == first and all(g.gene_dict["a"] <= 4 for g in again)
    assert [g.id for g in sampled_space(grown, 4, 0)[0]] != [g.id for g in first], "the grown space samples others"
    added = GeneSpace((*grown.genes, Gene("c", (0, 1), 0)), lambda g: None)
    with pytest.raises(ConfigError, match="differing in c"):
        resumed_space(added, final)
    assert resumed_space(grown, tmp_path / "fresh.jsonl.gz") is grown


def test_the_config_search_space_is_recorded_whole(tmp_path, monkeypatch):
    """record with search.space: every feasible genome of that sub-space, no other, and a header that says so (the
    exhaustive landscape the efficiency benchmark and a replay need); the measuring is a stand-in here."""
    from kernel_factory.evo import build, config
    from kernel_factory.evo.evaluate.gpu import GpuEvaluator
    from kernel_factory.evo.tools import record
    from kernel_factory.evo.protocols import EvaluatorInfo

    class Measured(GpuEvaluator):
        def __init__(self, cases):
            self.cases, self.baseline_us, self.copy_gbps = cases, {c.key: 9.0 for c in cases}, 4e3
            self.info = EvaluatorInfo("gpu", "stand-in", {"gpu": "none"})

        def evaluate(self, cands):
            return [EvalResult(c.id, Status.OK, 1.0, {k: 5.0 for k in self.baseline_us}, {}, self.baseline_us)
                    for c in cands]

        def close(self):
            pass

        @property
        def restarts(self):
            return 0
    monkeypatch.setattr(build, "need_gpu", lambda cfg, what: None)
    monkeypatch.setattr(build, "make_evaluator", lambda run, kind, race=True: Measured(run.cases))
    narrow = {"threads": [256], "rows_per_cta": [1, 2], "load": ["nc"], "store": ["plain"], "cluster": [1]}
    cfg = config.load("configs/rmsnorm_fwd_record.yaml", ("shapes=4x512",) + tuple(
        f"search.space.{k}={v}" for k, v in narrow.items()))
    out = record.record(cfg, tmp_path / "sub.jsonl.gz")
    rec = recording.read(out)
    space = build.restrict_space(build.prepare(cfg).problem.space, cfg.search.space)
    assert set(rec.entries) == {Genome.of(g).id for g in space.enumerate()} and len(rec.entries) > 16
    assert rec.header["space"]["threads"] == [256] and rec.header["space"]["rows_per_cta"] == [1, 2]
    assert rec.header["sampling"].startswith("exhaustive") and "search.space" in rec.header["sampling"]
