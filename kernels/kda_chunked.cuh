// KDA forward, the chunked form: included by kda_fwd.cu when FORM == FORM_CHUNKED, after its device helpers
// (kda_exp, kda_sigmoid, kda_load, kda_gate). problems/kda_reference.py `chunked` is its algebra, checked against
// the recurrence on the CPU. One CTA of CK_THREADS threads per (slice of CK_V columns, head, sequence) walks its
// sequence CHUNK tokens at a time; the state S (K x CK_V, fp32) stays in registers across chunks, thread (column c,
// lane l) holding rows l, l + CK_LANES, ... of column c, as the recurrent form holds them at K_LANES = 4.
// Per chunk of n <= CHUNK tokens, with gc the gate summed from the chunk's start per channel (so that every
// exponent below is at most zero and nothing overflows):
//   N[t][r] = beta_t sum_k k_t k_r exp(gc_t - gc_r) (r < t),   B[t][r] = sum_k q_t k_r exp(gc_t - gc_r) (r <= t)
//   (I + N) U = diag(beta) (V - (exp(gc) k) S), solved by the gene SOLVE
//   o = scale ((exp(gc) q) S + B U);   S <- diag(exp(gc_n)) S + (exp(gc_n - gc) k)^T U
// Tokens past n (a sequence's last, partial chunk) are staged as zeros with a zero gate: they add nothing, their
// rows of N, B and U are zero, and gc stays at gc_n. CUDA-core FMAs throughout: the first, correct version.
#define CK_V 64                          // problems/kda_fwd.py CHUNK_V
#define CK_LANES 4
#define CK_THREADS (CK_V * CK_LANES)     // problems/kda_fwd.py CHUNK_THREADS
#define CK_ROWS (HEAD_K / CK_LANES)
#define CK_KP (HEAD_K + 1)               // a row of K floats, padded: rows t and r start in different banks
#define CK_CP (CHUNK + 1)                // a row of a chunk x chunk matrix, padded alike
#if SOLVE == SOLVE_NEUMANN
#define CK_POWERS (CHUNK * CK_CP)        // N^2, N^4, ... in turn
#else
#define CK_POWERS 0
#endif
// The floats of dynamic shared memory; problems/kda_fwd.py chunked_smem() gives the recipe the same count in bytes.
#define CK_FLOATS (3 * CHUNK * CK_KP + 2 * CHUNK * CK_CP + CK_POWERS + CHUNK * CK_V + HEAD_K + 3 * CHUNK)

static_assert(CHUNK <= CK_THREADS && CHUNK % CK_LANES == 0, "one thread per token for beta; rows split by lanes");
static_assert(32 % CK_LANES == 0, "a column's lanes share a warp");

struct CkShared {
    float* q;      // [CHUNK][CK_KP]: normalized q, then exp(gc) q
    float* k;      // [CHUNK][CK_KP]: normalized k, then exp(gc) k
    float* g;      // [CHUNK][CK_KP]: the gate, then gc, then exp(gc_n - gc) k
    float* n;      // [CHUNK][CK_CP]: N, strictly lower
    float* b;      // [CHUNK][CK_CP]: B, lower
    float* p;      // [CHUNK][CK_CP]: N's powers (SOLVE_NEUMANN only)
    float* u;      // [CHUNK][CK_V]: the right-hand side, then U
    float* last;   // [HEAD_K]: gc_n
    float* beta;   // [CHUNK]
    float* rq;     // [CHUNK]: 1 / |q_t|
    float* rk;     // [CHUNK]: 1 / |k_t|
};

__device__ __forceinline__ CkShared ck_layout(float* base) {
    CkShared sm;
    sm.q = base;
    sm.k = sm.q + CHUNK * CK_KP;
    sm.g = sm.k + CHUNK * CK_KP;
    sm.n = sm.g + CHUNK * CK_KP;
    sm.b = sm.n + CHUNK * CK_CP;
    sm.p = sm.b + CHUNK * CK_CP;
    sm.u = sm.p + CK_POWERS;
    sm.last = sm.u + CHUNK * CK_V;
    sm.beta = sm.last + HEAD_K;
    sm.rq = sm.beta + CHUNK;
    sm.rk = sm.rq + CHUNK;
    return sm;
}

__device__ __forceinline__ unsigned ck_dynamic_smem() {
    unsigned bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(bytes));
    return bytes;
}

