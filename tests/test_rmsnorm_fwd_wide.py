"""The wide-row genes of the RMSNorm forward template (stage, stage_copy, cluster, persistent), on the CPU: the space
stays what it was at their defaults, every launch plan is within sm_90's limits and tells the kernel the truth about
its shared memory, and the genomes compile with NVRTC to binaries whose resources match what the launch assumes."""
import itertools
import random

import numpy as np
import pytest

from kernel_factory.evo.regions import regions as regions_of
from kernel_factory.evo.evaluate import render
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler
from kernel_factory.evo.types import Candidate, Case, Genome
from kernel_factory.problems import rmsnorm_fwd as rf

NEW_GENES = ("stage", "stage_copy", "cluster", "persistent")
SMEM_OPT_IN = 232448          # sm_90: 227 KB of shared memory per CTA, static + dynamic
SHAPES = tuple(s for name in ("benchmark", "correctness", "heldout") for s in rf.problem.shape_sets[name])
# Genes that change the launch geometry; the others only change the code.
GEOMETRY = ("threads", "rows_per_cta", "vec_bytes", "load", "keep_x", "reduce", "unroll", "tail") + NEW_GENES


def genome(**genes) -> dict:
    g = {**rf.problem.space.defaults(), **genes}
    assert rf.problem.space.why_infeasible(g) is None, rf.problem.space.why_infeasible(g)
    return g


# A spread over the new genes (and the old genes they interact with), compiled for every dtype below.
SPREAD = {
    "default": {},
    "stage_cp_async": dict(stage="smem"),
    "stage_cp_async_vec8_rows4": dict(stage="smem", vec_bytes=8, threads=128, rows_per_cta=4),
    "stage_bulk": dict(stage="smem", stage_copy="bulk"),
    "stage_bulk_rows2_nokeep": dict(stage="smem", stage_copy="bulk", rows_per_cta=2, keep_x=False),
    "cluster2": dict(cluster=2),
    "cluster4_stage": dict(cluster=4, stage="smem", threads=512),
    "cluster8_bulk": dict(cluster=8, stage="smem", stage_copy="bulk", threads=1024, keep_x=False),
    "cluster16_stage": dict(cluster=16, stage="smem", threads=512, unroll=4),
    "persistent": dict(persistent=True),
    "persistent_stage": dict(persistent=True, stage="smem", threads=128, rows_per_cta=4),
    "persistent_bulk_smem_reduce": dict(persistent=True, stage="smem", stage_copy="bulk", reduce="smem"),
    "persistent_cp_async_ring": dict(persistent=True, load="cp_async", unroll=1),
}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """(name, dtype) -> CompileOutput for SPREAD x dtypes, compiled once for the module."""
    compiler = Compiler(tmp_path_factory.mktemp("cache"), workers=2)
    jobs, names = [], []
    for (name, genes), dtype in itertools.product(SPREAD.items(), rf.problem.dtypes):
        g = Genome.of(genome(**genes))
        key = compiler.key(render.body(rf.problem, g, dtype))
        jobs.append(CompileJob(key, render.render(rf.problem, Candidate(g), dtype), f"{name}-{dtype}.cu"))
        names.append((name, dtype))
    by_key = {out.key: out for out in compiler.compile_many(jobs)}
    compiler.close()
    return {n: by_key[j.key] for n, j in zip(names, jobs)}


def test_defaults_of_the_new_genes_keep_the_old_space():
    space = rf.problem.space
    assert {space[n].default for n in NEW_GENES} == {"none", "cp_async", 1, False}
    feasible = list(space.enumerate())
    old = [g for g in feasible if all(g[n] == space[n].default for n in NEW_GENES + ("tail", "w_ahead"))
           and g["rows_per_cta"] in (1, 2, 4)]   # (rows_per_cta's later choices: tests/test_rmsnorm_fwd_subwarp.py)
    assert len(old) == 4272, "the genomes of the space before the wide genes must all stay feasible, and only they"
    before_subwarp = [g for g in feasible if g["rows_per_cta"] in (1, 2, 4) and g["w_ahead"] == "none"]
    assert len(old) < len(before_subwarp) < 2 * 40000   # tail (tests/test_rmsnorm_fwd_tail.py) doubles the space


