// RMSNorm forward: y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w, accumulated in fp32; rstd[r] is stored.
// x and y are (M, N) row-major in DTYPE; w is (N,) fp32; rstd is (M,) fp32.
//
// A template of the PTX Kernel Factory. It compiles as-is: every gene below is a #define with a default, and the
// factory prepends its own #defines to render a candidate. Instruction-level choices are inline PTX.
//
// Layout: each CTA normalizes ROWS_PER_CTA rows at once, TPR = THREADS / ROWS_PER_CTA threads per row (TPR = 32 is
// warp-per-row). Each thread walks its row in VEC_BYTES-wide vectors, strided by TPR. The first REG_VECS vectors of
// each thread stay in registers between the two passes (KEEP_X); the rest is re-read for the second pass.
// Rows whose length or alignment rules out vector access take a scalar path, so any (M, N) is correct.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ---- enumerations used by the genes -------------------------------------------------------------------------
#define DTYPE_BFLOAT16 0
#define DTYPE_FLOAT16 1
#define DTYPE_FLOAT32 2
#define LOAD_PLAIN 0      // ld.global
#define LOAD_NC 1         // ld.global.nc                   (read-only, non-coherent path)
#define LOAD_NC_NA 2      // ld.global.nc.L1::no_allocate   (stream past L1)
#define LOAD_CP_ASYNC 3   // cp.async global -> shared, UNROLL stages in flight per thread
#define STORE_PLAIN 0     // st.global
#define STORE_CS 1        // st.global.cs  (streaming: evict-first)
#define REDUCE_SHFL 0     // shfl.sync.bfly butterfly in each warp, then one shared-memory step across warps
#define REDUCE_SMEM 1     // shared-memory tree over the row's threads
#define RSQRT_APPROX 0    // rsqrt.approx.ftz.f32
#define RSQRT_PRECISE 1   // 1 / sqrt, IEEE round-to-nearest

// ---- genes (defaults) ------------------------------------------------------------------------------------------
#ifndef DTYPE
#define DTYPE DTYPE_BFLOAT16
#endif
#ifndef THREADS
#define THREADS 256
#endif
#ifndef ROWS_PER_CTA
#define ROWS_PER_CTA 1
#endif
#ifndef VEC_BYTES
#define VEC_BYTES 16
#endif
#ifndef LOAD
#define LOAD LOAD_NC
#endif
#ifndef STORE
#define STORE STORE_PLAIN
#endif
#ifndef KEEP_X
#define KEEP_X 1
#endif
#ifndef REDUCE
#define REDUCE REDUCE_SHFL
#endif
#ifndef RSQRT
#define RSQRT RSQRT_APPROX
#endif
#ifndef UNROLL
#define UNROLL 2
#endif

#if DTYPE == DTYPE_BFLOAT16
typedef __nv_bfloat16 elem_t;
#elif DTYPE == DTYPE_FLOAT16
typedef __half elem_t;
#else
typedef float elem_t;
#endif

constexpr int TPR = THREADS / ROWS_PER_CTA;                  // threads per row
constexpr int VEC = VEC_BYTES / (int)sizeof(elem_t);          // elements per vector access
constexpr int WORDS = VEC_BYTES / 4;                          // 32-bit words per vector
constexpr int REG_VECS = KEEP_X ? 128 / VEC_BYTES : 0;        // vectors per thread kept in registers (128 bytes)
static_assert(THREADS % ROWS_PER_CTA == 0 && TPR % 32 == 0, "a row needs whole warps");
static_assert(VEC_BYTES == 8 || VEC_BYTES == 16, "vector accesses are 8 or 16 bytes");

struct vec_t { unsigned int w[WORDS]; };

// ---- KF-EDIT-BEGIN load_store ----------------------------------------------------------------------------------
#if LOAD == LOAD_PLAIN
#define LD_OP "ld.global"
#elif LOAD == LOAD_NC_NA
#define LD_OP "ld.global.nc.L1::no_allocate"
#else  // LOAD_NC, and the second pass of LOAD_CP_ASYNC
#define LD_OP "ld.global.nc"
#endif
#if STORE == STORE_CS
#define ST_OP "st.global.cs"
#else
#define ST_OP "st.global"
#endif

__device__ __forceinline__ vec_t load_vec(const elem_t* p) {
  vec_t v;
#if VEC_BYTES == 16
  asm(LD_OP ".v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "l"(p));
#else
  asm(LD_OP ".v2.u32 {%0, %1}, [%2];" : "=r"(v.w[0]), "=r"(v.w[1]) : "l"(p));
#endif
  return v;
}

__device__ __forceinline__ void store_vec(elem_t* p, const vec_t& v) {
#if VEC_BYTES == 16
  asm volatile(ST_OP ".v4.u32 [%0], {%1, %2, %3, %4};"
               :: "l"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3]) : "memory");
#else
  asm volatile(ST_OP ".v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(v.w[0]), "r"(v.w[1]) : "memory");
#endif
}

