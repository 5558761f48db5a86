// Device helpers of the backward template (rmsnorm_bwd.cu), which includes this file after its genes: packed
// vector loads and stores with the PTX the genes choose, fp32 runs of w and dw, packing, the cluster exchange of
// row sums through DSMEM, the row reduction, the fetch of a row's register vectors (straight into registers or
// through the cp.async ring), and the batched loads of streamed vectors. The factory inlines it when it reads the
// template (kernels/templates.py), so candidates compile without an include path and every line counts in their hash.
// Raw bits of V elements: a whole vector, two elements (the narrow path: one word, two in fp32), or one element in
// the low bits of a word.
template <int V> struct Pack { unsigned int w[V == 1 ? 1 : V == VEC ? WORDS : V * (int)sizeof(elem_t) / 4]; };

// ---- KF-EDIT-BEGIN load_store ----------------------------------------------------------------------------------
#if LOAD == LOAD_PLAIN
#define LD_OP "ld.global"
#elif LOAD == LOAD_NC_NA
#define LD_OP "ld.global.nc.L1::no_allocate"
#else
#define LD_OP "ld.global.nc"
#endif
#if STORE == STORE_CS
#define ST_OP "st.global.cs"
#else
#define ST_OP "st.global"
#endif

template <int V> __device__ __forceinline__ Pack<V> load_pack(const elem_t* p) {
  Pack<V> v;
  if constexpr (V > 1 && V != VEC) {   // the narrow path's 2-element vectors: 4 bytes, or 8 in fp32
    if constexpr (sizeof(elem_t) == 2) asm(LD_OP ".u32 %0, [%1];" : "=r"(v.w[0]) : "l"(p));
    else asm(LD_OP ".v2.u32 {%0, %1}, [%2];" : "=r"(v.w[0]), "=r"(v.w[1]) : "l"(p));
  } else if constexpr (V > 1) {
#if VEC_BYTES == 16
    asm(LD_OP ".v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "l"(p));
#else
    asm(LD_OP ".v2.u32 {%0, %1}, [%2];" : "=r"(v.w[0]), "=r"(v.w[1]) : "l"(p));
#endif
  } else if constexpr (sizeof(elem_t) == 2) {
    unsigned short h;
    asm(LD_OP ".u16 %0, [%1];" : "=h"(h) : "l"(p));
    v.w[0] = h;
  } else {
    asm(LD_OP ".u32 %0, [%1];" : "=r"(v.w[0]) : "l"(p));
  }
  return v;
}

template <int V> __device__ __forceinline__ void store_pack(elem_t* p, const Pack<V>& v) {
  if constexpr (V > 1 && V != VEC) {
    if constexpr (sizeof(elem_t) == 2) asm volatile(ST_OP ".u32 [%0], %1;" :: "l"(p), "r"(v.w[0]) : "memory");
    else asm volatile(ST_OP ".v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(v.w[0]), "r"(v.w[1]) : "memory");
  } else if constexpr (V > 1) {
#if VEC_BYTES == 16
    asm volatile(ST_OP ".v4.u32 [%0], {%1, %2, %3, %4};"
                 :: "l"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]), "r"(v.w[3]) : "memory");
#else
    asm volatile(ST_OP ".v2.u32 [%0], {%1, %2};" :: "l"(p), "r"(v.w[0]), "r"(v.w[1]) : "memory");
#endif
  } else if constexpr (sizeof(elem_t) == 2) {
    asm volatile(ST_OP ".u16 [%0], %1;" :: "l"(p), "h"((unsigned short)v.w[0]) : "memory");
  } else {
    asm volatile(ST_OP ".u32 [%0], %1;" :: "l"(p), "r"(v.w[0]) : "memory");
  }
}

// fp32 runs of V values (w, dw partials) in 16-, 8- or 4-byte pieces. Partials are added with red.global.add by
// their one owner thread, so the additions happen in program order.
template <int V> constexpr int PIECE = V % 4 == 0 ? 4 : V % 2 == 0 ? 2 : 1;

template <int V> __device__ __forceinline__ void load_f32(const float* p, float (&f)[V]) {
#pragma unroll
  for (int i = 0; i < V; i += PIECE<V>) {
    if constexpr (V % 4 == 0) {
      const float4 t = __ldg(reinterpret_cast<const float4*>(p + i));
      f[i] = t.x; f[i + 1] = t.y; f[i + 2] = t.z; f[i + 3] = t.w;
    } else if constexpr (V % 2 == 0) {
      const float2 t = __ldg(reinterpret_cast<const float2*>(p + i));
      f[i] = t.x; f[i + 1] = t.y;
    } else {
      f[i] = __ldg(p + i);
    }
  }
}