__device__ __forceinline__ float ck_lanes_sum(float x) {   // over the CK_LANES threads of one column
#pragma unroll
    for (int off = CK_LANES / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

// A bf16 input as a float: ld.global.nc, or a plain ld.global written out (the kernel's const __restrict__
// pointers would let the compiler turn a plain C++ load into ld.global.nc too, and the gene would choose nothing).
__device__ __forceinline__ float ck_load(const __nv_bfloat16* p) {
#if LOAD == LOAD_NC
    return kda_load(p);
#else
    unsigned short bits;
    asm volatile("ld.global.u16 %0, [%1];" : "=h"(bits) : "l"(p));
    return __bfloat162float(__ushort_as_bfloat16(bits));
#endif
}

// The chunk's tokens [c0, c0 + n) as floats, zeros past n: q, k, the safe gate, and beta.
__device__ __forceinline__ void ck_stage(const CkShared& sm, const __nv_bfloat16* __restrict__ q,
                                         const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ g_raw,
                                         const __nv_bfloat16* __restrict__ beta_raw, const float* __restrict__ dt_bias,
                                         float rate, int c0, int n, int heads, int head) {
    for (int i = threadIdx.x; i < CHUNK * HEAD_K; i += CK_THREADS) {
        const int t = i / HEAD_K, j = i % HEAD_K;
        float qv = 0.0f, kv = 0.0f, gv = 0.0f;
        if (t < n) {
            const size_t at = ((size_t)(c0 + t) * heads + head) * HEAD_K + j;
            qv = ck_load(q + at);
            kv = ck_load(k + at);
            gv = kda_gate(ck_load(g_raw + at), dt_bias[head * HEAD_K + j], rate);
        }
        sm.q[t * CK_KP + j] = qv;
        sm.k[t * CK_KP + j] = kv;
        sm.g[t * CK_KP + j] = gv;
    }
    if (threadIdx.x < CHUNK) {
        const int t = threadIdx.x;
        sm.beta[t] = t < n ? kda_sigmoid(ck_load(beta_raw + (size_t)(c0 + t) * heads + head)) : 0.0f;
    }
}

// 1 / |q_t| and 1 / |k_t|, a warp per token.
__device__ __forceinline__ void ck_norms(const CkShared& sm) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int t = warp; t < CHUNK; t += CK_THREADS / 32) {
        float nq = 0.0f, nk = 0.0f;
        for (int j = lane; j < HEAD_K; j += 32) {
            nq += sm.q[t * CK_KP + j] * sm.q[t * CK_KP + j];
            nk += sm.k[t * CK_KP + j] * sm.k[t * CK_KP + j];
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            nq += __shfl_xor_sync(0xffffffffu, nq, off);
            nk += __shfl_xor_sync(0xffffffffu, nk, off);
        }
        if (lane == 0) {
            sm.rq[t] = rsqrtf(nq + NORM_EPS);
            sm.rk[t] = rsqrtf(nk + NORM_EPS);
        }
    }
}

// q and k normalized; the gate summed over the chunk's tokens per channel (by the first HEAD_K threads), its
// last value kept: the zero gates past n leave it at gc_n.
__device__ __forceinline__ void ck_normalize_and_sum(const CkShared& sm) {
    for (int i = threadIdx.x; i < CHUNK * HEAD_K; i += CK_THREADS) {
        const int t = i / HEAD_K, j = i % HEAD_K;
        sm.q[t * CK_KP + j] *= sm.rq[t];
        sm.k[t * CK_KP + j] *= sm.rk[t];
    }
    if (threadIdx.x < HEAD_K) {
        const int j = threadIdx.x;
        float sum = 0.0f;
        for (int t = 0; t < CHUNK; ++t) {
            sum += sm.g[t * CK_KP + j];
            sm.g[t * CK_KP + j] = sum;
        }
        sm.last[j] = sum;
    }
}

// N (beta-scaled, strictly lower) and B (lower), a thread per entry; each exponent gc_t - gc_r <= 0 for r <= t.
__device__ __forceinline__ void ck_pairs(const CkShared& sm) {
    for (int i = threadIdx.x; i < CHUNK * CHUNK; i += CK_THREADS) {
        const int t = i / CHUNK, r = i % CHUNK;
        float a = 0.0f, b = 0.0f;
        if (r <= t) {
            const float *qt = sm.q + t * CK_KP, *kt = sm.k + t * CK_KP, *kr = sm.k + r * CK_KP;
            const float *gt = sm.g + t * CK_KP, *gr = sm.g + r * CK_KP;
#pragma unroll 4
            for (int j = 0; j < HEAD_K; ++j) {
                const float decayed = kr[j] * kda_exp(gt[j] - gr[j]);
                a += kt[j] * decayed;
                b += qt[j] * decayed;
            }
        }
        sm.n[t * CK_CP + r] = r < t ? sm.beta[t] * a : 0.0f;
        sm.b[t * CK_CP + r] = b;
    }
}

