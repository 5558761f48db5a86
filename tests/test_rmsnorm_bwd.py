"""The RMSNorm backward problem on the CPU: its reference against autograd, tolerances that admit another summation
order but not a dropped row, launch plans (grid, scratch, shared memory) and the rows and columns they cover, the
gene rule, NVRTC builds of sampled genomes in every dtype, and every gene value's mark in the SASS."""
import math
import random

import numpy as np
import pytest
import torch

from kernel_factory.evo import registry
from kernel_factory.evo.evaluate import measure, render, sass
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler, compile_one, parse_ptxas
from kernel_factory.evo.protocols import Launch, MissingBaseline
from kernel_factory.evo.types import Candidate, Case, Genome
from kernel_factory.problems import rmsnorm_bwd as mod

P = mod.problem
DEFAULT = P.space.defaults()
# Genomes that between them take every gene value (each one feasible; checked below).
SPREAD = [dict(), dict(threads=128, rows_per_cta=2, ctas_per_sm=4, reg_vecs=1, vec_bytes=8, small_m="grouped",
               narrow=True),
          dict(threads=256, rows_per_cta=8, ctas_per_sm=4, reg_vecs=1, prefetch=False, load="plain", dw_acc="smem",
               small_m="direct"),
          dict(threads=512, cluster=4, ctas_per_sm=1, reg_vecs=4, vec_bytes=8, load="nc_na", store="cs"),
          dict(threads=1024, cluster=8, ctas_per_sm=1, reg_vecs=1, dw_acc="smem", reduce="smem", prefetch=False),
          dict(threads=512, cluster=2, ctas_per_sm=1, reg_vecs=2, dw_acc="smem", prefetch=False),
          dict(threads=512, rows_per_cta=4, ctas_per_sm=1, reg_vecs=4, vec_bytes=8, reduce="smem"),
          dict(threads=512, cluster=16, ctas_per_sm=1, reg_vecs=4, stages=2, prefetch=False, dw_acc="smem"),
          dict(threads=256, ctas_per_sm=2, reg_vecs=2, stages=3, prefetch=False),
          dict(threads=512, cluster=8, ctas_per_sm=1, reg_vecs=2, stages=4, prefetch=False, vec_bytes=8),
          dict(threads=256, cluster=16, ctas_per_sm=1, reg_vecs=8, stages=2, prefetch=False, cluster_sum="warps"),
          dict(threads=128, cluster=2, ctas_per_sm=1, reg_vecs=8, stages=3, prefetch=False, dw_acc="smem"),
          dict(threads=512, cluster=16, ctas_per_sm=1, reg_vecs=1, prefetch=False, dw_acc="smem",
               cluster_sum="warps", stream_batch=4),
          dict(threads=256, cluster=8, ctas_per_sm=2, reg_vecs=1, stages=2, prefetch=False, dw_acc="smem",
               stream_batch=2),
          # sub-warp rows (tests/test_rmsnorm_bwd_subwarp.py has more): 2 and 8 threads a row, rows_per_cta 16 to 64
          dict(threads=128, rows_per_cta=64, ctas_per_sm=4, reg_vecs=1, vec_bytes=8),
          dict(threads=256, rows_per_cta=32, ctas_per_sm=2, stages=2, prefetch=False),
          dict(threads=128, rows_per_cta=16, ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem",
               stream_batch=2, small_m="direct"),
          # 16 or 32 rows of a warp or more per CTA: their global partials once wrote past the scratch at M <= 5
          *(dict(threads=t, rows_per_cta=r, ctas_per_sm=1, reg_vecs=1, prefetch=False, vec_bytes=8, small_m=m)
            for t, r, m in ((512, 16, "grouped"), (1024, 16, "grouped"), (1024, 32, "none")))]


def genes(**kw):
    g = {**DEFAULT, **kw}
    assert P.space.why_infeasible(g) is None, (kw, P.space.why_infeasible(g))
    return g


def every_case():
    return [(shape, dt) for dt in P.dtypes for s in ("benchmark", "correctness", "heldout") for shape in P.shape_sets[s]]


