"""The RMSNorm backward's launch plan: the H200's limits as constants, the resources a genome needs (registers,
shared memory), and the launch recipe (kernels/recipe.py) with its evaluation for one case. Apart from the problem
plugin (problems/rmsnorm_bwd.py) so that each stays a size one can read; the plugin re-exports these names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..evo.protocols import recipe_names, recipe_value
from ..evo.types import GeneValue

EPS = 1e-6                 # the forward's eps (rmsnorm_fwd); make_inputs computes rstd with it
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
# The H200 the factory targets, as constants so that launch plans never query a GPU.
SMS = 132
REGS_PER_SM = 65536
THREADS_PER_SM = 2048
MIN_THREADS_PER_SM = 512           # below 16 warps per SM a persistent memory-bound grid starves, unless ...
MIN_RING_THREADS_PER_SM = 128      # ... cp.async keeps the bytes in flight (stages > 0): then 4 warps will do
MAX_SMEM_PER_CTA = 227 * 1024      # sm_90: static + dynamic shared memory of one CTA (dynamic above 48 KB opt-in)
SMEM_PER_SM = 228 * 1024           # sm_90: shared memory of an SM, 1 KB of it reserved per resident CTA
MAX_STATIC_SMEM = 48 * 1024
SMEM_SLACK = 1024                  # static shared memory beyond static_smem()'s count (alignment, compiler extras)
# Scratch: rows of fp32 dw partials. A plan uses at most SMS * max(ctas_per_sm) slots (times rows_per_cta when the
# partials live in global memory, one row per row group), never more rows than M plus its rows per CTA (at least
# SCRATCH_SPARE), and no more than SCRATCH_BYTES of them at very wide N (the plan then launches fewer slots). A case's
# outputs hold enough for any genome: MAX_ROWS_PER_CTA rows of a warp or more (1024 threads / 32) beyond M. Sub-warp
# rows (below) keep within M instead. The bound was once SCRATCH_SPARE for every genome, from before CTAs of 512 and
# 1024 threads: plans of 16 or 32 one-warp rows at M <= 5 wrote past it (the GPU gate's canaries, 2026-12-03);
# recipes of up to SCRATCH_SPARE rows keep it, as every exported kernel was built with it.
MAX_CTAS_PER_SM = 4
MAX_ROWS_PER_CTA = 32
SCRATCH_SPARE = 8
SCRATCH_BYTES = 256 * 2**20
DW_THREADS = 256                   # the template's rmsnorm_bwd_dw block
PLAN_VECTOR, PLAN_DW_SMEM, PLAN_DW_GLOBAL, PLAN_DW_WARP, PLAN_NARROW, PLAN_PEEL = 1, 2, 4, 8, 16, 32   # PLAN_*
BASE_REGS = 28                     # registers besides the slots and one vector's unpacked temporaries
RING_REGS = 16                     # more with a cp.async ring: slot addresses, and both passes' loads from it
PEEL_REGS = 8                      # more with tail=peel: a second vector path, its head and tail (more beside a ring)
PEEL_RING_REGS = 6
# A cluster's CTAs share one GPC, and the H200's GPCs hold different numbers of SMs, so fewer than SMS // cluster
# clusters of 4 or more are resident at once: with one CTA per SM, the driver counts 30 of 4, 15 of 8 and 7 of 16
# (cuOccupancyMaxActiveClusters, tests/gpu). A persistent grid launches no more clusters than are resident (times
# ctas_per_sm, a lower bound when CTAs share SMs): a second wave of the few left over would double the time.
RESIDENT_CLUSTERS = {4: 30, 8: 15, 16: 7}
# Small M (gene small_m). A direct plan's one slot runs every row while the other SMs idle: worth it (it saves the
# second launch and every partial row) up to about this many rows per CTA, a row's share of a cluster counting as
# a row (so up to 8 rows for one CTA, 128 for a cluster of 16). Grouped plans give a slot this many rows at least.
DIRECT_ROWS = 8
SLOT_ROWS = 4
# small_m=cols (kernels/rmsnorm_bwd_cols.cuh): at M up to COLS_ROWS, up to COLS_CTAS chunks of at least a thread's
# worth of columns (COLS_THREADS) split every row; the first launch takes COLS_GROUP rows a CTA.
COLS_ROWS = 64
COLS_THREADS = 256
COLS_CTAS = 2 * SMS
COLS_GROUP = 8
# Sub-warp rows: threads per row below a warp (rows_per_cta above threads / 32), a warp holding 32 / TPR rows. Their
# global partials take a row per (slot, row group) only for the groups that start within M (partial rows 0 .. M-1
# at most), so that rows_per_cta up to 64 fits the scratch of any N up to SCRATCH_BYTES / (4 * 64) = 1M elements.
SUBWARP_TPR = (2, 4, 8, 16)


def registers(g: Mapping[str, GeneValue]) -> int:
    """Registers per thread the genes need, for 2-byte dtypes (the worst case): per register vector, x and dy
    (twice with prefetch), w for the whole kernel and, with dw_acc=regs, the dw partials; plus the unpacked
    temporaries of one vector, x and dy of a streamed batch's other vectors (and addresses), and the ring's extra.
    Calibrated on NVRTC builds: no genome this admits spills."""
    words, elems = int(g["vec_bytes"]) // 4, int(g["vec_bytes"]) // 2
    per_vec = 2 * words * (2 if g["prefetch"] else 1) + elems * (2 if g["dw_acc"] == "regs" else 1)
    sb = int(g["stream_batch"])   # a batch's other vectors, and addresses (more per byte with 8-byte vectors)
    batch = (sb - 1) * (2 * words + elems) + (16 if words == 4 else 24) if sb > 1 else 0
    return (BASE_REGS + 2 * elems + int(g["reg_vecs"]) * per_vec + batch + (RING_REGS if int(g["stages"]) else 0)
            + (PEEL_REGS + (PEEL_RING_REGS if int(g["stages"]) else 0) if g.get("tail") == "peel" else 0))


def register_limit(g: Mapping[str, GeneValue]) -> int:
    """What __launch_bounds__(THREADS, CTAS_PER_SM) leaves per thread (allocated in units of 8)."""
    return min(255, REGS_PER_SM // (int(g["threads"]) * int(g["ctas_per_sm"])) // 8 * 8)


def static_smem(g: Mapping[str, GeneValue]) -> int:
    """Bytes of static shared memory the main kernel declares: two alternating reduction buffers, and with a
    cluster two mbarriers and two rows of CLUSTER exchange slots (per warp with cluster_sum=warps)."""
    threads, cluster, tpr = int(g["threads"]), int(g["cluster"]), int(g["threads"]) // int(g["rows_per_cta"])
    warps = g["cluster_sum"] == "warps"   # every warp's sum crosses the cluster: no CTA step, a slot per warp
    # a one-warp row, or warps pushing their sums across the cluster, shuffle only
    red = threads if g["reduce"] == "smem" else 0 if tpr <= 32 or warps else threads // 32
    return 4 * 2 * red + (16 + 8 * cluster * (threads // 32 if warps else 1) if cluster > 1 else 0)


def ring_bytes(g: Mapping[str, GeneValue]) -> int:
    """Bytes of the cp.async ring (stages > 0): per row slot, x and dy of every thread's register vectors."""
    return int(g["stages"]) * int(g["reg_vecs"]) * 2 * int(g["threads"]) * int(g["vec_bytes"])


