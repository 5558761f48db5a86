"""RMSNorm forward, the seeds' first problem: y = x * rsqrt(mean(x^2) + eps) * w with fp32 accumulation.

Declares the reference, the input generator, the shape sets (the public 11-row benchmark matrix, odd shapes for
correctness, model widths held out), tolerances, baselines and the kernel template with its gene space.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from kernel_factory.evo.protocols import Launch, MissingBaseline
from kernel_factory.evo.types import Case, Gene, GeneSpace, GeneValue
from kernel_factory.kernels import templates

EPS = 1e-6
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MAX_STATIC_SMEM = 48 * 1024
REGS_PER_SM = 65536


def _rule(g: Mapping[str, GeneValue]) -> str | None:
    """Reject genomes that cannot compile or launch, before the compiler sees them."""
    threads, rows = int(g["threads"]), int(g["rows_per_cta"])
    if threads % rows or (threads // rows) % 32:
        return f"threads={threads} / rows_per_cta={rows} must give whole warps per row"
    smem = 4 * (threads if g["reduce"] == "smem" else threads // 32)
    if g["load"] == "cp_async":
        smem += (int(g["unroll"]) + 1) * threads * int(g["vec_bytes"])
    if smem > MAX_STATIC_SMEM:
        return f"{smem} B of static shared memory exceeds {MAX_STATIC_SMEM} B"
    # x kept in registers costs 32 registers; each in-flight vector costs vec_bytes/4; ~28 for the rest.
    regs = 28 + (32 if g["keep_x"] else 0) + int(g["unroll"]) * int(g["vec_bytes"]) // 4
    limit = min(255, REGS_PER_SM // threads)
    if regs > limit:
        return f"about {regs} registers per thread exceed the {limit} that {threads} threads allow"
    return None


SPACE = GeneSpace(
    genes=(
        Gene("threads", (128, 256, 512, 1024), 256, doc="threads per CTA"),
        Gene("rows_per_cta", (1, 2, 4), 1, doc="rows normalized at once by one CTA (threads/rows = 32: warp per row)"),
        Gene("vec_bytes", (8, 16), 16, doc="bytes per vector load/store"),
        Gene("load", ("plain", "nc", "nc_na", "cp_async"), "nc", kind="ptx",
             doc="ld.global | ld.global.nc | ld.global.nc.L1::no_allocate | cp.async into shared memory"),
        Gene("store", ("plain", "cs"), "plain", kind="ptx", doc="st.global | st.global.cs"),
        Gene("keep_x", (False, True), True, doc="keep 128 bytes of x per thread in registers for the second pass"),
        Gene("reduce", ("shfl", "smem"), "shfl", kind="ptx", doc="shfl.sync.bfly butterfly | shared-memory tree"),
        Gene("rsqrt", ("approx", "precise"), "approx", kind="ptx", doc="rsqrt.approx.ftz.f32 | 1/sqrt (IEEE)"),
        Gene("unroll", (1, 2, 4), 2, doc="vectors in flight per thread (cp.async: pipeline depth)"),
    ),
    rule=_rule,
)

BENCHMARK = ((32768, 256), (32768, 512), (32768, 1024), (32768, 2048), (32768, 4096), (32768, 8192),
             (32768, 16384), (32768, 32768), (32768, 65536), (16384, 131072), (8192, 262144))
# Small and odd: M = 1 and M not a multiple of rows_per_cta; N below a warp, not a multiple of any vector width,
# and long rows that overflow the register-resident part.
CORRECTNESS = ((1, 256), (1, 7), (3, 1), (5, 33), (17, 760), (7, 1128), (199, 1024), (9, 4100), (64, 2048),
               (3, 20000), (2, 65536), (1, 262144), (5, 3001))
HELDOUT = ((4096, 2880), (4096, 3584), (4096, 5120), (4096, 7168), (1, 7168))


def _torch():
    import torch
    return torch


class RmsNormForward:
    name = "rmsnorm_fwd"
    version = "1"
    description = ("RMSNorm forward: y[i,:] = x[i,:] * rsqrt(mean(x[i,:]^2) + 1e-6) * w, fp32 accumulation; x and y "
                   "(M, N) in bf16/fp16/fp32, w (N,) fp32; rstd (M,) fp32 is stored too.")
    kernel_name = "rmsnorm_fwd"
    space = SPACE
    dtypes = ("bfloat16", "float16", "float32")
    shape_sets = {"benchmark": BENCHMARK, "correctness": CORRECTNESS, "heldout": HELDOUT}
    baselines = ("torch_eager", "torch_compile", "quack", "liger")

    def template(self) -> str:
        return templates.read("rmsnorm_fwd.cu")

    def bytes_moved(self, case: Case) -> int:
        m, n = case.shape
        s = DTYPE_BYTES[case.dtype]
        return m * n * 2 * s + n * 4

    def tolerance(self, dtype: str) -> tuple[float, float]:
        # Output rounding dominates: half an ulp is 2^-9 (bf16), 2^-12 (fp16) of |y|.
        return {"bfloat16": (1e-3, 8e-3), "float16": (1e-4, 2e-3), "float32": (1e-5, 1e-4)}[dtype]

    def make_inputs(self, case: Case, seed: int, device: str) -> dict[str, Any]:
        torch = _torch()
        m, n = case.shape
        gen = torch.Generator(device=device).manual_seed(seed)
        # Row magnitudes spread over 1e-3..1e2, so that eps matters on some rows and not on others.
        scale = torch.pow(10.0, torch.rand(m, 1, generator=gen, device=device) * 5 - 3)
        x = (torch.randn(m, n, generator=gen, device=device) * scale).to(getattr(torch, case.dtype))
        w = torch.randn(n, generator=gen, device=device)
        return {"x": x, "w": w}

    def make_outputs(self, case: Case, device: str) -> dict[str, Any]:
        torch = _torch()
        m, n = case.shape
        return {"y": torch.empty(m, n, dtype=getattr(torch, case.dtype), device=device),
                "rstd": torch.empty(m, dtype=torch.float32, device=device)}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        torch = _torch()
        xf = inputs["x"].float()
        rstd = torch.rsqrt(xf.square().mean(dim=-1) + EPS)
        return {"y": xf * rstd[:, None] * inputs["w"].float(), "rstd": rstd}

    def launch(self, genes: Mapping[str, GeneValue], case: Case, inputs: Mapping[str, Any],
               outputs: Mapping[str, Any]) -> Launch:
        m, n = case.shape
        rows = int(genes["rows_per_cta"])
        return Launch(grid=((m + rows - 1) // rows, 1, 1), block=(int(genes["threads"]), 1, 1), shared_bytes=0,
                      args=(inputs["x"], inputs["w"], outputs["y"], outputs["rstd"], np.int32(m), np.int32(n),
                            np.float32(EPS)))

    def baseline(self, name: str, case: Case, inputs: Mapping[str, Any]) -> Callable[[], Mapping[str, Any]]:
        torch = _torch()
        x, w = inputs["x"], inputs["w"]
        n = case.shape[1]
        if name == "torch_eager":
            # Weight in x's dtype: torch's fused kernel needs matching dtypes (fp32 w falls back to a slow path).
            wx = w.to(x.dtype)
            return lambda: {"y": torch.nn.functional.rms_norm(x, (n,), wx, EPS)}
        if name == "torch_compile":
            fn = torch.compile(_compiled_reference, dynamic=False)
            return lambda: {"y": fn(x, w)}
        if name == "quack":
            try:
                from quack.rmsnorm import rmsnorm_fwd
            except ImportError as exc:
                raise MissingBaseline(f"quack is not installed ({exc})") from exc
            return lambda: {"y": rmsnorm_fwd(x, w, eps=EPS)[0]}
        if name == "liger":
            try:
                from liger_kernel.ops.rms_norm import rms_norm_forward
            except ImportError as exc:
                raise MissingBaseline(f"liger-kernel is not installed ({exc})") from exc
            return lambda: {"y": rms_norm_forward(x, w, EPS, 0.0, "llama", None)[0]}
        raise MissingBaseline(f"unknown baseline {name!r}; this problem has {', '.join(self.baselines)}")


def _compiled_reference(x, w):
    xf = x.float()
    torch = _torch()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + EPS) * w).to(x.dtype)


problem = RmsNormForward()
