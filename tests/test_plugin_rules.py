"""Every rule of docs/adding-a-problem.md, broken on purpose in a plugin scaffolded by `kernel-factory new`: `check`
names the rule in one line (exit 1), and the scaffold as written passes. The rules table of the docs, the check's
RULES and the cases here name the same rules."""
from __future__ import annotations

import re
import shutil
import textwrap
from pathlib import Path

import pytest

from kernel_factory.evo import build, config, registry
from kernel_factory.evo.config import ConfigError
from kernel_factory.evo.evaluate import render
from kernel_factory.evo.evaluate.compile import CompileJob, CompileOutput
from kernel_factory.evo.tools import check_compile, cli, scaffold
from kernel_factory.evo.tools.check import RULES
from kernel_factory.evo.types import BuildInfo, Gene, GeneSpace

DOCS = Path(__file__).resolve().parent.parent / "docs" / "adding-a-problem.md"
NAME = "rules_probe"
ANCHOR = '    baselines = ("torch_eager", "torch_compile")   # the first is the default fitness baseline\n'


def add(code: str) -> dict[str, str]:
    """Members added to the problem's class."""
    return {ANCHOR: ANCHOR + textwrap.indent(textwrap.dedent(code), "    ")}


# (rule, edits of problem.py, edits of the template, what the one line says)
CASES = [
    ("imports", {"from kernel_factory.evo.types import": "from kernel_factory.evo import build  # noqa: F401\n"
                                                          "from kernel_factory.evo.types import"}, {},
     "imports kernel_factory.evo.build"),
    ("shape-sets", {"HELDOUT = ((1024, 2880), (2048, 5120))": "HELDOUT = ()"}, {}, "needs non-empty heldout"),
    ("shape-sets", add("fixed_dims = 2\n"), {}, "a ragged shape has its 2 fixed dims and at least one more"),
    ("dtypes", {'dtypes = ("bfloat16", "float16", "float32")': 'dtypes = ("bfloat16", "bf16")'}, {},
     "'bf16' is not a torch dtype name"),
    ("baselines", {'raise MissingBaseline(f"unknown baseline': 'raise KeyError(f"unknown baseline'}, {},
     "raised KeyError"),
    ("tolerance", {'"float16": (1e-6, 2e-3)': '"float16": (1e-6, 0.5)'}, {}, "tolerance('float16') = (1e-06, 0.5)"),
    ("feasible-defaults", {"\n))\n": "\n), rule=lambda g: 'not 256' if g['threads'] == 256 else None)\n"}, {},
     "the gene defaults are infeasible: not 256"),
    ("kernel-name", {"    kernel_name = NAME\n": '    kernel_name = "probe_main"\n'}, {},
     "no extern \"C\" __global__ kernel named 'probe_main'"),
    ("inline-headers", {}, {f'#include "{NAME}_genes.cuh"\n': f'#include "{NAME}_genes.cuh"\n#include "helpers.cuh"\n'},
     'returns #include "helpers.cuh": NVRTC gets no include path'),
    ("genes-header", {'("plain", "nc"), "nc"': '("plain", "nc", "nc_na"), "nc"'}, {},
     f"stale (the gene space changed since it was written): run `kernel-factory genes {NAME}`"),
    ("handwritten-macros", {},
     {"typedef float elem_t;\n#endif\n": "typedef float elem_t;\n#endif\n#define LOAD_NC 1\n"},
     "the template #defines LOAD_NC by hand"),
    ("macro-clash", {"\n))\n": '\n    Gene("n", (1, 2), 1),\n))\n'}, {},
     "gene 'n' becomes the macro N, and the template declares the name N in `rules_probe(const elem_t* __restrict__ "
     "x, elem_t* __restrict__ y, long long M, long long N) {`"),
    ("torch-compile", {'fn = compiled_for(_silu, f"{case.key}@{x.device}")': "fn = _torch().compile(_silu)"}, {},
     "calls torch.compile directly"),
    ("seeded-inputs", {"manual_seed(seed)": "manual_seed(0)"}, {},
     "make_inputs gives the same inputs for another seed"),
    ("reference", {'return {"y": _silu(inputs["x"].float())}': 'return {"y": _silu(inputs["x"].float()).half()}'}, {},
     "reference output 'y' is torch.float16; compute it in fp32"),
    ("row-wise", {'return {"y": _silu(inputs["x"].float())}':
                  'return {"y": _silu(inputs["x"].float()) - inputs["x"].float().mean()}'}, {},
     "an output row depends on other rows"),
    ("launch", {'"y": ["min", "M", MAX_GRID_Y]': '"y": "M"'}, {},
     "bfloat16:70000x3 {'threads': 256, 'load': 'nc'}: grid (1, 70000, 1) is outside CUDA's limits"),
    ("bytes-moved", {"return 2 * m * n * DTYPE_BYTES[case.dtype]":
                     "return 2 * m * n * DTYPE_BYTES[case.dtype] * (m < 8192)"}, {},
     "bytes_moved() = 0; it must be a positive int"),
    ("special-inputs", add("""
        def special_inputs(self, case, seed, device):
            return self.make_inputs(case, 0, device)
        """), {}, "special_inputs() must give the same inputs for a seed and others for another seed"),
    ("peers", add('peers = ("liger",)\n'), {}, "peers ['liger'] are not baselines"),
    ("row-reference", add("""
        row_outputs = ("y",)

        def reference_rows(self, inputs, rows):
            return self.reference(inputs)
        """), {}, "reference_rows(inputs, rows) differs from reference() at those rows"),
    ("determinism", add('deterministic = "yes"\n'), {}, "deterministic is 'yes'; it must be True or False"),
    ("expected-sass", add("""
        def expected_sass(self, genes, dtype):
            return [("LDG(", True, "an unclosed group")]
        """), {}, "expected_sass(defaults, 'bfloat16') holds ('LDG(', True, 'an unclosed group')"),
    ("recipe", {"        return recipe(genes, dtype)\n":
                '        return {**recipe(genes, dtype), "let": [["k", ["pow", 2, 2]]]}\n'}, {},
     "recipe(defaults, 'bfloat16'): let 'k': unknown recipe operation 'pow'"),
    ("workload", add("""
        from kernel_factory.evo.workload import Workload
        workload = Workload(dtypes=("float64",))
        """), {}, "dtypes ['float64'] are not the problem dtypes"),
    ("baseline-runs", {'return lambda: {"y": _silu(x)}': 'return lambda: {"y": _silu(x) * 2}'}, {},
     "baseline 'torch_eager' output 'y' differs from the reference"),
    ("compiles", {}, {"  const long long col": "  this_is_not_cuda;\n  const long long col"},
     "genomes do not compile; first {"),
]
SEPARATE = {"entry-point": "test_entry_point_name_must_match", "gene-names": "test_gene_names_are_c_identifiers"}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return scaffold.scaffold(NAME, tmp_path_factory.mktemp("scaffold"))


