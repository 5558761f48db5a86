// Device helpers of the forward template (rmsnorm_fwd.cu), which includes this file after its genes: vector
// loads and stores with the PTX the genes choose, packing, the row reduction, staging copies (cp.async, TMA bulk
// with mbarriers) and the cluster reduction. The factory inlines it when it reads the template (kernels/templates.py),
// so candidates compile without an include path and every line counts in a candidate's source hash.
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

#include "cp_async.cuh"
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

// Sub-warp rows (TPR < 32): the sum over a row group of TPR lanes. The butterfly's lane masks stay below TPR, so a
// lane only exchanges with the lanes of its own TPR-aligned group. The member mask is the whole warp: every thread
// calls row_sum, inactive rows included (a row past M still runs the reduction), so no group is ever missing.
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int m = TPR / 2; m > 0; m >>= 1) v += shfl_bfly(v, m);
  return v;
}

// Sum of v over the TPR threads of row group `grp`; every thread of the CTA must call it (it holds a barrier).
__device__ __forceinline__ float row_sum(float v, float* red, int lane, int grp) {
#if REDUCE == REDUCE_SHFL
  if (TPR < 32) return group_sum(v);
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

// w_vec: whether w is aligned for load_weight's vector loads. Always true with tail=scalar (a constant, folded away);
// with tail=peel a row's head shifts w by 0..VEC-1 elements, and a misaligned w is read a float at a time (w is
// shared by all rows, so it is served from L1/L2 either way).
__device__ __forceinline__ void fetch_weight(const float* w, float (&wf)[VEC], bool w_vec) {
  if (w_vec) {
    load_weight(w, wf);
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) wf[i] = __ldg(w + i);
  }
}

// y = x * rstd * w with the weights already in registers (w_ahead=regs fetched them beside x).
__device__ __forceinline__ void normalize_store_w(const vec_t& xv, const float (&wf)[VEC], elem_t* y, float rstd) {
  float f[VEC];
  unpack(xv, f);
#pragma unroll
  for (int i = 0; i < VEC; ++i) f[i] = f[i] * rstd * wf[i];
  store_vec(y, pack(f));
}

__device__ __forceinline__ void normalize_store(const vec_t& xv, const float* w, elem_t* y, float rstd, bool w_vec) {
  float f[VEC], wf[VEC];
  unpack(xv, f);
  fetch_weight(w, wf, w_vec);
#pragma unroll
  for (int i = 0; i < VEC; ++i) f[i] = f[i] * rstd * wf[i];
  store_vec(y, pack(f));
}

// w_ahead=l2: the weights of a slice of n elements, 128-byte lines spread over the row's TPR threads, asked into
// L2 (no registers held, no wait): the second pass then finds them there instead of in DRAM.
__device__ __forceinline__ void prefetch_weight_l2(const float* w, int n, int lane) {
  for (int i = lane * 32; i < n; i += TPR * 32) asm volatile("prefetch.global.L2 [%0];" :: "l"(w + i));
}
// The call of editable regions written before tail=peel (their patches still compile): w is vector-aligned there.
__device__ __forceinline__ void normalize_store(const vec_t& xv, const float* w, elem_t* y, float rstd) {
  normalize_store(xv, w, y, rstd, true);
}

#if TAIL == TAIL_PEEL
// ---- tail=peel: a row as a scalar head, a vector body and a scalar tail -------------------------------------------
// Elements before the first VEC_BYTES-aligned address at or after p (p is element-aligned).
__device__ __forceinline__ int head_elems(const elem_t* p) {
  const unsigned int off = (unsigned int)((unsigned long long)p % VEC_BYTES);
  return (int)((VEC_BYTES - off) % VEC_BYTES / sizeof(elem_t));
}

__device__ __forceinline__ bool weight_vec_ok(const float* w) {
  return (unsigned long long)w % (VEC % 4 == 0 ? 16 : 8) == 0;
}

// One thread's share of a row's peeled elements: head elements lane + k*TPR and tail elements lane + k*TPR, k below
// EDGE_N. Head and tail are shorter than a vector, so EDGE_N is 1 with whole warps per row; sub-warp rows may have
// fewer threads than a vector has elements. Their x stays in registers across the reduction.
enum { EDGE_N = (VEC - 1 + TPR - 1) / TPR };   // (an enum: a namespace-scope constexpr changes the binary)
struct edges_t {
  int head, tail_at, tail;           // head elements [0, head) and tail elements [tail_at, tail_at + tail) of the row
  float hx[EDGE_N], tx[EDGE_N];      // this thread's head and tail elements of x (0 where it has none)
};

__device__ __forceinline__ edges_t load_edges(const elem_t* xrow, int head, int tail_at, int tail, int lane) {
  edges_t e{head, tail_at, tail, {}, {}};
#pragma unroll
  for (int k = 0; k < EDGE_N; ++k) {
    const int i = lane + k * TPR;
    e.hx[k] = i < head ? to_float(xrow[i]) : 0.f;
    e.tx[k] = i < tail ? to_float(xrow[tail_at + i]) : 0.f;
  }
  return e;
}