// What the state products need, in place: exp(gc) q, exp(gc) k, and exp(gc_n - gc) k over the gate.
__device__ __forceinline__ void ck_decays(const CkShared& sm) {
    for (int i = threadIdx.x; i < CHUNK * HEAD_K; i += CK_THREADS) {
        const int t = i / HEAD_K, j = i % HEAD_K, at = t * CK_KP + j;
        const float gc = sm.g[at], kv = sm.k[at], decay = kda_exp(gc);
        sm.q[at] *= decay;
        sm.k[at] = kv * decay;
        sm.g[at] = kv * kda_exp(sm.last[j] - gc);
    }
}

// The right-hand side beta_t (v_t - (exp(gc_t) k_t)^T S) of this thread's column, zeros past n.
__device__ __forceinline__ void ck_rhs(const CkShared& sm, const float (&s)[CK_ROWS],
                                       const __nv_bfloat16* __restrict__ v, int c0, int n, int heads, int head,
                                       int col) {
    const int lc = threadIdx.x / CK_LANES, lane = threadIdx.x % CK_LANES;
    for (int t = 0; t < CHUNK; ++t) {
        float read = 0.0f;
#pragma unroll
        for (int i = 0; i < CK_ROWS; ++i) read += sm.k[t * CK_KP + lane + CK_LANES * i] * s[i];
        read = ck_lanes_sum(read);
        if (lane == 0) {
            const float value = t < n ? ck_load(v + ((size_t)(c0 + t) * heads + head) * HEAD_V + col) : 0.0f;
            sm.u[t * CK_V + lc] = sm.beta[t] * (value - read);
        }
    }
}

#if SOLVE == SOLVE_SUBSTITUTION
// (I + N) U = rhs, row by row: U_t = rhs_t - sum_{r<t} N[t][r] U_r. A column's rows are its own lanes' work, and
// its lanes share a warp, so a warp barrier orders each row before the next.
__device__ __forceinline__ void ck_solve(const CkShared& sm, int n) {
    const int lc = threadIdx.x / CK_LANES, lane = threadIdx.x % CK_LANES;
    for (int t = 1; t < n; ++t) {
        float acc = 0.0f;
        for (int r = lane; r < t; r += CK_LANES) acc += sm.n[t * CK_CP + r] * sm.u[r * CK_V + lc];
        acc = ck_lanes_sum(acc);
        if (lane == 0) sm.u[t * CK_V + lc] -= acc;
        __syncwarp();
    }
}
#else
// U <- U + sign * M U for a strictly lower M, each thread its column's rows lane, lane + CK_LANES, ...
__device__ __forceinline__ void ck_apply(const float* m, float* u, float sign) {
    const int lc = threadIdx.x / CK_LANES, lane = threadIdx.x % CK_LANES;
    float acc[CHUNK / CK_LANES];
#pragma unroll
    for (int e = 0; e < CHUNK / CK_LANES; ++e) {
        const int t = lane + CK_LANES * e;
        float a = 0.0f;
        for (int r = 0; r < t; ++r) a += m[t * CK_CP + r] * u[r * CK_V + lc];
        acc[e] = a;
    }
    __syncwarp();   // the column's rows are read by its own warp only
#pragma unroll
    for (int e = 0; e < CHUNK / CK_LANES; ++e) u[(lane + CK_LANES * e) * CK_V + lc] += sign * acc[e];
    __syncwarp();
}

// dst <- src src for a strictly lower src (dst may be src): every product read before any is written.
__device__ __forceinline__ void ck_square(float* dst, const float* src) {
    constexpr int per = (CHUNK * CHUNK + CK_THREADS - 1) / CK_THREADS;
    float acc[per];
#pragma unroll
    for (int e = 0; e < per; ++e) {
        const int i = threadIdx.x + e * CK_THREADS, t = i / CHUNK, r = i % CHUNK;
        float a = 0.0f;
        if (i < CHUNK * CHUNK)
            for (int m = r + 1; m < t; ++m) a += src[t * CK_CP + m] * src[m * CK_CP + r];
        acc[e] = a;
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < per; ++e) {
        const int i = threadIdx.x + e * CK_THREADS;
        if (i < CHUNK * CHUNK) dst[(i / CHUNK) * CK_CP + i % CHUNK] = acc[e];
    }
    __syncthreads();
}

// (I + N)^-1 = (I - N)(I + N^2)(I + N^4)...(I + N^(CHUNK/2)), exact since N^CHUNK = 0; the factors commute, so
// they apply to the right-hand side in any order. The partial chunk's N is zero past n and needs the same factors.
// The powers grow like binomials where N's entries near 1, so the space allows this only at chunks of 16
// (problems/kda_fwd.py NEUMANN_CHUNK); the code itself compiles at any chunk.
__device__ __forceinline__ void ck_solve(const CkShared& sm, int) {
    ck_apply(sm.n, sm.u, -1.0f);
    ck_square(sm.p, sm.n);
    for (int power = 2; power < CHUNK; power *= 2) {
        ck_apply(sm.p, sm.u, 1.0f);
        if (2 * power < CHUNK) ck_square(sm.p, sm.p);
    }
}
#endif

