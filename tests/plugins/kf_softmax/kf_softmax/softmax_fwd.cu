// Row softmax forward: y[r, :] = exp(x[r, :] - max(x[r, :])) / sum(exp(x[r, :] - max(x[r, :]))), in fp32 math.
// x and y are (M, N) row-major in DTYPE.
//
// A template of the PTX Kernel Factory, shipped by the kf-softmax-plugin package. It compiles as-is: every gene
// is a #define with a default (in softmax_fwd_genes.cuh, which `kernel-factory genes` writes from the gene space and
// problem.py inlines), and the factory prepends its own #defines to render a candidate. Instruction-level choices
// are inline PTX.
//
// Layout: each CTA handles ROWS_PER_CTA rows, TPR = THREADS / ROWS_PER_CTA threads per row (TPR = 32 is warp per
// row). Pass 1 gives each thread a running max m and a sum s of exp(x - m), rescaling s when m grows (online
// softmax), so x is read once; the row then combines the (m, s) pairs. Pass 2 writes exp(x - max) / sum. The first
// REG_VECS vectors of each thread stay in registers between the passes, so rows up to TPR * 128 bytes come from
// memory once; longer rows re-read the rest. Rows whose length or alignment rules out vector access take a scalar
// path, so any (M, N) is correct.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ---- genes ----------------------------------------------------------------------------------------------------------
// DTYPE and one macro per gene, with its choices' constants and its default: generated from the gene space in
// problem.py by `kernel-factory genes` (a rendered candidate's own #defines come first and win).
#include "softmax_fwd_genes.cuh"

#if DTYPE == DTYPE_BFLOAT16
typedef __nv_bfloat16 elem_t;
#elif DTYPE == DTYPE_FLOAT16
typedef __half elem_t;
#else
typedef float elem_t;
#endif

constexpr int TPR = THREADS / ROWS_PER_CTA;                  // threads per row
constexpr int WPR = TPR / 32;                                 // warps per row
constexpr int VEC = VEC_BYTES / (int)sizeof(elem_t);          // elements per vector access
constexpr int WORDS = VEC_BYTES / 4;                          // 32-bit words per vector
constexpr int REG_VECS = 128 / VEC_BYTES;                     // vectors per thread kept in registers (128 bytes)
constexpr float LOG2E = 1.4426950408889634f;
constexpr unsigned int NEG_INF_BITS = 0xff800000u;            // -inf (NVRTC has no <cmath>, hence no INFINITY)
// The shuffle reductions use a full-warp mask: a warp must never straddle two rows.
static_assert(THREADS % ROWS_PER_CTA == 0 && TPR % 32 == 0, "a row needs whole warps");
static_assert(VEC_BYTES == 8 || VEC_BYTES == 16, "vector accesses are 8 or 16 bytes");

struct vec_t { unsigned int w[WORDS]; };

// ---- KF-EDIT-BEGIN load_store ----------------------------------------------------------------------------------
#if LOAD == LOAD_PLAIN
#define LD_OP "ld.global"
#else
#define LD_OP "ld.global.nc"
#endif

// The width tests use the macro VEC_BYTES: the preprocessor cannot see constexpr values (WORDS would read as 0).
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
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};"
               :: "l"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3]) : "memory");
#else
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(v.w[0]), "r"(v.w[1]) : "memory");
#endif
}
// ---- KF-EDIT-END load_store ------------------------------------------------------------------------------------

// ---- KF-EDIT-BEGIN exp -----------------------------------------------------------------------------------------
// exp(d) for d = x - max <= 0. Both choices return +0 for d = -inf, which the online rescaling relies on.
__device__ __forceinline__ float exp_shifted(float d) {
#if EXP == EXP_APPROX
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d * LOG2E));
  return r;
#else
  return expf(d);
#endif
}
// ---- KF-EDIT-END exp -------------------------------------------------------------------------------------------

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

__device__ __forceinline__ float vec_max(const vec_t& v) {
  float f[VEC];
  unpack(v, f);
  float m = f[0];
#pragma unroll
  for (int i = 1; i < VEC; ++i) m = fmaxf(m, f[i]);
  return m;
}

__device__ __forceinline__ float vec_sum_exp(const vec_t& v, float m) {
  float f[VEC];
  unpack(v, f);
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < VEC; ++i) s += exp_shifted(f[i] - m);
  return s;
}

// Folds one vector into the running (m, s): s is rescaled to the new max before the vector's terms are added.
__device__ __forceinline__ void fold_vec(const vec_t& v, float& m, float& s) {
  const float mv = fmaxf(m, vec_max(v));
  s = s * exp_shifted(m - mv) + vec_sum_exp(v, mv);
  m = mv;
}

__device__ __forceinline__ void fold_scalar(float x, float& m, float& s) {
  const float mv = fmaxf(m, x);
  s = s * exp_shifted(m - mv) + exp_shifted(x - mv);
  m = mv;
}

// ---- KF-EDIT-BEGIN reduce --------------------------------------------------------------------------------------
__device__ __forceinline__ float shfl_bfly(float v, int lane_mask) {
  unsigned int r;
  asm volatile("shfl.sync.bfly.b32 %0, %1, %2, 0x1f, 0xffffffff;"
               : "=r"(r) : "r"(__float_as_uint(v)), "r"(lane_mask));
  return __uint_as_float(r);
}

