"""Gene macros have one home, the gene space: every shipped template includes a generated `<problem>_genes.cuh`
that matches its space, and no template #defines a gene, a choice constant or DTYPE by hand."""
import dataclasses
import random
from pathlib import Path

import pytest

from kernel_factory.evo import registry
from kernel_factory.evo.evaluate import render
from kernel_factory.evo.evaluate.compile import CompileJob, compile_one
from kernel_factory.evo.tools import cli, genes
from kernel_factory.evo.types import Genome
from kernel_factory.kernels import templates

PLUGIN_SOURCE = Path(__file__).parent / "plugins" / "kf_softmax" / "kf_softmax"
SHIPPED = ("rmsnorm_fwd", "rmsnorm_bwd", "rmsnorm_faults")


class Altered:
    """A problem with another gene space or template text, under the same name (so its header is the same file)."""

    def __init__(self, problem, space=None, extra: str = ""):
        self._problem, self.space, self._extra = problem, space or problem.space, extra
        self.name, self.dtypes = problem.name, problem.dtypes

    def template(self) -> str:
        text = self._problem.template()
        cut = text.index("#if DTYPE == DTYPE_BFLOAT16")   # after the genes header, before the code
        return text[:cut] + self._extra + text[cut:]


def _where(name: str) -> Path:
    return PLUGIN_SOURCE if name == "softmax_fwd" else templates.HERE


@pytest.mark.parametrize("name", SHIPPED + ("softmax_fwd",))
def test_committed_header_matches_its_gene_space_and_is_the_only_home(name):
    problem = registry.load("problem", name)
    st = genes.state(problem, _where(name))
    assert st.path == _where(name) / f"{name}_genes.cuh"
    assert st.fault() == "", st.fault()
    assert st.text in problem.template(), "the template must include the header (and template() inline it)"


@pytest.mark.parametrize("name", SHIPPED)
def test_a_changed_default_makes_the_header_stale(name):
    problem = registry.load("problem", name)
    rng = random.Random()
    gene = rng.choice([g for g in problem.space.genes if len(g.choices) > 1])
    other = rng.choice([c for c in gene.choices if c != gene.default])
    space = dataclasses.replace(problem.space, genes=tuple(
        dataclasses.replace(g, default=other) if g is gene else g for g in problem.space.genes))
    st = genes.state(Altered(problem, space), templates.HERE)
    assert not st.fresh and "is stale" in st.fault()
    assert f"#define {gene.name.upper()} {gene.define(other)}\n" in st.text


@pytest.mark.parametrize("name", SHIPPED)
def test_a_handwritten_gene_macro_in_the_template_is_caught(name):
    problem = registry.load("problem", name)
    gene = random.Random().choice(problem.space.genes)
    named = [c for c in gene.choices if isinstance(c, str)]
    extra = f"#ifndef {gene.name.upper()}\n#  define {gene.name.upper()} {gene.define(gene.default)}\n#endif\n"
    extra += f"#define {gene.define(named[-1])} {len(gene.choices) - 1}\n" if named else "#define DTYPE_FLOAT16 1\n"
    st = genes.state(Altered(problem, extra=extra), templates.HERE)
    assert st.fresh
    assert set(st.handwritten) == {gene.name.upper(), gene.define(named[-1]) if named else "DTYPE_FLOAT16"}
    assert "by hand" in st.fault()


def test_header_codes_choices_by_position_and_defines_every_dtype(rmsnorm):
    text = render.genes_header(rmsnorm)
    for gene in rmsnorm.space.genes:
        assert f"#ifndef {gene.name.upper()}\n#define {gene.name.upper()} {gene.define(gene.default)}\n#endif" in text
        for i, choice in enumerate(gene.choices):
            assert (f"#define {gene.define(choice)} {i}\n" in text) == isinstance(choice, str)
    odd = Altered(rmsnorm)
    odd.dtypes = ("float8_e4m3", "float16")
    text = render.genes_header(odd)
    assert "#define DTYPE_FLOAT8_E4M3 3\n" in text and "#define DTYPE_FLOAT32 2\n" in text
    assert "#ifndef DTYPE\n#define DTYPE DTYPE_FLOAT8_E4M3\n#endif" in text


def test_a_candidates_defines_come_before_the_header_defaults(rmsnorm):
    genome = Genome.of(random.Random().choice(list(rmsnorm.space.enumerate())))
    body = render.body(rmsnorm, genome, "float32")
    for gene in rmsnorm.space.genes:
        mine = body.index(f"#define {gene.name.upper()} {gene.define(genome.gene_dict[gene.name])}\n")
        assert mine < body.index(f"#ifndef {gene.name.upper()}\n")
    assert body.index("#define DTYPE DTYPE_FLOAT32\n") < body.index("#ifndef DTYPE\n")


@pytest.mark.parametrize("name", SHIPPED + ("softmax_fwd",))
def test_template_compiles_as_is(name):
    problem = registry.load("problem", name)
    out = compile_one(CompileJob(name, problem.template(), f"{name}.cu"))
    assert out.cubin is not None and out.cubin[:4] == b"\x7fELF", out.error


def test_cli_checks_and_refuses_a_bad_folder(capsys):
    assert cli.main(["genes", "--check"]) == 0
    assert cli.main(["genes", "--check", "--dir", str(PLUGIN_SOURCE), "softmax_fwd"]) == 0
    out = capsys.readouterr().out
    assert "rmsnorm_fwd: " in out and "softmax_fwd: " in out and "up to date" in out
    assert cli.main(["genes", "--dir", "/no/such/folder"]) == cli.EXIT_BAD_INPUT
    assert "--dir '/no/such/folder' is not a folder" in capsys.readouterr().err
