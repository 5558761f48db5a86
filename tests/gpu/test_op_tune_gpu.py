"""GPU tests of the op's first-call tuning (kernels/tune.py): on a new shape the op times every kernel its table holds
for the dtype and keeps the fastest; the outputs are right whichever wins, the pick is kept on disk and a second
process reuses it without timing, and a shape first met inside a CUDA-graph capture takes the rule's pick and is
right on replay. Fresh random inputs every time; NaN never passes (assert_close)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from kernel_factory.kernels import rmsnorm as op
from kernel_factory.kernels import runtime, tune
from rmsnorm_formula import formula

pytestmark = pytest.mark.gpu

DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (2e-3, 2e-3), torch.float32: (1e-4, 1e-4)}
SHAPES = [(1, 7168), (19, 4100), (301, 2880), (4099, 96), (6, 131072)]   # M = 1, odd N, tiny N, small M wide


def rand(shape, dtype, seed, grad=False):
    g = torch.Generator(device="cuda").manual_seed(seed)
    scale = torch.pow(10.0, torch.rand(shape[:-1] + (1,), generator=g, device="cuda") * 4 - 2)
    return (torch.randn(shape, generator=g, device="cuda") * scale).to(dtype).requires_grad_(grad)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """The op with kernels that have tuned nothing yet, its picks kept under tmp_path, every timing recorded."""
    monkeypatch.setenv("KF_TUNE_CACHE", str(tmp_path))
    monkeypatch.setattr(op, "FWD", runtime.Kernels("rmsnorm_fwd"))
    monkeypatch.setattr(op, "BWD", runtime.Kernels("rmsnorm_bwd"))
    timings = []
    real = tune.time_candidates

    def recorded(launches, device):
        samples = real(launches, device)
        timings.append(samples)
        return samples
    monkeypatch.setattr(tune, "time_candidates", recorded)
    return timings


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("x_dt", ["bf16", "fp16", "fp32"])
def test_a_tuned_shape_is_right_forward_and_backward(fresh, x_dt, shape, tmp_path):
    dtype = DT[x_dt]
    x, w = rand(shape, dtype, 1, grad=True), torch.randn(shape[-1], device="cuda").requires_grad_(True)
    out = op.rmsnorm(x, w)
    dout = rand(shape, dtype, 2)
    out.backward(dout)
    xr, wr = x.detach().double().requires_grad_(True), w.detach().double().requires_grad_(True)
    want = formula(xr, wr)[0]
    want.backward(dout.double())
    atol, rtol = TOL[dtype]
    torch.testing.assert_close(out.double(), want.detach(), atol=atol, rtol=rtol)
    for got, ref in ((x.grad, xr.grad), (w.grad, wr.grad)):
        torch.testing.assert_close(got.double(), ref, atol=atol * (1 + ref.abs().max().item()), rtol=rtol)
    name = runtime.DTYPE_NAMES[str(dtype)]
    m, n = shape
    for kernels, samples in zip((op.FWD, op.BWD), fresh):
        assert len(samples) == len(kernels.in_reach(name, m, n)) > 1   # the rule's pick, the region's candidates
        assert all(len(v) >= tune.ROUNDS[0] and all(t > 0 for t in v) for v in samples.values())
        pick = kernels._tuned[(torch.cuda.current_device(), name, m, n)]
        assert pick.genome == tune.fastest(samples)
        kept = json.loads(next(tmp_path.glob(f"{kernels.problem}-*.json")).read_text())["picks"]
        assert kept == {f"{torch.cuda.get_device_name()}|{name}|{m}|{n}": pick.genome}


def test_a_second_process_reuses_the_picks_without_timing(fresh, tmp_path):
    x, w = rand((37, 5000), torch.bfloat16, 3), torch.randn(5000, device="cuda")
    op.rmsnorm_fwd(x, w)
    assert len(fresh) == 1
    first = op.FWD._tuned[(torch.cuda.current_device(), "bfloat16", 37, 5000)].genome
    code = (
        "import torch\n"
        "from kernel_factory.kernels import rmsnorm as op, tune\n"
        "def refuse(*a):\n    raise AssertionError('timed again')\n"
        "tune.time_candidates = refuse\n"
        "x, w = torch.randn(37, 5000, device='cuda', dtype=torch.bfloat16), torch.randn(5000, device='cuda')\n"
        "y = op.rmsnorm_fwd(x, w)[0]\n"
        "ref = (x.float() * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + 1e-6) * w).to(x.dtype)\n"
        "torch.testing.assert_close(y.float(), ref.float(), atol=2e-2, rtol=2e-2)\n"
        "print(op.FWD._tuned[(0, 'bfloat16', 37, 5000)].genome)\n")
    env = {**os.environ, "KF_TUNE_CACHE": str(tmp_path)}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.strip().splitlines()[-1] == first


def test_a_shape_first_met_in_a_graph_capture_takes_the_rule_and_replays_right(fresh, tmp_path):
    shape = (53, 3000)
    static_x, w = rand(shape, torch.float16, 4), torch.randn(shape[-1], device="cuda")
    with tune.rule_only():       # the rule's module and plan made outside the capture, as any capture needs
        op.rmsnorm_fwd(static_x, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = op.rmsnorm_fwd(static_x, w)[0]
    assert not fresh and not op.FWD._tuned and not list(tmp_path.glob("*.json"))
    for seed in (5, 6):
        static_x.copy_(rand(shape, torch.float16, seed))
        static_out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(static_out.double(), formula(static_x.double(), w.double())[0], atol=2e-3,
                                   rtol=2e-3)
    op.rmsnorm_fwd(static_x, w)    # outside the capture the shape is tuned as usual
    assert len(fresh) == 1


def test_rule_only_runs_the_rules_kernel(fresh):
    x, w = rand((29, 6000), torch.float32, 7), torch.randn(6000, device="cuda")
    with tune.rule_only():
        y = op.rmsnorm_fwd(x, w)[0]
    assert not fresh and not op.FWD._tuned
    rule = op.FWD.kernel("float32", 29, 6000)
    assert [key[1] for key in op.FWD._launchers] == [rule.genome]
    torch.testing.assert_close(y.double(), formula(x.double(), w.double())[0], atol=1e-4, rtol=1e-4)
