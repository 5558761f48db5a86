"""GPU test (pytest -m gpu --gpu): the fault suite in one batch. Every fault gets its status, the good kernels in
the same batch are timed, and each crash or hang cost exactly one worker restart."""
import pytest

from kernel_factory.evo.tools import faults

pytestmark = pytest.mark.gpu


def test_fault_suite_every_class_right_and_good_kernels_timed():
    rows, restarts, fp = faults.run()
    print("\n" + faults.table(rows, restarts))
    wrong = [r for r in rows if not r.right]
    assert not wrong, wrong
    assert sum(r.fault == "none" and r.got == "ok" for r in rows) >= 3
    assert restarts == sum(r.got in ("crashed", "timeout") for r in rows)
