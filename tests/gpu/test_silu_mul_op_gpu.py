"""The generic library op on a GPU (run on an H200: tests/gpu/run.sh tests/gpu/test_silu_mul_op_gpu.py): the second
example plugin, silu_mul (out = silu(a) * b, two inputs on a 2-D grid), exported with --build from a recording of
made-up times (the op's correctness does not depend on them), then its op (kernels/op.py) against the fp64 formula:
every dtype, benchmark, odd and 3-D shapes, M past grid y's 65535 rows, every feasible genome, a side stream, a CUDA
graph and torch.compile. The op is loaded without a reference, so a silent fallback to torch cannot pass."""
from __future__ import annotations

import random

import pytest
import torch

from kernel_factory.evo import registry
from kernel_factory.evo.tools import export
from kernel_factory.kernels import op
from plugin_recordings import synthetic_recording

pytestmark = pytest.mark.gpu

DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
SHAPES = [(8192, 4096), (4096, 14336), (32768, 1024),        # benchmark
          (1024, 2880), (1, 1), (3, 7), (5, 4099),           # held-out, one element, odd N
          (70000, 3), (140001, 5), (2, 3, 1000)]             # rows past grid y's limit; 3-D a and b


@pytest.fixture(scope="module")
def problem():
    return registry.load("problem", "silu_mul")


def build(problem, folder, genomes=None):
    rec = synthetic_recording(folder / "rec.jsonl.gz", problem, genomes=genomes)
    path, table = export.export("silu_mul", [str(rec)], folder / "ops" / "silu_mul.json", build=True)
    return path, table


@pytest.fixture(scope="module")
def silu_op(problem, tmp_path_factory):
    path, _ = build(problem, tmp_path_factory.mktemp("op"))
    return op.load("silu_mul", path)   # no reference: the kernels run, or the call fails


def inputs(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(shape, generator=g, device="cuda") * 4).to(DT[dtype])
    b = torch.randn(shape, generator=g, device="cuda").to(DT[dtype])
    return a, b


def expect(problem, got, a, b, dtype):
    want = torch.nn.functional.silu(a.double()) * b.double()
    atol, rtol = problem.tolerance(dtype)
    assert got.shape == a.shape and got.dtype == a.dtype and got.is_cuda
    torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", sorted(DT))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_op_matches_the_formula(silu_op, problem, dtype, shape):
    a, b = inputs(shape, dtype, random.randrange(2**31))
    out = silu_op(a, b)
    torch.cuda.synchronize()
    expect(problem, out, a, b, dtype)
    assert torch.equal(torch.ops.kernel_factory.silu_mul(a, b), out)


def test_every_feasible_genome_through_the_op(problem, tmp_path):
    """Each genome alone in a table (so the op runs it at every N), at rows past grid y's limit and an odd width."""
    for i, genes in enumerate(problem.space.enumerate()):
        path, table = build(problem, tmp_path / str(i), genomes=[genes])
        assert len({k.split(":")[0] for k in table["kernels"]}) == 1
        one = op.load("silu_mul", path)
        for dtype in DT:
            for shape in ((66000, 5), (9, 4099)):
                a, b = inputs(shape, dtype, random.randrange(2**31))
                expect(problem, one(a, b), a, b, dtype)


def test_a_side_stream_a_cuda_graph_and_torch_compile(silu_op, problem):
    a, b = inputs((4096, 1024), "bfloat16", random.randrange(2**31))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = silu_op(a, b)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    expect(problem, out, a, b, "bfloat16")

    silu_op(a, b)   # warm: the launcher for this shape is made before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = silu_op(a, b)
    a.copy_(inputs((4096, 1024), "bfloat16", random.randrange(2**31))[0])
    graph.replay()
    torch.cuda.synchronize()
    expect(problem, captured, a, b, "bfloat16")

    compiled = torch.compile(lambda x, y: silu_op(x, y) * 2, fullgraph=True)
    x, y = inputs((1000, 3000), "float16", random.randrange(2**31))
    got = compiled(x, y)
    torch.cuda.synchronize()
    expect(problem, got / 2, x, y, "float16")
