// RMSNorm forward: y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * w, accumulated in fp32; rstd[r] is stored.
// x and y are (M, N) row-major in DTYPE; w is (N,) fp32; rstd is (M,) fp32.
//
// A template of the PTX Kernel Factory. It compiles as-is: every gene is a #define with a default (in the generated
// header below), and the factory prepends its own #defines to render a candidate. Instruction-level choices are
// inline PTX.
//
// Layout: each CTA normalizes ROWS_PER_CTA rows at once, TPR = THREADS / ROWS_PER_CTA threads per row (TPR = 32 is
// warp-per-row; TPR = 2..16 is sub-warp rows: one warp normalizes 32 / TPR narrow rows, and the row reduction is a
// butterfly over the TPR lanes of its group). Each thread walks its row in VEC_BYTES-wide vectors, strided by
// TPR. The first REG_VECS vectors of each thread stay in registers between the two passes (KEEP_X); the rest is
// re-read for the second pass.
// Rows whose length or alignment rules out vector access take a scalar path, so any (M, N) is correct.
// TAIL_PEEL narrows that to x and y rows of different alignment: any other row is a scalar head (up to x's first
// VEC_BYTES-aligned address), a body of whole vectors on the paths below, and a scalar tail; the head and tail are
// summed before the row reduction and stored after it. Every path supports it: the staged one (a persistent CTA
// prefetches the next row only when N % VEC == 0, since otherwise its head differs) and clusters (the body's
// vectors are split; the head belongs to rank 0, the tail to the last rank).
//
// Wide rows (genes whose defaults leave the kernel above unchanged):
// - STAGE_SMEM: the part of the row that is not kept in registers is copied once into dynamic shared memory during
//   the first pass (cp.async per thread, or TMA bulk copies completing on an mbarrier) and the second pass reads it
//   from there instead of from global memory. The launch passes `staged` = 0 when the slice would not fit in shared
//   memory; the kernel then takes the unstaged path.
// - CLUSTER > 1: one row per thread-block cluster; CTA `rank` normalizes the rank-th slice (whole vectors) of the
//   row and the partial sums of squares are exchanged through distributed shared memory. Grid = M * CLUSTER.
// - PERSISTENT: a grid of about one wave of CTAs loops over the rows; on the staged path each thread starts loading
//   its part of its next row while it finishes the current one.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

// ---- genes ----------------------------------------------------------------------------------------------------------
// DTYPE and one macro per gene, with its choices' constants and its default: generated from the gene space in
// problems/rmsnorm_fwd.py by `kernel-factory genes` (a rendered candidate's own #defines come first and win).
#include "rmsnorm_fwd_genes.cuh"


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
static_assert(THREADS % ROWS_PER_CTA == 0 && (TPR % 32 == 0 || TPR == 2 || TPR == 4 || TPR == 8 || TPR == 16),
              "a row needs whole warps, or 2, 4, 8 or 16 threads of one warp (sub-warp rows)");
static_assert(TPR >= 32 || STAGE == STAGE_NONE, "sub-warp rows are narrow rows: nothing to stage");
static_assert(VEC_BYTES == 8 || VEC_BYTES == 16, "vector accesses are 8 or 16 bytes");
static_assert(CLUSTER == 1 || CLUSTER == 2 || CLUSTER == 4 || CLUSTER == 8 || CLUSTER == 16,
              "clusters of 1 to 16 CTAs (above 8: non-portable, allowed by the launcher)");
static_assert(CLUSTER == 1 || (ROWS_PER_CTA == 1 && !PERSISTENT),
              "a cluster normalizes one row and is not persistent");
static_assert(STAGE_COPY == STAGE_COPY_CP_ASYNC || (STAGE == STAGE_SMEM && VEC_BYTES == 16),
              "bulk copies stage 16-byte vectors");
static_assert(STAGE == STAGE_NONE || LOAD != LOAD_CP_ASYNC, "staging replaces the cp.async ring");

#include "rmsnorm_fwd_device.cuh"

#if PERSISTENT
// CTAs per SM that one resident wave assumes. The launch bound makes the compiler fit that many by registers; the
// launch (problems/rmsnorm_fwd.py, persistent_ctas_per_sm) uses the same formula and also counts shared memory.
// Registers per thread, measured on ptxas' reports: keep_x's row part plus the next row's loads in flight need
// about 120, the rest about 56, plus the vectors in flight.
constexpr int REG_BUDGET = (KEEP_X ? 120 : 56) + UNROLL * VEC_BYTES / 4;
constexpr int PERSIST_BY_REGS = 65536 / (THREADS * ((REG_BUDGET + 7) / 8 * 8));
constexpr int PERSIST_CTAS = PERSIST_BY_REGS < 1 ? 1 : (PERSIST_BY_REGS > 2048 / THREADS ? 2048 / THREADS
                                                                                          : PERSIST_BY_REGS);