template <int V> __device__ __forceinline__ void store_f32(float* p, const float (&f)[V]) {
#pragma unroll
  for (int i = 0; i < V; i += PIECE<V>) {
    if constexpr (V % 4 == 0) *reinterpret_cast<float4*>(p + i) = make_float4(f[i], f[i + 1], f[i + 2], f[i + 3]);
    else if constexpr (V % 2 == 0) *reinterpret_cast<float2*>(p + i) = make_float2(f[i], f[i + 1]);
    else p[i] = f[i];
  }
}

template <int V> __device__ __forceinline__ void red_f32(float* p, const float (&f)[V]) {
#pragma unroll
  for (int i = 0; i < V; i += PIECE<V>) {
    if constexpr (V % 4 == 0)
      asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};"
                   :: "l"(p + i), "f"(f[i]), "f"(f[i + 1]), "f"(f[i + 2]), "f"(f[i + 3]) : "memory");
    else if constexpr (V % 2 == 0)
      asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(p + i), "f"(f[i]), "f"(f[i + 1]) : "memory");
    else
      asm volatile("red.global.add.f32 [%0], %1;" :: "l"(p + i), "f"(f[i]) : "memory");
  }
}
// ---- KF-EDIT-END load_store ------------------------------------------------------------------------------------

// fp32 runs that may start at any element (tail=peel: w and the dw partials of a row's vectors start hd elements past
// a vector boundary), in the widest pieces the address allows. ANY=false is the aligned run above; with ANY the check
// is at run time, and alike in every lane that shares a row (one hd per row group), so the branch does not diverge.
enum RunOp { RUN_LOAD, RUN_STORE, RUN_RED };

template <RunOp OP, int P> __device__ __forceinline__ void run_piece(float* p, float* f) {
  if constexpr (OP == RUN_LOAD) {
    if constexpr (P == 2) {
      const float2 t = __ldg(reinterpret_cast<const float2*>(p));
      f[0] = t.x; f[1] = t.y;
    } else {
      f[0] = __ldg(p);
    }
  } else if constexpr (OP == RUN_STORE) {
    if constexpr (P == 2) *reinterpret_cast<float2*>(p) = make_float2(f[0], f[1]);
    else p[0] = f[0];
  } else if constexpr (P == 2) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" :: "l"(p), "f"(f[0]), "f"(f[1]) : "memory");
  } else {
    asm volatile("red.global.add.f32 [%0], %1;" :: "l"(p), "f"(f[0]) : "memory");
  }
}

template <RunOp OP, int V, bool ANY> __device__ __forceinline__ void run_at(float* p, float (&f)[V]) {
  const unsigned int a = (unsigned int)reinterpret_cast<unsigned long long>(p);
  const int w = !ANY ? PIECE<V> : PIECE<V> == 4 && (a & 15) == 0 ? 4 : PIECE<V> >= 2 && (a & 7) == 0 ? 2 : 1;
  if (w == PIECE<V>) {   // the aligned run's own pieces
    if constexpr (OP == RUN_LOAD) load_f32<V>(p, f);
    else if constexpr (OP == RUN_STORE) store_f32<V>(p, f);
    else red_f32<V>(p, f);
  } else if (w == 2) {
    if constexpr (V % 2 == 0)
#pragma unroll
      for (int i = 0; i < V; i += 2) run_piece<OP, 2>(p + i, f + i);
  } else {
#pragma unroll
    for (int i = 0; i < V; ++i) run_piece<OP, 1>(p + i, f + i);
  }
}

template <int V, bool ANY> __device__ __forceinline__ void load_run(const float* p, float (&f)[V]) {
  run_at<RUN_LOAD, V, ANY>(const_cast<float*>(p), f);
}
template <int V, bool ANY> __device__ __forceinline__ void store_run(float* p, const float (&f)[V]) {
  run_at<RUN_STORE, V, ANY>(p, const_cast<float (&)[V]>(f));
}
template <int V, bool ANY> __device__ __forceinline__ void red_run(float* p, const float (&f)[V]) {
  run_at<RUN_RED, V, ANY>(p, const_cast<float (&)[V]>(f));
}

