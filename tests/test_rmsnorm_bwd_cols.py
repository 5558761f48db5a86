"""The backward's column split for few rows (small_m=cols, kernels/rmsnorm_bwd_cols.cuh), run on the CPU before any
GPU has: g++ builds the header's two kernels with a shim that runs each CTA as its 256 threads (std::threads), the
CTAs one after another in the grid and order the problem's own launch gives, so that the recipe's wiring (which
kernels, how many CTAs, each one's columns, the scratch of partial dots) and the kernels' indexing and reductions
are exercised on fresh random inputs with poisoned outputs, and compared with the problem's reference. The shim
makes __syncthreads a barrier of the whole CTA (the kernels call it CTA-uniformly); it does not model a GPU's memory
ordering or time. Not covered here: fp16's conversions (the intrinsics'), NVRTC's build
(tests/test_rmsnorm_bwd_sass.py compiles a cols genome in every dtype) and the GPU gate."""
from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from kernel_factory.evo.types import Case
from kernel_factory.problems.rmsnorm_bwd import COLS_GROUP, COLS_ROWS, COLS_THREADS, problem

SHIMS = Path(__file__).parent / "shims"   # file_io.h
SHIM = r"""
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __global__
#define __shared__ static
#define __restrict__
#define __launch_bounds__(...)
struct Dim3 { unsigned x, y, z; };
thread_local Dim3 threadIdx;
Dim3 blockIdx, gridDim;
std::barrier<>* g_cta;
struct __nv_bfloat16 { uint16_t bits; };
inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = uint32_t(h.bits) << 16; float f; std::memcpy(&f, &u, 4); return f;
}
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u; std::memcpy(&u, &f, 4); u += 0x7fffu + ((u >> 16) & 1u); return {uint16_t(u >> 16)};
}
inline void __syncthreads() { g_cta->arrive_and_wait(); }
using std::min;
#define DTYPE_BFLOAT16 0
#define DTYPE_FLOAT16 1
#define DTYPE_FLOAT32 2
#define SMALL_M_COLS 3
#define SMALL_M SMALL_M_COLS
#if DTYPE == DTYPE_BFLOAT16
typedef __nv_bfloat16 elem_t;
inline float load_elem(const elem_t* p) { return __bfloat162float(*p); }   // rmsnorm_bwd_device.cuh's, on the CPU
inline void store_elem(elem_t* p, float v) { *p = __float2bfloat16(v); }
#else
typedef float elem_t;
inline float load_elem(const elem_t* p) { return *p; }
inline void store_elem(elem_t* p, float v) { *p = v; }
#endif
#include "rmsnorm_bwd_cols.cuh"

#include "file_io.h"
template <class F> void grid(unsigned gx, unsigned gy, F kernel) {   // every CTA of a launch, one after another
    gridDim = {gx, gy, 1};
    for (unsigned by = 0; by < gy; ++by)
        for (unsigned bx = 0; bx < gx; ++bx) {
            blockIdx = {bx, by, 0};
            std::barrier<> cta(COLS_THREADS);
            g_cta = &cta;
            std::vector<std::thread> threads;
            for (unsigned t = 0; t < COLS_THREADS; ++t)
                threads.emplace_back([&, t] { threadIdx = {t, 0, 0}; kernel(); });
            for (auto& th : threads) th.join();
        }
}

// DIR M N then each launch's grid (x, y) and chunk: DOT_X DOT_Y DOT_CHUNK COLS_X COLS_Y COLS_CHUNK GROUPS.
// Inputs DIR/NAME.bin, outputs written back.
int main(int argc, char** argv) {
    const std::string dir = argv[1];
    const int m = std::atoi(argv[2]), n = std::atoi(argv[3]);
    unsigned g[4];
    for (int i = 0; i < 2; ++i) {
        g[2 * i] = unsigned(std::atoi(argv[4 + 3 * i]));
        g[2 * i + 1] = unsigned(std::atoi(argv[5 + 3 * i]));
    }
    const int chunk_dot = std::atoi(argv[6]), chunk = std::atoi(argv[9]), groups = std::atoi(argv[10]);
    auto x = read<elem_t>(dir + "/x.bin"), dy = read<elem_t>(dir + "/dy.bin"), dx = read<elem_t>(dir + "/dx.bin");
    auto w = read<float>(dir + "/w.bin"), rstd = read<float>(dir + "/rstd.bin");
    auto dw = read<float>(dir + "/dw.bin"), dot = read<float>(dir + "/dot.bin"), dwp = read<float>(dir + "/dwp.bin");
    grid(g[0], g[1], [&] {
        rmsnorm_bwd_cols_dot(x.data(), w.data(), dy.data(), rstd.data(), dot.data(), dwp.data(), m, n, chunk_dot);
    });
    grid(g[2], g[3], [&] {
        rmsnorm_bwd_cols(x.data(), w.data(), dy.data(), rstd.data(), dot.data(), dwp.data(), dx.data(), dw.data(),
                         m, n, chunk, groups);
    });
    write(dir + "/dx.bin", dx);
    write(dir + "/dw.bin", dw);
    return 0;
}
"""

