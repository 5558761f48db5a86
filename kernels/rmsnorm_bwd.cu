// RMSNorm backward, fp32 accumulation. With xhat = x * rstd and g = dy * w:
//   dx[r, :] = rstd[r] * (g - xhat * mean(g * xhat))      dw = sum over rows r of dy[r, :] * xhat[r, :]
// x, dy, dx are (M, N) row-major in DTYPE; w, dw are (N,) fp32; rstd is (M,) fp32 (from the forward pass).
//
// A template of the PTX Kernel Factory: it compiles as-is (every gene is a #define with a default, in the generated
// header below; the factory prepends its own), and instruction-level choices are inline PTX. The launch plan runs
// two kernels in order:
//  rmsnorm_bwd     a persistent grid of `slots` CTAs (thread-block clusters of CLUSTER CTAs sharing each row when
//                  CLUSTER > 1) loops over rows, ROWS_PER_CTA at once, and leaves fp32 dw partials in `partial`:
//                  one row per slot (per slot and row group where they accumulate in global memory).
//  rmsnorm_bwd_dw  sums the partial rows column by column into dw.
// With small_m=cols and few rows, two others instead split the columns over the GPU (rmsnorm_bwd_cols.cuh).
// No atomic is shared between threads and every sum has a fixed order: two launches give bitwise the same dx, dw.
//
// Layout: TPRC = CLUSTER * THREADS / ROWS_PER_CTA threads share a row (TPR below 32: sub-warp rows, 32 / TPR rows
// in each warp, summed by butterflies within each group of TPR lanes); thread gl = rank * TPR + lane owns vectors
// v = gl + k * TPRC (k = 0 .. K-1) of every row, so its dw columns never change. Its vectors k < REG_VECS keep x
// and dy in registers between the two passes (the next row's too, with PREFETCH) and w for the whole kernel; later
// vectors are streamed: read twice (the second time mostly from L2), STREAM_BATCH at a time, their loads issued
// together before any of their math so that each thread has that many in flight. With STAGES > 0 (vector path),
// the register vectors of the next STAGES - 1 rows are in flight at once: cp.async copies them into a ring of
// STAGES row slots in dynamic shared memory, private to each thread (slot [stage][k][x | dy][thread]), so that only
// cp.async.wait_group orders them and no barrier is needed; both passes read them there (x and dy take no registers
// across the row sum), and PREFETCH is off. dw partials of vector k stay in registers (DW_ACC=regs, k < REG_VECS)
// or go where the plan's flags say: dynamic shared memory (a region per row group, combined at the end) or a
// partial row in global memory. The flags also pick the vector path (N % VEC == 0, aligned pointers), the narrow
// path (gene NARROW: N even, two elements at a time) or one element at a time, so that any (M, N) is correct.
// With TAIL=peel and rows not a multiple of the vector (PLAN_PEEL), the vector path still runs: the plan's row stride
// times N is a multiple of the vector, so every row of a thread starts the same hd elements before a vector boundary,
// and its vectors (hence its dw columns) are the same in every row; the head [0, hd) and the tail past the last whole
// vector, each shorter than a vector, go one element at a time to threads gl < hd and gl < tl.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ---- genes ----------------------------------------------------------------------------------------------------------
// DTYPE and one macro per gene, with its choices' constants and its default: generated from the gene space in
// problems/rmsnorm_bwd.py by `kernel-factory genes` (a rendered candidate's own #defines come first and win).
#include "rmsnorm_bwd_genes.cuh"

// Flags of the launch plan (the kernel's `plan` argument).
#define PLAN_VECTOR 1     // N % VEC == 0 and every pointer aligned: vector accesses, else one element at a time
#define PLAN_DW_SMEM 2    // dw partials not in registers go to dynamic shared memory
#define PLAN_DW_GLOBAL 4  // ... to the partial row of (slot, row group) in global memory; neither: all in registers
#define PLAN_DW_WARP 8    // sub-warp rows, all in registers: a warp's groups add theirs by shuffles, a region per warp
#define PLAN_NARROW 16    // not the vector path, but N even (gene narrow): 2-element vectors, not one element at a time
#define PLAN_PEEL 32      // not the vector path, but aligned pointers and a row stride that keeps hd (gene tail=peel)

