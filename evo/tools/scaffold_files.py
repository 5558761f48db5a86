"""The text of the files `kernel-factory new NAME` writes (string.Template: $name is the problem, $pkg its package,
$dist the distribution name): a problem plugin that passes `kernel-factory check` as generated, for an author to
turn into their own operation. The example is SiLU over (M, N) rows, y = x * sigmoid(x), on a 2-D grid."""

PYPROJECT = """\
# The $name problem plugin for the PTX Kernel Factory (scaffolded by `kernel-factory new $name`). Installing this
# package is all it takes for `kernel-factory` to find the problem `$name`, through the entry point below.
[build-system]
requires = ["setuptools>=69"]
build-backend = "setuptools.build_meta"

[project]
name = "$dist"
version = "0.1.0"
description = "$name as a problem plugin for the PTX Kernel Factory."
requires-python = ">=3.11"
# ptx-kernel-factory (which brings numpy and torch) is needed at run time but not declared, so that pip never reaches
# for a package index for it: install this package with `pip install --no-deps -e .` into the factory's environment.
dependencies = []

[project.entry-points."kernel_factory.problems"]
$name = "$pkg.problem:problem"

[tool.setuptools]
packages = ["$pkg"]

[tool.setuptools.package-data]
$pkg = ["*.cu", "*.cuh", "recorded/*"]
"""

INIT = '''"""The $name problem plugin (scaffolded by `kernel-factory new $name`)."""
'''

PROBLEM = '''"""$name: the problem the $dist package registers.

Scaffolded by `kernel-factory new $name` as SiLU over rows, y = x * sigmoid(x) in fp32 math, x and y (M, N) in
bf16/fp16/fp32: replace the operation, keep the rules (docs/adding-a-problem.md of the factory; `kernel-factory
check $name` checks every one of them on the CPU)."""
# Imports of the factory: only its floor 1 (types, protocols, inputs, compiled, regions, workload).
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from kernel_factory.evo.compiled import compiled_for
from kernel_factory.evo.protocols import Launch, MissingBaseline, launch_from_recipe
from kernel_factory.evo.types import Case, Gene, GeneSpace, GeneValue

NAME = "$name"
TEMPLATE = Path(__file__).with_name(f"{NAME}.cu")
# The gene macros' header that `kernel-factory genes $name` writes from SPACE (run it after every change to SPACE);
# the template includes it and template() inlines it, so that a candidate is one text (NVRTC has no include path).
GENES_HEADER = TEMPLATE.with_name(f"{NAME}_genes.cuh")
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MAX_GRID_Y = 65535          # CUDA's limit on grid.y: the kernel walks the rows past it with a stride of gridDim.y
INPUT_SCALE = 4.0           # inputs spread over the sigmoid's whole bend

# Two genes: a structural one (threads per CTA) and a PTX choice (the load instruction). A gene `load` becomes the
# macro LOAD; its named choices the constants LOAD_PLAIN and LOAD_NC (names: C identifiers).
SPACE = GeneSpace(genes=(
    Gene("threads", (128, 256, 512), 256, doc="threads per CTA, each one column of a row"),
    Gene("load", ("plain", "nc"), "nc", kind="ptx", doc="ld.global | ld.global.nc (the read-only data path)"),
))

BENCHMARK = ((8192, 4096), (4096, 16384), (32768, 1024))
# Small and odd: one element, N below a warp, N not a multiple of the block, and M past grid.y's limit.
CORRECTNESS = ((1, 1), (3, 7), (17, 1000), (70000, 3))
HELDOUT = ((1024, 2880), (2048, 5120))


def _torch():
    import torch
    return torch


def _silu(x: Any) -> Any:
    return _torch().nn.functional.silu(x)


def recipe(genes: Mapping[str, GeneValue], dtype: str) -> dict[str, Any]:
    """How to launch the kernel of these genes on any (M, N), as data (the factory launches from it, and
    `kernel-factory export --build` writes it beside each cubin for the library op): a 2-D grid, columns along x,
    rows along y; 64-bit sizes. The op section tells the generic library op its inputs and outputs."""
    threads = int(genes["threads"])
    return {"steps": [{"kernel": NAME, "grid": {"x": ["cdiv", "N", threads], "y": ["min", "M", MAX_GRID_Y]},
                       "block": threads,
                       "args": [["ptr", "x"], ["ptr", "y"], ["i64", "M"], ["i64", "N"]]}],
            "op": {"inputs": ["x"], "outputs": {"y": {"like": "x"}}}}


class Problem:
    name = NAME
    version = "1"
    description = ("SiLU: y = x * sigmoid(x) elementwise, fp32 math; x and y (M, N) in bf16/fp16/fp32 (scaffolded "
                   "by kernel-factory new: replace it)")
    kernel_name = NAME
    space = SPACE
    dtypes = ("bfloat16", "float16", "float32")   # the first is the default
    shape_sets = {"benchmark": BENCHMARK, "correctness": CORRECTNESS, "heldout": HELDOUT}
    baselines = ("torch_eager", "torch_compile")   # the first is the default fitness baseline

    def template(self) -> str:
        return TEMPLATE.read_text().replace(f'#include "{GENES_HEADER.name}"\\n', GENES_HEADER.read_text())

    def bytes_moved(self, case: Case) -> int:
        m, n = case.shape
        return 2 * m * n * DTYPE_BYTES[case.dtype]

    def tolerance(self, dtype: str) -> tuple[float, float]:
        # Output rounding dominates: half an ulp is 2^-9 (bf16) and 2^-12 (fp16) of |y|; fp32 sees expf's few ulp.
        return {"bfloat16": (1e-5, 8e-3), "float16": (1e-6, 2e-3), "float32": (1e-6, 1e-5)}[dtype]

    def make_inputs(self, case: Case, seed: int, device: str) -> dict[str, Any]:
        torch = _torch()
        m, n = case.shape
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(m, n, generator=gen, device=device) * INPUT_SCALE
        return {"x": x.to(getattr(torch, case.dtype))}

    def make_outputs(self, case: Case, device: str) -> dict[str, Any]:
        torch = _torch()
        return {"y": torch.empty(case.shape, dtype=getattr(torch, case.dtype), device=device)}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return {"y": _silu(inputs["x"].float())}

    def recipe(self, genes: Mapping[str, GeneValue], dtype: str) -> dict[str, Any]:
        return recipe(genes, dtype)

    def launch(self, genes: Mapping[str, GeneValue], case: Case, inputs: Mapping[str, Any],
               outputs: Mapping[str, Any]) -> tuple[Launch, ...]:
        return launch_from_recipe(recipe(genes, case.dtype), case, {**inputs, **outputs})

    def baseline(self, name: str, case: Case, inputs: Mapping[str, Any]) -> Callable[[], Mapping[str, Any]]:
        x = inputs["x"]
        if name == "torch_eager":
            return lambda: {"y": _silu(x)}
        if name == "torch_compile":
            # Compiled for this case alone: a plain torch.compile runs eagerly past 8 shapes, without a word.
            fn = compiled_for(_silu, f"{case.key}@{x.device}")
            return lambda: {"y": fn(x)}
        raise MissingBaseline(f"unknown baseline {name!r}; this problem has {', '.join(self.baselines)}")


problem = Problem()
'''

