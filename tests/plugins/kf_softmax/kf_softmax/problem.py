"""Row softmax forward (y = softmax(x, dim=-1), fp32 math): the problem the kf-softmax-plugin package registers."""
# Reference, inputs, small shape sets (cheap to record the whole gene space on one GPU), tolerances, the baselines
# (torch eager, torch.compile, Liger) and the kernel template with its gene space. Imports only the factory's public
# contracts (kernel_factory.evo.types, .protocols, and .compiled for a torch.compile baseline that proves it ran
# compiled), as any third-party plugin should.
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from kernel_factory.evo.compiled import compiled_for
from kernel_factory.evo.protocols import Launch, MissingBaseline
from kernel_factory.evo.types import Case, Gene, GeneSpace, GeneValue

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
TEMPLATE = Path(__file__).parent / "softmax_fwd.cu"
# The gene macros' header that `kernel-factory genes` writes from SPACE; the template includes it, and template()
# inlines it, so that a candidate is one text (NVRTC needs no include path).
GENES_HEADER = TEMPLATE.with_name("softmax_fwd_genes.cuh")
INPUT_SCALE = 3.0


def _rule(g: Mapping[str, GeneValue]) -> str | None:
    """Reject genomes the template's static_assert would refuse, before the compiler sees them."""
    threads, rows = int(g["threads"]), int(g["rows_per_cta"])
    # The butterfly reductions shuffle across a full warp (mask 0xffffffff), so a warp must belong to one row.
    if threads % rows or (threads // rows) % 32:
        return f"threads={threads} / rows_per_cta={rows} must give whole warps per row"
    return None


SPACE = GeneSpace(
    genes=(
        Gene("threads", (128, 256, 512), 256, doc="threads per CTA"),
        Gene("rows_per_cta", (1, 8), 1,
             doc="rows one CTA handles at once (threads/rows = 32: warp per row, no CTA barrier)"),
        Gene("vec_bytes", (8, 16), 16, doc="bytes per vector load/store"),
        Gene("load", ("plain", "nc"), "nc", kind="ptx", doc="ld.global | ld.global.nc for the vector path"),
        Gene("exp", ("approx", "precise"), "approx", kind="ptx",
             doc="ex2.approx.ftz.f32 of (x - max) * log2(e) | expf"),
    ),
    rule=_rule,
)

BENCHMARK = ((8192, 1024), (8192, 4096), (4096, 16384))
# Small and odd: M = 1, N = 1, N below a warp and not a multiple of any vector width (scalar path), M not a
# multiple of rows_per_cta, and rows longer than the register-resident part.
CORRECTNESS = ((1, 7), (3, 1), (5, 33), (17, 1000), (64, 4096), (2, 20000))
HELDOUT = ((1024, 2880), (1024, 5120))


def _torch():
    import torch
    return torch


def _softmax(x: Any) -> Any:
    import torch
    return torch.softmax(x, dim=-1)


class SoftmaxForward:
    name = "softmax_fwd"
    version = "1"
    description = ("Row softmax forward: y[i,:] = exp(x[i,:] - max(x[i,:])) / sum(exp(x[i,:] - max(x[i,:]))), fp32 "
                   "math; x and y (M, N) in bf16/fp16/fp32.")
    kernel_name = "softmax_fwd"
    space = SPACE
    dtypes = ("bfloat16", "float16", "float32")
    shape_sets = {"benchmark": BENCHMARK, "correctness": CORRECTNESS, "heldout": HELDOUT}
    baselines = ("torch_eager", "torch_compile", "liger")

    def template(self) -> str:
        return TEMPLATE.read_text().replace(f'#include "{GENES_HEADER.name}"\n', GENES_HEADER.read_text())

    def bytes_moved(self, case: Case) -> int:
        m, n = case.shape
        return m * n * 2 * DTYPE_BYTES[case.dtype]

    def tolerance(self, dtype: str) -> tuple[float, float]:
        # Output rounding dominates: half an ulp is at most 2^-8 (bf16), 2^-11 (fp16) of |y|. In fp32, ex2.approx's
        # ~2 ulp, the rounding of (x - max) * log2(e) for |x - max| up to ~30 and the fp32 sum of up to 20000 terms
        # give a few 1e-6 relative.
        return {"bfloat16": (1e-5, 8e-3), "float16": (1e-6, 2e-3), "float32": (1e-7, 2e-5)}[dtype]

    def make_inputs(self, case: Case, seed: int, device: str) -> dict[str, Any]:
        torch = _torch()
        m, n = case.shape
        gen = torch.Generator(device=device).manual_seed(seed)
        # Scaled so that exp spans many orders of magnitude: a missing max-subtraction or a poor exp shows up.
        x = torch.randn(m, n, generator=gen, device=device) * INPUT_SCALE
        return {"x": x.to(getattr(torch, case.dtype))}

    def make_outputs(self, case: Case, device: str) -> dict[str, Any]:
        torch = _torch()
        m, n = case.shape
        return {"y": torch.empty(m, n, dtype=getattr(torch, case.dtype), device=device)}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        torch = _torch()
        return {"y": torch.softmax(inputs["x"].float(), dim=-1)}

    def launch(self, genes: Mapping[str, GeneValue], case: Case, inputs: Mapping[str, Any],
               outputs: Mapping[str, Any]) -> Launch:
        m, n = case.shape
        rows = int(genes["rows_per_cta"])
        return Launch(grid=((m + rows - 1) // rows, 1, 1), block=(int(genes["threads"]), 1, 1), shared_bytes=0,
                      args=(inputs["x"], outputs["y"], np.int32(m), np.int32(n)))

    def baseline(self, name: str, case: Case, inputs: Mapping[str, Any]) -> Callable[[], Mapping[str, Any]]:
        torch = _torch()
        x = inputs["x"]
        if name == "torch_eager":
            return lambda: {"y": torch.softmax(x, dim=-1)}
        if name == "torch_compile":
            # Compiled for this case's shape alone (a plain torch.compile runs eagerly past its recompile limit)
            fn = compiled_for(_softmax, f"{case.key}@{x.device}")
            return lambda: {"y": fn(x)}
        if name == "liger":
            try:
                from liger_kernel.ops.softmax import LigerSoftmaxFunction
            except ImportError as exc:
                raise MissingBaseline(f"liger-kernel is not installed ({exc})") from exc
            return lambda: {"y": LigerSoftmaxFunction.apply(x)}
        raise MissingBaseline(f"unknown baseline {name!r}; this problem has {', '.join(self.baselines)}")


problem = SoftmaxForward()