// o_t = scale ((exp(gc_t) q_t)^T S + sum_{r<=t} B[t][r] U_r) for this thread's column.
__device__ __forceinline__ void ck_outputs(const CkShared& sm, const float (&s)[CK_ROWS], __nv_bfloat16* __restrict__ o,
                                           int c0, int n, int heads, int head, int col, float scale) {
    const int lc = threadIdx.x / CK_LANES, lane = threadIdx.x % CK_LANES;
    for (int t = 0; t < n; ++t) {
        float out = 0.0f;
#pragma unroll
        for (int i = 0; i < CK_ROWS; ++i) out += sm.q[t * CK_KP + lane + CK_LANES * i] * s[i];
        for (int r = lane; r <= t; r += CK_LANES) out += sm.b[t * CK_CP + r] * sm.u[r * CK_V + lc];
        out = ck_lanes_sum(out);
        if (lane == 0) o[((size_t)(c0 + t) * heads + head) * HEAD_V + col] = __float2bfloat16(out * scale);
    }
}

// S <- diag(exp(gc_n)) S + (exp(gc_n - gc) k)^T U, this thread's rows of its column.
__device__ __forceinline__ void ck_advance(const CkShared& sm, float (&s)[CK_ROWS], int n) {
    const int lc = threadIdx.x / CK_LANES, lane = threadIdx.x % CK_LANES;
#pragma unroll
    for (int i = 0; i < CK_ROWS; ++i) s[i] *= kda_exp(sm.last[lane + CK_LANES * i]);
    for (int r = 0; r < n; ++r) {
        const float u = sm.u[r * CK_V + lc];
#pragma unroll
        for (int i = 0; i < CK_ROWS; ++i) s[i] += sm.g[r * CK_KP + lane + CK_LANES * i] * u;
    }
}

// One CTA per SM at least: ptxas then keeps every value in registers (under the plain bound it chose 64
// registers and spilled in one genome); a chunk's shared memory limits the CTAs per SM anyway.
extern "C" __global__ void __launch_bounds__(CK_THREADS, 1) kda_fwd(
    const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
    const __nv_bfloat16* __restrict__ g_raw, const __nv_bfloat16* __restrict__ beta_raw,
    const float* __restrict__ a_log, const float* __restrict__ dt_bias, const int* __restrict__ cu_seqlens,
    const float* __restrict__ initial_state, __nv_bfloat16* __restrict__ o, float* __restrict__ final_state,
    int heads, float scale) {
    extern __shared__ float ck_smem[];
    if (ck_dynamic_smem() < CK_FLOATS * sizeof(float)) __trap();   // the launch's smem is not this layout's
    const CkShared sm = ck_layout(ck_smem);
    const int head = blockIdx.y, seq = blockIdx.z;
    const int col = blockIdx.x * CK_V + threadIdx.x / CK_LANES, lane = threadIdx.x % CK_LANES;
    const int start = cu_seqlens[seq], end = cu_seqlens[seq + 1];
    const size_t state = ((size_t)seq * heads + head) * HEAD_K * HEAD_V;
    const float rate = kda_exp(a_log[head]);   // by the gene exp, so that exp=approx leaves no expf in SASS

    float s[CK_ROWS];
#pragma unroll
    for (int i = 0; i < CK_ROWS; ++i) s[i] = initial_state[state + (size_t)(lane + CK_LANES * i) * HEAD_V + col];

    for (int c0 = start; c0 < end; c0 += CHUNK) {
        const int n = min(CHUNK, end - c0);
        ck_stage(sm, q, k, g_raw, beta_raw, dt_bias, rate, c0, n, heads, head);
        __syncthreads();
        ck_norms(sm);
        __syncthreads();
        ck_normalize_and_sum(sm);
        __syncthreads();
        ck_pairs(sm);
        __syncthreads();
        ck_decays(sm);
        __syncthreads();
        ck_rhs(sm, s, v, c0, n, heads, head, col);
        __syncthreads();
        ck_solve(sm, n);
        __syncthreads();
        ck_outputs(sm, s, o, c0, n, heads, head, col, scale);
        ck_advance(sm, s, n);
        __syncthreads();   // the next chunk's staging overwrites what these two read
    }
#pragma unroll
    for (int i = 0; i < CK_ROWS; ++i) final_state[state + (size_t)(lane + CK_LANES * i) * HEAD_V + col] = s[i];
}
