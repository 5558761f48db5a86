"""Export for any problem: the second example plugin (silu_mul, two inputs on a 2-D grid) exported with --build from
a recording becomes a torch.library op (kernels/op.py) that runs on the CPU through the plugin's reference, with a
fake implementation that passes opcheck; an op of several outputs and a scalar; and export names what keeps a
problem from an op. The op on a GPU is tests/gpu/test_silu_mul_op_gpu.py."""
from __future__ import annotations

import json
import random
import subprocess
import sys
import warnings

import pytest
import torch

from kernel_factory.evo import registry
from kernel_factory.evo.tools import cli
from kernel_factory.kernels import op
from plugin_recordings import synthetic_recording

DT = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@pytest.fixture(scope="module")
def silu_mul():
    return registry.load("problem", "silu_mul")


@pytest.fixture(scope="module")
def exported(tmp_path_factory, silu_mul):
    """`kernel-factory export --problem silu_mul REC --build` into a fresh folder: the table, its cubins, and what
    the command printed."""
    folder = tmp_path_factory.mktemp("export")
    rec = synthetic_recording(folder / "silu_mul-synthetic.jsonl.gz", silu_mul)
    out = subprocess.run([sys.executable, "-m", "kernel_factory.evo.tools.cli", "export", "--problem", "silu_mul",
                          str(rec), "--build", "--out", str(folder / "ops" / "silu_mul.json")],
                         capture_output=True, text=True, cwd=folder, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return folder / "ops" / "silu_mul.json", out.stdout


def test_export_builds_every_kernel_and_says_how_to_load_the_op(exported):
    path, stdout = exported
    table = json.loads(path.read_text())
    assert set(table["dtypes"]) == {"bfloat16", "float16", "float32"}
    for key, kernel in table["kernels"].items():
        assert (path.parent / kernel["cubin"]).read_bytes()[:4] == b"\x7fELF"
        steps = kernel["recipe"]["steps"]
        assert steps[0]["grid"]["y"][0] == "min" and set(steps[0]["block"]) == {"x", "y"}, key
        assert kernel["recipe"]["op"] == {"inputs": ["a", "b"], "outputs": {"out": {"like": "a"}}}
    assert (f"library op: kernel_factory.kernels.op.load('silu_mul', '{path}') registers "
            "torch.ops.kernel_factory.silu_mul(a, b) -> out") in stdout


@pytest.fixture(scope="module")
def silu_op(exported, silu_mul):
    return op.load("silu_mul", exported[0], reference=silu_mul.reference)


@pytest.mark.parametrize("dtype", sorted(DT))
@pytest.mark.parametrize("shape", [(7, 33), (3, 5, 1000), (1, 1)])
def test_the_op_runs_its_reference_on_the_cpu(silu_op, silu_mul, dtype, shape):
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    a = (torch.randn(shape, generator=gen) * 4).to(DT[dtype])
    b = torch.randn(shape, generator=gen).to(DT[dtype])
    got = silu_op(a, b)
    assert got.shape == a.shape and got.dtype == a.dtype
    want = (torch.nn.functional.silu(a.double()) * b.double())
    atol, rtol = silu_mul.tolerance(dtype)
    torch.testing.assert_close(got.double(), want, atol=atol + 1e-2 * (dtype != "float32"), rtol=rtol)
    assert torch.equal(torch.ops.kernel_factory.silu_mul(a, b), got)


def test_the_cpu_path_says_once_that_it_runs_the_reference(exported, silu_mul):
    fresh = op.load("silu_mul", exported[0], reference=silu_mul.reference)
    with pytest.warns(RuntimeWarning, match=r"kernel_factory silu_mul: runs its torch reference \(tensors on cpu\)"):
        fresh(torch.randn(2, 3), torch.randn(2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh(torch.randn(2, 3), torch.randn(2, 3))


def test_the_op_passes_opcheck_and_traces_under_torch_compile(silu_op):
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    a, b = torch.randn(6, 40, generator=gen), torch.randn(6, 40, generator=gen)
    torch.library.opcheck(torch.ops.kernel_factory.silu_mul.default, (a, b))
    compiled = torch.compile(lambda x, y: silu_op(x, y) + 1, backend="eager", fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(a, b), silu_op(a, b) + 1)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = torch.ops.kernel_factory.silu_mul(torch.empty(2, 3, 4, dtype=torch.bfloat16),
                                                 torch.empty(2, 3, 4, dtype=torch.bfloat16))
        assert fake.shape == (2, 3, 4) and fake.dtype == torch.bfloat16


def test_without_a_reference_the_op_says_it_cannot_run_on_the_cpu(exported):
    bare = op.load("silu_mul", exported[0])
    try:
        with pytest.raises(op.OpError, match=r"cannot run its kernels here \(tensors on cpu\) and was loaded without "
                                             r"a reference: pass reference= to op.load\(\)"):
            bare(torch.randn(2, 3), torch.randn(2, 3))
        with pytest.raises(op.OpError, match="silu_mul takes a, b; got 1 tensors"):
            bare(torch.randn(2, 3))
    finally:
        op.load("silu_mul", exported[0], reference=registry.load("problem", "silu_mul").reference)


def _recipe(**op_section):
    return {"steps": [{"kernel": "k", "grid": {"x": ["cdiv", "N", 128], "y": "M"}, "block": 128,
                       "args": [["ptr", "x"], ["ptr", "y"], ["ptr", "rstd"], ["i64", "N"], ["f32", "eps"]]}],
            "op": op_section}


def _table(tmp_path, name, recipe):
    data = {"format": "kernel-factory-dispatch/2", "problem": name, "genomes": {"g": {"genes": {}, "patch": {}}},
            "dtypes": {"float32": {"general": {"genome": "g"}, "by_n": {}}},
            "kernels": {"g:float32": {"cubin": "cubins/none.cubin", "sha256": "0", "arch": "sm_90a",
                                      "recipe": recipe}}}
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return path


def test_an_op_of_several_outputs_and_a_scalar(tmp_path):
    """Outputs like an input or of a dtype and a shape (recipe expressions), and a scalar with its default: the
    schema, the fake implementation and the CPU path follow the recipe's op section."""
    recipe = _recipe(inputs=["x"], outputs={"rstd": {"dtype": "float32", "shape": ["M"]}, "y": {"like": "x"}},
                     returns=["y", "rstd"], scalars={"eps": 1e-6})

    def reference(inputs, eps=1e-6):
        x = inputs["x"].float().reshape(-1, inputs["x"].shape[-1])
        rstd = torch.rsqrt(x.square().mean(-1) + eps)
        return {"y": (x * rstd[:, None]).reshape(inputs["x"].shape), "rstd": rstd}
    norm = op.load("kf_test_norm", _table(tmp_path, "kf_test_norm", recipe), reference=reference)
    assert norm.spec.schema() == "kf_test_norm(Tensor x, float eps=1e-06) -> (Tensor y, Tensor rstd)"
    x = torch.randn(2, 5, 64, generator=torch.Generator().manual_seed(random.randrange(2**31))).to(torch.bfloat16)
    y, rstd = norm(x)
    assert y.shape == x.shape and y.dtype == torch.bfloat16 and rstd.shape == (10,) and rstd.dtype == torch.float32
    want = reference({"x": x})
    torch.testing.assert_close(rstd, want["rstd"])
    torch.library.opcheck(torch.ops.kernel_factory.kf_test_norm.default, (x.float(), 1e-5))
    with pytest.raises(op.OpError, match="takes x and the scalars eps; got 1 tensors and \\['epsilon'\\]"):
        norm(x, epsilon=1e-5)


@pytest.mark.parametrize("recipe, says", [
    ({"steps": [{"kernel": "k", "grid": 1, "block": 32, "args": [["ptr", "x"]]}]}, "has no 'op' section"),
    (_recipe(inputs=["x"], outputs={"y": {"like": "z"}}), "output 'y' is like 'z', which is not an input"),
    (_recipe(inputs=["x"], outputs={"y": {"like": "x"}}), "tensor 'rstd' is neither an op input, an op output nor"),
    (_recipe(inputs=["x"], outputs={"y": {"like": "x"}, "rstd": {"like": "x"}}), "outputs y, rstd need 'returns'"),
])
def test_what_keeps_a_table_from_an_op_is_named(tmp_path, recipe, says):
    with pytest.raises(op.OpError, match=says):
        op.load("kf_test_bad", _table(tmp_path, "kf_test_bad", recipe))


def test_export_build_names_a_problem_without_a_recipe(tmp_path, capsys):
    rec = tmp_path / "softmax.jsonl.gz"
    synthetic_recording(rec, registry.load("problem", "softmax_fwd"), dtypes=("bfloat16",))
    code = cli.main(["export", "--problem", "softmax_fwd", str(rec), "--build", "--out", str(tmp_path / "t.json")])
    assert code == cli.EXIT_BAD_INPUT
    assert "problem 'softmax_fwd' has no recipe(genes, dtype): the op cannot launch its kernels without the plugin" \
        in capsys.readouterr().err
