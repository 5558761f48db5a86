"""The backward's small-M plans on the CPU (gene small_m): the grid, the partial rows and the scratch never exceed
what M needs, a direct plan is one launch that writes dw itself, the rule's messages, NVRTC builds in every dtype, and
cubins byte-identical to the shipped ones (the gene changes the launch recipe, not the kernel)."""
import hashlib
import json

import pytest

from kernel_factory.evo.evaluate import render
from kernel_factory.evo.evaluate.compile import CompileJob, compile_one
from kernel_factory.evo.types import Candidate, Case, Genome
from kernel_factory.kernels import recipe as recipes
from kernel_factory.kernels import runtime
from kernel_factory.problems import rmsnorm_bwd as mod

P = mod.problem
DEFAULT = P.space.defaults()
SMALL = [dict(small_m="direct"), dict(small_m="grouped"),
         dict(small_m="grouped", threads=128, rows_per_cta=2, ctas_per_sm=4, reg_vecs=1, vec_bytes=8),
         dict(small_m="direct", threads=256, rows_per_cta=8, ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem"),
         dict(small_m="direct", threads=512, cluster=16, ctas_per_sm=1, reg_vecs=4, stages=2, prefetch=False,
              dw_acc="smem"),
         dict(small_m="grouped", threads=512, cluster=2, ctas_per_sm=1, reg_vecs=2, dw_acc="smem", prefetch=False)]
MS = (1, 2, 7, 131, 132, 133, 4096)
NS = (1, 7, 100, 1024, 4100, 8192, 65537, 262144)


def genes(**kw):
    g = {**DEFAULT, **kw}
    assert P.space.why_infeasible(g) is None, (kw, P.space.why_infeasible(g))
    return g


@pytest.mark.parametrize("kw", SMALL)
@pytest.mark.parametrize("dtype", P.dtypes)
def test_small_m_plans_launch_no_more_than_m_needs(kw, dtype):
    g = genes(**kw)
    rows, cluster = int(g["rows_per_cta"]), int(g["cluster"])
    group = mod.SLOT_ROWS if g["small_m"] == "grouped" else 1
    for m in MS:
        for n in NS:
            for aligned in (True, False):
                label = (kw, dtype, m, n, aligned)
                p = mod.plan(g, m, n, dtype, aligned)
                steps = recipes.evaluate(mod.recipe(g, dtype), m, n, 0.0,
                                         {t: 16 if aligned else 2 for t in ("x", "dy", "dx", "w", "dw", "dw_partial")})
                assert 1 <= p.slots <= -(-m // (rows * group)), label
                assert p.grid == p.slots * cluster and steps.steps[0].grid == p.grid, label
                direct = m <= mod.DIRECT_ROWS * rows * cluster and (rows == 1 or p.flags & mod.PLAN_DW_GLOBAL == 0)
                if direct:   # one launch, dw as the partial row, nothing allocated
                    assert p.launches == 1 and p.slots == 1 and [s.kernel for s in steps.steps] == ["rmsnorm_bwd"]
                    assert ("ptr", "dw_partial") not in steps.steps[0].args
                    assert ("ptr", "dw") in steps.steps[0].args and steps.buffers == {}, label
                else:        # scratch for exactly the partial rows the main kernel writes and rmsnorm_bwd_dw reads
                    assert p.launches == 2 and [s.kernel for s in steps.steps] == ["rmsnorm_bwd", "rmsnorm_bwd_dw"]
                    assert steps.buffers == {"dw_partial": ("float32", (p.partial_rows, n))}, label
                    assert p.partial_rows == p.slots * (rows if p.flags & mod.PLAN_DW_GLOBAL else 1), label
                    assert steps.steps[1].args[2] == ("i32", p.partial_rows), label
                    assert p.partial_rows <= max(1, -(-m // group)) + rows, label


def test_default_plans_keep_their_recipe_and_scratch():
    """Every shipped genome's recipe is the one its genes give now (small_m=none for the campaign's genomes, direct or
    grouped for the small-M grid's tuning candidates): the table's recipes still match."""
    table = json.loads((runtime.OPS_DIR / "rmsnorm_bwd.json").read_text())
    for key, rec in table["kernels"].items():
        genome_id, dtype = key.split(":")
        # genes added since the table was exported (narrow) take their defaults, as export gives them
        g = {**P.space.defaults(), **table["genomes"][genome_id]["genes"]}
        assert mod.recipe(g, dtype) == rec["recipe"], key
    tensors = dict.fromkeys(("x", "dy", "dx", "w", "dw", "dw_partial"), 256)
    p = recipes.evaluate(mod.recipe(DEFAULT, "bfloat16"), 1, 4096, 0.0, tensors)
    assert [s.kernel for s in p.steps] == ["rmsnorm_bwd", "rmsnorm_bwd_dw"]
    assert p.buffers["dw_partial"] == ("float32", (mod.scratch_rows(1, 4096, mod.SCRATCH_SPARE), 4096))


def test_grouped_plans_read_fewer_partial_rows():
    g, d = genes(small_m="grouped"), genes(small_m="direct")
    assert mod.plan(d, 131, 4096, "bfloat16").partial_rows == 131
    assert mod.plan(g, 131, 4096, "bfloat16").partial_rows == 33
    assert mod.plan(g, 4096, 4096, "bfloat16").slots == mod.plan(DEFAULT, 4096, 4096, "bfloat16").slots


def test_factory_launches_follow_the_plan():
    g = genes(small_m="direct")
    case = Case((3, 760), "bfloat16")
    inputs, outputs = P.make_inputs(case, 0, "cpu"), P.make_outputs(case, "cpu")
    (main,) = P.launch(g, case, inputs, outputs)
    assert main.kernel == "rmsnorm_bwd" and main.args[5] is outputs["dw"] and int(main.args[-2]) == 1
    case = Case((133, 760), "bfloat16")
    main, reduce = P.launch(genes(small_m="grouped"), case, P.make_inputs(case, 0, "cpu"), P.make_outputs(case, "cpu"))
    assert reduce.kernel == "rmsnorm_bwd_dw" and int(reduce.args[2]) == 34


@pytest.mark.parametrize("kw, words", [
    (dict(small_m="grouped", threads=512, cluster=16, ctas_per_sm=1), "use small_m=direct"),
    (dict(small_m="grouped", threads=512, cluster=8, ctas_per_sm=1), "changes no plan of cluster=8"),
])
def test_rule_rejects_meaningless_small_m_genomes(kw, words):
    why = P.space.why_infeasible({**DEFAULT, **kw})
    assert why is not None and words in why, why


def test_rule_allows_small_m_where_it_changes_the_plan():
    for kw in SMALL:
        genes(**kw)
    genes(small_m="grouped", threads=512, cluster=4, ctas_per_sm=1)


def cubin(g, dtype="bfloat16"):
    source = render.render(P, Candidate(Genome.of(g)), dtype)
    out = compile_one(CompileJob("k", source, "k.cu"))
    assert out.error is None, out.error
    return out.cubin


@pytest.mark.parametrize("dtype", P.dtypes)
@pytest.mark.parametrize("kw", [SMALL[0], SMALL[2], SMALL[4]])
def test_small_m_genomes_compile_to_the_kernel_of_small_m_none(kw, dtype):
    """small_m is a launch plan: the cubin is the one of the same genome at small_m=none, in every dtype."""
    assert cubin(genes(**kw), dtype) == cubin(genes(**{**kw, "small_m": "none"}), dtype)


def one_shipped_kernel_per_dtype() -> list[str]:
    """A kernel key (genome id:dtype) of the shipped backward table per dtype, the first in sorted order."""
    table = json.loads((runtime.OPS_DIR / "rmsnorm_bwd.json").read_text())
    first: dict[str, str] = {}
    for key in sorted(table["kernels"]):
        first.setdefault(key.split(":")[1], key)
    return sorted(first.values())


@pytest.mark.parametrize("key", one_shipped_kernel_per_dtype())
def test_shipped_cubins_rebuild_byte_identical(key):
    """Shipped genomes (their genes at small_m=none) compile today to the cubins the table records."""
    table = json.loads((runtime.OPS_DIR / "rmsnorm_bwd.json").read_text())
    genome_id, dtype = key.split(":")
    # genes added since the table was exported (narrow) take their defaults, as export gives them
    g = {**P.space.defaults(), **table["genomes"][genome_id]["genes"], "small_m": "none"}
    assert hashlib.sha256(cubin(g, dtype)).hexdigest() == table["kernels"][key]["sha256"], key