#if DTYPE == DTYPE_BFLOAT16
typedef __nv_bfloat16 elem_t;
#elif DTYPE == DTYPE_FLOAT16
typedef __half elem_t;
#else
typedef float elem_t;
#endif

constexpr int TPR = THREADS / ROWS_PER_CTA;                  // threads per row in one CTA
constexpr int TPRC = TPR * CLUSTER;                           // threads per row in the cluster
constexpr int VEC = VEC_BYTES / (int)sizeof(elem_t);          // elements per vector access
constexpr int WORDS = VEC_BYTES / 4;                          // 32-bit words per vector
constexpr int KV = REG_VECS;                                  // vectors per thread kept in registers
constexpr int SB = STREAM_BATCH;                              // streamed vectors loaded at once
static_assert(THREADS % ROWS_PER_CTA == 0 && (TPR % 32 == 0 || (TPR >= 2 && 32 % TPR == 0)),
              "a row takes whole warps, or 2, 4, 8 or 16 lanes of one (sub-warp rows)");
static_assert(VEC_BYTES == 8 || VEC_BYTES == 16, "vector accesses are 8 or 16 bytes");
static_assert(CLUSTER == 1 || (ROWS_PER_CTA == 1 && TPR > 32), "a cluster shares one row of several warps a CTA");
static_assert(CLUSTER <= 16, "clusters of up to 16 CTAs (above 8: non-portable, allowed by the launcher)");
static_assert(CLUSTER_SUM == CLUSTER_SUM_CTA || (CLUSTER > 1 && REDUCE == REDUCE_SHFL), "warp sums need shuffles");
static_assert(STAGES == 0 || (STAGES >= 2 && !PREFETCH), "a ring of 2 or more row slots, which replaces PREFETCH");
// Bytes of the cp.async ring at the start of dynamic shared memory (dw partials, where in shared memory, follow).
constexpr int RING_BYTES = STAGES * KV * 2 * THREADS * VEC_BYTES;

#include "rmsnorm_bwd_device.cuh"
#include "rmsnorm_bwd_cols.cuh"

// ---- rmsnorm_bwd_dw: dw[c] = sum over p of partial[p, c] --------------------------------------------------------
// A CTA covers qx runs of W columns (W = 4: float4 loads) with DW_THREADS / qx row lanes; lane l adds rows l,
// l + lanes, ..., then a shared-memory tree adds the lanes. The order is fixed, so dw is reproducible.
constexpr int DW_THREADS = 256;

template <int W> __device__ __forceinline__ void sum_columns(const float* p, float* dw, int P, int N, int qx,
                                                             float* red) {
  const int tx = threadIdx.x % qx, ty = threadIdx.x / qx, lanes = DW_THREADS / qx;
  const int col = (blockIdx.x * qx + tx) * W;
  float t[W] = {};
  if (col < N) {
#pragma unroll 4
    for (int r = ty; r < P; r += lanes) {
      float f[W];
      load_f32<W>(p + (size_t)r * N + col, f);
#pragma unroll
      for (int i = 0; i < W; ++i) t[i] += f[i];
    }
  }
#pragma unroll
  for (int i = 0; i < W; ++i) red[threadIdx.x * W + i] = t[i];
  __syncthreads();
  for (int s = lanes / 2; s > 0; s >>= 1) {
    if (ty < s)
#pragma unroll
      for (int i = 0; i < W; ++i) red[threadIdx.x * W + i] += red[(threadIdx.x + s * qx) * W + i];
    __syncthreads();
  }
  if (ty == 0 && col < N) {
#pragma unroll
    for (int i = 0; i < W; ++i) t[i] = red[tx * W + i];
    store_f32<W>(dw + col, t);
  }
}