def scratch_expr(rows: int) -> list:
    """Rows of dw-partial scratch for plans of at most `rows` rows per CTA, as a recipe expression of M and N."""
    return ["max", rows, ["min", ["add", "M", rows], SMS * MAX_CTAS_PER_SM, ["div", SCRATCH_BYTES, ["mul", 4, "N"]]]]


SCRATCH_ROWS = scratch_expr(MAX_ROWS_PER_CTA)   # the dw-partial scratch of a case's outputs: any plan fits


def scratch_rows(m: int, n: int, rows: int = MAX_ROWS_PER_CTA) -> int:
    """Rows of the dw-partial scratch for an (m, n) case (for plans of at most `rows` rows per CTA)."""
    return recipe_value(scratch_expr(rows), {"M": m, "N": n})


def recipe(g: Mapping[str, GeneValue], dtype: str) -> dict[str, Any]:
    """The launch recipe (kernels/recipe.py): the vector path where N and the pointers allow it (else, with the gene
    narrow, 2-element vectors where N is even, else one element at a time); dw partials in
    registers when the register vectors cover the row (one row group), else in shared memory when it holds them for
    ctas_per_sm CTAs per SM (more would leave CTAs of the persistent grid for a second wave), else in global memory;
    a persistent grid of ctas_per_sm CTAs per SM (fewer when M or the scratch is smaller); then rmsnorm_bwd_dw sums
    the `partial_rows` rows of partials with CTAs that each cover `qx` runs of `dw_width` columns (4: float4 loads;
    1: any N).

    Small M (gene small_m; at "none" the recipe is the one every shipped genome was timed with). At M up to
    DIRECT_ROWS per CTA of a slot, one slot (one CTA, or one cluster that shares each row) runs every row and its
    partial row is dw itself: one launch, no scratch, no second kernel. "grouped" also gives each slot SLOT_ROWS
    rows at least above that, which cuts the partial rows rmsnorm_bwd_dw reads from M to about M / SLOT_ROWS.

    Sub-warp rows (threads / rows_per_cta below 32): shared-memory partials per warp where the register vectors cover
    the row (_by_warp), and global partial rows only for the row groups that start within M (_group_rows); a genome
    of whole-warp rows gets the recipe it always had.

    tail=peel (PLAN_PEEL, see _peel): rows of N > vec elements, not a multiple of vec, with aligned pointers, take the
    vector path with a peeled head and tail; the slots are rounded to a multiple of the vectors' period over rows, so
    that every row a thread runs starts at the same offset from a vector boundary. It takes precedence over narrow,
    and a small_m genome then plans direct only at M = 1 (one slot would run rows of every offset)."""
    threads, rows, cluster = int(g["threads"]), int(g["rows_per_cta"]), int(g["cluster"])
    tpr = threads // rows
    vec_bytes = int(g["vec_bytes"])
    vec = vec_bytes // DTYPE_BYTES[dtype]
    ring = ring_bytes(g)
    aligned = ["and", *(["le", vec_bytes, ["align", t]] for t in ("x", "dy", "dx")),
               *(["le", 16, ["align", t]] for t in ("w", "dw", "dw_partial"))]
    in_regs = g["dw_acc"] == "regs" and rows == 1
    by_warp = g["dw_acc"] == "regs" and tpr < 32   # sub-warp rows: see _by_warp
    resident = RESIDENT_CLUSTERS.get(cluster, SMS // cluster) * int(g["ctas_per_sm"])   # clusters that fit at once
    narrow = bool(g.get("narrow")) and vec > 2
    peel = g.get("tail", "none") == "peel"   # (a genome without it gets the recipe it was exported with)
    wide = ["or", "vector", "peel"] if peel else "vector"   # the vector path, peeled or not
    slots = ["max", 1, ["min", ["cdiv", "M", rows * (SLOT_ROWS if g["small_m"] == "grouped" else 1)], resident, "cap"]]
    let = [
        ["aligned", aligned],
        ["vector", ["and", "aligned", ["eq", ["mod", "N", vec], 0]]],
        *(_peel_let(vec, resident) if peel else []),
        *(_narrow(dtype, vec, peel) if narrow else [["width", ["if", wide, vec, 1]]]),
        ["vecs", ["cdiv", ["div", "N", "width"], tpr * cluster]],
        ["partials", ["mul", "vecs", ["mul", "width", rows * tpr * 4]]],
        *(_by_warp(threads, tpr, int(g["reg_vecs"])) if by_warp else []),
        ["own", ["add", static_smem(g) + SMEM_SLACK + ring, "partials"]],
        ["in_regs", ["and", in_regs, ["le", "vecs", int(g["reg_vecs"])]]],
        ["in_smem", ["and", ["le", "own", MAX_SMEM_PER_CTA],
                     ["le", ["mul", int(g["ctas_per_sm"]), ["add", "own", 1024]], SMEM_PER_SM]]],
        ["flags", ["if", "in_regs", 0, ["if", "in_smem", _smem_flags(by_warp), PLAN_DW_GLOBAL]]],
        ["shared", ["if", ["and", ["not", "in_regs"], "in_smem"], ["add", ring, "partials"], ring]],
        ["scratch", scratch_expr(max(SCRATCH_SPARE, rows) if tpr >= 32 else SCRATCH_SPARE)],
        ["cap", ["div", "scratch", ["if", ["eq", "flags", PLAN_DW_GLOBAL], rows, 1]]],
        ["slots", _peel(slots) if peel else slots],
        ["partial_rows", ["if", ["eq", "flags", PLAN_DW_GLOBAL], _group_rows(rows, tpr), "slots"]],
        ["dw_width", ["if", ["and", ["eq", ["mod", "N", 4], 0], "aligned"], 4, 1]],
        ["columns", ["cdiv", "N", "dw_width"]],
        ["qx", ["if", ["le", SMS, ["cdiv", "columns", 8]], 8, ["if", ["le", SMS, ["cdiv", "columns", 4]], 4,
                ["if", ["le", SMS, ["cdiv", "columns", 2]], 2, 1]]]],
    ]
    main = {"kernel": "rmsnorm_bwd", "grid": ["mul", "slots", cluster], "block": threads, "cluster": cluster,
            "smem": "shared",
            "args": [["ptr", "x"], ["ptr", "w"], ["ptr", "dy"], ["ptr", "rstd"], ["ptr", "dx"], ["ptr", "dw_partial"],
                     ["i32", "M"], ["i32", "N"], ["i32", "slots"],
                     ["i32", ["add", "flags", ["if", "vector", PLAN_VECTOR, _mode(peel, narrow)]]]]}
    reduce = {"kernel": "rmsnorm_bwd_dw", "grid": ["cdiv", "columns", "qx"], "block": DW_THREADS,
              "args": [["ptr", "dw_partial"], ["ptr", "dw"], ["i32", "partial_rows"], ["i32", "N"], ["i32", "qx"],
                       ["i32", ["if", ["eq", "dw_width", 4], 1, 0]]]}
    if g["small_m"] == "none":
        return {"let": let, "buffers": {"dw_partial": {"dtype": "float32", "shape": ["scratch", "N"]}},
                "steps": [main, reduce]}
    if g["small_m"] == "cols":
        return _cols(let, main, reduce)
    # One slot writes dw where its partial row would go. Not with partials in global memory at rows_per_cta > 1:
    # those take a row per row group, and dw has one.
    at = next(i for i, (name, _) in enumerate(let) if name == "slots")
    direct = DIRECT_ROWS * rows * cluster
    once = [["or", ["not", "peel"], ["eq", "M", 1]]] if peel else []   # peeled rows of every offset: not in one slot
    let.insert(at, ["direct", ["and", ["le", "M", direct], *once, rows == 1 or ["ne", "flags", PLAN_DW_GLOBAL]]])
    let[at + 1] = ["slots", ["if", "direct", 1, let[at + 1][1]]]
    alone = {**main, "when": "direct", "args": [*main["args"][:5], ["ptr", "dw"], *main["args"][6:]]}
    # Scratch for exactly the partial rows written (none when the one slot writes dw: no step names it then).
    return {"let": let, "buffers": {"dw_partial": {"dtype": "float32", "shape": ["partial_rows", "N"]}},
            "steps": [alone, {**main, "when": ["not", "direct"]}, {**reduce, "when": ["not", "direct"]}]}


def _cols(let: list, main: dict, reduce: dict) -> dict[str, Any]:
    """small_m=cols: at M up to COLS_ROWS the two column-split kernels (rmsnorm_bwd_cols.cuh) over `ctas` chunks of
    `chunk` columns: the first on ctas x groups CTAs (COLS_GROUP rows each) writes an M x ctas scratch of partial dots
    and a groups x N scratch of partial dw, the second on ctas x M CTAs writes dx and dw; above, the genome's own
    plan."""
    let = [*let,
           ["cols", ["le", "M", COLS_ROWS]],
           ["ctas", ["max", 1, ["min", COLS_CTAS, ["cdiv", "N", COLS_THREADS]]]],
           ["chunk", ["cdiv", "N", "ctas"]],
           ["groups", ["cdiv", "M", COLS_GROUP]]]
    inputs = [["ptr", "x"], ["ptr", "w"], ["ptr", "dy"], ["ptr", "rstd"], ["ptr", "dot"], ["ptr", "dwp"]]
    dot = {"kernel": "rmsnorm_bwd_cols_dot", "grid": {"x": "ctas", "y": "groups"}, "block": COLS_THREADS,
           "when": "cols", "args": [*inputs, ["i32", "M"], ["i32", "N"], ["i32", "chunk"]]}
    cols = {"kernel": "rmsnorm_bwd_cols", "grid": {"x": "ctas", "y": "M"}, "block": COLS_THREADS, "when": "cols",
            "args": [*inputs, ["ptr", "dx"], ["ptr", "dw"], ["i32", "M"], ["i32", "N"], ["i32", "chunk"],
                     ["i32", "groups"]]}
    # each buffer one element where its plan does not run (the op allocates every buffer a recipe names)
    return {"let": let,
            "buffers": {"dw_partial": {"dtype": "float32",
                                       "shape": [["if", "cols", 1, "scratch"], ["if", "cols", 1, "N"]]},
                        "dot": {"dtype": "float32", "shape": [["if", "cols", "M", 1], ["if", "cols", "ctas", 1]]},
                        "dwp": {"dtype": "float32", "shape": [["if", "cols", "groups", 1], ["if", "cols", "N", 1]]}},
            "steps": [dot, cols, {**main, "when": ["not", "cols"]}, {**reduce, "when": ["not", "cols"]}]}


def _peel_let(vec: int, resident: int) -> list:
    """tail=peel: row r starts (r * N) % vec elements past a vector boundary, which repeats every `period` rows (the
    least power of two with period * N a multiple of vec; vec is 2, 4 or 8). A plan peels rows of more than a vector,
    not a multiple of it, with aligned pointers, where a period of slots is resident at once."""
    return [["period", ["if", ["eq", ["mod", "N", vec], 0], 1, ["if", ["eq", ["mod", ["mul", "N", 2], vec], 0], 2,
                        ["if", ["eq", ["mod", ["mul", "N", 4], vec], 0], 4, 8]]]],
            ["peel", ["and", "aligned", ["lt", vec, "N"], ["ne", ["mod", "N", vec], 0], ["le", "period", resident]]]]


def _mode(peel: bool, narrow: bool) -> int | list:
    """The path flag besides PLAN_VECTOR: PLAN_PEEL, else PLAN_NARROW, else 0 (one element at a time)."""
    rest = ["if", "narrow", PLAN_NARROW, 0] if narrow else 0
    return ["if", "peel", PLAN_PEEL, rest] if peel else rest


def _peel(slots: list) -> list:
    """Slots of a tail=peel plan where a slot runs several rows: a multiple of the period (rounded down, and at least
    one period: extra slots have no rows and write zero partials), so that the rows a slot runs all start alike and
    each thread's vectors (and dw columns) are the same in every row."""
    return ["if", ["and", "peel", ["lt", slots, "M"]], ["max", "period", ["sub", slots, ["mod", slots, "period"]]],
            slots]


def _narrow(dtype: str, vec: int, peel: bool) -> list:
    """Gene narrow: where the vector path cannot run (peeled or not) but N is even and x, dy, dx are aligned to two
    elements, 2-element vectors (PLAN_NARROW) rather than one element at a time."""
    ok = ["and", ["not", "vector"], *([["not", "peel"]] if peel else []), ["eq", ["mod", "N", 2], 0],
          *(["le", 2 * DTYPE_BYTES[dtype], ["align", t]] for t in ("x", "dy", "dx")),
          *(["le", 16, ["align", t]] for t in ("w", "dw", "dw_partial"))]
    return [["narrow", ok], ["width", ["if", ["or", "vector", "peel"] if peel else "vector", vec,
                                       ["if", "narrow", 2, 1]]]]


def _by_warp(threads: int, tpr: int, reg_vecs: int) -> list:
    """Sub-warp rows whose vectors all stay in registers (dw_acc=regs): at the end the 32 / TPR row groups of a warp,
    which own the same columns, add their dw partials by shuffles, so shared memory holds a region per warp instead
    of one per row group (PLAN_DW_WARP with PLAN_DW_SMEM): 4 KB rather than 64 KB for 128 threads of rows of 256."""
    return [["by_warp", ["le", "vecs", reg_vecs]],
            ["partials", ["if", "by_warp", ["mul", "vecs", ["mul", "width", threads // 32 * tpr * 4]], "partials"]]]


def _smem_flags(by_warp: bool) -> int | list:
    """The flags of partials in shared memory: per warp where _by_warp's condition holds, else per row group."""
    return ["if", "by_warp", PLAN_DW_SMEM | PLAN_DW_WARP, PLAN_DW_SMEM] if by_warp else PLAN_DW_SMEM


def _group_rows(rows: int, tpr: int) -> list:
    """Partial rows of a plan with global partials, one per (slot, row group): every group's, or with sub-warp rows
    those of the groups that start within M (the template's other groups leave the scratch alone)."""
    every = ["mul", "slots", rows]
    return ["min", every, "M"] if tpr < 32 else every


@dataclass(frozen=True)
class Plan:
    """The recipe's values for one case: the main kernel runs `slots` CTAs (clusters of `cluster` CTAs when
    cluster > 1) with the template's plan `flags` and `shared_bytes` of dynamic shared memory, and writes
    `partial_rows` rows of dw partials; rmsnorm_bwd_dw sums them with `dw_grid` CTAs of `dw_qx` runs of `dw_width`
    columns (unless the one slot wrote dw itself: launches = 1)."""

    slots: int
    cluster: int
    flags: int
    shared_bytes: int
    partial_rows: int
    dw_width: int
    dw_qx: int
    dw_grid: int
    launches: int = 2   # 1: the main kernel alone wrote dw (direct), no partials and no rmsnorm_bwd_dw

    @property
    def grid(self) -> int:
        """CTAs of the main kernel (a multiple of the cluster size)."""
        return self.slots * self.cluster


def plan(g: Mapping[str, GeneValue], m: int, n: int, dtype: str, aligned: bool = True) -> Plan:
    """The recipe evaluated for an (m, n) case, every tensor 16-byte aligned (else 2-byte aligned)."""
    align = 16 if aligned else 2
    v = recipe_names(recipe(g, dtype), m, n, 0.0,
                     {t: align for t in ("x", "dy", "dx", "w", "dw", "dw_partial")})
    mode = PLAN_VECTOR if v["vector"] else PLAN_PEEL if v.get("peel") else PLAN_NARROW if v.get("narrow") else 0
    return Plan(v["slots"], int(g["cluster"]), v["flags"] + mode, v["shared"],
                v["partial_rows"], v["dw_width"], v["qx"], -(-v["columns"] // v["qx"]), 1 if v.get("direct") else 2)
