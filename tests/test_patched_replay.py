"""Patched genomes on the CPU: binary identity of real NVRTC cubins, replay answering for edits that do not change
the kernel, and the GPU evaluator's screen and dedupe with its worker replaced (the GPU itself cannot run here)."""
import pytest

from kernel_factory.evo.regions import regions as regions_of
from kernel_factory.evo.evaluate import binary, gpu, render
from kernel_factory.evo.evaluate.compile import CompileJob, compile_one
from kernel_factory.evo.evaluate.replay import ReplayEvaluator
from kernel_factory.evo.types import Candidate, EvalResult, Genome, Status

CLOCK_KERNEL = r'''
extern "C" __global__ void k(unsigned long long* o) {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  o[0] = t + clock64();
}'''


def cubin(problem, genome: Genome, dtype: str = "bfloat16", name: str = "a.cu") -> bytes:
    out = compile_one(CompileJob("k", render.render(problem, Candidate(genome), dtype), name))
    assert out.error is None, out.error
    return out.cubin


def edits(problem) -> dict[str, dict[str, str]]:
    regions = regions_of(problem.template())
    return {
        "comment": {"reduce": "// a comment the compiler never sees\n" + regions["reduce"]},
        "whitespace": {"second_pass": "\n\n   " + regions["second_pass"].replace("\n", "\n\n")},
        "change": {"second_pass": regions["second_pass"].replace("rstd, w_vec);", "rstd * 1.0001f, w_vec);")},
        "broken": {"reduce": "this is not C++;\n"},
        "host": {"reduce": '#include <cstdio>\n' + regions["reduce"]},
        "unknown": {"nowhere": "int x;\n"},
    }


def recorded_ok_genes(problem, evaluator) -> dict:
    """Genes whose recorded status is ok (the synthetic recording also holds failures)."""
    for genes in problem.space.enumerate():
        hit = evaluator.rec.entries.get(Genome.of(genes).id)
        if hit and hit[1].status is Status.OK:
            return genes
    raise AssertionError("no ok genome in the recording")


def test_identity_ignores_names_comments_and_whitespace_but_not_code(rmsnorm):
    genes = rmsnorm.space.defaults()
    plain = binary.identity(cubin(rmsnorm, Genome.of(genes)))
    assert plain == binary.identity(cubin(rmsnorm, Genome.of(genes), name="another-name.cu"))
    for kind in ("comment", "whitespace"):
        assert binary.identity(cubin(rmsnorm, Genome.of(genes, edits(rmsnorm)[kind]))) == plain, kind
    assert binary.identity(cubin(rmsnorm, Genome.of(genes, edits(rmsnorm)["change"]))) != plain
    assert binary.identity(cubin(rmsnorm, Genome.of({**genes, "unroll": 4}))) != plain
    assert binary.identity(cubin(rmsnorm, Genome.of(genes), "float16")) != plain
    with pytest.raises(binary.NotACubin):
        binary.identity(b"not an elf")


def test_launch_identity_includes_the_genes(rmsnorm):
    code = {"bfloat16": cubin(rmsnorm, Genome.of(rmsnorm.space.defaults()))}
    genes = rmsnorm.space.defaults()
    assert binary.launch_identity(genes, code) == binary.launch_identity(dict(genes), code)
    assert binary.launch_identity({**genes, "rows_per_cta": 2}, code) != binary.launch_identity(genes, code)


def test_sass_backstop_finds_clock_and_timer_reads(rmsnorm):
    clocked = compile_one(CompileJob("k", CLOCK_KERNEL, "k.cu")).cubin
    assert gpu.timer_reads({"bfloat16": cubin(rmsnorm, Genome.of(rmsnorm.space.defaults()))}) is None
    reason = gpu.timer_reads({"bfloat16": clocked})
    assert reason and "SR_CLOCKLO" in reason and "SR_GLOBALTIMER" in reason


def test_seen_binaries_answers_duplicates():
    seen = binary.SeenBinaries()
    assert seen.reuse("b", "key", {}) is None
    seen.remember("key", EvalResult("a", Status.OK, 1.2, {"c": 3.0}, gpu_s=0.7, message="measured"))
    again = seen.reuse("b", "key", {})
    assert again.candidate_id == "b" and again.status is Status.OK and again.times_us == {"c": 3.0}
    assert again.gpu_s == 0.0 and again.message == "binary-identical to a, not re-run"


