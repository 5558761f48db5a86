"""The correctness gate's logic on the CPU: torch functions stand in for kernels, one per way a kernel cheats.
Each bad "kernel" must be caught with a message that says what it did; the honest one must pass."""
import random
import re

import pytest
import torch

from kernel_factory.evo import inputs as special
from kernel_factory.evo.evaluate import gate
from kernel_factory.evo.types import Case
from kernel_factory.problems.rmsnorm_fwd import EPS, problem as rmsnorm

CASE = Case((17, 760), "bfloat16")


def honest(ins, outs):
    xf = ins["x"].float()
    rstd = torch.rsqrt(xf.square().mean(-1) + EPS)
    outs["y"].copy_((xf * rstd[:, None] * ins["w"]).to(outs["y"].dtype))
    outs["rstd"].copy_(rstd)


def half_rows(ins, outs):
    honest(ins, outs)
    outs["y"][: outs["y"].shape[0] // 2] = float("nan")


def past_end(ins, outs):
    honest(ins, outs)
    y = outs["y"]
    torch.as_strided(y, (y.numel() + 1,), (1,))[-1] = 1.0   # one element beyond the buffer


def before_start(ins, outs):
    honest(ins, outs)
    r = outs["rstd"]
    torch.as_strided(r, (1,), (1,), r.storage_offset() - 3).fill_(2.0)


def scribbles_input(ins, outs):
    honest(ins, outs)
    ins["x"][0, 0] += 1


def nan_once(ins, outs):
    honest(ins, outs)
    outs["y"][3, 5] = float("nan")


def stale(ins, outs):
    if bool(torch.isfinite(outs["rstd"]).all()):
        return   # "already computed"
    honest(ins, outs)


def rstd_off_on_big_rows(ins, outs):
    honest(ins, outs)
    r = outs["rstd"]
    r[r < 1e-2] *= 1.2   # rows of large magnitude (rstd ~1e-2 and below): under bf16's absolute atol of 1e-3


def rstd_zero_on_big_rows(ins, outs):
    honest(ins, outs)
    r = outs["rstd"]
    r[r < 1e-2] = 0.0


def rstd_off_everywhere(ins, outs):
    honest(ins, outs)
    outs["rstd"].mul_(1.2)


def x_past_end(ins, outs):
    honest(ins, outs)
    x = ins["x"]
    torch.as_strided(x, (x.numel() + 1,), (1,))[-1] = 1.0   # one element beyond the input buffer


def w_past_end(ins, outs):
    honest(ins, outs)
    w = ins["w"]
    torch.as_strided(w, (1,), (1,), w.storage_offset() + w.numel() + 2).fill_(5.0)


def racy(ins, outs):
    honest(ins, outs)
    noise = torch.randint(0, 2, (1,)).item() * 1e-4   # within tolerance, but not reproducible
    outs["rstd"].add_(noise * outs["rstd"])


def eps_only_when_nonzero(ins, outs):
    xf = ins["x"].float()
    ms = xf.square().mean(-1)
    rstd = torch.rsqrt(ms + EPS * (ms > 0))   # forgets eps exactly where it matters most: an all-zero row
    outs["rstd"].copy_(rstd)
    outs["y"].copy_((xf * rstd[:, None] * ins["w"]).to(outs["y"].dtype))


def saturating_load(ins, outs):
    xf = ins["x"].float()
    xf = torch.where(xf.abs() > 1e30, xf.sign() * float("inf"), xf)   # a fast conversion that breaks at the top
    rstd = torch.rsqrt(xf.square().mean(-1) + EPS)
    outs["rstd"].copy_(rstd)
    outs["y"].copy_((xf * rstd[:, None] * ins["w"]).to(outs["y"].dtype))


def check(kernel, case=CASE):
    torch.manual_seed(0)
    return gate.Gate(rmsnorm, kernel, device="cpu").check(case, random.Random(1))


def test_an_honest_kernel_passes_every_launch():
    for dtype in ("bfloat16", "float16", "float32"):
        assert check(honest, Case((17, 760), dtype)) is None
    launches = []
    counted = lambda ins, outs: (launches.append(1), honest(ins, outs))   # noqa: E731
    assert gate.Gate(rmsnorm, counted, device="cpu", seeds=3).check(CASE, random.Random(2)) is None
    assert len(launches) == 5, "seeds=3: three seeds, one repeat, one special launch"


@pytest.mark.parametrize("kernel, words", [
    (half_rows, "non-finite"), (past_end, "after it"), (before_start, "before it"),
    (scribbles_input, "input 'x' was modified"), (nan_once, "non-finite"),
    (stale, "second call on the same buffers"), (eps_only_when_nonzero, "special rows"), (saturating_load, "special rows"),
    (rstd_off_on_big_rows, "rstd"), (rstd_zero_on_big_rows, "rstd"), (rstd_off_everywhere, "rstd"),
    (x_past_end, "wrote outside input 'x'"), (w_past_end, "wrote outside input 'w'"),
])
def test_each_cheat_is_caught(kernel, words):
    bad = check(kernel)
    assert bad is not None and words in bad, bad


def test_a_racy_kernel_is_caught_even_within_tolerance():
    # Flaky by nature for a real race; here the coin decides, so try seeds until the two launches disagree.
    for seed in range(20):
        torch.manual_seed(seed)
        bad = gate.Gate(rmsnorm, racy, device="cpu").check(CASE, random.Random(seed))
        if bad:
            assert "differs between two launches" in bad
            return
    pytest.fail("the racy kernel was never caught in 20 tries")


def test_canaries_report_distance_and_side():
    outs = rmsnorm.make_outputs(CASE, "cpu")
    g = gate.Guarded(outs, torch.Generator().manual_seed(0))
    assert g.violations() is None
    y = g.views["y"]
    torch.as_strided(y, (1,), (1,), y.storage_offset() + y.numel() + 9).fill_(3.0)
    msg = g.violations()
    assert "after it" in msg and "'y'" in msg and "nearest at byte 18 past its end" in msg   # bf16 element 9


def test_canaries_before_a_buffer_and_what_the_guards_hold_beside_it():
    outs = {"y": torch.empty(1 << 20, dtype=torch.float32)}
    g = gate.Guarded(outs, torch.Generator().manual_seed(1))
    y = g.views["y"]
    assert g.violations() is None
    # only the guard regions are kept to compare with, never a copy of the buffer (a wide fp32 panel ran out of
    # GPU memory on whole copies)
    assert sum(c.numel() for _, _, c in g._buffers) == 2 * gate.GUARD_BYTES
    torch.as_strided(y, (1,), (1,), y.storage_offset() - 2).fill_(float(torch.rand(1)) + 7.0)
    msg = g.violations()
    assert "before it" in msg and re.search(r"nearest at byte -[5-8] past its start", msg)   # bytes -8..-5


def test_special_rows_cover_the_documented_kinds():
    x = torch.randn(8, 300).to(torch.bfloat16)
    planted = special.plant_special_rows(x, torch.Generator().manual_seed(3))
    kinds = dict((k, r) for r, k in planted)
    assert set(kinds) == set(special.SPECIAL_ROWS)
    assert bool((x[kinds["zero"]] == 0).all())
    assert float(x[kinds["extremes"]].float().abs().max()) == torch.finfo(torch.bfloat16).max
    huge = x[kinds["huge"]].float()
    assert torch.isfinite(huge.square().sum()) and float(huge.abs().max()) > 1e15
    assert 0 < float(x[kinds["denormal"]].float().abs().max()) < torch.finfo(torch.bfloat16).smallest_normal


def test_reference_stays_finite_on_special_rows():
    for dtype in ("bfloat16", "float16", "float32"):
        for shape in ((17, 760), (5, 33), (9, 262144)):
            ref = rmsnorm.reference(rmsnorm.special_inputs(Case(shape, dtype), 4, "cpu"))
            assert all(bool(torch.isfinite(v).all()) for v in ref.values()), (dtype, shape)


def test_rstd_is_held_to_its_own_scale_in_every_dtype():
    for dtype in ("bfloat16", "float16", "float32"):
        bad = check(rstd_off_on_big_rows, Case((17, 760), dtype))
        assert bad is not None and "rstd" in bad, (dtype, bad)
        assert check(honest, Case((17, 760), dtype)) is None


def test_timed_outputs_are_sampled_fresh_with_both_ends_and_a_stripe():
    m = 32768
    a, b = gate.sample_rows(m, random.Random(1)), gate.sample_rows(m, random.Random(2))
    assert a != b, "two candidates must not share one sample"
    for rows in (a, b):
        assert len(rows) == 256 and len(set(rows)) == 256 and all(0 <= r < m for r in rows)
        assert set(range(8)) <= set(rows) and set(range(m - 8, m)) <= set(rows)
        runs = [r for r in rows if r - 1 in rows]
        assert len(runs) >= 63 + 7 + 7, "a contiguous stripe of 64 rows besides the ends"
    assert gate.sample_rows(100, random.Random(0)) == list(range(100))
