"""`kernel-factory check PROBLEM` on the CPU: a good plugin passes with ptxas resources reported; a gene value that
never compiles, an input generator that ignores its seed, or a reference that is not finite fails with one line
that names it. NVRTC compiles sm_90a cubins without a GPU."""
import math

import pytest

from kernel_factory.evo import registry
from kernel_factory.evo.tools import cli


class Edited:
    """The softmax plugin with one thing changed (a stand-in for a plugin author's mistake), under its name and
    module (what check reads the plugin's imports from)."""

    __module__ = "kf_softmax.problem"

    def __init__(self, inner, **changes):
        self._inner, self._changes = inner, changes

    def __getattr__(self, name):
        return self._changes.get(name) or getattr(self._inner, name)


@pytest.fixture
def plugin(monkeypatch):
    softmax = registry.load("problem", "softmax_fwd")

    def install(**changes):
        edited = Edited(softmax, **changes)
        load = registry.load
        monkeypatch.setattr(registry, "load", lambda kind, name: edited if name == "softmax_fwd" else load(kind, name))
    return softmax, install


def test_a_good_plugin_passes_and_reports_ptxas(capsys):
    assert cli.main(["check", "softmax_fwd", "--sample", "2", "--shapes", "1"]) == 0
    out = capsys.readouterr().out
    assert "compiled 2/2 genomes for sm_90a (bfloat16)" in out and "ptxas: registers " in out
    assert out.rstrip().endswith("softmax_fwd: ok")


def test_a_gene_value_that_never_compiles_is_named(plugin, capsys):
    softmax, install = plugin
    broken = softmax.template().replace("#include <cuda_fp16.h>",
                                        "#include <cuda_fp16.h>\n#if VEC_BYTES == 16\n#error sixteen\n#endif", 1)
    install(template=lambda: broken)   # the first dtype (bfloat16) fails: the others are not compiled
    assert cli.main(["check", "softmax_fwd", "--sample", "4", "--shapes", "1", "--seed", "3"]) == cli.EXIT_FAILED
    out, err = capsys.readouterr()
    (never,) = [line for line in out.splitlines() if line.startswith("gene values that never compiled: ")]
    assert "vec_bytes=16" in never and "vec_bytes=8" not in never
    assert "FAILED [compiles] bfloat16:" in err and "do not compile; first {" in err and "sixteen" in err


def test_inputs_that_ignore_their_seed_fail_before_any_compile(plugin, capsys):
    softmax, install = plugin
    install(make_inputs=lambda case, seed, device: softmax.make_inputs(case, 0, device))
    assert cli.main(["check", "softmax_fwd"]) == cli.EXIT_FAILED
    err = capsys.readouterr().err
    assert "make_inputs gives the same inputs for another seed" in err and "compiled" not in err


def test_a_reference_that_is_not_finite_fails(plugin, capsys):
    softmax, install = plugin
    install(reference=lambda inputs: {k: v * math.nan for k, v in softmax.reference(inputs).items()})
    assert cli.main(["check", "softmax_fwd"]) == cli.EXIT_FAILED
    assert "is not finite" in capsys.readouterr().err


def test_an_unknown_problem_is_one_line(capsys):
    assert cli.main(["check", "no_such_problem"]) == cli.EXIT_BAD_INPUT
    assert "unknown problem 'no_such_problem'; installed:" in capsys.readouterr().err