__device__ __forceinline__ void cp_async_vec(void* smem, const elem_t* gmem) {
  const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
#if VEC_BYTES == 16
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(gmem) : "memory");
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(s), "l"(gmem) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
// ---- KF-EDIT-END load_store ------------------------------------------------------------------------------------

__device__ __forceinline__ void unpack(const vec_t& v, float (&f)[VEC]) {
#pragma unroll
  for (int i = 0; i < WORDS; ++i) {
#if DTYPE == DTYPE_FLOAT32
    f[i] = __uint_as_float(v.w[i]);
#elif DTYPE == DTYPE_BFLOAT16
    const float2 t = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&v.w[i]));
    f[2 * i] = t.x; f[2 * i + 1] = t.y;
#else
    const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&v.w[i]));
    f[2 * i] = t.x; f[2 * i + 1] = t.y;
#endif
  }
}

__device__ __forceinline__ vec_t pack(const float (&f)[VEC]) {
  vec_t v;
#pragma unroll
  for (int i = 0; i < WORDS; ++i) {
#if DTYPE == DTYPE_FLOAT32
    v.w[i] = __float_as_uint(f[i]);
#elif DTYPE == DTYPE_BFLOAT16
    const __nv_bfloat162 t = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    v.w[i] = *reinterpret_cast<const unsigned int*>(&t);
#else
    const __half2 t = __floats2half2_rn(f[2 * i], f[2 * i + 1]);
    v.w[i] = *reinterpret_cast<const unsigned int*>(&t);
#endif
  }
  return v;
}

__device__ __forceinline__ float to_float(elem_t v) { return (float)v; }

__device__ __forceinline__ float sum_squares(const vec_t& v) {
  float f[VEC];
  unpack(v, f);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) s = fmaf(f[i], f[i], s);
  return s;
}

// ---- KF-EDIT-BEGIN reduce --------------------------------------------------------------------------------------
__device__ __forceinline__ float shfl_bfly(float v, int lane_mask) {
  unsigned int r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"
               : "=r"(r) : "r"(__float_as_uint(v)), "r"(lane_mask));
  return __uint_as_float(r);
}

#if REDUCE == REDUCE_SHFL
constexpr int RED_SLOTS = THREADS / 32;
#else
constexpr int RED_SLOTS = THREADS;
#endif

// Sum of v over the TPR threads of row group `grp`; every thread of the CTA must call it (it holds a barrier).
__device__ __forceinline__ float row_sum(float v, float* red, int lane, int grp) {
#if REDUCE == REDUCE_SHFL
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += shfl_bfly(v, m);
  if (TPR == 32) return v;
  constexpr int WPR = TPR / 32;
  if ((lane & 31) == 0) red[grp * WPR + (lane >> 5)] = v;
  __syncthreads();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < WPR; ++i) s += red[grp * WPR + i];
  return s;
#else
  red[grp * TPR + lane] = v;
  __syncthreads();
#pragma unroll
  for (int s = TPR / 2; s > 0; s >>= 1) {
    if (lane < s) red[grp * TPR + lane] += red[grp * TPR + lane + s];
    __syncthreads();
  }
  return red[grp * TPR];
#endif
}
// ---- KF-EDIT-END reduce ----------------------------------------------------------------------------------------

__device__ __forceinline__ float inv_rms(float sumsq, int n, float eps) {
  const float ms = sumsq / (float)n + eps;
#if RSQRT == RSQRT_APPROX
  float r;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(ms));
  return r;
#else
  return 1.0f / sqrtf(ms);
#endif
}

// w is fp32 and read by every row: the read-only path, in 16-byte pieces where VEC allows it.
// (VEC is a constexpr, not a macro: choose with `if constexpr`, never with #if.)
__device__ __forceinline__ void load_weight(const float* w, float (&f)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
      const float4 t = __ldg(reinterpret_cast<const float4*>(w + i));
      f[i] = t.x; f[i + 1] = t.y; f[i + 2] = t.z; f[i + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; i += 2) {
      const float2 t = __ldg(reinterpret_cast<const float2*>(w + i));
      f[i] = t.x; f[i + 1] = t.y;
    }
  }
}

__device__ __forceinline__ void normalize_store(const vec_t& xv, const float* w, elem_t* y, float rstd) {
  float f[VEC], wf[VEC];
  unpack(xv, f);
  load_weight(w, wf);
#pragma unroll
  for (int i = 0; i < VEC; ++i) f[i] = f[i] * rstd * wf[i];
  store_vec(y, pack(f));
}

