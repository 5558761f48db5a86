"""`kernel-factory new NAME` writes a plugin package whose every file is in place and valid (entry point, genes
header fresh, strict configs, a template that compiles as-is); bad names and existing folders are one line, exit 2,
nothing written. That `check` passes on it as written is tests/test_plugin_rules.py's; the example it made,
tests/plugins/kf_silu_mul, carries the scaffold's test and runs in CI."""
from __future__ import annotations

import tomllib

import pytest

from kernel_factory.evo import config
from kernel_factory.evo.evaluate import render
from kernel_factory.evo.evaluate.compile import CompileJob, compile_one
from kernel_factory.evo.tools import cli, scaffold


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    parent = tmp_path_factory.mktemp("new")
    assert cli.main(["new", "my_gate", "--dir", str(parent / "src")]) == 0   # the folder is made
    return parent / "src" / "kf_my_gate"


def test_every_file_is_written_and_the_entry_point_names_the_problem(written):
    names = {p.relative_to(written).as_posix() for p in written.rglob("*") if p.is_file()}
    assert names == {"pyproject.toml", "README.md", "record.yaml", "run.yaml", ".gitignore",
                     "tests/test_my_gate_plugin.py", "kf_my_gate/__init__.py", "kf_my_gate/problem.py",
                     "kf_my_gate/my_gate.cu", "kf_my_gate/my_gate_genes.cuh", "kf_my_gate/recorded/README.md"}
    meta = tomllib.loads((written / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["kernel_factory.problems"] == {"my_gate": "kf_my_gate.problem:problem"}
    assert meta["project"]["dependencies"] == [] and "--no-deps" in (written / "pyproject.toml").read_text()
    assert meta["tool"]["setuptools"]["package-data"]["kf_my_gate"] == ["*.cu", "*.cuh", "recorded/*"]


def test_the_genes_header_is_fresh_and_the_template_compiles_as_is(written):
    problem = scaffold.load(written, "my_gate")
    assert problem.name == "my_gate" and len(problem.space.genes) == 2
    assert {g.kind for g in problem.space.genes} == {"structure", "ptx"}
    assert render.genes_header_fault(problem) == ""
    out = compile_one(CompileJob("as-is", problem.template(), "my_gate.cu"))
    assert out.cubin is not None and out.cubin[:4] == b"\x7fELF", out.error


def test_the_configs_are_strict_configs_of_the_problem(written):
    for name in ("record.yaml", "run.yaml"):
        cfg = config.load(str(written / name), ())
        assert cfg.problem == "my_gate" and cfg.dtypes == ("bfloat16",)
    assert config.load(str(written / "record.yaml"), ()).evaluator.kind == "gpu"


@pytest.mark.parametrize("name, says", [
    ("My-Op", "problem name 'My-Op' is not valid: use lower-case letters, digits and _"),
    ("class", "problem name 'class' is not valid"),
    ("softmax_fwd", "a problem named 'softmax_fwd' is installed already"),
])
def test_a_bad_name_is_one_line_and_writes_nothing(tmp_path, capsys, name, says):
    assert cli.main(["new", name, "--dir", str(tmp_path)]) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert line.startswith(f"kernel-factory: error: {says}")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_folder_is_never_overwritten(written, capsys):
    before = (written / "kf_my_gate" / "problem.py").read_text()
    assert cli.main(["new", "my_gate", "--dir", str(written.parent)]) == cli.EXIT_BAD_INPUT
    assert "exists already; choose another --dir or name (nothing was written)" in capsys.readouterr().err
    assert (written / "kf_my_gate" / "problem.py").read_text() == before


def test_problems_prints_each_description_whole(capsys):
    """A description with a colon (most have one) is printed to its end, not cut at the colon."""
    from kernel_factory.evo import registry
    assert cli.main(["problems"]) == 0
    out = capsys.readouterr().out
    for name in ("softmax_fwd", "silu_mul"):
        description = registry.load("problem", name).description
        assert ":" in description
        (line,) = [ln for ln in out.splitlines() if ln.startswith(name + " ")]
        assert line.endswith(description)