GENES = {**problem.space.defaults(), "small_m": "cols"}


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
    """The shim built once per dtype: dtype -> executable."""
    if shutil.which("g++") is None:
        pytest.skip("needs g++ (C++20) to build the kernels' CUDA text for the CPU")
    from kernel_factory.kernels import templates
    folder = tmp_path_factory.mktemp("cols")
    (folder / "shim.cpp").write_text(SHIM)
    (folder / "rmsnorm_bwd_cols.cuh").write_text(templates.read("rmsnorm_bwd_cols.cuh"))
    out = {}
    for dtype, code in (("bfloat16", 0), ("float32", 2)):
        exe = folder / f"cols-{dtype}"
        subprocess.run(["g++", "-std=c++20", "-O2", "-pthread", f"-DDTYPE={code}", "-I", str(SHIMS), "-o", str(exe),
                        str(folder / "shim.cpp")], check=True, cwd=folder)
        out[dtype] = exe
    return out


def run_plan(exe, case: Case, inputs, outputs, folder) -> None:
    """The problem's own launch for the case, its two steps run by the shim on the CPU."""
    steps = problem.launch(GENES, case, inputs, outputs)
    assert [s.kernel for s in steps] == ["rmsnorm_bwd_cols_dot", "rmsnorm_bwd_cols"], \
        f"small_m=cols at M = {case.shape[0]} must run the column split alone"
    assert steps[0].block[0] == steps[1].block[0] == COLS_THREADS and steps[0].grid[0] == steps[1].grid[0]
    m, n = case.shape
    assert steps[0].grid[1] == -(-m // COLS_GROUP) and steps[1].grid[1] == m
    for name, t in {**inputs, **outputs}.items():
        np_t = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        np_t.contiguous().numpy().tofile(folder / f"{name}.bin")
    dims = [str(int(v)) for s in steps for v in (s.grid[0], s.grid[1], s.args[8 if s is steps[0] else 10])]
    subprocess.run([str(exe), str(folder), str(m), str(n), *dims, str(int(steps[1].args[-1]))], check=True,
                   timeout=600)
    dtype = outputs["dx"].dtype
    raw = np.fromfile(folder / "dx.bin", dtype=np.int16 if dtype == torch.bfloat16 else np.float32)
    outputs["dx"] = torch.from_numpy(raw.reshape(m, n)).view(dtype) if dtype == torch.bfloat16 else \
        torch.from_numpy(raw.reshape(m, n))
    outputs["dw"] = torch.from_numpy(np.fromfile(folder / "dw.bin", dtype=np.float32))


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_the_column_split_computes_the_backward_on_odd_shapes(builds, dtype, tmp_path):
    rng = random.Random()
    shapes = [(1, rng.randrange(3000, 9000)), (rng.randrange(2, 9), rng.randrange(700, 4000) | 1),
              (COLS_ROWS, rng.randrange(300, 900))]
    for m, n in shapes:
        case = Case((m, n), dtype)
        inputs = problem.make_inputs(case, seed=rng.randrange(2**31), device="cpu")
        outputs = problem.make_outputs(case, "cpu")
        for t in outputs.values():   # poisoned: a value the kernels do not write stays NaN
            t.fill_(float("nan"))
        run_plan(builds[dtype], case, inputs, outputs, tmp_path)
        want = problem.reference(inputs)
        atol, rtol = problem.tolerance(dtype)
        for name in ("dx", "dw"):
            got = outputs[name].float()
            assert not got.isnan().any(), f"{name} has values the kernels never wrote at {m}x{n}"
            torch.testing.assert_close(got, want[name].float(), atol=atol, rtol=rtol,
                                       msg=lambda s: f"{name} at {dtype} {m}x{n}: {s}")


def test_above_cols_rows_the_genome_keeps_its_own_plan():
    case = Case((COLS_ROWS + 1, 4096), "bfloat16")
    inputs = problem.make_inputs(case, seed=3, device="cpu")
    steps = problem.launch(GENES, case, inputs, problem.make_outputs(case, "cpu"))
    assert [s.kernel for s in steps] == ["rmsnorm_bwd", "rmsnorm_bwd_dw"]