TEMPLATE = """\
// $name: y = x * sigmoid(x) (SiLU) in fp32 math; x and y are (M, N) row-major in DTYPE.
//
// A template of the PTX Kernel Factory, scaffolded by `kernel-factory new $name`. It compiles as-is: every gene
// is a macro with a default in ${name}_genes.cuh, which `kernel-factory genes $name` writes from the gene space in
// problem.py and template() inlines; the factory puts its own #defines first to render a candidate.
//
// Layout: a 2-D grid. blockIdx.x covers THREADS columns of a row; blockIdx.y walks the rows with a stride of
// gridDim.y (a grid holds at most 65535 CTAs along y). Sizes are 64-bit, so tensors past 2^31 elements index right.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "${name}_genes.cuh"

#if DTYPE == DTYPE_BFLOAT16
typedef __nv_bfloat16 elem_t;
#elif DTYPE == DTYPE_FLOAT16
typedef __half elem_t;
#else
typedef float elem_t;
#endif

// ---- KF-EDIT-BEGIN load --------------------------------------------------------------------------------------------
// One element through inline PTX: ld.global, or ld.global.nc (the read-only data path).
#if LOAD == LOAD_NC
#define LD_OP "ld.global.nc"
#else
#define LD_OP "ld.global"
#endif

__device__ __forceinline__ float load_elem(const elem_t* p) {
#if DTYPE == DTYPE_FLOAT32
  float v;
  asm(LD_OP ".f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
#else
  unsigned short bits;
  asm(LD_OP ".b16 %0, [%1];" : "=h"(bits) : "l"(p));
#if DTYPE == DTYPE_BFLOAT16
  return __bfloat162float(__ushort_as_bfloat16(bits));
#else
  return __half2float(__ushort_as_half(bits));
#endif
#endif
}
// ---- KF-EDIT-END load ----------------------------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(THREADS)
$name(const elem_t* __restrict__ x, elem_t* __restrict__ y, long long M, long long N) {
  const long long col = (long long)blockIdx.x * THREADS + threadIdx.x;
  if (col >= N) return;
  for (long long row = blockIdx.y; row < M; row += gridDim.y) {
    // ---- KF-EDIT-BEGIN compute -------------------------------------------------------------------------------------
    const float v = load_elem(x + row * N + col);
    y[row * N + col] = (elem_t)(v / (1.0f + expf(-v)));
    // ---- KF-EDIT-END compute ---------------------------------------------------------------------------------------
  }
}
"""