__device__ __forceinline__ float edges_sum_squares(const edges_t& e) {
  float s = fmaf(e.hx[0], e.hx[0], e.tx[0] * e.tx[0]);
#pragma unroll
  for (int k = 1; k < EDGE_N; ++k) s += fmaf(e.hx[k], e.hx[k], e.tx[k] * e.tx[k]);
  return s;
}

// The same arithmetic as the scalar path, so a row's edges round exactly as they would there.
__device__ __forceinline__ void store_edges(const edges_t& e, const float* wrow, elem_t* yrow, float rstd, int lane) {
#pragma unroll
  for (int k = 0; k < EDGE_N; ++k) {
    const int i = lane + k * TPR;
    if (i < e.head) yrow[i] = (elem_t)(e.hx[k] * rstd * __ldg(wrow + i));
    if (i < e.tail) yrow[e.tail_at + i] = (elem_t)(e.tx[k] * rstd * __ldg(wrow + e.tail_at + i));
  }
}
#endif

__device__ __forceinline__ unsigned int smem_addr(const void* p) {
  return (unsigned int)__cvta_generic_to_shared(p);
}

// ---- KF-EDIT-BEGIN stage_copy -------------------------------------------------------------------------------------
// Staging copies for STAGE_SMEM. cp_async needs only cp_async_vec (above): each thread copies, and later reads, its
// own vectors. bulk: TMA copies of a whole contiguous range, counted on an mbarrier (the transaction count), which
// every thread of the row waits on by phase parity.
__device__ __forceinline__ void mbar_init(unsigned long long* bar, unsigned int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" :: "r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initialized mbarrier visible to the async proxy (the TMA unit), before its first use.
__device__ __forceinline__ void mbar_init_fence() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
__device__ __forceinline__ void mbar_expect_bytes(unsigned long long* bar, unsigned int bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
               :: "r"(smem_addr(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* bar, unsigned int parity) {
  asm volatile("{\n"
               " .reg .pred ready;\n"
               "KF_MBAR_WAIT:\n"
               " mbarrier.try_wait.parity.shared::cta.b64 ready, [%0], %1;\n"
               " @!ready bra KF_MBAR_WAIT;\n"
               "}" :: "r"(smem_addr(bar)), "r"(parity) : "memory");
}
// 16-byte aligned source, destination and size. The destination is this CTA's own shared memory, which is a valid
// shared::cluster address; completion is counted in bytes on `bar`.
__device__ __forceinline__ void bulk_copy(void* smem, const void* gmem, unsigned int bytes, unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               :: "r"(smem_addr(smem)), "l"(gmem), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
// A staged vector back from shared memory in one access (a vec_t* alone only promises 4-byte alignment). volatile:
// it must stay after the wait that completes the copy.
__device__ __forceinline__ vec_t load_staged(const vec_t* p) {
  vec_t v;
#if VEC_BYTES == 16
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3]) : "r"(smem_addr(p)));
#else
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.w[0]), "=r"(v.w[1]) : "r"(smem_addr(p)));
#endif
  return v;
}
// Orders this CTA's earlier generic-proxy accesses to shared memory before later async-proxy (TMA) writes.
__device__ __forceinline__ void async_proxy_fence() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }
// ---- KF-EDIT-END stage_copy ---------------------------------------------------------------------------------------

// ---- KF-EDIT-BEGIN cluster_reduce ---------------------------------------------------------------------------------
#if CLUSTER > 1
__device__ __forceinline__ int cluster_rank() {
  unsigned int r;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return (int)r;
}
__device__ __forceinline__ int cluster_ctas() {
  unsigned int n;
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
  return (int)n;
}
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed;" ::: "memory");
}
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }

// The row's sum over the cluster; every thread of every CTA calls it once. Thread j stores this CTA's partial into
// slot [rank] of CTA j's `part` (DSMEM: mapa + st.shared::cluster), then one cluster barrier (release/acquire)
// publishes all slots. After it no CTA touches another's shared memory, so any CTA may exit. Every CTA adds the
// slots in the same order, so all of them normalize with the same rstd.
__device__ __forceinline__ float cluster_sum(float partial, float* part, int rank) {
  cluster_wait();                      // pairs with the arrive at kernel start: every CTA of the cluster is running
  if (threadIdx.x < CLUSTER) {
    unsigned int remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;"
                 : "=r"(remote) : "r"(smem_addr(part + rank)), "r"((unsigned int)threadIdx.x));
    asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(remote), "f"(partial) : "memory");
  }
  cluster_arrive();
  cluster_wait();
  float s = 0.f;
#pragma unroll
  for (int i = 0; i < CLUSTER; ++i) s += part[i];
  return s;
}
#else
__device__ __forceinline__ float cluster_sum(float partial, float*, int) { return partial; }
#endif
// ---- KF-EDIT-END cluster_reduce -----------------------------------------------------------------------------------
