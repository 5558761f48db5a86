"""Rendering: gene #defines, a header naming the candidate, and patches confined to editable regions."""
import pytest

from kernel_factory.evo.regions import regions as regions_of
from kernel_factory.evo.evaluate import render
from kernel_factory.evo.types import Candidate, Genome

T = """head
// ---- KF-EDIT-BEGIN one ----
old one
// ---- KF-EDIT-END one ----
middle
// KF-EDIT-BEGIN two
old two
// KF-EDIT-END two
tail
"""


def test_regions_are_found():
    assert regions_of(T) == {"one": "old one\n", "two": "old two\n"}


def test_patch_replaces_only_its_region():
    out = render.apply_patch(T, {"two": "new two"})
    assert "new two\n" in out and "old two" not in out and "old one" in out
    assert out.startswith("head\n") and out.endswith("tail\n") and "KF-EDIT-END two" in out


def test_unknown_region_is_an_error():
    with pytest.raises(render.PatchError, match="'three'"):
        render.apply_patch(T, {"three": "x"})


def test_render_has_header_defines_and_template(rmsnorm):
    cand = Candidate(Genome.of({**rmsnorm.space.defaults(), "load": "cp_async"}), ("aaa", "bbb"), "uniform_crossover", 4)
    src = render.render(rmsnorm, cand, "float16")
    assert src.startswith(f"// kernel-factory candidate {cand.id}")
    assert "parents: aaa, bbb | operator: uniform_crossover | generation: 4" in src
    assert "#define LOAD LOAD_CP_ASYNC\n" in src and "#define KEEP_X 1\n" in src and "#define DTYPE DTYPE_FLOAT16" in src
    # lineage is in the header only: the binary (and its cache key) depends on genes, not parents
    assert render.body(rmsnorm, cand.genome, "float16") in src


def test_template_regions_exist(rmsnorm):
    assert {"load_store", "reduce", "first_pass", "second_pass"} <= set(regions_of(rmsnorm.template()))


def test_templates_inline_their_local_headers(tmp_path, monkeypatch):
    from kernel_factory.kernels import templates
    for name in ("rmsnorm_fwd.cu", "rmsnorm_bwd.cu"):
        text = templates.read(name)
        assert '#include "' not in text and "KF-EDIT-BEGIN load_store" in text and "#include <cuda_bf16.h>" in text
    monkeypatch.setattr(templates, "HERE", tmp_path)
    (tmp_path / "k.cu").write_text('// k\n#include "a.cuh"\nint k;\n')
    (tmp_path / "a.cuh").write_text('int a;\n#include "b.cuh"\n')
    (tmp_path / "b.cuh").write_text("int b;\n")
    assert templates.read("k.cu") == "// k\nint a;\nint b;\nint k;\n"
    (tmp_path / "b.cuh").write_text('#include "a.cuh"\n')
    with pytest.raises(templates.TemplateError, match=r"include each other: k.cu -> a.cuh -> b.cuh -> a.cuh"):
        templates.read("k.cu")
    (tmp_path / "a.cuh").write_text('#include "gone.cuh"\n')
    with pytest.raises(templates.TemplateError, match=r"template 'a.cuh' needs 'gone.cuh', which is not in"):
        templates.read("k.cu")


def test_the_gpu_tests_wrong_kernel_edits_apply_to_todays_template_and_compile(rmsnorm):
    """tests/gpu/test_gpu_evaluator.py makes wrong kernels by editing the template's second_pass region; an edit
    that no longer matches the template fails there only on a GPU host. Here: each edit applies, changes the
    source, and the patched kernel compiles with NVRTC."""
    import importlib.util
    from pathlib import Path
    from kernel_factory.evo.evaluate.compile import CompileJob, compile_one
    path = Path(__file__).parent / "gpu" / "test_gpu_evaluator.py"
    spec = importlib.util.spec_from_file_location("gpu_evaluator_tests", path)
    gpu_tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_tests)
    body = regions_of(rmsnorm.template())["second_pass"]
    for name, (old, new) in gpu_tests.WRONG_EDITS.items():
        edited = gpu_tests.second_pass(rmsnorm, old, new)
        assert edited != body, name
        cand = gpu_tests.patched(rmsnorm, "second_pass", edited)
        out = compile_one(CompileJob(name, render.render(rmsnorm, cand, "bfloat16"), f"{name}.cu"))
        assert out.error is None and out.cubin, (name, out.error)
