"""RMSNorm forward, the seeds' first problem: y = x * rsqrt(mean(x^2) + eps) * w with fp32 accumulation.

Declares the reference, the input generator, the shape sets (the public 11-row benchmark matrix, odd shapes for
correctness, model widths held out), tolerances, baselines and the kernel template with its gene space.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from ..evo.compiled import compiled_for
from ..evo.inputs import plant_special_rows
from ..evo.protocols import Launch, MissingBaseline, Peer, launch_from_recipe, recipe_names
from ..evo.types import Case, Gene, GeneSpace, GeneValue
from ..evo.workload import Workload
from ..kernels import templates

EPS = 1e-6
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MAX_STATIC_SMEM = 48 * 1024
REGS_PER_SM = 65536
# The H200 the factory targets (constants, so that launch plans never query a GPU): its SM count, and sm_90's
# shared memory per SM, per CTA (static + dynamic, opt-in) and reserved by the system for each resident CTA.
SMS = 132
SMEM_PER_SM = 228 * 1024
MAX_SMEM_PER_CTA = 227 * 1024
RESERVED_SMEM_PER_CTA = 1024
SMEM_SLACK = 1024          # static shared memory beyond static_smem()'s count (alignment, compiler extras)
# rstd in every dtype: no absolute slack, 1e-3 relative (rsqrt.approx is good to ~2^-22; fp32 sums of up to 2048
# terms per thread in another order stay far below 1e-4). A kernel that stores 0, or rstd 1% off, fails.
RSTD_TOLERANCE = (0.0, 1e-3)
KEPT_BYTES = 128           # x bytes per thread that keep_x holds in registers (the template's REG_VECS * VEC_BYTES)
SUBWARP_TPR = (2, 4, 8, 16)   # threads per row below a warp: one warp normalizes 32 / TPR rows ("sub-warp rows")


def static_smem(g: Mapping[str, GeneValue]) -> int:
    """Bytes of static shared memory the template declares for these genes (reduction slots, cp.async ring, cluster
    slots, mbarriers)."""
    threads = int(g["threads"])
    smem = 4 * (threads if g["reduce"] == "smem" else threads // 32) * (2 if g["persistent"] else 1)
    if g["load"] == "cp_async":
        smem += (int(g["unroll"]) + 1) * threads * int(g["vec_bytes"])
    if int(g["cluster"]) > 1:
        smem += 4 * int(g["cluster"])
    if g["stage"] == "smem" and g["stage_copy"] == "bulk":
        smem += 8 * int(g["rows_per_cta"])
    return smem


def weight_regs(g: Mapping[str, GeneValue]) -> int:
    """Registers that w_ahead=regs holds per thread: one fp32 weight per kept element, counted for 2-byte dtypes
    (64; fp32 needs 32), since the rule does not know the dtype."""
    return KEPT_BYTES // 2 if g["w_ahead"] == "regs" else 0


def _rule(g: Mapping[str, GeneValue]) -> str | None:
    """Reject genomes that cannot compile or launch, before the compiler sees them, and combinations whose extra
    gene would mean nothing (so that the enumerated space holds no duplicates of that kind)."""
    threads, rows = int(g["threads"]), int(g["rows_per_cta"])
    tpr = threads // rows
    if threads % rows or (tpr % 32 and tpr not in SUBWARP_TPR):
        return (f"threads={threads} / rows_per_cta={rows} must give whole warps per row, or 2, 4, 8 or 16 threads "
                "per row (sub-warp rows)")
    if tpr < 32 and g["stage"] == "smem":
        return (f"sub-warp rows ({tpr} threads per row) are for narrow rows, which registers hold: "
                "needs stage=none")
    if g["stage"] == "none" and g["stage_copy"] != "cp_async":
        return f"stage_copy={g['stage_copy']} only matters with stage=smem; keep the default cp_async"
    if g["stage"] == "smem" and g["load"] == "cp_async":
        return "stage=smem replaces load=cp_async's shared-memory ring; pick a plain, nc or nc_na load"
    if g["stage_copy"] == "bulk" and int(g["vec_bytes"]) != 16:
        return "stage_copy=bulk stages 16-byte vectors: needs vec_bytes=16"
    if int(g["cluster"]) > 1 and rows != 1:
        return f"cluster={g['cluster']} splits one row over the cluster: needs rows_per_cta=1"
    if int(g["cluster"]) > 1 and g["persistent"]:
        return "a cluster normalizes one row per launch slot: persistent needs cluster=1"
    smem = static_smem(g)
    if smem > MAX_STATIC_SMEM:
        return f"{smem} B of static shared memory exceeds {MAX_STATIC_SMEM} B"
    if g["w_ahead"] == "regs" and not g["keep_x"]:
        return "w_ahead=regs loads the weights of the vectors keep_x holds: needs keep_x=True"
    if g["w_ahead"] == "regs" and (threads > 256 or g["persistent"]):
        return ("w_ahead=regs holds 64 more registers per thread (they spill under a launch bound of 512 threads or "
                "a persistent wave): needs threads <= 256 and persistent=False")
    # x kept in registers costs 32 registers, their weights (w_ahead=regs) as many fp32 values as x has elements;
    # each in-flight vector costs vec_bytes/4; ~28 for the rest.
    regs = 28 + (32 if g["keep_x"] else 0) + int(g["unroll"]) * int(g["vec_bytes"]) // 4 + weight_regs(g)
    limit = min(255, REGS_PER_SM // threads)
    if regs > limit:
        return f"about {regs} registers per thread exceed the {limit} that {threads} threads allow"
    return None


SPACE = GeneSpace(
    genes=(
        Gene("threads", (128, 256, 512, 1024), 256, doc="threads per CTA"),
        Gene("rows_per_cta", (1, 2, 4, 8, 16, 32, 64, 128), 1,
             doc="rows normalized at once by one CTA; threads/rows_per_cta threads per row (TPR): whole warps, or "
                 "2..16 (sub-warp rows, several rows per warp, for narrow rows)"),
        Gene("vec_bytes", (8, 16), 16, doc="bytes per vector load/store"),
        Gene("load", ("plain", "nc", "nc_na", "cp_async"), "nc", kind="ptx",
             doc="ld.global | ld.global.nc | ld.global.nc.L1::no_allocate | cp.async into shared memory"),
        Gene("store", ("plain", "cs"), "plain", kind="ptx", doc="st.global | st.global.cs"),
        Gene("keep_x", (False, True), True, doc="keep 128 bytes of x per thread in registers for the second pass"),
        Gene("reduce", ("shfl", "smem"), "shfl", kind="ptx", doc="shfl.sync.bfly butterfly | shared-memory tree"),
        Gene("rsqrt", ("approx", "precise"), "approx", kind="ptx", doc="rsqrt.approx.ftz.f32 | 1/sqrt (IEEE)"),
        Gene("unroll", (1, 2, 4), 2, doc="vectors in flight per thread (cp.async: pipeline depth)"),
        Gene("stage", ("none", "smem"), "none",
             doc="second pass re-reads x from global | from dynamic shared memory filled in the first pass"),
        Gene("stage_copy", ("cp_async", "bulk"), "cp_async", kind="ptx",
             doc="staging copy: cp.async.cg per thread | cp.async.bulk (TMA) with an mbarrier"),
        Gene("cluster", (1, 2, 4, 8, 16), 1,
             doc="CTAs of a thread-block cluster that share one row (sums via DSMEM; 16 is non-portable)"),
        Gene("persistent", (False, True), False, doc="one wave of CTAs loops over the rows (staged: prefetch)"),
        Gene("tail", ("scalar", "peel"), "scalar",
             doc="a row of N not a multiple of the vector, or not vector-aligned: all scalar | vectors, with a scalar "
                 "head up to the first aligned address and a scalar tail (every path: staged, cluster, persistent)"),
        Gene("w_ahead", ("none", "l2", "regs"), "none", kind="ptx",
             doc="the weight is read after the row's sum, one more trip to memory before the stores (rows that are "
                 "few are bound by such trips) | prefetch.global.L2 of the CTA's weight slice before the first pass "
                 "| the kept vectors' weights loaded into registers beside x (needs keep_x)"),
    ),
    rule=_rule,
)


def kept_vectors(g: Mapping[str, GeneValue]) -> int:
    """Vectors of a row (slice) held in registers by all TPR threads together: the template's REG_VECS * TPR."""
    tpr = int(g["threads"]) // int(g["rows_per_cta"])
    return (KEPT_BYTES // int(g["vec_bytes"]) if g["keep_x"] else 0) * tpr


def staged_bytes(g: Mapping[str, GeneValue], n: int, dtype: str) -> int | None:
    """Dynamic shared memory for the staged path (the template's stage_buf: rows_per_cta slices, each less its
    register part), or None where rows of width n take the scalar path (n not a multiple of the vector, tail=scalar).
    With tail=peel a row's vector body is at most floor(n / vec) vectors, whatever its head: sized for that."""
    vec = int(g["vec_bytes"]) // DTYPE_BYTES[dtype]
    if n % vec and g["tail"] != "peel":
        return None
    slice_vecs = -(-(n // vec) // int(g["cluster"]))
    return int(g["rows_per_cta"]) * max(0, slice_vecs - kept_vectors(g)) * int(g["vec_bytes"])


def persistent_ctas_per_sm(g: Mapping[str, GeneValue]) -> int:
    """Resident CTAs per SM of a persistent genome with nothing staged: the template's PERSIST_CTAS (its launch
    bound makes the compiler fit that many by registers), fewer where shared memory allows fewer."""
    return recipe_names(recipe(g, "float32"), 1, 1)["per_sm"]


def recipe(g: Mapping[str, GeneValue], dtype: str) -> dict[str, Any]:
    """The launch recipe (kernels/recipe.py) of these genes in dtype: the CTAs of the grid, the cluster, the dynamic
    shared memory and the `staged` flag the kernel receives (1: stage_buf holds the slice; 0: the unstaged path),
    as expressions of M and N. The factory launches from it, and export writes it beside the cubin for the op."""
    rows, cluster, threads = int(g["rows_per_cta"]), int(g["cluster"]), int(g["threads"])
    vec_bytes = int(g["vec_bytes"])
    vec = vec_bytes // DTYPE_BYTES[dtype]
    fixed = static_smem(g) + SMEM_SLACK
    if g["stage"] == "smem":
        need = ["mul", rows, ["max", 0, ["sub", ["cdiv", ["div", "N", vec], cluster], kept_vectors(g)]], vec_bytes]
        fits: Any = ["le", ["add", fixed, "need"], MAX_SMEM_PER_CTA]
        if g["tail"] != "peel":   # tail=scalar normalizes rows of N not a multiple of the vector on the scalar path
            fits = ["and", ["eq", ["mod", "N", vec], 0], fits]
        let = [["need", need], ["staged", ["if", fits, 1, 0]], ["dynamic", ["if", "staged", "need", 0]]]
    else:
        let = [["staged", 0], ["dynamic", 0]]
    ctas: Any = ["cdiv", "M", rows]
    if g["persistent"]:
        budget = (120 if g["keep_x"] else 56) + int(g["unroll"]) * vec_bytes // 4
        by_regs = min(max(1, REGS_PER_SM // (threads * (-(-budget // 8) * 8))), 2048 // threads)
        by_smem = ["div", SMEM_PER_SM, ["add", fixed + RESERVED_SMEM_PER_CTA, "dynamic"]]
        let.append(["per_sm", ["max", 1, ["min", by_regs, by_smem]]])
        ctas = ["min", ctas, ["mul", SMS, "per_sm"]]
    return {"let": let,
            "steps": [{"kernel": "rmsnorm_fwd", "grid": ["mul", ctas, cluster], "block": threads, "cluster": cluster,
                       "smem": "dynamic",
                       "args": [["ptr", "x"], ["ptr", "w"], ["ptr", "y"], ["ptr", "rstd"], ["i32", "M"],
                                ["i32", "N"], ["f32", "eps"], ["i32", "staged"]]}]}


BENCHMARK = ((32768, 256), (32768, 512), (32768, 1024), (32768, 2048), (32768, 4096), (32768, 8192),
             (32768, 16384), (32768, 32768), (32768, 65536), (16384, 131072), (8192, 262144))
# Small and odd: M = 1 and M not a multiple of rows_per_cta; N below a warp, not a multiple of any vector width,
# and long rows that overflow the register-resident part.
CORRECTNESS = ((1, 256), (1, 7), (3, 1), (5, 33), (17, 760), (7, 1128), (199, 1024), (9, 4100), (64, 2048),
               (3, 20000), (2, 65536), (1, 262144), (5, 3001))
HELDOUT = ((4096, 2880), (4096, 3584), (4096, 5120), (4096, 7168), (1, 7168))


def _torch():
    import torch
    return torch


# The peers every report times beside ours, forward and backward alike: each must load (its module is imported
# before anything is timed) or be left out by name. QuACK's autotuned entry points tune at every new shape, so they
# are timed on the benchmark rows only; held-out and workload shapes get QuACK's heuristic entry points.
PEERS = (Peer("int21", "INT21", "rmsnorm"), Peer("quack", "QuACK", "quack.rmsnorm"),
         Peer("quack_tuned", "QuACK tuned", "quack.rmsnorm", tuned=True),
         Peer("liger", "Liger", "liger_kernel.ops.rms_norm"), Peer("torch_eager", "torch eager"),
         Peer("torch_compile", "torch.compile"))


class RmsNormForward:
    name = "rmsnorm_fwd"
    version = "1"
    description = ("RMSNorm forward: y[i,:] = x[i,:] * rsqrt(mean(x[i,:]^2) + 1e-6) * w, fp32 accumulation; x and y "
                   "(M, N) in bf16/fp16/fp32, w (N,) fp32; rstd (M,) fp32 is stored too.")
    kernel_name = "rmsnorm_fwd"
    space = SPACE
    dtypes = ("bfloat16", "float16", "float32")
    shape_sets = {"benchmark": BENCHMARK, "correctness": CORRECTNESS, "heldout": HELDOUT}
    # What users run (a workload campaign draws its training and held-out shapes from it): every batch size from
    # M = 1, model widths, powers of two and odd widths up to 262144, inputs up to 2 GiB.
    workload = Workload(dtypes=dtypes)
    # torch_eager is the search's default. quack_tuned autotunes per shape at its first call (tens of seconds);
    # int21 is INT21's RMSNorm-H100 (import name `rmsnorm`, JIT-built on first use; a declared peer: see PEERS);
    # factory_op is this project's exported library op (kernels/rmsnorm.py), for `kernel-factory bench --op`.
    baselines = ("torch_eager", "torch_compile", "quack", "quack_tuned", "liger", "int21", "factory_op")
    peers = ("quack", "quack_tuned", "int21")   # the published kernels the targets are set against (best peer)
    declared_peers = PEERS                      # what bench, heldout and gap time by default

    def template(self) -> str:
        return templates.read("rmsnorm_fwd.cu")

    def bytes_moved(self, case: Case) -> int:
        m, n = case.shape
        s = DTYPE_BYTES[case.dtype]
        return m * n * 2 * s + n * 4

    def tolerance(self, dtype: str) -> tuple[float, float]:
        # Output rounding dominates: half an ulp is 2^-9 (bf16), 2^-12 (fp16) of |y|.
        return {"bfloat16": (1e-3, 8e-3), "float16": (1e-4, 2e-3), "float32": (1e-5, 1e-4)}[dtype]

    def output_tolerance(self, name: str, dtype: str) -> tuple[float, float] | None:
        # rstd is an fp32 statistic whatever x's dtype, and the backward consumes it: relative to its own scale
        # (1e-2 on rows of magnitude 1e2, 1e3 on zero rows), never the output dtype's absolute atol.
        return RSTD_TOLERANCE if name == "rstd" else None

    def make_inputs(self, case: Case, seed: int, device: str) -> dict[str, Any]:
        torch = _torch()
        m, n = case.shape
        gen = torch.Generator(device=device).manual_seed(seed)
        # Row magnitudes spread over 1e-3..1e2, so that eps matters on some rows and not on others.
        scale = torch.pow(10.0, torch.rand(m, 1, generator=gen, device=device) * 5 - 3)
        x = (torch.randn(m, n, generator=gen, device=device) * scale).to(getattr(torch, case.dtype))
        w = torch.randn(n, generator=gen, device=device)
        return {"x": x, "w": w}

    def make_outputs(self, case: Case, device: str) -> dict[str, Any]:
        torch = _torch()
        m, n = case.shape
        return {"y": torch.empty(m, n, dtype=getattr(torch, case.dtype), device=device),
                "rstd": torch.empty(m, dtype=torch.float32, device=device)}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        torch = _torch()
        xf = inputs["x"].float()
        rstd = torch.rsqrt(xf.square().mean(dim=-1) + EPS)
        return {"y": xf * rstd[:, None] * inputs["w"].float(), "rstd": rstd}

    def recipe(self, genes: Mapping[str, GeneValue], dtype: str) -> dict[str, Any]:
        return recipe(genes, dtype)

    def launch(self, genes: Mapping[str, GeneValue], case: Case, inputs: Mapping[str, Any],
               outputs: Mapping[str, Any]) -> Launch:
        (step,) = launch_from_recipe(recipe(genes, case.dtype), case, {**inputs, **outputs}, EPS)
        return step

    def expected_sass(self, genes: Mapping[str, GeneValue], dtype: str) -> list[tuple[str, bool, str]]:
        """What each PTX choice must leave in the binary (opcode regex, present?, why); the GPU evaluator flags
        a candidate whose SASS contradicts its genes. tests/test_sass.py checks the same facts on the CPU."""
        width = "128" if genes["vec_bytes"] == 16 else "64"
        out = [(rf"STG\.E(\.EF)?\.{width}", True, f"{genes['vec_bytes']}-byte vector stores"),
               (r"STG\.E\.EF.*", genes["store"] == "cs", "st.global.cs is an evict-first store"),
               (r"SHFL\.BFLY.*", genes["reduce"] == "shfl", "shfl.sync.bfly reduction")]
        if genes["rsqrt"] == "approx":   # (the precise path's IEEE sqrt uses MUFU.RSQ too, so only this way round)
            out.append((r"MUFU\.RSQ.*", True, "rsqrt.approx.ftz.f32"))
        if genes["load"] == "nc_na":
            out.append((r"LDG\.E\.NA\..*", True, "ld.global.nc.L1::no_allocate"))
        if genes["load"] == "cp_async" or genes["stage"] == "smem":
            out.append((r"LDGSTS.*", genes["stage_copy"] == "cp_async", "cp.async into shared memory"))
        if genes["stage"] == "smem" and genes["stage_copy"] == "bulk":
            out.append((r"UBLKCP.*", True, "cp.async.bulk (TMA) staging"))
        out.append((r"UCGABAR_ARV.*", int(genes["cluster"]) > 1, "barrier.cluster across the row's CTAs"))
        out.append((r"CCTL\.E\.PF2", genes["w_ahead"] == "l2", "prefetch.global.L2 of the weight"))
        return out

    def special_inputs(self, case: Case, seed: int, device: str) -> dict[str, Any]:
        """Random inputs with adversarial rows planted in x (zero, huge, tiny, denormal, dtype extremes)."""
        inputs = self.make_inputs(case, seed, device)
        plant_special_rows(inputs["x"], _torch().Generator(device=device).manual_seed(seed ^ 0x5EED))
        return inputs

    def baseline(self, name: str, case: Case, inputs: Mapping[str, Any]) -> Callable[[], Mapping[str, Any]]:
        torch = _torch()
        x, w = inputs["x"], inputs["w"]
        n = case.shape[1]
        if name == "torch_eager":
            # Weight in x's dtype: torch's fused kernel needs matching dtypes (fp32 w falls back to a slow path).
            wx = w.to(x.dtype)
            return lambda: {"y": torch.nn.functional.rms_norm(x, (n,), wx, EPS)}
        if name == "torch_compile":
            # Compiled per case, and every call checked to have run the compiled graph (evo/compiled.py).
            fn = compiled_for(_compiled_reference, f"{case.key}@{x.device}")
            return lambda: {"y": fn(x, w)}
        if name == "quack":
            quack = _peer("quack.rmsnorm", "rmsnorm_fwd")
            return lambda: dict(zip(("y", "rstd"), quack.rmsnorm_fwd(x, w, eps=EPS, store_rstd=True)[::2]))
        if name == "quack_tuned":
            quack = _peer("quack.rmsnorm", "rmsnorm_fwd_tuned")
            y, rstd = torch.empty_like(x), torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
            return lambda: (quack.rmsnorm_fwd_tuned(x, w, y, rstd=rstd, eps=EPS), {"y": y, "rstd": rstd})[1]
        if name == "int21":
            int21 = _peer("rmsnorm", "rmsnorm_fwd")
            # store_rstd=False: INT21's fast kernels do not store rstd (with it, it takes a slower path).
            return lambda: {"y": int21.rmsnorm_fwd(x, w, eps=EPS)[0]}
        if name == "factory_op":
            from ..kernels import rmsnorm as op
            return lambda: dict(zip(("y", "rstd"), op.rmsnorm_fwd(x, w, eps=EPS, store_rstd=True)[::2]))
        if name == "liger":
            try:
                from liger_kernel.ops.rms_norm import rms_norm_forward
            except ImportError as exc:
                raise MissingBaseline(f"liger-kernel is not installed ({exc})") from exc
            return lambda: {"y": rms_norm_forward(x, w, EPS, 0.0, "llama", None)[0]}
        raise MissingBaseline(f"unknown baseline {name!r}; this problem has {', '.join(self.baselines)}")


def _peer(module: str, function: str) -> Any:
    """A peer's module by import name, or MissingBaseline saying what is missing."""
    import importlib
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        raise MissingBaseline(f"{module} is not importable here ({exc})") from exc
    if not hasattr(mod, function):
        raise MissingBaseline(f"{module} has no {function} (another package of that name?)")
    return mod


def _compiled_reference(x, w):
    xf = x.float()
    torch = _torch()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS) * w).to(x.dtype)


problem = RmsNormForward()