#include "cp_async.cuh"

#if DTYPE == DTYPE_BFLOAT16
__device__ __forceinline__ float2 word_to_float2(unsigned int w) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}
__device__ __forceinline__ unsigned int float2_to_word(float a, float b) {
  const __nv_bfloat162 t = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned int*>(&t);
}
#elif DTYPE == DTYPE_FLOAT16
__device__ __forceinline__ float2 word_to_float2(unsigned int w) {
  return __half22float2(*reinterpret_cast<const __half2*>(&w));
}
__device__ __forceinline__ unsigned int float2_to_word(float a, float b) {
  const __half2 t = __floats2half2_rn(a, b);
  return *reinterpret_cast<const unsigned int*>(&t);
}
#endif

// Raw bits <-> fp32: element by element for fp32 and the one-element path, two at a time for 16-bit vectors.
template <int V> __device__ __forceinline__ void unpack(const Pack<V>& v, float (&f)[V]) {
#pragma unroll
  for (int i = 0; i < V; i += (V > 1 && sizeof(elem_t) == 2) ? 2 : 1) {
    if constexpr (V > 1 && sizeof(elem_t) == 2) {
      const float2 t = word_to_float2(v.w[i / 2]);
      f[i] = t.x; f[i + 1] = t.y;
    } else {
      f[i] = (float)reinterpret_cast<const elem_t*>(v.w)[i];
    }
  }
}

template <int V> __device__ __forceinline__ Pack<V> pack(const float (&f)[V]) {
  Pack<V> v = {};
#pragma unroll
  for (int i = 0; i < V; i += (V > 1 && sizeof(elem_t) == 2) ? 2 : 1) {
    if constexpr (V > 1 && sizeof(elem_t) == 2) v.w[i / 2] = float2_to_word(f[i], f[i + 1]);
    else reinterpret_cast<elem_t*>(v.w)[i] = (elem_t)f[i];
  }
  return v;
}

// One element as fp32, and back: tail=peel's head and tail elements.
__device__ __forceinline__ float load_elem(const elem_t* p) {
  float f[1];
  unpack(load_pack<1>(p), f);
  return f[0];
}
__device__ __forceinline__ void store_elem(elem_t* p, float v) {
  const float f[1] = {v};
  store_pack<1>(p, pack<1>(f));
}

// ---- cluster exchange (CLUSTER > 1) ----------------------------------------------------------------------------
// A row's sum crosses the cluster through DSMEM: thread 0 of every CTA pushes its CTA's sum into slot [p][rank] of
// each CTA with st.async, which completes on that CTA's mbarrier [p] (CLUSTER * 4 bytes a row); p alternates by
// row. No thread waits for its own global stores, as a release barrier.cluster would make it do every row.
// CLUSTER_SUM=warps skips the CTA barrier: lane r of every warp pushes the warp's sum into slot [p][warp][rank] of
// CTA r, and each warp adds up all PUSHERS * CLUSTER slots itself, in a fixed order. Two slots suffice: no CTA can
// push row it + 2 before every warp of the cluster has pushed row it + 1, which each does after reading row it.
#if CLUSTER_SUM == CLUSTER_SUM_WARPS
constexpr int PUSHERS = THREADS / 32;
#else
constexpr int PUSHERS = 1;
#endif
struct Cluster { unsigned long long bar[2]; float slot[2][PUSHERS * CLUSTER]; };

__device__ __forceinline__ unsigned int smem_addr(const void* p) { return (unsigned int)__cvta_generic_to_shared(p); }
__device__ __forceinline__ unsigned int peer(const void* p, int rank) {   // p's twin in CTA `rank` of the cluster
  unsigned int r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr(p)), "r"(rank));
  return r;
}
__device__ __forceinline__ int cluster_id(int which) {   // 0: rank in the cluster, 1: cluster index, 2: CTAs
  unsigned int r;
  if (which == 0) asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  else if (which == 1) asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(r));
  else asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
  return (int)r;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
