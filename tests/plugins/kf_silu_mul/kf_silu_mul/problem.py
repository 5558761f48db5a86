"""silu_mul: the problem the kf-silu-mul package registers.

out = silu(a) * b elementwise (SwiGLU's gate), fp32 math; a, b and out (M, N) in bf16/fp16/fp32. Scaffolded with
`kernel-factory new silu_mul`, then made binary: two inputs, a 2-D block on a 2-D grid, and a feasibility rule. It
launches from a launch recipe with an op section, so `kernel-factory export --build` makes a library op of it."""
# Imports of the factory: only its floor 1 (types, protocols, inputs, compiled, regions, workload).
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from kernel_factory.evo.compiled import compiled_for
from kernel_factory.evo.protocols import Launch, MissingBaseline, launch_from_recipe
from kernel_factory.evo.types import Case, Gene, GeneSpace, GeneValue

NAME = "silu_mul"
TEMPLATE = Path(__file__).with_name(f"{NAME}.cu")
# The gene macros' header that `kernel-factory genes silu_mul` writes from SPACE (run it after every change to SPACE);
# the template includes it and template() inlines it, so that a candidate is one text (NVRTC has no include path).
GENES_HEADER = TEMPLATE.with_name(f"{NAME}_genes.cuh")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MAX_GRID_Y = 65535          # CUDA's limit on grid.y: the kernel walks the rows past it with a stride of gridDim.y
MAX_THREADS = 1024          # threads per CTA: THREADS x ROWS_PER_CTA
A_SCALE = 4.0               # a spreads over the sigmoid's whole bend


def _rule(g: Mapping[str, GeneValue]) -> str | None:
    """The template's static_assert: a CTA holds at most 1024 threads."""
    threads = int(g["threads"]) * int(g["rows_per_cta"])
    return f"threads x rows_per_cta = {threads} > {MAX_THREADS} threads per CTA" if threads > MAX_THREADS else None


SPACE = GeneSpace(genes=(
    Gene("threads", (128, 256, 512), 256, doc="threads along a row (block x), each one column"),
    Gene("rows_per_cta", (1, 2, 4), 1, doc="rows a CTA takes at once (block y)"),
    Gene("load", ("plain", "nc"), "nc", kind="ptx", doc="ld.global | ld.global.nc (the read-only data path)"),
), rule=_rule)

BENCHMARK = ((8192, 4096), (4096, 14336), (32768, 1024))
# Small and odd: one element, N below a warp, N not a multiple of the block, M not a multiple of rows_per_cta, and
# M past grid.y's limit.
CORRECTNESS = ((1, 1), (3, 7), (17, 1000), (5, 4099), (70000, 3))
HELDOUT = ((1024, 2880), (2048, 11008))


def _torch():
    import torch
    return torch


def _silu_mul(a: Any, b: Any) -> Any:
    return _torch().nn.functional.silu(a) * b


def recipe(genes: Mapping[str, GeneValue], dtype: str) -> dict[str, Any]:
    """A 2-D block (columns along x, rows along y) on a 2-D grid; 64-bit sizes. The op section: inputs a and b,
    output out like a."""
    threads, rows = int(genes["threads"]), int(genes["rows_per_cta"])
    return {"steps": [{"kernel": NAME,
                       "grid": {"x": ["cdiv", "N", threads], "y": ["min", ["cdiv", "M", rows], MAX_GRID_Y]},
                       "block": {"x": threads, "y": rows},
                       "args": [["ptr", "a"], ["ptr", "b"], ["ptr", "out"], ["i64", "M"], ["i64", "N"]]}],
            "op": {"inputs": ["a", "b"], "outputs": {"out": {"like": "a"}}}}


class SiluMul:
    name = NAME
    version = "1"
    description = ("SiLU-and-multiply: out = silu(a) * b = a * sigmoid(a) * b elementwise, fp32 math; a, b and out "
                   "(M, N) in bf16/fp16/fp32 (SwiGLU's gate)")
    kernel_name = NAME
    space = SPACE
    dtypes = ("bfloat16", "float16", "float32")
    shape_sets = {"benchmark": BENCHMARK, "correctness": CORRECTNESS, "heldout": HELDOUT}
    baselines = ("torch_eager", "torch_compile", "liger")
    peers = ("liger",)   # the published kernel: the bench's best peer

    def template(self) -> str:
        return TEMPLATE.read_text().replace(f'#include "{GENES_HEADER.name}"\n', GENES_HEADER.read_text())

    def bytes_moved(self, case: Case) -> int:
        m, n = case.shape
        return 3 * m * n * DTYPE_BYTES[case.dtype]

    def tolerance(self, dtype: str) -> tuple[float, float]:
        # Output rounding dominates: half an ulp is 2^-9 (bf16) and 2^-12 (fp16) of |out|; fp32 sees expf's few ulp
        # and one more rounding in the product.
        return {"bfloat16": (1e-5, 8e-3), "float16": (1e-6, 2e-3), "float32": (1e-6, 1e-5)}[dtype]

    def make_inputs(self, case: Case, seed: int, device: str) -> dict[str, Any]:
        torch = _torch()
        m, n = case.shape
        gen = torch.Generator(device=device).manual_seed(seed)
        dtype = getattr(torch, case.dtype)
        a = torch.randn(m, n, generator=gen, device=device) * A_SCALE
        b = torch.randn(m, n, generator=gen, device=device)
        return {"a": a.to(dtype), "b": b.to(dtype)}

    def make_outputs(self, case: Case, device: str) -> dict[str, Any]:
        torch = _torch()
        return {"out": torch.empty(case.shape, dtype=getattr(torch, case.dtype), device=device)}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"out": _silu_mul(inputs["a"].float(), inputs["b"].float())}

    def recipe(self, genes: Mapping[str, GeneValue], dtype: str) -> dict[str, Any]:
        return recipe(genes, dtype)

    def launch(self, genes: Mapping[str, GeneValue], case: Case, inputs: Mapping[str, Any],
               outputs: Mapping[str, Any]) -> tuple[Launch, ...]:
        return launch_from_recipe(recipe(genes, case.dtype), case, {**inputs, **outputs})

    def baseline(self, name: str, case: Case, inputs: Mapping[str, Any]) -> Callable[[], Mapping[str, Any]]:
        a, b = inputs["a"], inputs["b"]
        if name == "torch_eager":
            return lambda: {"out": _silu_mul(a, b)}
        if name == "torch_compile":
            # Compiled for this case alone: a plain torch.compile runs eagerly past 8 shapes, without a word.
            fn = compiled_for(_silu_mul, f"{case.key}@{a.device}")
            return lambda: {"out": fn(a, b)}
        if name == "liger":
            try:
                from liger_kernel.ops.swiglu import LigerSiLUMulFunction
            except ImportError as exc:
                raise MissingBaseline(f"liger-kernel is not installed ({exc})") from exc
            return lambda: {"out": LigerSiLUMulFunction.apply(a, b)}
        raise MissingBaseline(f"unknown baseline {name!r}; this problem has {', '.join(self.baselines)}")


problem = SiluMul()