extern "C" __global__ void __launch_bounds__(DW_THREADS)
rmsnorm_bwd_dw(const float* __restrict__ partial, float* __restrict__ dw, int P, int N, int qx, int vec) {
  __shared__ __align__(16) float red[DW_THREADS * 4];
  if (vec) sum_columns<4>(partial, dw, P, N, qx, red);
  else sum_columns<1>(partial, dw, P, N, qx, red);
}

// Pass 1 of one vector: sum of g * x (the row's c = rstd * that / N).
template <int V> __device__ __forceinline__ float dot(const Pack<V>& xv, const Pack<V>& dv, const float (&wf)[V]) {
  float xf[V], df[V], s = 0.f;
  unpack(xv, xf);
  unpack(dv, df);
#pragma unroll
  for (int i = 0; i < V; ++i) s = fmaf(df[i] * wf[i], xf[i], s);
  return s;
}

// Pass 2 of one vector: stores dx = rstd * (g - xhat * c); hands back dy and xhat for dw.
template <int V> __device__ __forceinline__ void grad(const Pack<V>& xv, const Pack<V>& dv, const float (&wf)[V],
                                                      float rs, float c, elem_t* dxp, float (&df)[V], float (&xh)[V]) {
  float xf[V], o[V];
  unpack(xv, xf);
  unpack(dv, df);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    xh[i] = xf[i] * rs;
    o[i] = rs * fmaf(-xh[i], c, df[i] * wf[i]);
  }
  store_pack<V>(dxp, pack<V>(o));
}

// dw partial += dy * xhat for vector slot k: shared memory (lane-major per (k, e): no bank conflicts) or global.
template <int V, bool PEEL = false> __device__ __forceinline__ void dw_add(float* dsm, float* prow, bool in_smem, int k,
                                                        int lane, int v, const float (&df)[V], const float (&xh)[V]) {
  if (in_smem) {
#pragma unroll
    for (int e = 0; e < V; ++e) dsm[(k * V + e) * TPR + lane] = fmaf(df[e], xh[e], dsm[(k * V + e) * TPR + lane]);
  } else {
    float d[V];
#pragma unroll
    for (int e = 0; e < V; ++e) d[e] = df[e] * xh[e];
    red_run<V, PEEL>(prow + (size_t)v * V, d);
  }
}

// Passes 1 and 2 of one head or tail element (tail=peel) at column col of the row at off: its g * x, then dx stored
// and dy * xhat added to its partial (pass 2 reads x, dy and w again, from L1 or L2, and the partial is added where
// it lies, by its one owner thread: no registers held across the row sum or the rows).
__device__ __forceinline__ float edge_dot(const Args& a, size_t off, int col) {
  return load_elem(a.dy + off + col) * __ldg(a.w + col) * load_elem(a.x + off + col);
}
__device__ __forceinline__ void edge_grad(const Args& a, size_t off, int col, float rs, float c, float* dw) {
  const float xh = load_elem(a.x + off + col) * rs, d = load_elem(a.dy + off + col);
  store_elem(a.dx + off + col, rs * fmaf(-xh, c, d * __ldg(a.w + col)));
  const float t[1] = {d * xh};
  red_f32<1>(dw, t);
}