__device__ __forceinline__ void cluster_start(Cluster& c) {
  if (cluster_id(2) != CLUSTER) __trap();      // launched without its cluster: the exchange cannot work
  if (threadIdx.x == 0) {
#pragma unroll
    for (int p = 0; p < 2; ++p)
      asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem_addr(&c.bar[p])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  cluster_sync();                              // every CTA runs, its barriers set, before the first push
}
#if CLUSTER_SUM == CLUSTER_SUM_WARPS
// This lane's share of the row's sum: the slots lane, lane + 32, ... once every warp of the cluster has pushed.
// The wait acquires at CTA scope: the slots are this CTA's shared memory, so no L1 lines need invalidating.
__device__ __forceinline__ float cluster_share(float v, Cluster& c, int it) {
  const int p = it & 1, rank = cluster_id(0), lane = threadIdx.x & 31;
  if (threadIdx.x == 0)
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(&c.bar[p])), "n"(PUSHERS * CLUSTER * 4) : "memory");
  if (lane < CLUSTER)
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                 :: "r"(peer(&c.slot[p][(threadIdx.x >> 5) * CLUSTER + rank], lane)), "r"(__float_as_uint(v)),
                    "r"(peer(&c.bar[p], lane)) : "memory");
  asm volatile("{\n\t.reg .pred done;\n\tWAIT_%=:\n\t"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n\t@!done bra WAIT_%=;\n\t}"
               :: "r"(smem_addr(&c.bar[p])), "r"((it >> 1) & 1) : "memory");
  v = 0.f;
#pragma unroll
  for (int i = lane; i < PUSHERS * CLUSTER; i += 32) v += c.slot[p][i];
  return v;
}
#endif
__device__ __forceinline__ float cluster_sum(float v, Cluster& c, int it) {
  const int p = it & 1, rank = cluster_id(0);
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                 :: "r"(smem_addr(&c.bar[p])), "n"(CLUSTER * 4) : "memory");
#pragma unroll
    for (int r = 0; r < CLUSTER; ++r)
      asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                   :: "r"(peer(&c.slot[p][rank], r)), "r"(__float_as_uint(v)), "r"(peer(&c.bar[p], r)) : "memory");
  }
  asm volatile("{\n\t.reg .pred done;\n\tWAIT_%=:\n\t"
               "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 done, [%0], %1;\n\t@!done bra WAIT_%=;\n\t}"
               :: "r"(smem_addr(&c.bar[p])), "r"((it >> 1) & 1) : "memory");
  v = 0.f;
#pragma unroll
  for (int r = 0; r < CLUSTER; ++r) v += c.slot[p][r];   // rank order: the same sum in every CTA
  return v;
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

// Sum of v over the TPRC threads of row group `grp`. Every thread of the CTA (and cluster) calls it once per row,
// `it` counting rows; buffers alternate by row, so a thread already on the next row never overwrites values still
// being read (the cluster's slots are safe too: a CTA reads them before the next row's CTA barrier).
__device__ __forceinline__ float row_sum(float v, float* red, Cluster* cl, int grp, int lane, int it) {
  red += (it & 1) * RED_SLOTS;
#if REDUCE == REDUCE_SHFL
  // Butterfly offsets 16 .. 1 for rows of whole warps, TPR/2 .. 1 within a sub-warp row's group of TPR lanes (xor by
  // less than TPR stays inside the group). Every lane of the warp takes part in every shuffle, as the row loop runs
  // alike in the whole CTA (idle rows included), so the full member mask holds.
#pragma unroll
  for (int m = (TPR < 32 ? TPR : 32) / 2; m > 0; m >>= 1) v += shfl_bfly(v, m);
#if CLUSTER_SUM == CLUSTER_SUM_WARPS
  v = cluster_share(v, *cl, it);
#pragma unroll
  for (int m = 16; m > 0; m >>= 1) v += shfl_bfly(v, m);   // xor pairs add alike: every lane gets the same sum
  return v;
#endif
  if constexpr (TPR > 32) {
    constexpr int WPR = TPR / 32;
    if ((lane & 31) == 0) red[grp * WPR + (lane >> 5)] = v;
    __syncthreads();
    v = 0.f;
#pragma unroll
    for (int i = 0; i < WPR; ++i) v += red[grp * WPR + i];
  }
#else
  red[grp * TPR + lane] = v;
  __syncthreads();
#pragma unroll
  for (int s = TPR / 2; s > 0; s >>= 1) {
    if (lane < s) red[grp * TPR + lane] += red[grp * TPR + lane + s];
    __syncthreads();
  }
  v = red[grp * TPR];
#endif
#if CLUSTER > 1
  v = cluster_sum(v, *cl, it);
#endif
  return v;
}
// ---- KF-EDIT-END reduce ----------------------------------------------------------------------------------------