@pytest.mark.parametrize("genes, fragment", [
    (dict(stage_copy="bulk"), "only matters with stage=smem"),
    (dict(stage="smem", stage_copy="bulk", vec_bytes=8), "vec_bytes=16"),
    (dict(stage="smem", load="cp_async"), "replaces load=cp_async"),
    (dict(cluster=2, rows_per_cta=2), "rows_per_cta=1"),
    (dict(cluster=4, persistent=True), "persistent needs cluster=1"),
])
def test_rule_forbids_meaningless_combinations(genes, fragment):
    reason = rf.problem.space.why_infeasible({**rf.problem.space.defaults(), **genes})
    assert reason and fragment in reason, reason


def expected_stage_bytes(g: dict, n: int, dtype: str) -> int | None:
    """From first principles: the CTA's slice of a row (whole vectors, split over the cluster) less the part that
    its threads keep in registers (128 bytes each), for each row it holds. tail=peel stages the row's body of
    whole vectors, floor(n / vector) of them at most; tail=scalar stages nothing of a row with a partial vector."""
    vec_bytes = g["vec_bytes"]
    elems = vec_bytes // rf.DTYPE_BYTES[dtype]
    if n % elems and g["tail"] != "peel":
        return None
    slice_bytes = -(-(n // elems) // g["cluster"]) * vec_bytes
    kept = 128 * (g["threads"] // g["rows_per_cta"]) if g["keep_x"] else 0
    return g["rows_per_cta"] * max(0, slice_bytes - kept)


def geometry_genomes():
    seen = {}
    for g in rf.problem.space.enumerate():
        seen.setdefault(tuple(g[k] for k in GEOMETRY), g)
    return list(seen.values())


def test_launch_plans_stay_within_limits_and_set_the_flag():
    fake = {"x": "x", "w": "w"}, {"y": "y", "rstd": "rstd"}
    genomes = geometry_genomes()
    assert len(genomes) > 1000
    staged_seen = unstaged_seen = 0
    for g, (m, n), dtype in itertools.product(genomes, SHAPES, rf.problem.dtypes):
        plan = rf.problem.launch(g, Case((m, n), dtype), *fake)
        c, rows = g["cluster"], g["rows_per_cta"]
        assert len(plan.args) == 8 and isinstance(plan.args[-1], np.int32), "one argument list for every genome"
        staged = int(plan.args[-1])
        assert plan.block == (g["threads"], 1, 1)
        assert plan.cluster == ((c, 1, 1) if c > 1 else None)
        assert plan.grid[0] % c == 0 and plan.grid[0] >= c
        slots = plan.grid[0] // c * rows
        if g["persistent"]:
            assert plan.grid[0] <= rf.SMS * 2048 // g["threads"] and slots <= -(-m // rows) * rows
        else:
            assert slots >= m and slots - rows < m, "one CTA (or cluster) per rows_per_cta rows"
        assert rf.static_smem(g) + rf.SMEM_SLACK + plan.shared_bytes <= SMEM_OPT_IN
        need = expected_stage_bytes(g, n, dtype)
        if g["stage"] == "smem" and need is not None and rf.static_smem(g) + rf.SMEM_SLACK + need <= SMEM_OPT_IN:
            assert staged == 1 and plan.shared_bytes == need, (g, m, n, dtype)
            staged_seen += 1
        else:
            assert staged == 0 and plan.shared_bytes == 0, (g, m, n, dtype)
            unstaged_seen += g["stage"] == "smem"
    assert staged_seen and unstaged_seen, "both sides of the flag must be exercised"


@pytest.mark.parametrize("genes, shape, dtype, staged, smem", [
    (dict(stage="smem"), (32768, 65536), "bfloat16", 1, 131072 - 256 * 128),
    (dict(stage="smem"), (16384, 131072), "bfloat16", 1, 262144 - 256 * 128),   # 224 KB: just fits
    (dict(stage="smem"), (16384, 131072), "float32", 0, 0),              # 480 KB: over the limit, unstaged
    (dict(stage="smem"), (8192, 262144), "bfloat16", 0, 0),
    (dict(stage="smem", cluster=2), (16384, 131072), "float32", 1, 262144 - 256 * 128),
    (dict(stage="smem", cluster=4, threads=512), (8192, 262144), "bfloat16", 1, 131072 - 512 * 128),
    (dict(stage="smem", cluster=8, threads=1024, unroll=1), (8192, 262144), "float32", 1, 0),  # in registers
    (dict(stage="smem"), (5, 33), "bfloat16", 0, 0),                     # scalar path: nothing to stage
    (dict(stage="smem", keep_x=False, rows_per_cta=4, threads=128), (1, 256), "float16", 1, 4 * 512),
])
def test_launch_examples(genes, shape, dtype, staged, smem):
    plan = rf.problem.launch(genome(**genes), Case(shape, dtype), {"x": 0, "w": 0}, {"y": 0, "rstd": 0})
    assert (int(plan.args[-1]), plan.shared_bytes) == (staged, smem)


def test_persistent_grid_is_one_wave():
    g = genome(persistent=True)
    plan = rf.problem.launch(g, Case((32768, 256), "bfloat16"), {"x": 0, "w": 0}, {"y": 0, "rstd": 0})
    assert plan.grid[0] == rf.SMS * rf.persistent_ctas_per_sm(g) < 32768
    small = rf.problem.launch(g, Case((3, 256), "bfloat16"), {"x": 0, "w": 0}, {"y": 0, "rstd": 0})
    assert small.grid[0] == 3


def test_spread_compiles_for_every_dtype(builds):
    for (name, dtype), out in builds.items():
        assert out.error is None, f"{name} {dtype}: {out.error}"
        assert out.cubin[:4] == b"\x7fELF"


def test_static_shared_memory_is_what_the_launch_counts(builds):
    for (name, dtype), out in builds.items():
        g = genome(**SPREAD[name])
        assert out.info.shared_bytes <= rf.static_smem(g) + rf.SMEM_SLACK, (name, dtype, out.info.shared_bytes)


def test_persistent_ctas_fit_the_compiled_registers(builds):
    """The launch sizes a persistent grid for persistent_ctas_per_sm resident CTAs: the compiled kernel must fit."""
    checked = 0
    for (name, dtype), out in builds.items():
        g = genome(**SPREAD[name])
        if g["persistent"]:
            ctas = rf.persistent_ctas_per_sm(g)
            assert ctas * g["threads"] * out.info.registers <= rf.REGS_PER_SM, (name, dtype, out.info.registers)
            checked += 1
    assert checked >= 3 * len(rf.problem.dtypes)


def test_persistent_ctas_fit_on_a_random_sample(tmp_path):
    genomes = random.Random(4).sample([g for g in rf.problem.space.enumerate() if g["persistent"]], 6)
    compiler = Compiler(tmp_path / "cache", workers=2)
    jobs = [CompileJob(str(i), render.render(rf.problem, Candidate(Genome.of(g)), "bfloat16"), f"{i}.cu")
            for i, g in enumerate(genomes)]
    for out in compiler.compile_many(jobs):
        g = genomes[int(out.key)]
        assert out.error is None, out.error
        assert rf.persistent_ctas_per_sm(g) * g["threads"] * out.info.registers <= rf.REGS_PER_SM, g
    compiler.close()


def test_template_has_the_new_editable_regions():
    regions = regions_of(rf.problem.template())
    assert {"stage_copy", "cluster_reduce", "staged_row", "first_pass", "second_pass"} <= set(regions)


def test_the_launcher_starts_the_planned_number_of_ctas(monkeypatch):
    """Launch.grid counts CTAs (the problems size it M * cluster); the driver must receive exactly that many."""
    import cuda.core
    from kernel_factory.evo.evaluate import launcher

    class Module:
        def allow_shared(self, name: str, nbytes: int) -> None:
            pass

        def allow_cluster(self, name: str, cluster: tuple[int, int, int] | None) -> None:
            pass

        def kernel(self, name: str) -> str:
            return "rmsnorm_fwd"

    class Config:   # cuda.core's LaunchConfig wants a driver; this one records what the launcher asks for
        def __init__(self, grid, block, shmem_size, cluster=None):
            self.grid, self.block, self.shmem_size, self.cluster = grid, block, shmem_size, cluster

    sent = []
    monkeypatch.setattr(cuda.core, "LaunchConfig", Config)
    monkeypatch.setattr(cuda.core, "launch", lambda stream, cfg, kernel, *args: sent.append(cfg))
    plan = rf.problem.launch(genome(cluster=4), Case((3, 4096), "bfloat16"), {"x": 0, "w": 0}, {"y": 0, "rstd": 0})
    launcher.launcher(None, Module(), plan)()
    (cfg,) = sent
    # cuda.core's LaunchConfig: "When cluster is specified, the grid parameter represents the number of clusters"
    ctas = tuple(g * c for g, c in zip(cfg.grid, cfg.cluster)) if cfg.cluster else cfg.grid
    assert ctas == plan.grid == (12, 1, 1)