template <int V, bool PEEL = false> __device__ __forceinline__ void run_rows(const Args& a, float* red, Cluster* cl,
                                                                             float* dsm_all, Pack<V>* ring) {
  const int grp = threadIdx.x / TPR, lane = threadIdx.x % TPR;
#if CLUSTER > 1
  const int rank = cluster_id(0), slot = cluster_id(1);
  if (slot >= a.slots) return;                // launched beyond the plan: idle (a cluster leaves as a whole)
  cluster_start(*cl);
#else
  const int rank = 0, slot = blockIdx.x;
  if (slot >= a.slots) return;
#endif
  // PEEL: this thread's rows start hd elements before a vector boundary (the same hd in each: the plan's stride of
  // slots * ROWS_PER_CTA rows times N is a multiple of VEC, or the thread has one row; anything else traps). Its
  // vectors start at element hd of the row (of w, of the partial row), where they are aligned in every row.
  int hd = 0;
  if constexpr (PEEL) {
    const int first = slot * ROWS_PER_CTA + grp, stride = a.slots * ROWS_PER_CTA;
    hd = min((VEC - (int)((size_t)first * a.N % VEC)) % VEC, a.N);
    if ((size_t)stride * a.N % VEC && first + stride < a.M) __trap();
  }
  const float* w = a.w + hd;
  const int gl = rank * TPR + lane, nv = (a.N - hd) / V, K = (nv + TPRC - 1) / TPRC;
  // This thread's head element (column gl < hd) and tail element (column tail_at + gl, gl < tl), with tail=peel.
  const int tail_at = hd + nv * V, tl = PEEL ? a.N - tail_at : 0;
  const bool eh = PEEL && gl < hd, et = PEEL && gl < tl;
  const bool in_smem = a.plan & PLAN_DW_SMEM;
  const bool in_global = a.plan & PLAN_DW_GLOBAL;
  // Sub-warp rows with every partial in registers: shared memory holds a region per warp, not per row group.
  const bool by_warp = TPR < 32 && (a.plan & PLAN_DW_WARP);
  const int regions = by_warp ? THREADS / 32 : ROWS_PER_CTA;
  float* dsm = dsm_all + (size_t)(by_warp ? threadIdx.x / 32 : grp) * K * V * TPR;
  // Global partials get a row per (slot, row group), so that every element has exactly one owner thread. With
  // sub-warp rows only a group that starts within M owns one (the plan counts partial rows below M).
  float* prow = a.partial + (size_t)(in_global ? slot * ROWS_PER_CTA + grp : slot) * a.N + hd;
  const bool parked = TPR < 32 && in_global && slot * ROWS_PER_CTA + grp >= a.M;

  float wr[KV][V], dwr[KV][V];
#pragma unroll
  for (int k = 0; k < KV; ++k) {
#pragma unroll
    for (int e = 0; e < V; ++e) wr[k][e] = dwr[k][e] = 0.f;
    if (gl + k * TPRC < nv) load_run<V, PEEL>(w + (size_t)(gl + k * TPRC) * V, wr[k]);
  }
  const float zero[V] = {};
  if constexpr (PEEL) {   // the head and tail columns: one owner thread per partial row, which adds every row's
    if (eh) prow[gl - hd] = 0.f;
    if (et) prow[tail_at - hd + gl] = 0.f;
  }
  for (int k = 0; gl + k * TPRC < nv; ++k) {   // every partial this thread owns starts at zero
    if (in_smem && !by_warp) {                 // (a warp's region is written once, at the end)
#pragma unroll
      for (int e = 0; e < V; ++e) dsm[(k * V + e) * TPR + lane] = 0.f;
    } else if (in_global && !parked) {
      store_run<V, PEEL>(prow + (size_t)(gl + k * TPRC) * V, zero);
    }
  }

  const int stride = a.slots * ROWS_PER_CTA;
  int row = slot * ROWS_PER_CTA + grp, it = 0;
  constexpr bool ringed = STAGES > 0 && V == VEC;   // the narrow and one-element paths load as without a ring
  Pack<V> xs[KV], ds[KV];
#if PREFETCH
  Pack<V> xn[KV], dn[KV];
  load_regs<V>(a, row, gl, nv, xs, ds, hd);
#endif
  if constexpr (ringed) {
#pragma unroll
    for (int j = 0; j < STAGES - 1; ++j) stage_row<V>(a, ring, row + j * stride, j, gl, nv, hd);
  }
  for (int base = slot * ROWS_PER_CTA; base < a.M; base += stride, row += stride, ++it) {
    const bool active = row < a.M;             // an idle row group still reaches every barrier
    if constexpr (ringed) {
      stage_row<V>(a, ring, row + (STAGES - 1) * stride, (it + STAGES - 1) % STAGES, gl, nv, hd);
      cp_async_wait<STAGES - 1>();             // this row's group has landed (this thread's own copies)
      if (active) read_slot<V>(ring, it % STAGES, gl, nv, xs, ds);
    } else {
#if PREFETCH
      load_regs<V>(a, row + stride, gl, nv, xn, dn, hd);
#else
      load_regs<V>(a, row, gl, nv, xs, ds, hd);
#endif
    }
    const size_t off = (size_t)(active ? row : 0) * a.N;
    const elem_t* xr = a.x + off + hd;    // the row's first vector (hd = 0 but with tail=peel)
    const elem_t* dyr = a.dy + off + hd;
    const float rs = active ? __ldg(a.rstd + row) : 0.f;
    float s = 0.f;
    if constexpr (PEEL) {   // this thread's head and tail elements (tail=peel), read again in pass 2
      if (active && eh) s = edge_dot(a, off, gl);
      if (active && et) s += edge_dot(a, off, tail_at + gl);
    }
    // ---- KF-EDIT-BEGIN first_pass ------------------------------------------------------------------------------
    if (active) {
#pragma unroll
      for (int k = 0; k < KV; ++k)
        if (gl + k * TPRC < nv) s += dot<V>(xs[k], ds[k], wr[k]);
#pragma unroll 1
      for (int k = KV; gl + k * TPRC < nv; k += SB) {  // streamed vectors, SB at a time (sums in vector order)
        Batch<V> b;
        load_batch<V>(xr, dyr, gl, nv, k, b);
#pragma unroll
        for (int u = 0; u < SB; ++u) {
          const int v = gl + (k + u) * TPRC;
          if (v >= nv) continue;
          float wf[V];
          load_run<V, PEEL>(w + (size_t)v * V, wf);
          s += dot<V>(b.x[u], b.dy[u], wf);
        }
      }
    }
    // ---- KF-EDIT-END first_pass --------------------------------------------------------------------------------
    const float c = rs * (row_sum(s, red, cl, grp, lane, it) / (float)a.N);   // mean(g * xhat)
    // ---- KF-EDIT-BEGIN second_pass -----------------------------------------------------------------------------
    if (active) {
      if constexpr (ringed) read_slot<V>(ring, it % STAGES, gl, nv, xs, ds);   // again: no registers held across
      elem_t* dxr = a.dx + off + hd;
      float df[V], xh[V];
#pragma unroll
      for (int k = 0; k < KV; ++k) {
        const int v = gl + k * TPRC;
        if (v >= nv) continue;
        grad<V>(xs[k], ds[k], wr[k], rs, c, dxr + (size_t)v * V, df, xh);
        if constexpr (DW_ACC == DW_ACC_REGS) {
#pragma unroll
          for (int e = 0; e < V; ++e) dwr[k][e] = fmaf(df[e], xh[e], dwr[k][e]);
        } else {
          dw_add<V, PEEL>(dsm, prow, in_smem, k, lane, v, df, xh);
        }
      }
#pragma unroll 1
      for (int k = KV; gl + k * TPRC < nv; k += SB) {  // the streamed vectors again (mostly from L2)
        Batch<V> b;
        load_batch<V>(xr, dyr, gl, nv, k, b);
#pragma unroll
        for (int u = 0; u < SB; ++u) {
          const int v = gl + (k + u) * TPRC;
          if (v >= nv) continue;
          float wf[V];
          load_run<V, PEEL>(w + (size_t)v * V, wf);
          grad<V>(b.x[u], b.dy[u], wf, rs, c, dxr + (size_t)v * V, df, xh);
          dw_add<V, PEEL>(dsm, prow, in_smem, k + u, lane, v, df, xh);
        }
      }
    }
    // ---- KF-EDIT-END second_pass -------------------------------------------------------------------------------
    if constexpr (PEEL) {
      if (active && eh) edge_grad(a, off, gl, rs, c, prow - hd + gl);
      if (active && et) edge_grad(a, off, tail_at + gl, rs, c, prow - hd + tail_at + gl);
    }
#if PREFETCH
#pragma unroll
    for (int k = 0; k < KV; ++k) { xs[k] = xn[k]; ds[k] = dn[k]; }
#endif
  }

  if constexpr (ringed) cp_async_wait<0>();  // no copy outlives the loop (groups past the last row are empty)
  // Publish the slot's partials: combine the row groups' shared regions in a fixed order, or add the register
  // partials to the global row, or store them (all in registers, one row group).
  if (in_smem) {
    if constexpr (DW_ACC == DW_ACC_REGS) {
      if constexpr (TPR < 32) {
        if (by_warp) warp_dw<V>(dwr, dsm, gl, nv, lane);
      }
      if (!by_warp) {
#pragma unroll
        for (int k = 0; k < KV; ++k)
          if (gl + k * TPRC < nv)
#pragma unroll
            for (int e = 0; e < V; ++e) dsm[(k * V + e) * TPR + lane] += dwr[k][e];
      }
    }
    __syncthreads();
    for (int k = grp; gl + k * TPRC < nv; k += ROWS_PER_CTA) {
      float t[V];
#pragma unroll
      for (int e = 0; e < V; ++e) {
        t[e] = 0.f;
        for (int g = 0; g < regions; ++g) t[e] += dsm_all[(size_t)g * K * V * TPR + (k * V + e) * TPR + lane];
      }
      store_run<V, PEEL>(prow + (size_t)(gl + k * TPRC) * V, t);
    }
  } else if (DW_ACC == DW_ACC_REGS && !parked) {
#pragma unroll
    for (int k = 0; k < KV; ++k) {
      const int v = gl + k * TPRC;
      if (v >= nv) continue;
      if (in_global) red_run<V, PEEL>(prow + (size_t)v * V, dwr[k]);
      else store_run<V, PEEL>(prow + (size_t)v * V, dwr[k]);
    }
  }
#if CLUSTER > 1
  cluster_sync();                              // keep this CTA's shared memory alive for the cluster's last reads
#endif
}

