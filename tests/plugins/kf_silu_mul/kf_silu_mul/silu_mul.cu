// silu_mul: out = silu(a) * b = a * sigmoid(a) * b (SwiGLU's gate) in fp32 math; a, b and out are (M, N) row-major
// in DTYPE.
//
// A template of the PTX Kernel Factory, scaffolded by `kernel-factory new silu_mul` and made binary. It compiles
// as-is: every gene is a macro with a default in silu_mul_genes.cuh, which `kernel-factory genes silu_mul` writes from
// the gene space in problem.py and template() inlines; the factory puts its own #defines first to render a candidate.
//
// Layout: a 2-D block on a 2-D grid. threadIdx.x/blockIdx.x cover THREADS columns of a row; threadIdx.y covers the
// ROWS_PER_CTA rows of a CTA, and blockIdx.y walks the row groups with a stride of gridDim.y (a grid holds at most
// 65535 CTAs along y). Sizes are 64-bit, so tensors past 2^31 elements index right.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "silu_mul_genes.cuh"

#if DTYPE == DTYPE_BFLOAT16
typedef __nv_bfloat16 elem_t;
#elif DTYPE == DTYPE_FLOAT16
typedef __half elem_t;
#else
typedef float elem_t;
#endif

static_assert(THREADS * ROWS_PER_CTA <= 1024, "a CTA holds at most 1024 threads");

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

extern "C" __global__ void __launch_bounds__(THREADS * ROWS_PER_CTA)
silu_mul(const elem_t* __restrict__ a, const elem_t* __restrict__ b, elem_t* __restrict__ out, long long M,
         long long N) {
  const long long col = (long long)blockIdx.x * THREADS + threadIdx.x;
  if (col >= N) return;
  const long long step = (long long)gridDim.y * ROWS_PER_CTA;
  for (long long row = (long long)blockIdx.y * ROWS_PER_CTA + threadIdx.y; row < M; row += step) {
    // ---- KF-EDIT-BEGIN compute -------------------------------------------------------------------------------------
    const long long i = row * N + col;
    const float x = load_elem(a + i);
    out[i] = (elem_t)(x / (1.0f + expf(-x)) * load_elem(b + i));
    // ---- KF-EDIT-END compute ---------------------------------------------------------------------------------------
  }
}
