"""The KDA forward's reference (problems/kda_reference.py, issue 31): the chunked form against the token-by-token
recurrence that defines the op, packed sequences independent of each other, FlashKDA's gate and the delta rule's
write-then-read property, on fresh random inputs in float64."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from plugin_recordings import synthetic_recording

from kernel_factory.evo.protocols import MissingBaseline
from kernel_factory.evo.tools import cli
from kernel_factory.evo.types import Case
from kernel_factory.kernels import op
from kernel_factory.problems import kda_reference as kda
from kernel_factory.problems.kda_fwd import problem


def _prepared(lengths, heads=3, head=16, seed=0, initial=True):
    raw = kda.make_inputs(lengths, heads, seed, head_k=head, head_v=head + 8, dtype=torch.float64, initial=initial)
    p = kda.prepare(raw, torch.float64)
    state = raw.get("initial_state")
    return p, raw["cu_seqlens"].tolist(), None if state is None else state.double()


@pytest.mark.parametrize("chunk", [1, 16, 32, 64])
def test_the_chunked_form_is_the_recurrence(chunk):
    lengths = [5, 37, 64, 1, 130]   # shorter than a chunk, odd, whole chunks, one token, several chunks and a rest
    p, cu, state = _prepared(lengths, seed=chunk)
    args = (p["q"], p["k"], p["v"], p["g"], p["beta"], cu)
    want_o, want_s = kda.recurrent(*args, initial_state=state)
    got_o, got_s = kda.chunked(*args, initial_state=state, chunk=chunk)
    assert torch.isfinite(want_o).all() and want_o.abs().max() > 1e-3 and want_s.abs().max() > 1e-3
    torch.testing.assert_close(got_o, want_o, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(got_s, want_s, rtol=1e-9, atol=1e-10)


def test_packed_sequences_do_not_see_each_other():
    lengths = [20, 9, 41]
    p, cu, state = _prepared(lengths, seed=5)
    o, s = kda.chunked(p["q"], p["k"], p["v"], p["g"], p["beta"], cu, initial_state=state, chunk=16)
    for i, (a, b) in enumerate(zip(cu, cu[1:])):
        alone = kda.recurrent(*(p[n][a:b] for n in ("q", "k", "v", "g", "beta")), [0, b - a],
                              initial_state=state[i:i + 1])
        torch.testing.assert_close(o[a:b], alone[0], rtol=1e-9, atol=1e-10)
        torch.testing.assert_close(s[i:i + 1], alone[1], rtol=1e-9, atol=1e-10)
    zero = kda.chunked(p["q"], p["k"], p["v"], p["g"], p["beta"], cu, chunk=16)
    torch.testing.assert_close(zero[0], kda.recurrent(p["q"], p["k"], p["v"], p["g"], p["beta"], cu,
                                                      initial_state=torch.zeros_like(state))[0])


def test_a_written_value_is_read_back_by_its_key():
    """beta = 1, no decay, an empty state: after token t writes (k, v), the query k reads scale * v."""
    torch.manual_seed(1)
    k = torch.randn(1, 2, 8, dtype=torch.float64)
    k = k / k.norm(dim=-1, keepdim=True)
    v = torch.randn(1, 2, 5, dtype=torch.float64)
    o, s = kda.recurrent(k, k, v, torch.zeros(1, 2, 8, dtype=torch.float64), torch.ones(1, 2, dtype=torch.float64),
                         [0, 1], scale=1.0)
    torch.testing.assert_close(o[0], v[0])
    torch.testing.assert_close(s[0], k[0][..., None] * v[0][:, None, :])


def test_the_safe_gate_decays_every_channel_within_its_bound():
    raw = kda.make_inputs([300], 4, seed=3, head_k=32, head_v=32)
    g = kda.safe_gate(raw["g_raw"], raw["A_log"], raw["dt_bias"])
    assert g.shape == raw["g_raw"].shape and (g <= 0).all() and (g >= kda.LOWER).all()
    x = torch.exp(raw["A_log"].double())[:, None] * (raw["g_raw"].double() + raw["dt_bias"].double())
    torch.testing.assert_close(g.double(), kda.LOWER / (1 + torch.exp(-x)), rtol=1e-6, atol=1e-6)
    assert g.min() < 0.9 * kda.LOWER and g.max() > 0.1 * kda.LOWER       # the inputs span the bound, both ends
    again = kda.make_inputs([300], 4, seed=3, head_k=32, head_v=32)
    other = kda.make_inputs([300], 4, seed=4, head_k=32, head_v=32)
    assert torch.equal(raw["q"], again["q"]) and not torch.equal(raw["q"], other["q"])


def test_the_reference_gives_finite_outputs_of_the_ops_shapes():
    raw = kda.make_inputs([100, 28], 2, seed=8, head_k=16, head_v=16)
    out = kda.reference(raw, chunk=32)
    assert out["o"].shape == (128, 2, 16) and out["final_state"].shape == (2, 2, 16, 16)
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in out.values())


@pytest.mark.parametrize("cu, why", [([0], "at least one sequence"), ([1, 4], "starts at 0"),
                                     ([0, 5, 3], "never decreases")])
def test_bad_sequence_bounds_and_states_are_named(cu, why):
    with pytest.raises(ValueError, match=why):
        kda.bounds(cu)
    p, cu_ok, state = _prepared([4, 4])
    with pytest.raises(ValueError, match=r"initial_state has shape \(1, 3, 16, 24\)"):
        kda.recurrent(p["q"], p["k"], p["v"], p["g"], p["beta"], cu_ok, initial_state=state[:1])
    with pytest.raises(ValueError, match="lengths"):
        kda.make_inputs([3, 0], 2, seed=0)


def test_the_kda_plugin_passes_check_with_ragged_shapes(capsys):
    """problems/kda_fwd.py: every plugin rule on the CPU (ragged shapes, launch limits on every shape, the reference
    against reference_rows, the torch baseline, sampled genomes compiled for sm_90a)."""
    assert cli.main(["check", "kda_fwd", "--sample", "3", "--jobs", "1"]) == 0
    out = capsys.readouterr().out
    assert out.strip().endswith("kda_fwd: ok") and "launch plans: " in out and "within CUDA's limits" in out
    assert "compiled 3/3 genomes for sm_90a" in out


def test_the_kda_launch_covers_every_sequence_head_and_column():
    case = Case((3, 70, 1, 17), "bfloat16")
    inputs, outputs = problem.make_inputs(case, 0, "cpu"), problem.make_outputs(case, "cpu")
    assert inputs["cu_seqlens"].tolist() == [0, 70, 71, 88] and outputs["o"].shape == (88, 3, 128)
    assert outputs["final_state"].shape == (3, 3, 128, 128)
    (plan,) = problem.launch({**problem.space.defaults(), "v_block": 32, "k_lanes": 8}, case, inputs, outputs)
    assert plan.grid == (4, 3, 3) and plan.block == (256, 1, 1)
    assert plan.args[:9] == tuple(inputs[n] for n in ("q", "k", "v", "g_raw", "beta_raw", "A_log", "dt_bias",
                                                      "cu_seqlens", "initial_state"))
    assert plan.args[9] is outputs["o"] and plan.args[10] is outputs["final_state"] and plan.args[11] == 3
    flash = [s for s in problem.shape_sets["benchmark"] if s[0] == 96]
    assert len(flash) == 3 and all(sum(s[1:]) == 8192 for s in flash)


def test_the_fla_peer_is_declared_and_missing_is_a_clear_error(monkeypatch):
    assert [p.baseline for p in problem.declared_peers] == ["fla", "torch_eager"] and problem.peers == ("fla",)
    monkeypatch.setitem(sys.modules, "fla", None)   # as on a machine without FLA
    case = Case((2, 5), "bfloat16")
    with pytest.raises(MissingBaseline, match="FLA is not installed here"):
        problem.baseline("fla", case, problem.make_inputs(case, 0, "cpu"))
    with pytest.raises(MissingBaseline, match="unknown baseline 'flashkda'; this problem has torch_eager, fla"):
        problem.baseline("flashkda", case, {})


def test_the_kda_op_is_exported_and_runs_its_reference_on_the_cpu(tmp_path):
    """`kernel-factory export --problem kda_fwd REC --build`: a torch.library op over the raw inputs, o and the final
    state out; on the CPU it runs the reference, and its fake implementation passes opcheck."""
    rec = synthetic_recording(tmp_path / "kda.jsonl.gz", problem, dtypes=("bfloat16",))
    out = subprocess.run([sys.executable, "-m", "kernel_factory.evo.tools.cli", "export", "--problem", "kda_fwd",
                          str(rec), "--build", "--out", str(tmp_path / "ops" / "kda_fwd.json")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "torch.ops.kernel_factory.kda_fwd(q, k, v, g_raw, beta_raw, A_log, dt_bias, cu_seqlens, " \
           "initial_state) -> o, final_state" in out.stdout
    kda_op = op.load("kda_fwd", tmp_path / "ops" / "kda_fwd.json", reference=problem.reference)
    inputs = problem.make_inputs(Case((2, 9, 30), "bfloat16"), 4, "cpu")
    args = [inputs[n] for n in ("q", "k", "v", "g_raw", "beta_raw", "A_log", "dt_bias", "cu_seqlens",
                                "initial_state")]
    with pytest.warns(RuntimeWarning, match="runs its torch reference"):
        o, state = kda_op(*args)
    want = problem.reference(inputs)
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    torch.testing.assert_close(o.float(), want["o"], atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(state, want["final_state"])
    torch.library.opcheck(torch.ops.kernel_factory.kda_fwd.default, tuple(args))