extern "C" __global__ void __launch_bounds__(THREADS, CTAS_PER_SM)
rmsnorm_bwd(const elem_t* __restrict__ x, const float* __restrict__ w, const elem_t* __restrict__ dy,
            const float* __restrict__ rstd, elem_t* __restrict__ dx, float* __restrict__ partial,
            int M, int N, int slots, int plan) {
  __shared__ float red[2 * RED_SLOTS];
#if CLUSTER > 1
  __shared__ Cluster cluster;
  Cluster* cl = &cluster;
#else
  Cluster* cl = nullptr;
#endif
  extern __shared__ __align__(16) unsigned char dynamic_smem[];   // the ring, then the dw partials
  float* dsm = reinterpret_cast<float*>(dynamic_smem + RING_BYTES);
  const Args a{x, w, dy, rstd, dx, partial, M, N, slots, plan};
  if (plan & PLAN_VECTOR) run_rows<VEC>(a, red, cl, dsm, reinterpret_cast<Pack<VEC>*>(dynamic_smem));
#if TAIL == TAIL_PEEL
  else if (plan & PLAN_PEEL) run_rows<VEC, true>(a, red, cl, dsm, reinterpret_cast<Pack<VEC>*>(dynamic_smem));
#endif
#if NARROW
  else if (VEC > 2 && (plan & PLAN_NARROW)) run_rows<2>(a, red, cl, dsm, reinterpret_cast<Pack<2>*>(dynamic_smem));
#endif
  else run_rows<1>(a, red, cl, dsm, reinterpret_cast<Pack<1>*>(dynamic_smem));
}