README = """\
# $dist: the $name problem plugin

Scaffolded by `kernel-factory new $name`: a complete problem plugin for the PTX Kernel Factory (SiLU over rows, as a
starting point) that passes `kernel-factory check $name` as generated. Every rule it follows, with a worked example
of each optional hook, is in the factory's docs/adding-a-problem.md.

| file | what |
|---|---|
| `$pkg/problem.py` | the problem: reference, inputs, shape sets, tolerances, baselines, gene space, launch recipe |
| `$pkg/$name.cu` | the CUDA C++ template with inline PTX; genes are macros |
| `$pkg/${name}_genes.cuh` | the gene macros and defaults, written by `kernel-factory genes $name` (do not edit) |
| `$pkg/recorded/` | recordings of the gene space for replay without a GPU (none yet) |
| `record.yaml` | the config `kernel-factory record` measures the space with, on a GPU host |
| `run.yaml` | a search config: `kernel-factory run run.yaml` |
| `tests/` | the factory's whole check as a pytest test |

Next steps:

```bash
# install into the factory's environment (--no-deps: the factory is already there)
pip install --no-deps -e .
# the contract, the CPU reference and inputs, launches, baselines, compiles: no GPU needed
kernel-factory check $name
# edit problem.py and $name.cu; after any change to the gene space, rewrite ${name}_genes.cuh
# (check and run refuse a stale one), and compile every genome of the space
kernel-factory genes $name
kernel-factory check $name --all
# on a GPU host: measure the space for replay, then search (live there, replayed elsewhere)
kernel-factory record record.yaml --out $pkg/recorded/${name}-bfloat16-h200.jsonl.gz
kernel-factory run run.yaml
# a torch.library op of the best kernels: kernel_factory.kernels.op.load("$name", "ops/$name.json")
kernel-factory export --problem $name RUN_ID --build --out ops/$name.json
```
"""

RECORDED_README = """\
# Recorded measurements of $name

None yet. On a GPU host, `kernel-factory record record.yaml --out $pkg/recorded/${name}-<dtype>-<gpu>.jsonl.gz`
measures every feasible genome (it resumes if stopped); ship the file here as package data and say in this README
how, when and on what it was recorded. The replay evaluator finds it by the problem's name.
"""

RECORD_CONFIG = """\
# Record every feasible genome of $name in bf16 on a GPU host, for replay on machines without one:
#   kernel-factory record record.yaml --out $pkg/recorded/${name}-bfloat16-<gpu>.jsonl.gz
# Each genome goes through the full correctness gate and is timed on every benchmark shape; `kernel-factory check
# $name --all` counts the genomes first (docs/adding-a-problem.md says how long a recording takes).
problem: $name
dtypes: [bfloat16]
evaluator:
  kind: gpu
  baseline: torch_eager
  gpu: {max_reps: 30, target_ms: 1.0}
"""

RUN_CONFIG = """\
# Search $name's gene space: live on a GPU host, replaying its recording elsewhere (evaluator.kind: auto).
#   kernel-factory run run.yaml
problem: $name
dtypes: [bfloat16]
shapes: benchmark
seed: 0
search:
  population: 12
  generations: 6
  operators:
    gene_mutation: {weight: 0.6, per_gene_p: 0.3}
    uniform_crossover: {weight: 0.4}
stop:
  patience: 3
evaluator:
  kind: auto
  baseline: torch_eager
"""

TEST = '''"""$name against every rule of the factory's plugin contract, on the CPU (what `kernel-factory check $name`
runs): inputs, every dtype's reference, launch plans, baselines and compiles of a few genomes."""
from kernel_factory.evo.tools.check import check


def test_the_plugin_passes_the_factory_check():
    lines = check("$name", sample=2, shapes=2)
    assert lines[0].startswith("contract: $name") and any(line.startswith("compiled 2/2") for line in lines)
'''

GITIGNORE = """\
# pip's in-tree builds
/build/
*.egg-info/
"""
