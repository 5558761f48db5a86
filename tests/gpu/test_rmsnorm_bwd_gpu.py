"""GPU tests of the RMSNorm backward template (run on an H200: pytest -m gpu --gpu tests/gpu/test_rmsnorm_bwd_gpu.py).

The default genome, genomes at the corners of the space and twenty random feasible ones are compiled for all three
dtypes. Each must pass the worker's correctness gate (fresh inputs, stale output buffers, a bitwise-repeated launch,
planted special rows, canaries around every output) on every correctness and held-out shape, and a few on the
widest benchmark rows too; then the live evaluator checks and times a spread of them end to end.

The live evaluator re-checks sampled rows of every timed output. dw sums all M rows, so that check needs the
problem's reference_rows() (dx at the sampled rows, dw in full); a worker that slices every input by rows and
compares dw against a sum over the sampled rows only rejects every genome, correct or not."""
import os
import random

import pytest

from kernel_factory.evo.types import Candidate, Case, Genome, Status

pytestmark = pytest.mark.gpu

DTYPES = ("bfloat16", "float16", "float32")
# Every placement of dw (registers, shared, global), warp-per-row and multi-warp rows, clusters of 2 to 16, both
# vector widths, every load and store flavour, both reductions, with and without prefetch, cp.async rings of 2 to 4
# row slots (some holding whole rows, in CTAs of 4 or 8 warps), streamed vectors one at a time and in batches.
CORNERS = {
    "warp_rows_vec8": dict(threads=128, rows_per_cta=2, ctas_per_sm=4, reg_vecs=1, vec_bytes=8),
    "warp_rows_plain": dict(threads=256, rows_per_cta=8, ctas_per_sm=4, reg_vecs=1, prefetch=False, load="plain",
                            dw_acc="smem"),
    "rows4_smem_tree": dict(threads=512, rows_per_cta=4, ctas_per_sm=1, reg_vecs=4, vec_bytes=8, reduce="smem"),
    "cluster2_smem_dw": dict(threads=512, cluster=2, ctas_per_sm=1, reg_vecs=2, dw_acc="smem", prefetch=False),
    "cluster4_na_cs": dict(threads=512, cluster=4, ctas_per_sm=1, reg_vecs=4, vec_bytes=8, load="nc_na", store="cs"),
    "cluster8_1024": dict(threads=1024, cluster=8, ctas_per_sm=1, reg_vecs=1, dw_acc="smem", reduce="smem",
                          prefetch=False),
    "cluster8_512_kv4": dict(threads=512, cluster=8, ctas_per_sm=1, reg_vecs=4, prefetch=False, dw_acc="smem"),
    "ctas4_no_prefetch": dict(ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem"),
    "ring2_cluster16": dict(threads=512, cluster=16, ctas_per_sm=1, reg_vecs=4, stages=2, prefetch=False,
                            dw_acc="smem"),
    "ring4_cluster16_kv2": dict(threads=512, cluster=16, ctas_per_sm=1, reg_vecs=2, stages=4, prefetch=False),
    "ring3_cta2": dict(threads=256, ctas_per_sm=2, reg_vecs=2, stages=3, prefetch=False),
    "ring4_cluster8_vec8": dict(threads=512, cluster=8, ctas_per_sm=1, reg_vecs=2, stages=4, prefetch=False,
                                vec_bytes=8),
    "ring2_warp_rows": dict(threads=256, rows_per_cta=8, ctas_per_sm=2, reg_vecs=1, stages=2, prefetch=False),
    # whole rows on chip: 8 vectors of x and dy per thread through the ring, CTAs of 4 or 8 warps
    "ring_row_c16": dict(threads=256, cluster=16, ctas_per_sm=1, reg_vecs=8, stages=2, prefetch=False),
    "ring_row_c16_cta2": dict(threads=256, cluster=16, ctas_per_sm=2, reg_vecs=4, stages=2, prefetch=False,
                              dw_acc="smem"),
    "ring_row_c2_128": dict(threads=128, cluster=2, ctas_per_sm=1, reg_vecs=8, stages=3, prefetch=False,
                            dw_acc="smem"),
    # every warp's sum straight across the cluster (cluster_sum=warps): 8 warps x 16 CTAs, 32 warps x 8 CTAs
    "ring_row_c16_warps": dict(threads=256, cluster=16, ctas_per_sm=1, reg_vecs=8, stages=2, prefetch=False,
                               cluster_sum="warps"),
    "cluster8_1024_warps": dict(threads=1024, cluster=8, ctas_per_sm=1, reg_vecs=1, dw_acc="smem", prefetch=False,
                                cluster_sum="warps"),
    # streamed vectors loaded in batches of 2 or 4 (stream_batch): past one register vector, in clusters of 16, in
    # a ring, in rows of one warp with global partials
    "stream4_c16": dict(threads=512, cluster=16, ctas_per_sm=1, reg_vecs=1, dw_acc="smem", prefetch=False,
                        cluster_sum="warps", stream_batch=4),
    "stream2_ring_c8": dict(threads=256, cluster=8, ctas_per_sm=2, reg_vecs=1, stages=2, prefetch=False,
                            dw_acc="smem", stream_batch=2),
    "stream2_vec8": dict(threads=256, ctas_per_sm=2, reg_vecs=1, vec_bytes=8, stream_batch=2),
    "stream2_warp_rows": dict(threads=128, rows_per_cta=4, ctas_per_sm=4, reg_vecs=1, prefetch=False,
                              stream_batch=2),
    # narrow: 2-element vectors where N is even but no multiple of the vector (N = 4100, 1030, 66 of the
    # correctness shapes), plain, beside a ring, in rows of one warp, in sub-warp rows and across a cluster
    "narrow": dict(narrow=True),
    "narrow_ring3": dict(narrow=True, threads=256, ctas_per_sm=2, reg_vecs=2, stages=3, prefetch=False),
    "narrow_warp_rows": dict(narrow=True, threads=128, rows_per_cta=4, ctas_per_sm=4, reg_vecs=1, prefetch=False,
                             stream_batch=2),
    "narrow_subwarp": dict(narrow=True, threads=128, rows_per_cta=16, ctas_per_sm=4),
    "narrow_cluster8": dict(narrow=True, threads=512, cluster=8, ctas_per_sm=1, reg_vecs=4, prefetch=False,
                            dw_acc="smem"),
    # at 64 registers (2 CTAs of 512 threads), as the op's general and widest-row genomes are, which take narrow but
    # not tail=peel (its second vector path spills there): their narrow twins
    "narrow_x2_vec8": dict(narrow=True, threads=512, reg_vecs=1, vec_bytes=8, load="plain", store="cs"),
    "narrow_x2_cluster16": dict(narrow=True, threads=512, cluster=16, cluster_sum="warps", reg_vecs=1,
                                dw_acc="smem", prefetch=False, store="cs"),
    # tail=peel: the vector path with a peeled head and tail (N = 33, 3001, 4100, 1030, 66, 5001, 30001 of the
    # correctness shapes), with partials in registers, shared and global memory, beside a ring, across clusters, with
    # 8-byte vectors and batches, and small_m plans (direct only at M = 1, else grouped slots of several rows)
    "peel": dict(tail="peel"),
    "peel_smem_kv1": dict(tail="peel", reg_vecs=1, dw_acc="smem"),
    "peel_ring3": dict(tail="peel", threads=256, ctas_per_sm=2, reg_vecs=2, stages=3, prefetch=False),
    "peel_cluster4_vec8": dict(tail="peel", threads=512, cluster=4, ctas_per_sm=1, reg_vecs=4, vec_bytes=8,
                               load="nc_na", store="cs"),
    "peel_cluster8_stream2": dict(tail="peel", threads=256, cluster=8, ctas_per_sm=2, reg_vecs=1, stages=2,
                                  prefetch=False, dw_acc="smem", stream_batch=2),
    "peel_cluster16": dict(tail="peel", threads=512, cluster=16, ctas_per_sm=1, reg_vecs=2, prefetch=False),
    "peel_direct": dict(tail="peel", small_m="direct"),
    "peel_grouped_narrow": dict(tail="peel", small_m="grouped", narrow=True, threads=128, ctas_per_sm=4, reg_vecs=1),
    "peel_narrow": dict(tail="peel", narrow=True),
    # at 64 registers with one 8-byte register vector (the op's general genome's twin)
    "peel_x2_vec8": dict(tail="peel", threads=512, reg_vecs=1, vec_bytes=8, load="plain", store="cs"),
    # the column split at M <= 64 (kernels/rmsnorm_bwd_cols.cuh), the genome's own plan above
    "cols": dict(small_m="cols"),
    "cols_peel_cluster4": dict(small_m="cols", tail="peel", threads=512, cluster=4, ctas_per_sm=1, reg_vecs=2),
}
WIDE = [Case((32768, 1024), "bfloat16"), Case((16384, 131072), "float16"), Case((8192, 262144), "bfloat16")]
TIMED = [Case((32768, 1024), "bfloat16"), Case((32768, 16384), "bfloat16"), Case((8192, 262144), "bfloat16"),
         Case((32768, 4096), "float32"), Case((32768, 256), "float16")]


def problem():
    from kernel_factory.problems.rmsnorm_bwd import problem as p
    return p


def genomes() -> dict[str, dict]:
    p = problem()
    out = {"default": p.space.defaults()}
    out.update({name: {**p.space.defaults(), **kw} for name, kw in CORNERS.items()})
    for i, g in enumerate(random.Random(2026).sample(list(p.space.enumerate()), 20)):
        out[f"random{i}"] = g
    for name, g in out.items():
        assert p.space.why_infeasible(g) is None, (name, p.space.why_infeasible(g))
    only = focus()
    return {n: g for n, g in out.items() if n == "default" or any(w in n for w in only)} if only else out


def focus() -> list[str]:
    """KF_BWD_GENOMES, e.g. "peel,narrow": only the default and the corners whose name holds one of those words are
    built and checked (a focused check of a template change)."""
    return [w for w in os.environ.get("KF_BWD_GENOMES", "").split(",") if w]


def build_all(named: dict[str, dict], cache) -> dict[str, tuple[dict, dict]]:
    """name -> (genes, {dtype: cubin}) for named genomes of the backward, compiled on the CPU pool like the
    evaluator does (tests/gpu/test_rmsnorm_bwd_small_gpu.py builds its genomes with it too)."""
    from kernel_factory.evo.evaluate import render
    from kernel_factory.evo.evaluate.compile import CompileJob, Compiler
    p = problem()
    compiler = Compiler(cache, workers=8)
    jobs, owner = [], {}
    try:
        for name, g in named.items():
            for dt in DTYPES:
                key = compiler.key(render.body(p, Genome.of(g), dt))
                owner[key] = (name, dt)
                jobs.append(CompileJob(key, render.render(p, Candidate(Genome.of(g)), dt), f"{name}-{dt}.cu"))
        out: dict[str, tuple[dict, dict]] = {name: (g, {}) for name, g in named.items()}
        for res in compiler.compile_many(jobs):
            name, dt = owner[res.key]
            assert res.error is None, f"{name} {dt}:\n{res.error}"
            out[name][1][dt] = res.cubin
    finally:
        compiler.close()
    return out


def build_changes(changes: dict[str, dict], cache) -> dict[str, tuple[dict, dict]]:
    """build_all of named genomes given as changes to the defaults, each checked feasible first."""
    p = problem()
    named = {name: {**p.space.defaults(), **kw} for name, kw in changes.items()}
    for name, g in named.items():
        assert p.space.why_infeasible(g) is None, (name, p.space.why_infeasible(g))
    return build_all(named, cache)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return build_all(genomes(), tmp_path_factory.mktemp("bwd-gpu-cache"))


@pytest.fixture(scope="module")
def bench():
    """The worker's per-process state, in this process: its gate, launcher and stream."""
    from kernel_factory.evo.evaluate import worker
    return worker.Bench({"problem": "rmsnorm_bwd", "baseline": "torch_eager", "bench_cases": [], "check_cases": []})


def gate(bench, module, genes: dict, case: Case, rng: random.Random) -> str | None:
    """The worker's four-launch correctness gate on one case: None, or why the genome failed it."""
    from kernel_factory.evo.evaluate import worker
    try:
        bench.gate_case(module, genes, case, rng)
    except worker.Rejected as exc:
        return f"{exc.status.value}: {exc}"
    return None


def module(cubin: bytes):
    from kernel_factory.evo.evaluate import launcher
    return launcher.Module(cubin, "rmsnorm_bwd")


def gate_shapes(bench, built: dict[str, tuple[dict, dict]], dtype: str, shapes, rng: random.Random) -> list[str]:
    """Every built genome through the gate on every (M, N) shape in one dtype: the failures, a line each (the
    small-M and sub-warp GPU tests gate their genomes with it too)."""
    failures = []
    for name, (g, cubins) in built.items():
        loaded = module(cubins[dtype])
        for shape in shapes:
            bad = gate(bench, loaded, g, Case(tuple(shape), dtype), rng)
            if bad:
                failures.append(f"{name} {tuple(shape)}: {bad[:300]}")
    return failures


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_genome_passes_the_gate_on_odd_and_held_out_shapes(built, bench, dtype):
    p = problem()
    failures = gate_shapes(bench, built, dtype, p.shape_sets["correctness"] + p.shape_sets["heldout"],
                           random.Random(7))
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("case", WIDE, ids=lambda c: c.key)
def test_corners_pass_the_gate_on_benchmark_rows(built, bench, case):
    rng = random.Random(8)
    names = ["default", "warp_rows_vec8", "cluster8_1024", "cluster8_512_kv4", "rows4_smem_tree", "ring2_cluster16",
             "ring4_cluster16_kv2", "ring3_cta2", "ring_row_c16", "ring_row_c16_cta2", "ring_row_c2_128",
             "ring_row_c16_warps", "cluster8_1024_warps", "stream4_c16", "stream2_ring_c8", "stream2_vec8",
             "stream2_warp_rows"]
    names = list(built) if focus() else names   # a focused check takes its own genomes to the wide rows
    failures = [f"{n}: {bad[:300]}" for n in names
                if (bad := gate(bench, module(built[n][1][case.dtype]), built[n][0], case, rng))]
    assert not failures, "\n".join(failures)


def test_live_evaluator_checks_and_times_a_spread(built, tmp_path):
    from kernel_factory.evo.evaluate.gpu import GpuEvaluator
    from kernel_factory.evo.evaluate.worker import release_memory
    # The gate tests before this one ran wide cases in this process: torch's caching allocator still holds that
    # memory, and the evaluator's worker (another process) needs it for its input sets.
    release_memory()
    p = problem()
    names = list(built) if focus() else ["default", *CORNERS, "random0", "random1", "random2"]
    cands = {n: Candidate(Genome.of(built[n][0]), operator="test") for n in names}
    ev = GpuEvaluator(p, TIMED, "torch_eager", 0, str(tmp_path), compile_workers=8)
    try:
        results = dict(zip(cands, ev.evaluate(list(cands.values()))))
    finally:
        ev.close()
    keys = [c.key for c in TIMED]
    print("\n" + "genome".ljust(20) + "".join(k.rjust(28) for k in keys))
    for name, res in results.items():
        print(name.ljust(20) + "".join((f"{res.times_us[k]:.1f} us {res.gbps[k]:.0f} GB/s" if k in res.times_us
                                        else "-").rjust(28) for k in keys) + f"  {res.status.value} {res.message[:60]}")
    bad = {n: f"{r.status.value}: {r.message[:300]}" for n, r in results.items() if r.status is not Status.OK}
    assert not bad, bad
    assert all(r.fitness > 0 and set(r.times_us) == set(keys) for r in results.values())


def test_persistent_clusters_fit_on_the_gpu_at_once(built):
    """A persistent grid of more clusters than the GPU holds at once runs a second wave: the plan's cap for each
    cluster size must not exceed the driver's count of co-resident clusters for that kernel and shared memory."""
    from cuda.core import Device, LaunchConfig
    from kernel_factory.problems import rmsnorm_bwd as mod
    device = Device(0)
    device.set_current()
    seen = {}
    for name in ("cluster2_smem_dw", "cluster4_na_cs", "cluster8_1024", "ring2_cluster16", "ring4_cluster16_kv2",
                 "ring_row_c16", "ring_row_c16_cta2", "ring_row_c16_warps"):
        g, cubins = built[name]
        m = module(cubins["bfloat16"])
        p = mod.plan(g, 8192, 262144, "bfloat16")
        m.allow_shared("", p.shared_bytes)
        m.allow_cluster("", (p.cluster, 1, 1))
        cfg = LaunchConfig(grid=(p.slots, 1, 1), block=(int(g["threads"]), 1, 1), shmem_size=p.shared_bytes,
                           cluster=(p.cluster, 1, 1))
        fits = m.kernel("").occupancy.max_active_clusters(cfg, stream=device.default_stream)
        seen[name] = (p.cluster, p.slots, fits)
    print(seen)
    assert all(slots <= fits for _, slots, fits in seen.values()), seen