extern "C" __global__ void __launch_bounds__(THREADS)
rmsnorm_fwd(const elem_t* __restrict__ x, const float* __restrict__ w, elem_t* __restrict__ y,
            float* __restrict__ rstd_out, int M, int N, float eps) {
  __shared__ float red[RED_SLOTS];
#if LOAD == LOAD_CP_ASYNC
  __shared__ __align__(16) unsigned char ring[(UNROLL + 1) * THREADS * VEC_BYTES];
#endif
  const int grp = threadIdx.x / TPR;          // row group inside the CTA
  const int lane = threadIdx.x % TPR;         // thread inside the row
  const int row = blockIdx.x * ROWS_PER_CTA + grp;
  const bool active = row < M;                // inactive threads still reach every barrier
  const elem_t* xr = x + (size_t)(active ? row : 0) * N;
  elem_t* yr = y + (size_t)(active ? row : 0) * N;

  const bool vector_ok = (N % VEC == 0) &&
                         (((unsigned long long)x | (unsigned long long)y) % VEC_BYTES == 0) &&
                         ((unsigned long long)w % (VEC % 4 == 0 ? 16 : 8) == 0);
  if (!vector_ok) {
    // Scalar path: any N, any alignment.
    float ss = 0.f;
    if (active)
      for (int i = lane; i < N; i += TPR) { const float f = to_float(xr[i]); ss = fmaf(f, f, ss); }
    const float rstd = inv_rms(row_sum(ss, red, lane, grp), N, eps);
    if (active) {
      for (int i = lane; i < N; i += TPR) yr[i] = (elem_t)(to_float(xr[i]) * rstd * __ldg(w + i));
      if (lane == 0 && rstd_out) rstd_out[row] = rstd;
    }
    return;
  }

  const int nv = active ? N / VEC : 0;        // vectors in this row
  float ss = 0.f;
  vec_t kept[REG_VECS > 0 ? REG_VECS : 1];    // compile-time indices only, so it stays in registers

  // ---- KF-EDIT-BEGIN first_pass --------------------------------------------------------------------------------
#if LOAD == LOAD_CP_ASYNC
  constexpr int STAGES = UNROLL + 1;          // ring slots per thread
  // Per-thread ring of STAGES slots; slot (s, thread) is contiguous across threads (no bank conflicts).
  // Prefetch distance UNROLL: the refill of iteration k goes to the slot read in iteration k-1.
  vec_t* slots = reinterpret_cast<vec_t*>(ring);
#pragma unroll
  for (int s = 0; s < UNROLL; ++s) {
    const int v = lane + s * TPR;
    if (v < nv) cp_async_vec(&slots[s * THREADS + threadIdx.x], xr + (size_t)v * VEC);
    cp_async_commit();
  }
#define KF_STEP(k, KEEP)                                                                        \
  {                                                                                             \
    cp_async_wait<UNROLL - 1>();                                                                \
    const vec_t cur = slots[((k) % STAGES) * THREADS + threadIdx.x];                            \
    ss += sum_squares(cur);                                                                     \
    KEEP;                                                                                       \
    const int vn = lane + ((k) + UNROLL) * TPR;                                                 \
    if (vn < nv) cp_async_vec(&slots[(((k) + UNROLL) % STAGES) * THREADS + threadIdx.x],        \
                              xr + (size_t)vn * VEC);                                           \
    cp_async_commit();                                                                          \
  }
#pragma unroll
  for (int k = 0; k < REG_VECS; ++k)
    if (lane + k * TPR < nv) KF_STEP(k, kept[k] = cur)
  for (int k = REG_VECS; lane + k * TPR < nv; ++k) KF_STEP(k, (void)0)
#undef KF_STEP
  cp_async_wait<0>();
#else
  // Registers first: all REG_VECS loads are issued before the first use.
#pragma unroll
  for (int k = 0; k < REG_VECS; ++k)
    if (lane + k * TPR < nv) kept[k] = load_vec(xr + (size_t)(lane + k * TPR) * VEC);
#pragma unroll
  for (int k = 0; k < REG_VECS; ++k)
    if (lane + k * TPR < nv) ss += sum_squares(kept[k]);
  // The rest streams, UNROLL loads in flight per thread.
  for (int k0 = REG_VECS; lane + k0 * TPR < nv; k0 += UNROLL) {
    vec_t buf[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int v = lane + (k0 + u) * TPR;
      if (v < nv) buf[u] = load_vec(xr + (size_t)v * VEC);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
      if (lane + (k0 + u) * TPR < nv) ss += sum_squares(buf[u]);
  }
#endif
  // ---- KF-EDIT-END first_pass ----------------------------------------------------------------------------------

  const float rstd = inv_rms(row_sum(ss, red, lane, grp), N, eps);
  if (!active) return;
  if (lane == 0 && rstd_out) rstd_out[row] = rstd;

  // ---- KF-EDIT-BEGIN second_pass -------------------------------------------------------------------------------
#pragma unroll
  for (int k = 0; k < REG_VECS; ++k) {
    const int v = lane + k * TPR;
    if (v < nv) normalize_store(kept[k], w + (size_t)v * VEC, yr + (size_t)v * VEC, rstd);
  }
  for (int k0 = REG_VECS; lane + k0 * TPR < nv; k0 += UNROLL) {
    vec_t buf[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int v = lane + (k0 + u) * TPR;
      if (v < nv) buf[u] = load_vec(xr + (size_t)v * VEC);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int v = lane + (k0 + u) * TPR;
      if (v < nv) normalize_store(buf[u], w + (size_t)v * VEC, yr + (size_t)v * VEC, rstd);
    }
  }
  // ---- KF-EDIT-END second_pass ---------------------------------------------------------------------------------
}
