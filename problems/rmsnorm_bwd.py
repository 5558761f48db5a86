"""RMSNorm backward: dx and dw of y = x * rstd * w, given dy and the forward pass's rstd, with fp32 accumulation.

Declares the reference, the input generator, the shape sets (the public 11-row benchmark matrix, odd shapes for
correctness, model widths held out), tolerances, baselines, and the two-kernel template with its gene space and its
launch plan: a persistent main kernel that leaves fp32 dw partials in a scratch output, then a column reduction.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ..evo.compiled import compiled_for
from ..evo.protocols import Launch, MissingBaseline, launch_from_recipe
from ..evo.types import Case, Gene, GeneSpace, GeneValue
from ..evo.workload import Workload
from ..kernels import templates
from .rmsnorm_fwd import PEERS
from .rmsnorm_bwd_plan import (  # noqa: F401  (re-exported: tests and tools read them here)
    COLS_CTAS, COLS_GROUP, COLS_ROWS, COLS_THREADS, DIRECT_ROWS, DTYPE_BYTES, DW_THREADS, EPS, MAX_SMEM_PER_CTA,
    MAX_STATIC_SMEM, MIN_RING_THREADS_PER_SM, MAX_CTAS_PER_SM, MAX_ROWS_PER_CTA, MIN_THREADS_PER_SM, PLAN_DW_GLOBAL,
    PLAN_DW_SMEM, PLAN_DW_WARP, PLAN_NARROW, PLAN_PEEL, PLAN_VECTOR, RESIDENT_CLUSTERS, SCRATCH_BYTES, SCRATCH_ROWS,
    SCRATCH_SPARE, SLOT_ROWS,
    SMEM_PER_SM, SMEM_SLACK, SMS, SUBWARP_TPR, THREADS_PER_SM, Plan, plan, recipe, register_limit, registers,
    ring_bytes, scratch_rows, static_smem)


def _rule(g: Mapping[str, GeneValue]) -> str | None:
    """Reject genomes that cannot compile or launch (or would spill), and combinations that cannot pay off, before
    the compiler sees them."""
    threads, rows, cluster = int(g["threads"]), int(g["rows_per_cta"]), int(g["cluster"])
    tpr, per_sm = threads // rows, threads * int(g["ctas_per_sm"])
    if threads % rows or (tpr % 32 and tpr not in SUBWARP_TPR):
        return (f"threads={threads} / rows_per_cta={rows} must give whole warps per row, or "
                f"{'/'.join(map(str, SUBWARP_TPR))} threads per row (sub-warp rows)")
    if per_sm > THREADS_PER_SM:
        return f"{g['ctas_per_sm']} CTAs of {threads} threads exceed the {THREADS_PER_SM} threads of an SM"
    ring = int(g["stages"]) > 0
    if per_sm < (MIN_RING_THREADS_PER_SM if ring else MIN_THREADS_PER_SM):
        return f"{per_sm} threads per SM ({g['ctas_per_sm']} x {threads}) cannot keep a persistent grid busy"
    if rows > 1 and tpr > 128:
        return f"rows of {tpr} threads: a row of more than four warps takes a CTA of its own"
    if cluster > 1 and (rows != 1 or threads < (128 if ring else 512)):
        return (f"cluster={cluster} shares one row among CTAs: needs rows_per_cta=1 and threads >= 512 "
                f"(128 with a ring)")
    if g["cluster_sum"] == "warps" and (cluster == 1 or g["reduce"] != "shfl"):
        return "cluster_sum=warps sends each warp's shuffled sum across a cluster: needs cluster > 1 and reduce=shfl"
    resident = RESIDENT_CLUSTERS.get(cluster, SMS // cluster) * int(g["ctas_per_sm"])
    # Past a direct plan's rows, a grouped plan's slots are at least that many rows / SLOT_ROWS: where those are
    # already all the resident slots, grouping never binds and the genome is small_m=direct under another name.
    direct = DIRECT_ROWS * rows * cluster
    if g["small_m"] == "grouped" and -(-(direct + 1) // (rows * SLOT_ROWS)) >= resident:
        return (f"small_m=grouped changes no plan of cluster={cluster}: past the direct plan's {direct} rows, "
                f"slots of {SLOT_ROWS} rows are already all {resident} resident ones; use small_m=direct")
    if g.get("tail") == "peel" and rows != 1:
        return ("tail=peel keeps each thread's vectors the same in every row it runs only with one row per CTA: "
                f"needs rows_per_cta=1, not {rows}")
    # Calibrated on NVRTC builds of the genomes this rule once removed whole (every limit under 128): with one 8-byte
    # register vector none of 100 spilled (bf16 and fp32; 50 of them in fp16 too); with more, 9 of 10 did.
    if g.get("tail") == "peel" and register_limit(g) < 128 and int(g["reg_vecs"]) * int(g["vec_bytes"]) > 8:
        return (f"tail=peel's second vector path spills under the {register_limit(g)} registers per thread that "
                f"{g['ctas_per_sm']} CTAs of {threads} threads allow, past one 8-byte register vector: needs "
                f"reg_vecs=1 and vec_bytes=8, or at most 512 threads per SM")
    if g["reduce"] == "smem" and tpr <= 32:
        return f"a row of {tpr} threads (one warp or less) sums with shuffles; reduce=smem is for rows of several warps"
    if static_smem(g) > MAX_STATIC_SMEM:
        return f"{static_smem(g)} B of static shared memory exceeds {MAX_STATIC_SMEM} B"
    if int(g["stages"]) and g["prefetch"]:
        return f"stages={g['stages']}: the cp.async ring already loads rows ahead; needs prefetch=False"
    own = static_smem(g) + SMEM_SLACK + ring_bytes(g)
    if int(g["ctas_per_sm"]) * (own + 1024) > SMEM_PER_SM or own > MAX_SMEM_PER_CTA:
        return (f"a ring of {ring_bytes(g)} B per CTA ({g['stages']} stages of {g['reg_vecs']} vectors of "
                f"{g['threads']} threads) leaves no room for {g['ctas_per_sm']} CTAs per SM")
    if registers(g) > register_limit(g):
        return (f"about {registers(g)} registers per thread exceed the {register_limit(g)} that "
                f"{g['ctas_per_sm']} CTAs of {threads} threads allow")
    return None


SPACE = GeneSpace(
    genes=(
        Gene("threads", (128, 256, 512, 1024), 256, doc="threads per CTA"),
        Gene("rows_per_cta", (1, 2, 4, 8, 16, 32, 64), 1,
             doc="rows processed at once by one CTA (threads/rows = 32: warp per row; 16..2: sub-warp rows, a warp "
                 "holds 2..16 rows)"),
        Gene("vec_bytes", (8, 16), 16, doc="bytes per vector load/store of x, dy, dx"),
        Gene("load", ("plain", "nc", "nc_na"), "nc", kind="ptx",
             doc="x and dy: ld.global | ld.global.nc | ld.global.nc.L1::no_allocate"),
        Gene("store", ("plain", "cs"), "plain", kind="ptx", doc="dx: st.global | st.global.cs"),
        Gene("reg_vecs", (1, 2, 4, 8), 2,
             doc="vectors per thread whose x, dy stay on chip (registers, or the ring's slots) and w, dw in registers"),
        Gene("dw_acc", ("regs", "smem"), "regs",
             doc="dw partials of the register vectors in registers | all in shared memory (global when too wide)"),
        Gene("ctas_per_sm", (1, 2, 4), 2, doc="persistent grid: CTAs per SM (also the launch bound's minimum)"),
        Gene("cluster", (1, 2, 4, 8, 16), 1,
             doc="CTAs of a thread-block cluster sharing each row (row sums via DSMEM; 16 is non-portable)"),
        Gene("reduce", ("shfl", "smem"), "shfl", kind="ptx", doc="row sum: shfl.sync.bfly butterfly | smem tree"),
        Gene("cluster_sum", ("cta", "warps"), "cta", kind="ptx",
             doc="a cluster's row sum: the CTA's sum, st.async from thread 0 | every warp's, st.async from a lane per "
                 "CTA, with no CTA barrier and a CTA-scope mbarrier wait"),
        Gene("prefetch", (False, True), True, doc="load the next row's register vectors before this row's reduction"),
        Gene("stages", (0, 2, 3, 4), 0,
             doc="cp.async ring of row slots in shared memory: the register vectors of stages-1 rows ahead in flight"),
        Gene("stream_batch", (1, 2, 4), 1,
             doc="streamed vectors (past the register ones) whose x and dy loads issue together, before their math"),
        Gene("narrow", (False, True), False,
             doc="rows whose N is even but no multiple of the vector: 2-element vectors (4 bytes in bf16 and fp16, "
                 "8 in fp32) instead of one element at a time (no effect where the vector is 2 elements already)"),
        Gene("tail", ("none", "peel"), "none",
             doc="rows whose N is no multiple of the vector: the narrow or one-element path | the vector path with a "
                 "peeled head and tail (one element at a time), the slots a multiple of the rows' alignment period "
                 "(rows_per_cta=1)"),
        Gene("small_m", ("none", "direct", "grouped", "cols"), "none",
             doc="at M up to DIRECT_ROWS per CTA of a slot, one slot runs every row and writes dw itself (one launch, "
                 "no partials) | that, and above it slots of SLOT_ROWS rows at least (fewer partial rows to sum) | "
                 "at M up to COLS_ROWS, two launches that split the columns over the GPU (rmsnorm_bwd_cols.cuh); "
                 "above, the genome's own plan"),
    ),
    rule=_rule,
)


REFERENCE_CHUNK = 2**24   # elements of a row block in reference(): 64 MiB per fp32 temporary

BENCHMARK = ((32768, 256), (32768, 512), (32768, 1024), (32768, 2048), (32768, 4096), (32768, 8192),
             (32768, 16384), (32768, 32768), (32768, 65536), (16384, 131072), (8192, 262144))
# Small and odd: M = 1 and M not a multiple of rows_per_cta; N below a warp, not a multiple of any vector width,
# even but no multiple of a vector (the narrow path: 4100, 1030, 66),
# rows too wide for registers (shared-memory partials) and for shared memory (global partials); M large enough
# that slots loop over many rows and the reduction sums hundreds of partial rows; rows no multiple of a vector run by
# slots of several rows, their partials in shared and in global memory (tail=peel: 600 x 5001, 300 x 30001).
CORRECTNESS = ((1, 256), (1, 7), (3, 1), (5, 33), (17, 760), (7, 1128), (199, 1024), (9, 4100), (64, 2048),
               (3, 20000), (2, 65536), (1, 262144), (5, 3001), (1000, 256), (3000, 40), (33, 1030), (300, 66),
               (600, 5001), (300, 30001))
HELDOUT = ((4096, 2880), (4096, 3584), (4096, 5120), (4096, 7168), (1, 7168))


def _torch():
    import torch
    return torch


class RmsNormBackward:
    name = "rmsnorm_bwd"
    version = "1"
    description = ("RMSNorm backward: with xhat = x * rstd and g = dy * w, dx = rstd * (g - xhat * mean(g * xhat)) "
                   "per row and dw = sum over rows of dy * xhat, fp32 accumulation; x, dy, dx (M, N) in "
                   "bf16/fp16/fp32, w and dw (N,) fp32, rstd (M,) fp32 from the forward pass (eps 1e-6).")
    kernel_name = "rmsnorm_bwd"
    space = SPACE
    dtypes = ("bfloat16", "float16", "float32")
    shape_sets = {"benchmark": BENCHMARK, "correctness": CORRECTNESS, "heldout": HELDOUT}
    # What users run (a workload campaign draws its training and held-out shapes from it): every batch size from
    # M = 1, model widths, powers of two and odd widths up to 262144, inputs up to 2 GiB.
    workload = Workload(dtypes=dtypes)
    baselines = ("torch_eager", "torch_compile", "quack", "quack_tuned", "liger", "int21", "factory_op")
    peers = ("quack", "quack_tuned", "int21")   # the published kernels the targets are set against (best peer)
    declared_peers = PEERS                      # what bench, heldout and gap time by default (the forward's)
    row_outputs = ("dx",)   # outputs split by rows; dw sums over every row (see reference_rows)

    def template(self) -> str:
        return templates.read("rmsnorm_bwd.cu")

    def bytes_moved(self, case: Case) -> int:
        # QuACK's convention: read x and dy, write dx; w and dw once; rstd and the partials not counted.
        m, n = case.shape
        return 3 * m * n * DTYPE_BYTES[case.dtype] + 4 * n

    def tolerance(self, dtype: str) -> tuple[float, float]:
        # rtol: dx's output rounding (half an ulp is 2^-9 in bf16, 2^-12 in fp16 of |dx|). atol: dw is an fp32 sum
        # over M rows of unit-size terms, |dw| ~ sqrt(M); summed in another order than torch's, it differs by up to
        # ~5e-4 at M = 32768 (measured with a CPU emulation of the kernel's order), which rtol * |dw| does not cover
        # where dw is near zero. One dropped row moves dw by |dy * xhat| ~ 1, hundreds of times this bound.
        return {"bfloat16": (2e-3, 8e-3), "float16": (2e-3, 2e-3), "float32": (2e-3, 1e-4)}[dtype]

    def make_inputs(self, case: Case, seed: int, device: str) -> dict[str, Any]:
        torch = _torch()
        m, n = case.shape
        gen = torch.Generator(device=device).manual_seed(seed)
        # Row magnitudes of x spread over 1e-3..1e2 as in the forward (rstd from ~1e-2 to ~700); dy of unit size,
        # so every row weighs alike in dw and a dropped row shows.
        scale = torch.pow(10.0, torch.rand(m, 1, generator=gen, device=device) * 5 - 3)
        dt = getattr(torch, case.dtype)
        x = (torch.randn(m, n, generator=gen, device=device) * scale).to(dt)
        w = torch.randn(n, generator=gen, device=device)
        dy = torch.randn(m, n, generator=gen, device=device).to(dt)
        return {"x": x, "w": w, "dy": dy, "rstd": _rstd(x)}

    def special_inputs(self, case: Case, seed: int, device: str) -> dict[str, Any]:
        """Inputs with planted rows (the gate's fourth launch): x = 0 (so rstd = 1/sqrt(eps)), dy = 0, x of rms
        1e-30 (x^2 underflows in fp32) and x of rms 1e3; dx stays finite in every dtype."""
        inputs = self.make_inputs(case, seed, device)
        for row, (key, rms) in enumerate((("x", 0.0), ("dy", 0.0), ("x", 1e-30), ("x", 1e3))[:case.shape[0]]):
            t = inputs[key]
            f = t[row].float()
            t[row] = (f * (rms / f.square().mean().sqrt().clamp_min(1e-30))).to(t.dtype)
        inputs["rstd"] = _rstd(inputs["x"])
        return inputs

    def make_outputs(self, case: Case, device: str) -> dict[str, Any]:
        torch = _torch()
        m, n = case.shape
        return {"dx": torch.empty(m, n, dtype=getattr(torch, case.dtype), device=device),
                "dw": torch.empty(n, dtype=torch.float32, device=device),
                "dw_partial": torch.empty(scratch_rows(m, n), n, dtype=torch.float32, device=device),
                # small_m=cols (its plan runs at M <= COLS_ROWS): each row's partial dot per chunk of columns, and
                # each group of COLS_GROUP rows' partial dw
                "dot": torch.empty(max(1, min(m, COLS_ROWS)), COLS_CTAS, dtype=torch.float32, device=device),
                "dwp": torch.empty(-(-max(1, min(m, COLS_ROWS)) // COLS_GROUP), n, dtype=torch.float32,
                                   device=device)}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        """dx in fp32 and dw, computed a block of rows at a time: at 16384 x 131072 the whole-tensor fp32
        temporaries came to about 50 GiB and ran an 80 GB H100 out of memory inside the gate."""
        torch = _torch()
        x, dy, rstd, w = inputs["x"], inputs["dy"], inputs["rstd"], inputs["w"]
        m, n = x.shape
        dx = torch.empty(m, n, dtype=torch.float32, device=x.device)
        dw = torch.zeros(n, dtype=torch.float32, device=x.device)
        step = max(1, REFERENCE_CHUNK // max(n, 1))
        for i in range(0, m, step):
            xhat = x[i:i + step].float() * rstd[i:i + step, None]
            dyf = dy[i:i + step].float()
            g = dyf * w
            c = (g * xhat).mean(dim=-1, keepdim=True)
            dx[i:i + step] = (g - xhat * c) * rstd[i:i + step, None]
            dw += (dyf * xhat).sum(dim=0)
        return {"dx": dx, "dw": dw}

    def reference_rows(self, inputs: Mapping[str, Any], rows: Any) -> dict[str, Any]:
        """For checking a timed output cheaply: dx at the given rows (a LongTensor), dw in full (summed in chunks of
        rows, so that memory stays bounded at the widest benchmark rows)."""
        pick = {k: inputs[k].index_select(0, rows) for k in ("x", "dy", "rstd")}
        x, dy, rstd = inputs["x"], inputs["dy"], inputs["rstd"]
        dw = sum((dy[i:i + 1024].float() * x[i:i + 1024].float() * rstd[i:i + 1024, None]).sum(dim=0)
                 for i in range(0, x.shape[0], 1024))
        return {"dx": self.reference({**pick, "w": inputs["w"]})["dx"], "dw": dw}

    def expected_sass(self, genes: Mapping[str, GeneValue], dtype: str) -> list[tuple[str, bool, str]]:
        """Opcode prefixes a binary of these genes must (True) or must not (False) contain: the PTX choices."""
        return [("LDG.E.NA", genes["load"] == "nc_na", "load=nc_na is ld.global.nc.L1::no_allocate"),
                ("STG.E.EF", genes["store"] == "cs", "store=cs is st.global.cs"),
                ("SHFL.BFLY", genes["reduce"] == "shfl", "reduce=shfl is shfl.sync.bfly"),
                ("UCGABAR", int(genes["cluster"]) > 1, "cluster>1 syncs with barrier.cluster"),
                ("LDGSTS", int(genes["stages"]) > 0, "stages>0 copies rows ahead with cp.async")]

    def recipe(self, genes: Mapping[str, GeneValue], dtype: str) -> dict[str, Any]:
        return recipe(genes, dtype)

    def launch(self, genes: Mapping[str, GeneValue], case: Case, inputs: Mapping[str, Any],
               outputs: Mapping[str, Any]) -> tuple[Launch, ...]:
        return launch_from_recipe(recipe(genes, case.dtype), case, {**inputs, **outputs})

    def baseline(self, name: str, case: Case, inputs: Mapping[str, Any]) -> Callable[[], Mapping[str, Any]]:
        torch = _torch()
        x, w, dy, rstd = inputs["x"], inputs["w"], inputs["dy"], inputs["rstd"]
        n = case.shape[1]
        if name == "torch_eager":
            # Weight in x's dtype (torch's fused kernels need matching dtypes). The forward runs once here; each
            # call replays only the backward graph.
            xr, wr = x.detach().requires_grad_(True), w.detach().to(x.dtype).requires_grad_(True)
            y = torch.nn.functional.rms_norm(xr, (n,), wr, EPS)
            return lambda: dict(zip(("dx", "dw"), torch.autograd.grad(y, (xr, wr), dy, retain_graph=True)))
        if name == "torch_compile":
            # Compiled per case, and every call checked to have run the compiled graph (evo/compiled.py).
            fn = compiled_for(_compiled_backward, f"{case.key}@{x.device}")
            return lambda: dict(zip(("dx", "dw"), fn(x, w, dy, rstd)))
        if name in ("quack", "quack_tuned"):
            return _quack(name, x, w, dy, rstd)
        if name == "liger":
            try:
                from liger_kernel.ops.rms_norm import rms_norm_backward, rms_norm_forward
            except ImportError as exc:
                raise MissingBaseline(f"liger-kernel is not installed ({exc})") from exc
            # Liger takes its own forward's rstd and launch shape; in_place=False leaves dy alone.
            _, _, rstd_l, block, warps, mode = rms_norm_forward(x, w, EPS, 0.0, "llama", None)
            return lambda: dict(zip(("dx", "dw"), rms_norm_backward(dy, x, w, rstd_l, 0.0, mode, block, warps,
                                                                    False, None)))
        if name == "int21":
            try:
                import rmsnorm as int21   # INT21 RMSNorm-H100 (pip name rmsnorm-h100; JIT-builds on first call)
            except ImportError as exc:
                raise MissingBaseline(f"INT21 RMSNorm-H100 (module rmsnorm) is not installed ({exc})") from exc
            if not hasattr(int21, "rmsnorm_bwd_ref"):
                raise MissingBaseline(f"module rmsnorm at {getattr(int21, '__file__', '?')} is not INT21's")
            return lambda: dict(zip(("dx", "dw"), int21.rmsnorm_bwd(x, w, dy, rstd)[:2]))
        if name == "factory_op":   # this project's exported library op (kernels/rmsnorm.py), for bench --op
            from ..kernels import rmsnorm as op
            return lambda: dict(zip(("dx", "dw"), op.rmsnorm_bwd(x, w, dy, rstd)[:2]))
        raise MissingBaseline(f"unknown baseline {name!r}; this problem has {', '.join(self.baselines)}")


def _rstd(x):
    torch = _torch()
    return torch.rsqrt(x.float().square().mean(dim=-1) + EPS)


def _compiled_backward(x, w, dy, rstd):
    xhat = x.float() * rstd[:, None]
    dyf = dy.float()
    g = dyf * w
    dx = (g - xhat * (g * xhat).mean(dim=-1, keepdim=True)) * rstd[:, None]
    return dx.to(x.dtype), (dyf * xhat).sum(dim=0)


def _quack(name: str, x, w, dy, rstd) -> Callable[[], Mapping[str, Any]]:
    """QuACK's heuristic entry point, or its autotuned one (tuned on the first call, made here so that a shape the
    tuner cannot serve is a MissingBaseline rather than a failure inside a timing loop)."""
    import importlib
    torch = _torch()
    try:   # by module name: `import quack.rmsnorm as qr` binds the package's rmsnorm function, not the module
        qr = importlib.import_module("quack.rmsnorm")
    except ImportError as exc:
        raise MissingBaseline(f"quack is not installed ({exc})") from exc
    if name == "quack":
        return lambda: dict(zip(("dx", "dw"), qr.rmsnorm_bwd(x, w, dy, rstd)[:2]))
    if not hasattr(qr, "rmsnorm_bwd_tuned") or not hasattr(qr, "get_sm_count"):
        raise MissingBaseline("this quack has no rmsnorm_bwd_tuned")
    dx = torch.empty_like(x)
    partial = torch.empty(qr.get_sm_count(x.shape[1], x.device), x.shape[1], dtype=torch.float32, device=x.device)

    def run() -> dict[str, Any]:
        qr.rmsnorm_bwd_tuned(x, w, dy, rstd, dx, partial, has_dw_partial=True)
        return {"dx": dx, "dw": partial.sum(dim=0)}
    try:
        run()
    except Exception as exc:   # e.g. the tuner's pick needs more shared memory than sm_90 has (N >= 16384)
        raise MissingBaseline(f"quack's rmsnorm_bwd_tuned fails here: {type(exc).__name__}: {exc}"[:500]) from exc
    return run


problem = RmsNormBackward()