// Sub-warp rows (PLAN_DW_WARP): the 32 / TPR row groups of a warp own the same columns at lanes TPR apart, so xor
// offsets 16 .. TPR add their register partials (every lane shuffles every slot, in use or not: full mask), and the
// warp's first group writes the sum into the warp's shared region.
template <int V> __device__ __forceinline__ void warp_dw(float (&dwr)[KV][V], float* dsm, int gl, int nv, int lane) {
#pragma unroll
  for (int k = 0; k < KV; ++k)
#pragma unroll
    for (int e = 0; e < V; ++e)
#pragma unroll
      for (int m = 16; m >= TPR; m >>= 1) dwr[k][e] += shfl_bfly(dwr[k][e], m);
  if (threadIdx.x % 32 >= TPR) return;
#pragma unroll
  for (int k = 0; k < KV; ++k)
    if (gl + k * TPRC < nv)
#pragma unroll
      for (int e = 0; e < V; ++e) dsm[(k * V + e) * TPR + lane] = dwr[k][e];
}

// ---- a row's register vectors: straight into registers, or through the cp.async ring ---------------------------
struct Args {   // the main kernel's arguments
  const elem_t* x; const float* w; const elem_t* dy; const float* rstd; elem_t* dx; float* partial;
  int M, N, slots, plan;
};

// Loads a row's register vectors into registers (nothing past the last row); they start hd elements into the row.
template <int V> __device__ __forceinline__ void load_regs(const Args& a, int row, int gl, int nv, Pack<V> (&xs)[KV],
                                                            Pack<V> (&ds)[KV], int hd = 0) {
  if (row >= a.M) return;
  const size_t off = (size_t)row * a.N + hd;
#pragma unroll
  for (int k = 0; k < KV; ++k) {
    const int v = gl + k * TPRC;
    if (v < nv) {
      xs[k] = load_pack<V>(a.x + off + (size_t)v * V);
      ds[k] = load_pack<V>(a.dy + off + (size_t)v * V);
    }
  }
}

// The ring: row slot s holds, per register vector k, this thread's x and dy vectors ([s][k][x | dy][thread]).
template <int V> __device__ __forceinline__ Pack<V>* ring_at(Pack<V>* ring, int s, int k, int t) {
  return ring + ((s * KV + k) * 2 + t) * THREADS + threadIdx.x;
}

// Starts copying a row's register vectors (from element hd on) into slot s (nothing past the last row), as one commit
// group.
template <int V> __device__ __forceinline__ void stage_row(const Args& a, Pack<V>* ring, int row, int s, int gl,
                                                           int nv, int hd = 0) {
  if (row < a.M) {
    const size_t off = (size_t)row * a.N + hd;
#pragma unroll
    for (int k = 0; k < KV; ++k) {
      const int v = gl + k * TPRC;
      if (v < nv) {
        cp_async_vec(ring_at<V>(ring, s, k, 0), a.x + off + (size_t)v * V);
        cp_async_vec(ring_at<V>(ring, s, k, 1), a.dy + off + (size_t)v * V);
      }
    }
  }
  cp_async_commit();
}

// This thread's register vectors of the row in slot s, once its copies have landed.
template <int V> __device__ __forceinline__ void read_slot(Pack<V>* ring, int s, int gl, int nv, Pack<V> (&xs)[KV],
                                                           Pack<V> (&ds)[KV]) {
#pragma unroll
  for (int k = 0; k < KV; ++k)
    if (gl + k * TPRC < nv) {
      xs[k] = *ring_at<V>(ring, s, k, 0);
      ds[k] = *ring_at<V>(ring, s, k, 1);
    }
}

// The streamed vectors k .. k + SB - 1 of a row (those past the last vector are left unset): x and dy of all of them
// are loaded before any is used, so that SB vectors per thread are in flight. w (the same every row, so mostly from
// L1) is loaded where each vector's math needs it, which keeps it out of the batch's registers.
template <int V> struct Batch { Pack<V> x[SB], dy[SB]; };
template <int V> __device__ __forceinline__ void load_batch(const elem_t* xr, const elem_t* dyr, int gl, int nv,
                                                            int k, Batch<V>& b) {
#pragma unroll
  for (int u = 0; u < SB; ++u) {
    if (gl + (k + u) * TPRC < nv) {
      const size_t v = gl + (k + u) * TPRC;
      b.x[u] = load_pack<V>(xr + v * V);
      b.dy[u] = load_pack<V>(dyr + v * V);
    }
  }
}
