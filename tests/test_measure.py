"""The output comparison used by the GPU worker (runs on CPU torch here): NaN never passes, misses are located."""
import torch

from kernel_factory.evo.evaluate.measure import mismatch, quantile


def test_match_and_miss():
    ref = torch.randn(64, 33)
    assert mismatch(ref.clone(), ref, 1e-5, 1e-4, "y") is None
    off = ref.clone()
    off[7, 5] += 1.0
    msg = mismatch(off, ref, 1e-5, 1e-4, "y")
    assert msg and "1 of 2112 values off" in msg and "(7, 5)" in msg


def test_nan_and_inf_never_pass():
    ref = torch.randn(8, 8)
    for bad in (float("nan"), float("inf")):
        out = ref.clone()
        out[3, 3] = bad
        assert "non-finite" in mismatch(out, ref, 1.0, 1.0, "y")
    assert "non-finite" in mismatch(torch.full((4, 4), float("nan")), ref[:4, :4], 1e9, 1e9, "y")


def test_low_precision_output_within_rounding_passes():
    ref = torch.randn(128, 256) * 3
    assert mismatch(ref.to(torch.bfloat16), ref, 1e-3, 8e-3, "y") is None
    assert mismatch(ref.to(torch.bfloat16) * 1.02, ref, 1e-3, 8e-3, "y") is not None


def test_shape_mismatch():
    assert "shape" in mismatch(torch.zeros(2, 3), torch.zeros(3, 2), 1, 1, "y")


def test_quantile():
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.5
    assert quantile([5.0], 0.75) == 5.0
