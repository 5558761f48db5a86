"""The torch.compile baselines on the CPU: each case runs its own compiled graph (more cases than dynamo's
recompile limit included), and a call that falls back to eager code raises instead of being timed."""
import pytest
import torch

from kernel_factory.evo import compiled
from kernel_factory.evo.types import Case
from kernel_factory.problems import rmsnorm_bwd, rmsnorm_fwd

# More shapes than dynamo's default recompile limit (8): the old single compiled function ran eager past it.
SHAPES = [(3, 64), (5, 96), (2, 128), (7, 33), (4, 256), (6, 48), (1, 512), (9, 80), (3, 200), (2, 1000), (5, 17)]


@pytest.fixture(autouse=True)
def eager_backend(monkeypatch):
    """Dynamo's eager backend: the same capture, guards and recompile limit as inductor, without C++ codegen."""
    monkeypatch.setattr(compiled, "COMPILE_BACKEND", "eager")
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def graphs() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


@pytest.mark.parametrize("problem", [rmsnorm_fwd.problem, rmsnorm_bwd.problem], ids=lambda p: p.name)
def test_every_case_runs_its_own_compiled_graph(problem):
    assert len(SHAPES) > torch._dynamo.config.recompile_limit
    for i, shape in enumerate(SHAPES):
        case = Case(shape, "bfloat16")
        inputs = problem.make_inputs(case, seed=100 + i, device="cpu")
        before = graphs()
        fn = problem.baseline("torch_compile", case, inputs)
        first, second = fn(), fn()
        assert graphs() == before + 1, f"{case.key}: compiled {graphs() - before} graphs, want 1"
        ref = problem.reference(inputs)
        atol, rtol = problem.tolerance("bfloat16")
        for name, got in first.items():
            assert torch.equal(got, second[name])
            assert torch.allclose(got.float(), ref[name].float(), atol=atol * 4, rtol=rtol * 4), (case.key, name)


@pytest.mark.parametrize("fullgraph", [True, False])
def test_a_call_past_the_recompile_limit_raises(fullgraph):
    """One CompiledBaseline fed new shapes past a limit forced to 2: the third shape would run eager (fullgraph off:
    the graph-call count catches it; on: dynamo's own refusal), and is refused either way."""
    base = compiled.CompiledBaseline(rmsnorm_fwd._compiled_reference, f"limit-test-{fullgraph}", fullgraph=fullgraph)
    with torch._dynamo.config.patch(recompile_limit=2):
        for n in (16, 24):
            base(torch.randn(3, n, dtype=torch.bfloat16), torch.randn(n))
        with pytest.raises(compiled.NotCompiled, match="instead of 1|cannot run compiled"):
            base(torch.randn(3, 40, dtype=torch.bfloat16), torch.randn(40))


def test_a_graph_break_is_refused_before_timing():
    def breaks(x):
        y = x * 2
        print("", end="")   # a side effect dynamo cannot trace: with fullgraph it is an error, not eager code
        return y + 1
    base = compiled.CompiledBaseline(breaks, "break-test")
    with pytest.raises(compiled.NotCompiled):
        base(torch.randn(4))