# ---- registration, shapes, space ------------------------------------------------------------------------------
def test_registered_with_the_public_matrix():
    assert registry.load("problem", "rmsnorm_bwd") is P and P.name == P.kernel_name == "rmsnorm_bwd"
    assert P.shape_sets["benchmark"][:9] == tuple((32768, 1 << k) for k in range(8, 17))
    assert P.shape_sets["benchmark"][9:] == ((16384, 131072), (8192, 262144))
    odd = P.shape_sets["correctness"]
    assert min(m for m, _ in odd) == 1 and min(n for _, n in odd) < 32 and any(n % 2 for _, n in odd)
    assert {33, 760, 1128, 4100, 262144} <= {n for _, n in odd}
    assert P.shape_sets["heldout"] == ((4096, 2880), (4096, 3584), (4096, 5120), (4096, 7168), (1, 7168))
    assert P.bytes_moved(Case((32768, 4096), "bfloat16")) == 3 * 32768 * 4096 * 2 + 4 * 4096
    assert P.baselines[0] == "torch_eager" and mod.EPS == 1e-6


def test_space_is_tens_of_thousands_and_every_value_is_reachable():
    feasible = list(P.space.enumerate())
    # small_m (a launch plan, one kernel) made it ~2.7x, narrow 2x
    assert 300 <= len(feasible) <= 600000, len(feasible)
    for gene in P.space.genes:
        assert {g[gene.name] for g in feasible} == set(gene.choices), gene.name
    taken = {(k, genes(**kw)[k]) for kw in SPREAD for k in DEFAULT}
    assert taken >= {(g.name, c) for g in P.space.genes for c in g.choices}, "SPREAD must take every gene value"


@pytest.mark.parametrize("kw, words", [
    (dict(threads=512, rows_per_cta=64, reduce="smem"), "shuffles"),
    (dict(threads=1024, ctas_per_sm=4), "threads of an SM"),
    (dict(threads=128, ctas_per_sm=2), "persistent grid busy"), (dict(threads=512, rows_per_cta=2), "CTA of its own"),
    (dict(cluster=2, threads=512, rows_per_cta=4), "rows_per_cta=1"),
    (dict(cluster=4, threads=256), "threads >= 512"),
    (dict(cluster=4, threads=128, ctas_per_sm=4, stages=2, prefetch=False, reg_vecs=1, rows_per_cta=4),
     "rows_per_cta=1"),
    (dict(threads=128, ctas_per_sm=1, reg_vecs=1), "persistent grid busy"),   # a ring would allow 4 warps per SM
    (dict(threads=256, ctas_per_sm=2, reg_vecs=8, prefetch=False), "registers"),
    (dict(threads=256, ctas_per_sm=2, reg_vecs=8, stages=2, prefetch=False, vec_bytes=8), "registers"),
    (dict(threads=256, rows_per_cta=8, reduce="smem"), "shuffles"),
    (dict(threads=1024, ctas_per_sm=1, reg_vecs=4), "registers"),
    (dict(threads=256, ctas_per_sm=4, reg_vecs=1, prefetch=True), "registers"),
    (dict(stages=2, prefetch=True), "needs prefetch=False"),
    (dict(cluster_sum="warps"), "needs cluster > 1"),
    (dict(threads=512, cluster=2, ctas_per_sm=1, reduce="smem", cluster_sum="warps"), "reduce=shfl"),
    (dict(threads=512, ctas_per_sm=2, reg_vecs=2, stages=4, prefetch=False), "no room for 2 CTAs per SM"),
    (dict(threads=1024, cluster=16, ctas_per_sm=1, reg_vecs=4, stages=4, prefetch=False), "no room"),
])
def test_rule_rejects_with_a_reason(kw, words):
    reason = P.space.why_infeasible({**DEFAULT, **kw})
    assert reason and words in reason, reason


# ---- reference, inputs, tolerances ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", P.dtypes)
@pytest.mark.parametrize("shape", [(1, 7), (5, 33), (17, 760), (9, 1128)])
def test_reference_is_the_gradient_of_rmsnorm(shape, dtype):
    inputs = P.make_inputs(Case(shape, dtype), 3, "cpu")
    x = inputs["x"].double().requires_grad_(True)
    w = inputs["w"].double().requires_grad_(True)
    y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + mod.EPS) * w
    dx, dw = torch.autograd.grad(y, (x, w), inputs["dy"].double())
    ref = P.reference(inputs)
    assert ref["dx"].dtype == ref["dw"].dtype == torch.float32
    assert torch.allclose(ref["dx"].double(), dx, rtol=1e-4, atol=1e-5 * float(dx.abs().max()))
    assert torch.allclose(ref["dw"].double(), dw, rtol=1e-4, atol=1e-5 * float(dw.abs().max()))
    rstd = torch.rsqrt(inputs["x"].float().square().mean(-1) + mod.EPS)
    assert torch.equal(inputs["rstd"], rstd) and inputs["w"].dtype == torch.float32


