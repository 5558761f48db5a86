"""The evaluator's fault suite as a problem: RMSNorm forward (the reference, inputs, shapes and tolerances of
rmsnorm_fwd) with a template whose FAULT gene selects one of twelve deliberate faults, or none. It exists to prove
the evaluator (evo/faults.py runs it); it is not something to evolve."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from ..evo.protocols import Launch, Peer
from ..evo.types import Case, Gene, GeneSpace, GeneValue
from ..kernels import templates
from .rmsnorm_fwd import EPS, RmsNormForward

# fault gene value -> the status the evaluator must give it
EXPECTED = {
    "none": "ok",
    "compile_error": "compile_error",
    "ptxas_overflow": "compile_error",
    "illegal_address": "crashed",
    "misaligned": "crashed",
    "hang": "timeout",
    "trap": "crashed",
    "nan_output": "incorrect",
    "half_output": "incorrect",
    "past_end": "incorrect",
    "heldout_only": "incorrect",
    "stale": "incorrect",
    "race": "incorrect",
}

SPACE = GeneSpace(genes=(
    Gene("fault", tuple(EXPECTED), "none", doc="which deliberate fault the kernel carries"),
    Gene("threads", (128, 256, 512, 1024), 256, doc="threads per CTA (one CTA per row)"),
))


class RmsNormFaults(RmsNormForward):
    name = "rmsnorm_faults"
    version = "1"
    description = "RMSNorm forward with deliberate faults (the evaluator's fault suite; not for evolving)"
    kernel_name = "rmsnorm_faults"
    space = SPACE
    dtypes = ("bfloat16",)
    baselines = ("torch_eager",)
    peers = ("torch_eager",)
    declared_peers = (Peer("torch_eager", "torch eager"),)   # none of the forward's peers is a baseline here
    # The forward's launch recipe and workload are not this kernel's: it launches one CTA per row (launch() below),
    # is never exported and never serves a workload. None turns an inherited optional hook off.
    recipe = None
    workload = None

    def expected_sass(self, genes: Mapping[str, GeneValue], dtype: str) -> list[tuple[str, bool, str]]:
        return []   # the faults select no PTX flavours: nothing to check in their binaries

    def template(self) -> str:
        return templates.read("rmsnorm_faults.cu")

    def launch(self, genes: Mapping[str, GeneValue], case: Case, inputs: Mapping[str, Any],
               outputs: Mapping[str, Any]) -> Launch:
        m, n = case.shape
        return Launch(grid=(m, 1, 1), block=(int(genes["threads"]), 1, 1), shared_bytes=0,
                      args=(inputs["x"], inputs["w"], outputs["y"], outputs["rstd"], np.int32(m), np.int32(n),
                            np.float32(EPS)))


problem = RmsNormFaults()