// Max (IS_MAX) or sum of v over the TPR threads of row group `grp`: a butterfly in each warp, then one step through
// shared memory across the row's warps. Every thread of the CTA must call it (it holds a barrier when TPR > 32).
template <bool IS_MAX>
__device__ __forceinline__ float row_reduce(float v, float* red, int lane, int grp) {
#pragma unroll
  for (int k = 16; k > 0; k >>= 1) {
    const float o = shfl_bfly(v, k);
    v = IS_MAX ? fmaxf(v, o) : v + o;
  }
  if (WPR == 1) return v;
  if ((lane & 31) == 0) red[grp * WPR + (lane >> 5)] = v;
  __syncthreads();
  float r = red[grp * WPR];
#pragma unroll
  for (int i = 1; i < WPR; ++i) r = IS_MAX ? fmaxf(r, red[grp * WPR + i]) : r + red[grp * WPR + i];
  return r;
}

// The row's max and 1 / sum of exp(x - max) from each thread's (m, s). The two reductions use separate shared
// slots, so no barrier is needed between them.
__device__ __forceinline__ void row_stats(float m, float s, float (&red)[2][THREADS / 32], int lane, int grp,
                                          float& row_max, float& inv_sum) {
  row_max = row_reduce<true>(m, red[0], lane, grp);
  inv_sum = 1.0f / row_reduce<false>(s * exp_shifted(m - row_max), red[1], lane, grp);
}
// ---- KF-EDIT-END reduce ----------------------------------------------------------------------------------------

__device__ __forceinline__ void write_vec(const vec_t& xv, elem_t* y, float row_max, float inv_sum) {
  float f[VEC];
  unpack(xv, f);
#pragma unroll
  for (int i = 0; i < VEC; ++i) f[i] = exp_shifted(f[i] - row_max) * inv_sum;
  store_vec(y, pack(f));
}

extern "C" __global__ void __launch_bounds__(THREADS)
softmax_fwd(const elem_t* __restrict__ x, elem_t* __restrict__ y, int M, int N) {
  __shared__ float red[2][THREADS / 32];
  const int grp = threadIdx.x / TPR;          // row group inside the CTA
  const int lane = threadIdx.x % TPR;         // thread inside the row
  const int row = blockIdx.x * ROWS_PER_CTA + grp;
  const bool active = row < M;                // inactive threads still reach every barrier
  const elem_t* xr = x + (size_t)(active ? row : 0) * N;
  elem_t* yr = y + (size_t)(active ? row : 0) * N;
  float m = __uint_as_float(NEG_INF_BITS), s = 0.f, row_max, inv_sum;

  const bool vector_ok = (N % VEC == 0) && (((unsigned long long)x | (unsigned long long)y) % VEC_BYTES == 0);
  if (!vector_ok) {
    // Scalar path: any N, any alignment.
    if (active)
      for (int i = lane; i < N; i += TPR) fold_scalar(to_float(xr[i]), m, s);
    row_stats(m, s, red, lane, grp, row_max, inv_sum);
    if (active)
      for (int i = lane; i < N; i += TPR) yr[i] = (elem_t)(exp_shifted(to_float(xr[i]) - row_max) * inv_sum);
    return;
  }

  const int nv = active ? N / VEC : 0;        // vectors in this row
  vec_t kept[REG_VECS];                       // compile-time indices only, so it stays in registers

  // ---- KF-EDIT-BEGIN first_pass --------------------------------------------------------------------------------
  // Registers first: all REG_VECS loads are issued before the first use, and their max is taken before any exp,
  // so the kept part needs no rescaling.
#pragma unroll
  for (int k = 0; k < REG_VECS; ++k)
    if (lane + k * TPR < nv) kept[k] = load_vec(xr + (size_t)(lane + k * TPR) * VEC);
#pragma unroll
  for (int k = 0; k < REG_VECS; ++k)
    if (lane + k * TPR < nv) m = fmaxf(m, vec_max(kept[k]));
#pragma unroll
  for (int k = 0; k < REG_VECS; ++k)
    if (lane + k * TPR < nv) s += vec_sum_exp(kept[k], m);
  // The rest streams through, two loads in flight per thread.
  for (int v = lane + REG_VECS * TPR; v < nv; v += 2 * TPR) {
    const vec_t a = load_vec(xr + (size_t)v * VEC);
    if (v + TPR < nv) {
      const vec_t b = load_vec(xr + (size_t)(v + TPR) * VEC);
      fold_vec(a, m, s);
      fold_vec(b, m, s);
    } else {
      fold_vec(a, m, s);
    }
  }
  // ---- KF-EDIT-END first_pass ----------------------------------------------------------------------------------

  row_stats(m, s, red, lane, grp, row_max, inv_sum);
  if (!active) return;

  // ---- KF-EDIT-BEGIN second_pass -------------------------------------------------------------------------------
#pragma unroll
  for (int k = 0; k < REG_VECS; ++k) {
    const int v = lane + k * TPR;
    if (v < nv) write_vec(kept[k], yr + (size_t)v * VEC, row_max, inv_sum);
  }
  for (int v = lane + REG_VECS * TPR; v < nv; v += TPR)
    write_vec(load_vec(xr + (size_t)v * VEC), yr + (size_t)v * VEC, row_max, inv_sum);
  // ---- KF-EDIT-END second_pass ---------------------------------------------------------------------------------
}