def kernel_order(inputs, slots, dtype):
    """dx and dw summed in the kernel's order: the row sum in 32 interleaved pieces, dw per slot then over slots."""
    xf, dyf, w, r = inputs["x"].float(), inputs["dy"].float(), inputs["w"], inputs["rstd"][:, None]
    m, n = xf.shape
    s = sum((dyf * w * xf)[:, i::32].sum(-1, keepdim=True) for i in range(32))
    c = r * (s / n)
    xhat = xf * r
    dx = (r * (dyf * w - xhat * c)).to(getattr(torch, dtype))
    terms = torch.cat([dyf * xhat, torch.zeros(-m % slots, n)]).view(-1, slots, n)
    partial = torch.zeros(slots, n)
    for i in range(terms.shape[0]):
        partial += terms[i]
    dw = torch.zeros(n)
    for p in range(slots):
        dw += partial[p]
    return {"dx": dx, "dw": dw}


@pytest.mark.parametrize("dtype", P.dtypes)
def test_tolerance_admits_another_order_but_not_a_dropped_row(dtype):
    inputs = P.make_inputs(Case((8192, 256), dtype), 5, "cpu")
    ref, atol, rtol = P.reference(inputs), *P.tolerance(dtype)
    got = kernel_order(inputs, 264, dtype)
    for name in ref:
        assert measure.mismatch(got[name], ref[name], atol, rtol, name) is None
    dropped = dict(inputs, dy=inputs["dy"].clone())
    dropped["dy"][4321] = 0
    assert measure.mismatch(kernel_order(dropped, 264, dtype)["dw"], ref["dw"], atol, rtol, "dw") is not None
    assert measure.mismatch((got["dx"].float() * 1.02), ref["dx"], atol, rtol, "dx") is not None


def test_inputs_special_rows_and_sampled_reference():
    case = Case((6, 200), "float16")
    a, b = P.make_inputs(case, 1, "cpu"), P.make_inputs(case, 1, "cpu")
    assert all(torch.equal(a[k], b[k]) for k in a) and not torch.equal(a["x"], P.make_inputs(case, 2, "cpu")["x"])
    special = P.special_inputs(case, 1, "cpu")
    assert not special["x"][0].any() and not special["dy"][1].any()
    assert float(special["rstd"][0]) == pytest.approx(1 / math.sqrt(mod.EPS), rel=1e-6)
    ref = P.reference(special)
    assert all(torch.isfinite(v).all() for v in ref.values()) and float(ref["dx"].abs().max()) < 65504
    rows = torch.tensor([0, 3, 5])
    sub = P.reference_rows(a, rows)
    full = P.reference(a)
    assert torch.allclose(sub["dx"], full["dx"][rows]) and torch.allclose(sub["dw"], full["dw"], rtol=1e-5, atol=1e-5)


def test_baselines_fail_as_values_here():
    case = Case((4, 64), "float32")
    inputs = P.make_inputs(case, 0, "cpu")
    with pytest.raises(MissingBaseline):
        P.baseline("nope", case, inputs)
    eager = P.baseline("torch_eager", case, inputs)()
    ref = P.reference(inputs)
    assert torch.allclose(eager["dx"], ref["dx"], rtol=1e-4, atol=1e-4)
    assert torch.allclose(eager["dw"], ref["dw"], rtol=1e-4, atol=1e-4)
    dx, dw = mod._compiled_backward(inputs["x"], inputs["w"], inputs["dy"], inputs["rstd"])
    assert torch.allclose(dx, ref["dx"], rtol=1e-5, atol=1e-5) and torch.allclose(dw, ref["dw"], rtol=1e-5, atol=1e-5)
    for name in ("quack", "quack_tuned", "liger", "int21"):
        try:
            P.baseline(name, case, inputs)
        except MissingBaseline:
            pass
        except Exception as exc:   # an installed peer refusing CPU tensors is fine too; a crash in our code is not
            assert not isinstance(exc, (NameError, AttributeError, SyntaxError)), exc