def variant(base: Path, where: Path, problem_edits: dict, template_edits: dict, regen: bool = False):
    """A copy of the scaffold with text edits (each must apply), loaded as a problem."""
    root = where / "plugin"
    shutil.copytree(base, root)
    for rel, edits in ((f"kf_{NAME}/problem.py", problem_edits), (f"kf_{NAME}/{NAME}.cu", template_edits)):
        path = root / rel
        text = path.read_text()
        for old, new in edits.items():
            assert old in text, f"{old!r} is not in {rel}"
            text = text.replace(old, new, 1)
        path.write_text(text)
    problem = scaffold.load(root, NAME)
    if regen:
        (root / f"kf_{NAME}" / render.header_name(problem)).write_text(render.genes_header(problem))
    return problem


def run_check(monkeypatch, capsys, problem, entry: str = NAME, *args: str) -> tuple[int, str, str]:
    real = registry.load
    monkeypatch.setattr(registry, "load", lambda kind, name: problem if (kind, name) == ("problem", entry)
                        else real(kind, name))
    code = cli.main(["check", entry, "--sample", "1", "--shapes", "2", "--jobs", "1", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("rule, problem_edits, template_edits, says", CASES, ids=[c[0] for c in CASES])
def test_a_broken_rule_is_named_in_one_line(base, tmp_path, monkeypatch, capsys, rule, problem_edits,
                                            template_edits, says):
    problem = variant(base, tmp_path, problem_edits, template_edits, regen=rule == "macro-clash")
    code, out, err = run_check(monkeypatch, capsys, problem)
    assert code == cli.EXIT_FAILED, out + err
    first, *rest = err.strip().splitlines()
    assert first.startswith(f"kernel-factory check: {NAME}: FAILED [{rule}] "), err
    assert says in first, first
    if rule == "compiles":   # the generated source around the error's line, the line marked
        assert "generated source around line" in rest[0]
        assert any(line.startswith(">>") and "this_is_not_cuda" in line for line in rest), err
    else:
        assert rest == [], err
    assert "Traceback" not in err and not out.rstrip().endswith(": ok")


def test_the_scaffold_passes_as_written(base, tmp_path, monkeypatch, capsys):
    problem = variant(base, tmp_path, {}, {})
    code, out, err = run_check(monkeypatch, capsys, problem)
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith(f"contract: {NAME} v1") and lines[-1] == f"{NAME}: ok"
    assert any(line.startswith("cpu float32:3x7: ") and "rows independent" in line for line in lines)
    assert any("launch plans: " in line and "within CUDA's limits" in line for line in lines)
    assert any(line.startswith("baselines on the CPU") and "torch_eager, torch_compile match" in line
               for line in lines)
    assert sum(line.startswith("compiled 1/1 genomes for sm_90a") for line in lines) == 3


def test_entry_point_name_must_match(base, tmp_path, monkeypatch, capsys):
    problem = variant(base, tmp_path, {}, {})
    code, _, err = run_check(monkeypatch, capsys, problem, "probe_alias")
    assert code == cli.EXIT_FAILED
    assert err.strip() == (f"kernel-factory check: probe_alias: FAILED [entry-point] the entry point is named "
                           f"'probe_alias' but the problem's name is '{NAME}': configs, recordings and genes headers "
                           "use the name, so the two must agree")


@pytest.mark.parametrize("choice, says", [("wt-through", "is not a C identifier"),
                                          ("NC", "both become LOAD_NC")])
def test_gene_names_are_c_identifiers(base, tmp_path, choice, says):
    """A choice that is not a C identifier would render as STORE_WT - THROUGH (0 - 0: the first choice), silently:
    the space refuses it when it is built, so the plugin fails to load, naming the choice."""
    with pytest.raises(ValueError, match=re.escape(says)):
        Gene("load", ("plain", "nc", choice), "nc")
    with pytest.raises(ValueError, match=re.escape(says)):   # a plugin with such a space does not load
        variant(base, tmp_path, {'("plain", "nc"), "nc"': f'("plain", "nc", "{choice}"), "plain"'}, {})
    with pytest.raises(ValueError, match="the name must be a C identifier"):
        Gene("wt-through", (1, 2), 1)
    with pytest.raises(ValueError, match="genes 'load' and 'load_nc' both define the macro LOAD_NC"):
        GeneSpace((Gene("load", ("plain", "nc"), "nc"), Gene("load_nc", (0, 1), 0)))


def test_every_rule_is_documented_checked_and_tested():
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", DOCS.read_text(), re.M))
    tested = {c[0] for c in CASES} | set(SEPARATE)
    assert documented == set(RULES) == tested
    assert all(name in globals() for name in SEPARATE.values())


def test_a_stale_header_fails_run_too(base, tmp_path, monkeypatch):
    """`run` refuses a stale genes header of any installed plugin (before anything is made), naming the fix."""
    problem = variant(base, tmp_path, {'("plain", "nc"), "nc"': '("plain", "nc", "nc_na"), "nc"'}, {})
    real = registry.load
    monkeypatch.setattr(registry, "load", lambda kind, name: problem if name == NAME else real(kind, name))
    cfg = config.parse({"problem": NAME, "out_dir": str(tmp_path / "runs")})
    with pytest.raises(ConfigError, match=re.escape(f"run `kernel-factory genes {NAME}`")):
        build.prepare(cfg)
    assert not (tmp_path / "runs").exists()


def test_genomes_that_compile_alike_are_reported(base, tmp_path, monkeypatch, capsys):
    """A gene the template never reads makes its values one binary: check says so (a stale header or a forgotten
    gene looks the same), and passes (a gene only launch() reads is legitimate)."""
    problem = variant(base, tmp_path, {"\n))\n": '\n    Gene("unused", (1, 2), 1),\n))\n'}, {}, regen=True)
    code, out, err = run_check(monkeypatch, capsys, problem, NAME, "--all")
    assert code == 0, err
    (line,) = [ln for ln in out.splitlines() if ln.startswith("identical binaries (bfloat16): ")]
    assert "6 genomes compile to the same binary as another, e.g. unused = 1 | 2 (the other genes equal)" in line


def test_compiling_many_genomes_shows_progress(monkeypatch):
    clock = iter(range(0, 10_000, 3))
    monkeypatch.setattr(check_compile.time, "monotonic", lambda: float(next(clock)))
    jobs = [CompileJob(str(i), "", f"{i}.cu") for i in range(40)]
    lines = []
    out = check_compile.run_jobs(jobs, lambda job: CompileOutput(job.key, None, BuildInfo(), "x"), None,
                                 lines.append, "bfloat16")
    assert len(out) == 40 and 3 <= len(lines) <= 10
    assert all(re.fullmatch(r"compiling bfloat16: \d+/40 \(\d+\.\d/s, about \d+ s left\)", ln)
               for ln in lines), lines


def test_a_gene_macro_used_as_a_name_gets_a_hint(base, tmp_path):
    problem = variant(base, tmp_path, {}, {})
    source = "int a;\nint b;\n__global__ void k(long long N) {}\n"
    context, hint = check_compile.source_context(source, 'x.cu(3): error: expected an identifier', problem)
    assert ">>     3 | __global__ void k(long long N) {}" in context and hint == ""
    problem.space = GeneSpace((*problem.space.genes, Gene("n", (1, 2), 1)))
    _, hint = check_compile.source_context(source, 'x.cu(3): error: expected an identifier', problem)
    assert "uses N, gene 'n''s macro, where a name is expected" in hint


def test_ragged_shapes_may_vary_in_rank_past_their_fixed_dims():
    """RaggedShapes: (heads, then each packed sequence's length) passes the shape-sets rule; without the declaration
    the same sets fail it, and so does a fixed_dims that is not a count."""
    from types import SimpleNamespace

    from kernel_factory.evo.tools import check_contract
    sets = {"benchmark": ((96, 8192), (96, 1300, 547, 2048, 963, 271, 3063)), "correctness": ((2, 5, 1, 70),),
            "heldout": ((64, 1024, 1024),)}
    check_contract.shape_sets(SimpleNamespace(shape_sets=sets, fixed_dims=1))
    for problem, says in ((SimpleNamespace(shape_sets=sets), "shapes of ranks [2, 3, 4, 7]"),
                          (SimpleNamespace(shape_sets=sets, fixed_dims=-1), "fixed_dims = -1"),
                          (SimpleNamespace(shape_sets=sets, fixed_dims=2), "(96, 8192): a ragged shape has its 2")):
        with pytest.raises(check_contract.CheckFailed, match=re.escape(says)):
            check_contract.shape_sets(problem)
