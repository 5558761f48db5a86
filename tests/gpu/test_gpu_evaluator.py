"""GPU tests (run on a GPU host: pytest -m gpu --gpu): the live evaluator accepts a correct kernel, rejects wrong
and crashing ones with the right status, survives a fault, and times the same candidate consistently."""
import pytest

from kernel_factory.evo.types import Candidate, Case, Genome, Status

pytestmark = pytest.mark.gpu

CASES = [Case((32768, 1024), "bfloat16"), Case((8192, 8192), "bfloat16"), Case((4096, 65536), "bfloat16")]
SPREAD = 0.15
# Edits of the template's second_pass region that make a wrong kernel (a CPU test, tests/test_render.py, checks
# that each still applies to today's template and compiles, so that this GPU test cannot rot unseen).
WRONG_EDITS = {"scaled": ("rstd, w_vec);", "rstd * 1.01f, w_vec);"),
               "skips_last": ("if (v < nv) normalize_store", "if (v < nv - 1) normalize_store")}   # stated bound for one candidate timed in two separate evaluations (medians, per case)


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory):
    from kernel_factory.evo.evaluate.gpu import GpuEvaluator
    from kernel_factory.problems.rmsnorm_fwd import problem
    ev = GpuEvaluator(problem, CASES, "torch_eager", 0, str(tmp_path_factory.mktemp("gpu")), compile_workers=4)
    yield ev
    ev.close()


def patched(problem, region, body):
    return Candidate(Genome.of(problem.space.defaults(), {region: body}), operator="test")


def second_pass(problem, old, new):
    """The template's second_pass region with one edit (the edit must apply)."""
    from kernel_factory.evo.regions import regions
    body = regions(problem.template())["second_pass"]
    assert old in body
    return body.replace(old, new)


def test_default_genome_is_correct_and_timed(evaluator):
    from kernel_factory.problems.rmsnorm_fwd import problem
    (res,) = evaluator.evaluate([Candidate(Genome.of(problem.space.defaults()))])
    assert res.status is Status.OK, res.message
    assert set(res.times_us) == {c.key for c in CASES} and res.fitness > 0
    assert evaluator.info.fingerprint["gpu"] and float(evaluator.info.fingerprint["copy_gbps"]) > 100


def test_wrong_kernels_are_rejected(evaluator):
    from kernel_factory.problems.rmsnorm_fwd import problem
    scaled, skips_last = (patched(problem, "second_pass", second_pass(problem, *WRONG_EDITS[k]))
                          for k in ("scaled", "skips_last"))
    results = evaluator.evaluate([scaled, skips_last])
    for res in results:
        assert res.status is Status.INCORRECT, (res.status, res.message)
        assert res.fitness == 0.0 and not res.times_us
    assert "non-finite" in results[1].message or "values off" in results[1].message


def test_crash_is_a_status_and_the_worker_recovers(evaluator):
    from kernel_factory.problems.rmsnorm_fwd import problem
    crash = patched(problem, "second_pass",
                    "if (lane == 0) { *(volatile float*)(0x10) = rstd; }\n")
    restarts = evaluator.restarts
    crashed, good = evaluator.evaluate([crash, Candidate(Genome.of({**problem.space.defaults(), "unroll": 1}))])
    assert crashed.status is Status.CRASHED, crashed.message
    assert evaluator.restarts == restarts + 1
    assert good.status is Status.OK, good.message


def test_same_candidate_timed_twice_agrees(evaluator):
    """Two separate measurements: the second bypasses the binary reuse (which would hand back the first result)."""
    from kernel_factory.problems.rmsnorm_fwd import problem
    cand = Candidate(Genome.of({**problem.space.defaults(), "store": "cs"}))
    (a,), (b,) = evaluator.evaluate([cand]), evaluator.measure_again([cand])
    assert a.status is Status.OK and b.status is Status.OK
    assert b.gpu_s > 0 and "not re-run" not in b.message, "the second result must be a new measurement"
    assert a.times_us != b.times_us, "two independent event timings of 3 cases are never all identical"
    (c,) = evaluator.evaluate([cand])
    assert c.gpu_s == 0 and "not re-run" in c.message   # reuse is still the default
    for key in a.times_us:
        spread = abs(a.times_us[key] - b.times_us[key]) / min(a.times_us[key], b.times_us[key])
        print(f"{key}: {a.times_us[key]:.2f} us vs {b.times_us[key]:.2f} us ({spread:.1%})")
        assert spread < SPREAD