# ---- launch plans ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kw", SPREAD)
def test_plans_stay_within_grid_scratch_and_shared_memory(kw):
    g = genes(**kw)
    rows, cluster, threads = int(g["rows_per_cta"]), int(g["cluster"]), int(g["threads"])
    for (m, n), dtype in every_case():
        p, label = mod.plan(g, m, n, dtype), f"{kw} {m}x{n} {dtype}"
        width = int(g["vec_bytes"]) // mod.DTYPE_BYTES[dtype]
        assert bool(p.flags & mod.PLAN_VECTOR) == (n % width == 0), label
        assert 1 <= p.slots <= min(-(-m // rows), mod.SMS * int(g["ctas_per_sm"]) // cluster), label
        assert p.grid == p.slots * cluster, label
        # the template writes partial row `slot`, or `slot * rows_per_cta + group` with global partials (sub-warp
        # rows: only for the groups that start within M)
        group_rows = p.slots * rows if threads // rows >= 32 else min(p.slots * rows, m)
        assert p.partial_rows == (group_rows if p.flags & mod.PLAN_DW_GLOBAL else p.slots), label
        assert p.partial_rows <= mod.scratch_rows(m, n), label
        assert mod.scratch_rows(m, n) * n * 4 <= max(mod.SCRATCH_BYTES, mod.MAX_ROWS_PER_CTA * n * 4), label
        assert mod.static_smem(g) + mod.SMEM_SLACK + p.shared_bytes <= 227 * 1024, label
        dw_bytes = p.shared_bytes - mod.ring_bytes(g)   # the ring comes first, then any dw partials
        assert dw_bytes >= 0 and (dw_bytes > 0) == bool(p.flags & mod.PLAN_DW_SMEM), label
        if cluster in mod.RESIDENT_CLUSTERS:
            assert p.slots <= mod.RESIDENT_CLUSTERS[cluster] * int(g["ctas_per_sm"]), label
        narrow = bool(p.flags & mod.PLAN_NARROW)   # 2-element vectors: gene narrow, N even, not the vector path
        assert narrow == (bool(g.get("narrow")) and width > 2 and n % width != 0 and n % 2 == 0), label
        per = width if p.flags & mod.PLAN_VECTOR else 2 if narrow else 1
        vectors = n // per
        if not p.flags & (mod.PLAN_DW_SMEM | mod.PLAN_DW_GLOBAL):   # all partials in registers: they must fit
            assert rows == 1 and g["dw_acc"] == "regs" and vectors <= int(g["reg_vecs"]) * threads * cluster, label
        if p.flags & mod.PLAN_DW_SMEM:   # one region per row group (per warp: sub-warp rows' PLAN_DW_WARP)
            vecs_per_thread = -(-vectors // (threads // rows * cluster))
            regions = threads // 32 if p.flags & mod.PLAN_DW_WARP else rows
            assert dw_bytes == regions * vecs_per_thread * per * (threads // rows) * 4, label
        assert p.dw_qx in (1, 2, 4, 8) and p.dw_width in (1, 4), label
        assert (p.dw_grid - 1) * p.dw_qx * p.dw_width < n <= p.dw_grid * p.dw_qx * p.dw_width, label


def test_plans_pick_registers_shared_or_global_partials():
    regs, smem, glob = mod.PLAN_VECTOR, mod.PLAN_VECTOR | mod.PLAN_DW_SMEM, mod.PLAN_VECTOR | mod.PLAN_DW_GLOBAL
    d = mod.plan(DEFAULT, 32768, 4096, "bfloat16")   # 256 threads x 8 elements x 2 slots cover 4096
    assert d.flags == regs and d.shared_bytes == 0 and d.slots == mod.SMS * 2 and d.partial_rows == d.slots
    assert mod.plan(DEFAULT, 32768, 8192, "bfloat16").flags == smem
    assert mod.plan(DEFAULT, 32768, 8192, "bfloat16").shared_bytes == 8192 * 4
    wide = mod.plan(DEFAULT, 8192, 262144, "bfloat16")
    assert wide.flags == glob and wide.partial_rows == wide.slots
    warp_rows = mod.plan(genes(threads=256, rows_per_cta=8, ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem"),
                         3000, 40, "bfloat16")
    assert warp_rows.flags == smem and warp_rows.shared_bytes == 8 * 1 * 8 * 32 * 4
    big = genes(threads=1024, cluster=8, ctas_per_sm=1, reg_vecs=1, dw_acc="smem", reduce="smem", prefetch=False)
    p = mod.plan(big, 8192, 262144, "bfloat16")
    assert p.flags == smem and p.shared_bytes == 4 * 8 * 1024 * 4 and p.slots == 15 and p.grid == 120
    g = genes(threads=256, rows_per_cta=8, ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem")
    p = mod.plan(g, 8192, 262144, "bfloat16")
    assert p.flags == glob and p.slots == 32 and p.partial_rows == 256 == mod.scratch_rows(8192, 262144)
    # a whole row of 262144 on chip: 16 CTAs x 256 threads x 8 vectors, through a ring of two row slots
    whole = genes(threads=256, cluster=16, ctas_per_sm=1, reg_vecs=8, stages=2, prefetch=False)
    p = mod.plan(whole, 8192, 262144, "bfloat16")
    assert p.flags == regs and p.shared_bytes == 2 * 8 * 2 * 256 * 16 and p.slots == 7
    # dw partials in shared memory only where ctas_per_sm CTAs still fit on an SM (else a second wave)
    two = genes(threads=256, cluster=16, ctas_per_sm=2, reg_vecs=4, stages=2, prefetch=False, dw_acc="smem")
    fits, over = mod.plan(two, 16384, 131072, "bfloat16"), mod.plan(two, 8192, 262144, "bfloat16")
    assert fits.flags == smem and 2 * (fits.shared_bytes + 2048) <= mod.SMEM_PER_SM
    assert over.flags == glob and over.shared_bytes == mod.ring_bytes(two) and over.slots == 14
    assert mod.plan(DEFAULT, 5, 33, "bfloat16").flags & mod.PLAN_VECTOR == 0
    assert mod.plan(DEFAULT, 5, 64, "bfloat16", aligned=False).flags & mod.PLAN_VECTOR == 0


@pytest.mark.parametrize("kw", [SPREAD[0], SPREAD[3]])
def test_launch_returns_both_kernels_with_typed_arguments(kw):
    g = genes(**kw)
    case = Case((17, 760), "bfloat16")
    inputs, outputs = P.make_inputs(case, 0, "cpu"), P.make_outputs(case, "cpu")
    assert outputs["dw_partial"].shape == (mod.scratch_rows(17, 760), 760) and set(P.reference(inputs)) < set(outputs)
    main, reduce = P.launch(g, case, inputs, outputs)
    assert isinstance(main, Launch) and isinstance(reduce, Launch)
    assert (main.kernel, reduce.kernel) == ("rmsnorm_bwd", "rmsnorm_bwd_dw")
    assert main.kernel in P.template() and reduce.kernel in P.template()
    p = mod.plan(g, 17, 760, "bfloat16")
    assert main.grid == (p.grid, 1, 1) and main.block == (int(g["threads"]), 1, 1)
    assert main.cluster == ((int(g["cluster"]), 1, 1) if int(g["cluster"]) > 1 else None)
    assert main.shared_bytes == p.shared_bytes and reduce.block == (mod.DW_THREADS, 1, 1)
    assert int(main.args[-2]) == p.slots and int(main.args[-1]) == p.flags and int(reduce.args[2]) == p.partial_rows
    for arg in main.args + reduce.args:
        assert isinstance(arg, (torch.Tensor, np.generic)), f"untyped kernel argument {arg!r}"
    # a misaligned view takes the element-at-a-time path
    shifted = dict(inputs, x=torch.empty(17 * 760 + 1, dtype=torch.bfloat16)[1:].view(17, 760))
    assert int(P.launch(g, case, shifted, outputs)[0].args[-1]) & mod.PLAN_VECTOR == 0


# ---- NVRTC builds and SASS ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """Every SPREAD genome plus 12 random feasible ones, in all three dtypes: (genes, dtype) -> CompileOutput."""
    rng = random.Random(11)
    picks = [genes(**kw) for kw in SPREAD] + rng.sample(list(P.space.enumerate()), 12)
    compiler = Compiler(tmp_path_factory.mktemp("bwd-cache"), workers=2)
    jobs, label = [], {}
    for g in picks:
        for dt in P.dtypes:
            key = compiler.key(render.body(P, Genome.of(g), dt))
            label[key] = (g, dt)
            jobs.append(CompileJob(key, render.render(P, Candidate(Genome.of(g)), dt), f"{dt}.cu"))
    try:
        return [(label[o.key][0], label[o.key][1], o) for o in compiler.compile_many(jobs)]
    finally:
        compiler.close()


def test_sampled_genomes_compile_in_every_dtype_without_spilling(builds):
    assert len(builds) == 3 * (len(SPREAD) + 12)
    for g, dt, out in builds:
        assert out.error is None, f"{g} {dt}:\n{out.error}"
        # ptxas reports the main kernel first (so the factory's build report is about it)
        main = out.info.log.split("Compiling entry function 'rmsnorm_bwd_dw'")[0]
        assert "Compiling entry function 'rmsnorm_bwd'" in main, out.info.log
        report = parse_ptxas(main)
        assert report["spill_stores"] == report["local_bytes"] == 0, f"{g} {dt} spills: {main}"
        assert report["registers"] <= mod.register_limit(g), (g, dt, report)
        assert report.get("shared_bytes", 0) == mod.static_smem(g), (g, dt, report)   # what the plan budgets for
        ops = sass.opcodes(sass.disassemble(out.cubin))
        for prefix, present, why in P.expected_sass(g, dt):
            assert bool(has(ops, prefix)) == present, (g, dt, prefix, why)


def sass_of(dtype="bfloat16", **kw):
    out = compile_one(CompileJob("k", render.render(P, Candidate(Genome.of(genes(**kw))), dtype), "k.cu"))
    assert out.error is None, out.error
    return sass.opcodes(sass.disassemble(out.cubin)), out.info


def has(ops, prefix):
    return sum(n for op, n in ops.items() if op.startswith(prefix))


def test_vector_width_and_load_store_flavours():
    nc, _ = sass_of()
    plain, _ = sass_of(load="plain")
    na, _ = sass_of(load="nc_na")
    cs, _ = sass_of(store="cs")
    narrow, _ = sass_of(vec_bytes=8)
    # x and dy: 16-byte read-only loads; w's float4 loads take that path in every flavour
    assert plain["LDG.E.128"] > 0 and nc["LDG.E.128"] == 0 and nc["LDG.E.128.CONSTANT"] > plain["LDG.E.128.CONSTANT"]
    assert na["LDG.E.NA.128.CONSTANT"] > 0 and not has(nc, "LDG.E.NA")
    assert cs["STG.E.EF.128"] > 0 and not has(nc, "STG.E.EF")
    assert narrow["LDG.E.64.CONSTANT"] > 0 and narrow["STG.E.64"] > nc["STG.E.64"]
    for ops, kw in ((nc, {}), (plain, dict(load="plain")), (na, dict(load="nc_na")), (cs, dict(store="cs"))):
        for prefix, present, why in P.expected_sass(genes(**kw), "bfloat16"):
            assert bool(has(ops, prefix)) == present, (kw, prefix, why)


def test_reduction_cluster_and_row_groups():
    shfl, _ = sass_of(threads=512, ctas_per_sm=1)
    smem, _ = sass_of(threads=512, ctas_per_sm=1, reduce="smem")
    assert has(shfl, "SHFL.BFLY") >= 5 and not has(smem, "SHFL")
    assert smem["BAR.SYNC.DEFER_BLOCKING"] > shfl["BAR.SYNC.DEFER_BLOCKING"], "the tree's barriers"
    cluster, _ = sass_of(threads=512, ctas_per_sm=1, cluster=4)
    # barrier.cluster at start and exit; per row, st.async of the CTA's sum to each CTA completing on its mbarrier
    # (SYNCS arrive with transaction count, STAS, phase-check wait), and no GPU-wide fence inside the row loop
    assert has(cluster, "UCGABAR_ARV") >= 2 and has(cluster, "SYNCS.ARRIVE.TRANS64") and has(cluster, "STAS") >= 4
    assert has(cluster, "SYNCS.PHASECHK.TRANS64") and cluster["MEMBAR.ALL.GPU"] == has(cluster, "UCGABAR_ARV")
    assert not has(shfl, "UCGABAR") and not has(shfl, "STAS") and not has(shfl, "SYNCS")
    # cluster_sum=warps: one st.async per lane (a CTA each), no CTA barrier in the row's sum, and a CTA-scope wait
    # (the cluster-scope acquire invalidates L1 after every row's wait: CCTL.IVALL)
    warps, _ = sass_of(threads=512, ctas_per_sm=1, cluster=4, cluster_sum="warps")
    assert has(warps, "STAS") < has(cluster, "STAS") and has(warps, "SYNCS.PHASECHK.TRANS64")
    assert warps["BAR.SYNC.DEFER_BLOCKING"] < cluster["BAR.SYNC.DEFER_BLOCKING"]
    assert has(warps, "CCTL.IVALL") == has(warps, "UCGABAR_WAIT") < has(cluster, "CCTL.IVALL")
    warp_rows, _ = sass_of(rows_per_cta=8, ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem")
    one_row, _ = sass_of(ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem")
    assert warp_rows["BAR.SYNC.DEFER_BLOCKING"] < one_row["BAR.SYNC.DEFER_BLOCKING"], "a warp's row needs no barrier"


def test_register_slots_prefetch_and_dw_placement():
    counts = [sass_of(threads=512, ctas_per_sm=1, reg_vecs=k, prefetch=False, dw_acc="smem")[0]["LDG.E.128.CONSTANT"]
              for k in (1, 2, 4)]
    assert counts[0] < counts[1] < counts[2], f"each register vector adds its own x, dy and w loads: {counts}"
    once, _ = sass_of(prefetch=False)
    ahead, _ = sass_of(prefetch=True)
    assert ahead["LDG.E.128.CONSTANT"] > once["LDG.E.128.CONSTANT"], "the first row's register vectors load before the loop"
    regs, _ = sass_of(dw_acc="regs")
    shared, _ = sass_of(dw_acc="smem")
    # registers: partials stored straight into the partial row when the slots cover it (smem: always via smem)
    assert regs["STG.E.128"] > shared["STG.E.128"]
    assert has(regs, "REDG") and has(shared, "REDG"), "global partials (red.global.add) stay as the fallback"


def test_streamed_vectors_load_a_batch_before_their_math():
    kw = dict(threads=512, ctas_per_sm=1, reg_vecs=1, prefetch=False, dw_acc="smem")
    one, _ = sass_of(**kw)
    four, _ = sass_of(**kw, stream_batch=4)
    # a batch of four unrolls the x and dy loads of both passes' streamed loops (w's float4 loads come with them)
    assert four["LDG.E.128.CONSTANT"] >= one["LDG.E.128.CONSTANT"] + 2 * 2 * 3, (one, four)
    assert four["BAR.SYNC.DEFER_BLOCKING"] == one["BAR.SYNC.DEFER_BLOCKING"], "no barrier per batch"
    assert mod.registers(genes(**kw, stream_batch=4)) > mod.registers(genes(**kw, stream_batch=2)) > \
        mod.registers(genes(**kw))


def test_ring_copies_rows_ahead_with_cp_async_and_clusters_of_16():
    plain, _ = sass_of(prefetch=False)
    ring, _ = sass_of(prefetch=False, stages=3)
    # x and dy of the register vectors come by LDGSTS (cp.async) into the ring and LDS out of it; no barrier is
    # added (each thread reads its own copies, ordered by cp.async.wait_group: LDGDEPBAR and DEPBAR)
    assert has(ring, "LDGSTS") >= 4 and has(ring, "LDGDEPBAR") and has(ring, "DEPBAR") and has(ring, "LDS")
    assert not has(plain, "LDGSTS") and ring["LDG.E.128.CONSTANT"] < plain["LDG.E.128.CONSTANT"]
    assert ring["BAR.SYNC.DEFER_BLOCKING"] == plain["BAR.SYNC.DEFER_BLOCKING"]
    wide, _ = sass_of(threads=512, cluster=16, ctas_per_sm=1, reg_vecs=4, stages=2, prefetch=False, dw_acc="smem")
    assert has(wide, "UCGABAR_ARV") and has(wide, "STAS") >= 16 and has(wide, "LDGSTS")
    g = genes(threads=512, cluster=16, ctas_per_sm=1, reg_vecs=4, stages=2, prefetch=False, dw_acc="smem")
    p = mod.plan(g, 8192, 262144, "bfloat16")   # 16 CTAs x 512 threads x 4 vectors of 8 cover the row on chip
    assert p.slots == mod.RESIDENT_CLUSTERS[16] and p.grid == 16 * p.slots and p.flags & mod.PLAN_DW_SMEM
    assert p.shared_bytes == mod.ring_bytes(g) + 4 * 262144 // 16 == 2 * 4 * 2 * 512 * 16 + 65536


def test_ctas_per_sm_caps_the_registers():
    two = sass_of(threads=256, ctas_per_sm=2, reg_vecs=1, prefetch=False, dw_acc="smem")[1]
    four = sass_of(threads=256, ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem")[1]
    assert four.registers <= 64 < two.registers <= 128, (four.registers, two.registers)
