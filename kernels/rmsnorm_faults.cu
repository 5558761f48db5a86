// The evaluator's fault suite: a plain, correct RMSNorm forward (one CTA per row) and twelve deliberate faults,
// one per value of the FAULT gene. Each fault is something a generated kernel really does; the evaluator must give
// each its proper status while the good kernels of the same batch are still timed.
//
// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w, fp32 accumulation; rstd[r] is stored.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// DTYPE and the genes FAULT and THREADS, with FAULT's constants and the defaults: generated from the gene space in
// problems/rmsnorm_faults.py by `kernel-factory genes`. The faults, one per FAULT_* constant but FAULT_NONE:
//   FAULT_COMPILE_ERROR    not C++
//   FAULT_PTXAS_OVERFLOW   256 KB of static shared memory: ptxas refuses it
//   FAULT_ILLEGAL_ADDRESS  a store 1 TB past y
//   FAULT_MISALIGNED       a 16-byte vector load from an address that is 2 bytes off
//   FAULT_HANG             never returns
//   FAULT_TRAP             PTX trap
//   FAULT_NAN_OUTPUT       one NaN in the middle of y
//   FAULT_HALF_OUTPUT      writes only the first half of every row
//   FAULT_PAST_END         also writes the element just past the end of y
//   FAULT_HELDOUT_ONLY     right everywhere except at N = 7168 (a held-out model width)
//   FAULT_STALE            skips rows whose rstd already holds a value: stale when called again
//   FAULT_RACE             cross-warp sum without barriers: the result depends on warp timing
#include "rmsnorm_faults_genes.cuh"

#if DTYPE == DTYPE_BFLOAT16
typedef __nv_bfloat16 elem_t;
#elif DTYPE == DTYPE_FLOAT16
typedef __half elem_t;
#else
typedef float elem_t;
#endif

__device__ __forceinline__ float to_float(elem_t v) { return (float)v; }

#if FAULT == FAULT_COMPILE_ERROR
this line is not C++;
#endif

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
  return v;
}

// Sum over the CTA; every thread gets the total.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float red[THREADS / 32];
  __shared__ float total;
  v = warp_sum(v);
#if FAULT == FAULT_RACE
  if (threadIdx.x == 0) total = 0.f;        // no barrier: other warps may add before this, or read before all add
  if ((threadIdx.x & 31) == 0) atomicAdd(&total, v);
  return total;
#else
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0.f;
    for (int i = 0; i < THREADS / 32; ++i) s += red[i];
    total = s;
  }
  __syncthreads();
  return total;
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS)
rmsnorm_faults(const elem_t* __restrict__ x, const float* __restrict__ w, elem_t* __restrict__ y,
               float* __restrict__ rstd_out, int M, int N, float eps) {
  const int row = blockIdx.x;
  const elem_t* xr = x + (size_t)row * N;
  elem_t* yr = y + (size_t)row * N;
#if FAULT == FAULT_STALE
  if (rstd_out[row] == rstd_out[row]) return;   // not NaN: "already computed" by an earlier call
#endif
#if FAULT == FAULT_TRAP
  if (row == M / 2 && threadIdx.x == 0) asm volatile("trap;");
#endif
#if FAULT == FAULT_HANG
  if (threadIdx.x == 0) for (;;) asm volatile("nanosleep.u32 1000;");
#endif
  float ss = 0.f;
  for (int i = threadIdx.x; i < N; i += THREADS) { const float f = to_float(xr[i]); ss = fmaf(f, f, ss); }
#if FAULT == FAULT_PTXAS_OVERFLOW
  __shared__ float big[1 << 16];
  big[(threadIdx.x * 977 + row) & 0xffff] = ss;
  __syncthreads();
  ss = big[(threadIdx.x * 131 + row + 1) & 0xffff] * 0.f + ss;
#endif
#if FAULT == FAULT_MISALIGNED
  if (N >= 16 && threadIdx.x == 0) {
    unsigned int a, b, c, d;
    asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"((const char*)xr + 2));
    ss += (float)((a ^ b ^ c ^ d) & 1u) * 0.f;
  }
#endif
  float rstd = rsqrtf(block_sum(ss) / (float)N + eps);
#if FAULT == FAULT_HELDOUT_ONLY
  if (N == 7168) rstd *= 1.01f;
#endif
  int end = N;
#if FAULT == FAULT_HALF_OUTPUT
  end = N / 2 + (N > 1 ? 0 : 1);
#endif
  for (int i = threadIdx.x; i < end; i += THREADS) yr[i] = (elem_t)(to_float(xr[i]) * rstd * w[i]);
  if (threadIdx.x == 0) rstd_out[row] = rstd;
#if FAULT == FAULT_NAN_OUTPUT
  __syncthreads();   // after every thread's own stores, so that nothing overwrites the NaN
  if (row == M / 2 && threadIdx.x == 0) yr[N / 2] = (elem_t)__int_as_float(0x7fc00000);
#endif
#if FAULT == FAULT_PAST_END
  if (row == M - 1 && threadIdx.x == 0) y[(size_t)M * N] = (elem_t)1.0f;
#endif
#if FAULT == FAULT_ILLEGAL_ADDRESS
  if (row == 0 && threadIdx.x == 0) y[(size_t)1 << 39] = (elem_t)0.0f;
#endif
}