@pytest.fixture
def replay(rmsnorm, bench_cases, synthetic_recording, tmp_path):
    ev = ReplayEvaluator(rmsnorm, bench_cases, "torch_eager", 0, str(tmp_path), recording=str(synthetic_recording))
    yield ev
    ev.close()


def test_replay_answers_binary_identical_edits_and_only_those(replay, rmsnorm, tmp_path):
    genes = recorded_ok_genes(rmsnorm, replay)
    plain = Candidate(Genome.of(genes))
    (base,) = replay.evaluate([plain])
    assert base.status is Status.OK and replay._compiler is None   # unpatched genomes never start a compiler
    kinds = ["comment", "whitespace", "change", "broken", "host", "unknown"]
    cands = [Candidate(Genome.of(genes, edits(rmsnorm)[k])) for k in kinds]
    got = dict(zip(kinds, replay.evaluate(cands)))
    for kind in ("comment", "whitespace"):
        assert got[kind].status is Status.OK and got[kind].fitness == base.fitness
        assert got[kind].times_us == base.times_us and got[kind].candidate_id == cands[kinds.index(kind)].id
        assert got[kind].message == f"replayed: binary-identical to recorded genome {plain.id}"
    assert got["change"].status is Status.NOT_RECORDED
    assert got["change"].message == "no recorded measurement for this binary" and got["change"].build
    assert got["broken"].status is Status.COMPILE_ERROR and "error" in got["broken"].message
    assert got["host"].status is Status.REJECTED and "#include <cstdio>" in got["host"].message
    assert got["unknown"].status is Status.INVALID_PATCH and "nowhere" in got["unknown"].message
    assert any((tmp_path / "cache").rglob("*.cubin"))


def test_replay_without_compile_patches(rmsnorm, bench_cases, synthetic_recording, tmp_path):
    ev = ReplayEvaluator(rmsnorm, bench_cases, "torch_eager", 0, str(tmp_path), recording=str(synthetic_recording),
                         compile_patches=False)
    (res,) = ev.evaluate([Candidate(Genome.of(rmsnorm.space.defaults(), edits(rmsnorm)["comment"]))])
    assert res.status is Status.NOT_RECORDED and "compile_patches is off" in res.message
    assert ev._compiler is None


class FakeWorker:
    """Stands in for the GPU worker process: answers every request with fixed times and counts the requests."""

    def __init__(self, setup, setup_timeout_s: float = 0.0):
        self.cases = setup["bench_cases"]
        self.ready = {"baseline_us": {k: 20.0 for k in self.cases}, "copy_gbps": 4000.0,
                      "fingerprint": {"gpu": "FAKE (CPU test)"}}
        self.requests: list[str] = []
        self.restarts = 0

    def ask(self, request, deadline_s):
        self.requests.append(request["id"])
        return {"status": "ok", "times_us": {k: 10.0 for k in self.cases}, "gpu_s": 0.5}

    def close(self):
        pass


def test_gpu_evaluator_screens_and_never_reruns_a_binary(rmsnorm, bench_cases, tmp_path, monkeypatch):
    monkeypatch.setattr(gpu, "gpu_unavailable_reason", lambda: None)
    monkeypatch.setattr(gpu, "WorkerHandle", FakeWorker)
    ev = gpu.GpuEvaluator(rmsnorm, bench_cases, "torch_eager", 0, str(tmp_path), compile_workers=2)
    try:
        genes = rmsnorm.space.defaults()
        kinds = ["plain", "comment", "change", "host", "unknown", "broken"]
        cands = [Candidate(Genome.of(genes, edits(rmsnorm).get(k))) for k in kinds]
        got = dict(zip(kinds, ev.evaluate(cands)))
        assert sorted(ev.worker.requests) == sorted([cands[0].id, cands[2].id]) or \
            sorted(ev.worker.requests) == sorted([cands[1].id, cands[2].id])
        pair = [got["plain"], got["comment"]]
        assert all(r.status is Status.OK and r.fitness == pytest.approx(2.0) for r in pair)
        assert sum(r.message.startswith("binary-identical to ") and r.gpu_s == 0.0 for r in pair) == 1
        assert got["change"].status is Status.OK and got["change"].gpu_s == 0.5
        assert got["host"].status is Status.REJECTED and got["unknown"].status is Status.INVALID_PATCH
        assert got["broken"].status is Status.COMPILE_ERROR
        (again,) = ev.evaluate([cands[0]])
        assert len(ev.worker.requests) == 2 and again.message.startswith("binary-identical to ")
    finally:
        ev.close()
