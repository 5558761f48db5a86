"""Sub-warp rows of the RMSNorm forward template (threads / rows_per_cta = 2, 4, 8 or 16 threads per row, so that one
warp normalizes 16..2 narrow rows), on the CPU: the rule admits them and names what it refuses, the space before them
is unchanged (and the bundled recording still covers only it), the launch gives each CTA rows_per_cta rows, NVRTC
compiles them across the template's paths for every dtype, and the row reduction's butterfly reaches the binary with
lane masks below TPR only. tests/gpu/test_rmsnorm_fwd_subwarp_gpu.py runs them through the correctness gate."""
import hashlib
import itertools
import json
import re
from pathlib import Path

import pytest

from kernel_factory.evo.evaluate import recording, render, replay, sass
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler
from kernel_factory.evo.types import Candidate, Case, Genome
from kernel_factory.problems import rmsnorm_fwd as rf

SPACE = rf.problem.space
OP_TABLE = Path(__file__).resolve().parents[1] / "kernels" / "ops" / "rmsnorm_fwd.json"   # the shipped forward op
OLD_ROWS = (1, 2, 4)   # rows_per_cta's choices before sub-warp rows: whole warps per row only

# Sub-warp genomes over the template's unstaged paths: registers and streaming, vec8, the cp.async ring, the
# shared-memory tree reduction, persistent CTAs (with the ring too) and tail=peel (heads longer than TPR).
CORNERS = {
    "tpr2_128": dict(threads=128, rows_per_cta=64),
    "tpr2_peel_vec8": dict(threads=256, rows_per_cta=128, vec_bytes=8, tail="peel"),
    "tpr4_peel": dict(threads=256, rows_per_cta=64, tail="peel"),
    "tpr4_smem_reduce": dict(threads=128, rows_per_cta=32, reduce="smem"),
    "tpr8_nokeep_unroll4_vec8": dict(threads=256, rows_per_cta=32, vec_bytes=8, keep_x=False, unroll=4),
    "tpr8_persistent_peel": dict(threads=256, rows_per_cta=32, persistent=True, tail="peel"),
    "tpr16_1024_cp_async": dict(threads=1024, rows_per_cta=64, load="cp_async", unroll=1),
    "tpr16_persistent_ring_peel": dict(threads=128, rows_per_cta=8, persistent=True, load="cp_async", unroll=1,
                                       tail="peel"),
}


def genes(**extra) -> dict:
    g = {**SPACE.defaults(), **extra}
    assert SPACE.why_infeasible(g) is None, SPACE.why_infeasible(g)
    return g


def tpr(g: dict) -> int:
    return int(g["threads"]) // int(g["rows_per_cta"])


def compile_all(tmp_path_factory, named: dict[tuple, dict]) -> dict:
    """{name: CompileOutput} for {name: (genes, dtype)}, compiled together."""
    compiler = Compiler(tmp_path_factory.mktemp("cache"), workers=2)
    jobs = {}
    for name, (g, dtype) in named.items():
        genome = Genome.of(g)
        jobs[name] = CompileJob(compiler.key(render.body(rf.problem, genome, dtype)),
                                render.render(rf.problem, Candidate(genome), dtype), f"{'-'.join(name)}.cu")
    by_key = {out.key: out for out in compiler.compile_many(jobs.values())}
    compiler.close()
    return {name: by_key[job.key] for name, job in jobs.items()}


@pytest.fixture(scope="module")
def corner_builds(tmp_path_factory):
    return compile_all(tmp_path_factory, {(name, dtype): (genes(**extra), dtype)
                                          for (name, extra), dtype in itertools.product(CORNERS.items(),
                                                                                         rf.problem.dtypes)})


def test_the_default_genome_is_warp_per_row():
    assert SPACE["rows_per_cta"].default == 1 and tpr(SPACE.defaults()) == 256


def test_rule_admits_every_subwarp_width_with_every_cta_size():
    seen = set()
    for threads, rows in itertools.product(SPACE["threads"].choices, SPACE["rows_per_cta"].choices):
        t = threads // rows
        why = SPACE.why_infeasible({**SPACE.defaults(), "threads": threads, "rows_per_cta": rows,
                                    "keep_x": False, "unroll": 1})   # (registers fit 1024 threads)
        assert (why is None) == (t in rf.SUBWARP_TPR or t % 32 == 0), (threads, rows, why)
        if why is None:
            seen.add(t)
    assert set(rf.SUBWARP_TPR) <= seen


@pytest.mark.parametrize("extra, fragment", [
    (dict(threads=128, rows_per_cta=128), "2, 4, 8 or 16 threads per row"),
    (dict(threads=256, rows_per_cta=32, stage="smem"), "needs stage=none"),
    (dict(threads=128, rows_per_cta=64, stage="smem", stage_copy="bulk"), "needs stage=none"),
    (dict(threads=256, rows_per_cta=16, cluster=2), "rows_per_cta=1"),
])
def test_rule_names_what_it_refuses(extra, fragment):
    why = SPACE.why_infeasible({**SPACE.defaults(), **extra})
    assert why and fragment in why, why