def test_the_baseline_is_timed_like_a_candidate_and_again_during_the_run(tmp_path):
    """torch.compile as the baseline: measured at setup after a discarded first pass (its compile), then again
    between candidates; each result is taken against the latest measurement, and the books keep every one."""
    from kernel_factory.evo.evaluate.gpu import GpuEvaluator
    from kernel_factory.problems.rmsnorm_fwd import problem
    cases = [Case((4096, 1024), "bfloat16"), Case((1024, 8192), "bfloat16")]
    ev = GpuEvaluator(problem, cases, "torch_compile", 0, str(tmp_path), compile_workers=4, baseline_every_s=1e-3,
                      graph_below_us=30.0)
    try:
        defaults = problem.space.defaults()
        cands = [Candidate(Genome.of({**defaults, "unroll": u})) for u in (1, 2, 4)]
        results = ev.evaluate(cands)
        books = ev.accounting()["baseline"]
    finally:
        ev.close()
    assert all(r.status is Status.OK for r in results), [r.message for r in results]
    assert books["measurements"] == 1 + len(cands) and not books["errors"], books
    assert books["gpu_s"] > 0 and all(0.5 < g < 2.0 for g in books["relative_to_first"]), books
    bases = [tuple(sorted(r.baseline_us.items())) for r in results]
    assert len(set(bases)) == len(cands), "each candidate is taken against its own, fresh baseline measurement"


def test_racing_legs_gate_once_and_time_the_cases_asked(evaluator):
    """Racing on the GPU: the first leg gates in full and times only the cases asked; the second times the rest
    without a second gate, and the whole result holds every case, with each leg's own GPU time."""
    from kernel_factory.problems.rmsnorm_fwd import problem
    cand = Candidate(Genome.of({**problem.space.defaults(), "vec_bytes": 8}), operator="test")
    keys = [c.key for c in CASES[:1]]
    (first,) = evaluator.time_first([cand], keys)
    assert first.status is Status.OK and set(first.times_us) == set(keys) and first.gpu_s > 0
    (rest,) = evaluator.time_rest([cand], [first])
    assert rest.status is Status.OK and set(rest.times_us) == {c.key for c in CASES}
    assert rest.times_us[keys[0]] == first.times_us[keys[0]] and rest.fitness > 0 and rest.gpu_s > 0
    assert evaluator.accounting()["compile_wait_s"] >= 0


def test_paired_timing_takes_each_fitness_against_the_baseline_timed_beside_it(tmp_path):
    """evaluator.gpu.paired: every case of a candidate is timed interleaved with the baseline; the result carries
    that baseline, the fitness is its geomean against the candidate's times, and a wrong kernel still fails."""
    import math
    from kernel_factory.evo.evaluate.gpu import GpuEvaluator
    from kernel_factory.problems.rmsnorm_fwd import problem
    cases = [Case((4096, 1024), "bfloat16"), Case((8192, 8192), "bfloat16")]
    ev = GpuEvaluator(problem, cases, "torch_eager", 0, str(tmp_path), compile_workers=4, paired=True)
    try:
        defaults = problem.space.defaults()
        good = [Candidate(Genome.of({**defaults, "unroll": u})) for u in (1, 4)]
        bad = patched(problem, "second_pass", second_pass(problem, *WRONG_EDITS["scaled"]))
        results = ev.evaluate([*good, bad])
        setup = dict(ev.baseline_us)
    finally:
        ev.close()
    ok, wrong = results[:2], results[2]
    assert all(r.status is Status.OK for r in ok), [r.message for r in ok]
    assert wrong.status is Status.INCORRECT, wrong.message
    for r in ok:
        assert set(r.baseline_us) == {c.key for c in cases} and r.baseline_us != setup
        want = math.exp(sum(math.log(r.baseline_us[k] / r.times_us[k]) for k in r.times_us) / len(r.times_us))
        assert math.isclose(r.fitness, want, rel_tol=1e-9)
    assert ok[0].baseline_us != ok[1].baseline_us, "each candidate has its own paired baseline"