#define KF_BOUNDS __launch_bounds__(THREADS, PERSIST_CTAS)
#else
#define KF_BOUNDS __launch_bounds__(THREADS)
#endif

extern "C" __global__ void KF_BOUNDS
rmsnorm_fwd(const elem_t* __restrict__ x, const float* __restrict__ weight, elem_t* __restrict__ y,
            float* __restrict__ rstd_out, int M, int N, float eps, int staged) {
  __shared__ float red[RED_SLOTS * (1 + PERSISTENT)];   // persistent: two buffers, alternating by row
#if LOAD == LOAD_CP_ASYNC
  __shared__ __align__(16) unsigned char ring[(UNROLL + 1) * THREADS * VEC_BYTES];
#endif
  const int grp = threadIdx.x / TPR;          // row group inside the CTA
  const int lane = threadIdx.x % TPR;         // thread inside the row
#if CLUSTER > 1
  __shared__ float cluster_part[CLUSTER];
  const int rank = cluster_rank();
  if (cluster_ctas() != CLUSTER) __trap();    // launched without its cluster: the DSMEM exchange cannot work
  cluster_arrive_relaxed();                   // waited for in cluster_sum, before the first remote store
#else
  constexpr int rank = 0;
  float* const cluster_part = nullptr;
#endif
#if STAGE == STAGE_SMEM
  extern __shared__ __align__(16) unsigned char stage_buf[];
  vec_t skept[REG_VECS > 0 ? REG_VECS : 1];   // the staged path's register part (loaded ahead when persistent)
  bool prefetched = false;                    // this thread's part of its row is already on its way
#endif
#if STAGE == STAGE_SMEM && STAGE_COPY == STAGE_COPY_BULK
  __shared__ __align__(8) unsigned long long stage_bar[ROWS_PER_CTA];
  unsigned int stage_phase = 0;               // parity of this row group's next mbarrier phase
  if (threadIdx.x == 0) {
    for (int g = 0; g < ROWS_PER_CTA; ++g) mbar_init(&stage_bar[g], 1);
    mbar_init_fence();
  }
  __syncthreads();
#endif

#if PERSISTENT
  // One wave of CTAs walks the rows; the loop bound is uniform over the CTA, so every barrier is reached by all.
  const int row_step = gridDim.x * ROWS_PER_CTA;
  int parity = 0;
  for (int first = blockIdx.x * ROWS_PER_CTA; first < M; first += row_step, parity ^= 1) {
    float* const rbuf = red + parity * RED_SLOTS;
#define KF_ROW_DONE continue
#else
  {
    const int first = blockIdx.x / CLUSTER * ROWS_PER_CTA;
    float* const rbuf = red;
#define KF_ROW_DONE return
#endif
  const int row = first + grp;
  const bool active = row < M;                // inactive threads still reach every barrier
#if CLUSTER > 1
  // This CTA's slice of the row: [lo, hi), `slice` elements (whole vectors) per CTA; the last may be short or empty.
  const int slice = ((N + VEC - 1) / VEC + CLUSTER - 1) / CLUSTER * VEC;
  const int lo = min(N, rank * slice), hi = min(N, lo + slice);
#else
  const int slice = N;
  constexpr int lo = 0;
  const int hi = N;
#endif
  const elem_t* xr = x + (size_t)(active ? row : 0) * N + lo;
  elem_t* yr = y + (size_t)(active ? row : 0) * N + lo;
  const float* w = weight + lo;               // (tail=peel moves xr, yr and w to the row's vector body)

#if TAIL == TAIL_PEEL
  // Same row stride, so x and y rows share their alignment in every row exactly when the bases do.
  const bool vector_ok = ((unsigned long long)x - (unsigned long long)y) % VEC_BYTES == 0;
#else
  const bool vector_ok = (N % VEC == 0) &&
                         (((unsigned long long)x | (unsigned long long)y) % VEC_BYTES == 0) &&
                         ((unsigned long long)weight % (VEC % 4 == 0 ? 16 : 8) == 0);
#endif
  if (!vector_ok) {
    // Scalar path: any N, any alignment.
    float ss = 0.f;
    if (active)
      for (int i = lane; i < hi - lo; i += TPR) { const float f = to_float(xr[i]); ss = fmaf(f, f, ss); }
    const float rstd = inv_rms(cluster_sum(row_sum(ss, rbuf, lane, grp), cluster_part, rank), N, eps);
    if (active) {
      for (int i = lane; i < hi - lo; i += TPR) yr[i] = (elem_t)(to_float(xr[i]) * rstd * __ldg(w + i));
      if (lane == 0 && rank == 0 && rstd_out) rstd_out[row] = rstd;
    }
    KF_ROW_DONE;
  }

#if TAIL == TAIL_PEEL
  // The row's head (aligning x) and its body of whole vectors; a cluster splits the body's vectors like the slices
  // above, and the head goes to rank 0, the tail to the last rank. Inactive rows have neither body nor edges.
  const elem_t* const xrow = x + (size_t)(active ? row : 0) * N;
  elem_t* const yrow = y + (size_t)(active ? row : 0) * N;
  const int head = active ? min(N, head_elems(xrow)) : 0;
  const int body = active ? (N - head) / VEC : 0;
  const int per = (body + CLUSTER - 1) / CLUSTER;      // body vectors per CTA of the cluster
  const int b0 = min(body, rank * per);
  const int nv = min(body, b0 + per) - b0;             // vectors in this CTA's part of the body
  const int tail_at = head + body * VEC;
  const edges_t edges = load_edges(xrow, rank == 0 ? head : 0, tail_at,
                                   active && rank == CLUSTER - 1 ? N - tail_at : 0, lane);
  const float edge_ss = edges_sum_squares(edges);
  const int body_at = head + b0 * VEC;                 // this CTA's first body element: its x address is aligned
  xr = xrow + body_at;
  yr = yrow + body_at;
  w = weight + body_at;
  const bool w_vec = weight_vec_ok(w);                 // per row when N % VEC != 0: the head moves w
#define KF_STORE_EDGES store_edges(edges, weight, yrow, rstd, lane)
#else
  const int nv = active ? (hi - lo) / VEC : 0;        // vectors in this row (in this CTA's slice of it)
  constexpr bool w_vec = true;                        // vector_ok checked w's alignment
  constexpr float edge_ss = 0.f;                      // no scalar head or tail beside the vectors
#define KF_STORE_EDGES (void)0
#endif
#if W_AHEAD == W_AHEAD_L2
  prefetch_weight_l2(w, nv * VEC, lane);
#endif
#if W_AHEAD == W_AHEAD_REGS
  // The kept vectors' weights, asked for before x's sum needs the round trip to memory it waits for.
  float wk[REG_VECS > 0 ? REG_VECS : 1][VEC];
#pragma unroll
  for (int k = 0; k < REG_VECS; ++k)
    if (lane + k * TPR < nv) fetch_weight(w + (size_t)(lane + k * TPR) * VEC, wk[k], w_vec);
#define KF_STORE_KEPT(k, xv) normalize_store_w(xv, wk[k], yr + (size_t)(lane + (k) * TPR) * VEC, rstd)
#else
#define KF_STORE_KEPT(k, xv) \
  normalize_store(xv, w + (size_t)(lane + (k) * TPR) * VEC, yr + (size_t)(lane + (k) * TPR) * VEC, rstd, w_vec)
#endif
#if STAGE == STAGE_SMEM
  if (staged) {
  // ---- KF-EDIT-BEGIN staged_row -----------------------------------------------------------------------------------
    // Vectors [0, REG) of the slice stay in registers, [REG, nv) are staged in shared memory at sv[v - REG]; each
    // thread owns vectors lane + k*TPR, as on the unstaged path. The launch sized stage_buf for this layout.
    constexpr int REG = REG_VECS * TPR;
    vec_t* const sv = reinterpret_cast<vec_t*>(stage_buf) + grp * max(0, slice / VEC - REG);
#if PERSISTENT && TAIL == TAIL_PEEL
    // Rows start at the same alignment (the same head) only when N % VEC == 0; otherwise nothing is prefetched.
    const bool fetch_next = row + row_step < M && N % VEC == 0;
    const elem_t* const xn = fetch_next ? xr + (size_t)row_step * N : xr;
#elif PERSISTENT
    const bool fetch_next = row + row_step < M;      // same N and alignment: the next row takes this path too
    const elem_t* const xn = x + (size_t)(fetch_next ? row + row_step : 0) * N + lo;
#else
    constexpr bool fetch_next = false;
    const elem_t* const xn = xr;
#endif
#if STAGE_COPY == STAGE_COPY_BULK
#if PERSISTENT
    __syncthreads();                                  // all reads of the previous row's staged vectors are done
#endif
    constexpr unsigned int BULK_CHUNK = 16384;        // bytes per TMA request; the first warp of the row issues them
    const unsigned int stage_bytes = nv > REG ? (unsigned int)(nv - REG) * VEC_BYTES : 0u;
    if (lane < 32 && stage_bytes > 0) {
      if (lane == 0) {
        async_proxy_fence();
        mbar_expect_bytes(&stage_bar[grp], stage_bytes);
      }
      __syncwarp();
      const unsigned char* src = reinterpret_cast<const unsigned char*>(xr + (size_t)REG * VEC);
      for (unsigned int off = lane * BULK_CHUNK; off < stage_bytes; off += 32 * BULK_CHUNK)
        bulk_copy(reinterpret_cast<unsigned char*>(sv) + off, src + off, min(BULK_CHUNK, stage_bytes - off),
                  &stage_bar[grp]);
    }
#else
    if (!prefetched) {
      for (int v = REG + lane; v < nv; v += TPR) cp_async_vec(&sv[v - REG], xr + (size_t)v * VEC);
      cp_async_commit();
    }
#endif
    if (!prefetched) {
#pragma unroll
      for (int k = 0; k < REG_VECS; ++k)
        if (lane + k * TPR < nv) skept[k] = load_vec(xr + (size_t)(lane + k * TPR) * VEC);
    }
    float ss = edge_ss;
#pragma unroll
    for (int k = 0; k < REG_VECS; ++k)
      if (lane + k * TPR < nv) ss += sum_squares(skept[k]);
#if STAGE_COPY == STAGE_COPY_BULK
    if (stage_bytes > 0) {
      mbar_wait(&stage_bar[grp], stage_phase);
      stage_phase ^= 1u;
    }
#else
    cp_async_wait<0>();
#endif
#pragma unroll UNROLL
    for (int v = REG + lane; v < nv; v += TPR) ss += sum_squares(load_staged(&sv[v - REG]));

    const float rstd = inv_rms(cluster_sum(row_sum(ss, rbuf, lane, grp), cluster_part, rank), N, eps);
    if (active) {
      if (lane == 0 && rank == 0 && rstd_out) rstd_out[row] = rstd;
      KF_STORE_EDGES;
      // Each vector is refilled with the next row's only after its value was stored: no read is overtaken.
#pragma unroll
      for (int k = 0; k < REG_VECS; ++k) {
        const int v = lane + k * TPR;
        if (v < nv) {
          KF_STORE_KEPT(k, skept[k]);
          if (fetch_next) skept[k] = load_vec(xn + (size_t)v * VEC);
        }
      }
#pragma unroll UNROLL
      for (int v = REG + lane; v < nv; v += TPR) {
        normalize_store(load_staged(&sv[v - REG]), w + (size_t)v * VEC, yr + (size_t)v * VEC, rstd, w_vec);
#if STAGE_COPY == STAGE_COPY_CP_ASYNC
        if (fetch_next) cp_async_vec(&sv[v - REG], xn + (size_t)v * VEC);
#endif
      }
#if STAGE_COPY == STAGE_COPY_CP_ASYNC
      if (fetch_next) cp_async_commit();
#endif
    }
    prefetched = fetch_next;
  // ---- KF-EDIT-END staged_row -------------------------------------------------------------------------------------
    KF_ROW_DONE;
  }
#endif
  float ss = edge_ss;
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

  const float rstd = inv_rms(cluster_sum(row_sum(ss, rbuf, lane, grp), cluster_part, rank), N, eps);
  if (!active) KF_ROW_DONE;
  if (lane == 0 && rank == 0 && rstd_out) rstd_out[row] = rstd;
  KF_STORE_EDGES;

  // ---- KF-EDIT-BEGIN second_pass -------------------------------------------------------------------------------
#pragma unroll
  for (int k = 0; k < REG_VECS; ++k) {
    const int v = lane + k * TPR;
    if (v < nv) KF_STORE_KEPT(k, kept[k]);
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
      if (v < nv) normalize_store(buf[u], w + (size_t)v * VEC, yr + (size_t)v * VEC, rstd, w_vec);
    }
  }
  // ---- KF-EDIT-END second_pass ---------------------------------------------------------------------------------
  }
#undef KF_ROW_DONE
#undef KF_STORE_EDGES
#undef KF_STORE_KEPT
}