def test_the_space_before_subwarp_rows_is_unchanged():
    """The larger rows_per_cta values add genomes and change none: the old choices give the old space, exactly
    (60640 feasible genomes with the wide genes and tail, the weight read after the sum), and the new ones hold
    sub-warp and warp-per-row rows."""
    feasible = list(SPACE.enumerate())
    assert sum(g["rows_per_cta"] in OLD_ROWS and g["w_ahead"] == "none" for g in feasible) == 60640
    assert {tpr(g) for g in feasible if g["rows_per_cta"] not in OLD_ROWS} >= set(rf.SUBWARP_TPR) | {32}


def test_whole_warp_genomes_build_the_shipped_cubins_byte_for_byte(tmp_path_factory):
    """Sub-warp rows change nothing for the genomes from before them: the op's shipped kernels (tail scalar and peel)
    rebuild from today's template to the same bytes."""
    table = json.loads(OP_TABLE.read_text())
    named = {(key,): ({**SPACE.defaults(), **table["genomes"][key.split(":")[0]]["genes"]}, key.split(":")[1])
             for key in table["kernels"] if not table["genomes"][key.split(":")[0]].get("patch")}
    assert len(named) >= 20 and {g["tail"] for g, _ in named.values()} == {"scalar", "peel"}
    for (key,), out in compile_all(tmp_path_factory, named).items():
        assert out.cubin is not None, (key, out.error)
        assert hashlib.sha256(out.cubin).hexdigest() == table["kernels"][key]["sha256"], f"{key} changed"


def test_replay_keeps_to_the_recorded_rows_per_cta():
    """The quickstart's recording (bf16, the benchmark rows) predates sub-warp rows: a replayed search (the quickstart
    without a GPU) is limited to the rows_per_cta it measured, so it never proposes a genome the recording cannot
    answer."""
    rec = replay.choose_recording(rf.problem, [Case(s, "bfloat16") for s in rf.problem.shape_sets["benchmark"]], None)
    covered = recording.covered_choices(rec.header, SPACE)
    assert covered["rows_per_cta"] == OLD_ROWS
    assert SPACE.restricted(covered).defaults() == SPACE.defaults()


@pytest.mark.parametrize("name", list(CORNERS))
@pytest.mark.parametrize("m", [1, 3, 133, 32768, 32771])
def test_launch_gives_each_cta_rows_per_cta_rows(name, m):
    g = genes(**CORNERS[name])
    plan = rf.problem.launch(g, Case((m, 100), "bfloat16"), {"x": 0, "w": 0}, {"y": 0, "rstd": 0})
    ctas = -(-m // g["rows_per_cta"])
    if g["persistent"]:
        ctas = min(ctas, rf.SMS * rf.persistent_ctas_per_sm(g))
    assert plan.grid == (ctas, 1, 1) and plan.block == (g["threads"], 1, 1) and plan.shared_bytes == 0


def test_kept_vectors_count_the_row_group_threads():
    g = genes(**CORNERS["tpr4_peel"])
    assert rf.kept_vectors(g) == 4 * rf.KEPT_BYTES // 16


@pytest.mark.parametrize("dtype", rf.problem.dtypes)
@pytest.mark.parametrize("name", list(CORNERS))
def test_subwarp_corners_compile_and_keep_their_sass_facts(corner_builds, name, dtype):
    out = corner_builds[name, dtype]
    assert out.cubin is not None and out.cubin[:4] == b"\x7fELF", out.error
    g = genes(**CORNERS[name])
    assert out.info.shared_bytes <= rf.static_smem(g) + rf.SMEM_SLACK
    assert out.info.registers * g["threads"] <= rf.REGS_PER_SM
    ops = sass.opcodes(sass.disassemble(out.cubin))
    for pattern, present, why in rf.problem.expected_sass(g, dtype):
        assert bool(sum(n for op, n in ops.items() if re.match(pattern, op))) == present, (name, pattern, why)


BFLY = re.compile(r"SHFL\.BFLY\s+\S+,\s*\S+,\s*\S+,\s*(0x[0-9a-f]+)")


@pytest.fixture(scope="module")
def butterflies(tmp_path_factory):
    """TPR -> the lane masks of every SHFL.BFLY in the bf16 binary (threads=256, tail=peel: scalar and vector paths)."""
    widths = (*rf.SUBWARP_TPR, 32)
    outs = compile_all(tmp_path_factory, {(str(t),): (genes(rows_per_cta=256 // t, tail="peel"), "bfloat16")
                                          for t in widths})
    return {t: [int(m, 16) for m in BFLY.findall(sass.disassemble(outs[str(t),].cubin))] for t in widths}


def test_subwarp_butterflies_reach_the_binary(butterflies):
    """Warp per row: lane masks 16..1 at each reduction site. Sub-warp rows: masks TPR/2..1 only, as many per site,
    so no lane ever exchanges with another row's group."""
    warp = butterflies[32]
    sites = len(warp) // 5
    assert sites >= 1 and sorted(set(warp)) == [1, 2, 4, 8, 16] and len(warp) == 5 * sites
    for t in rf.SUBWARP_TPR:
        masks = butterflies[t]
        steps = t.bit_length() - 1
        assert sorted(set(masks)) == [1 << i for i in range(steps)], (t, masks)
        assert len(masks) == steps * sites, (t, masks)
