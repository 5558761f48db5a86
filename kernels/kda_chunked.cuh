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
// rows of N, B and U are zero, and gc stays at gc_n. The gene MMA picks how the chunk's dense products are taken:
// CUDA-core FMAs (MMA_FMA, the first, correct version), or mma.sync.m16n8k16 tiles with bf16 operands and fp32
// accumulators (MMA_MMA_SYNC; the PTX is in kda_mma.cuh): the right-hand side's and the output's products with S,
// B U, S's update, and N's and B's blocks below the diagonal of 16-token blocks. The diagonal blocks stay FMAs with
// each exponent exact; the state stays fp32 in registers, its tiles reading a copy rounded to bf16.
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
#if MMA == MMA_MMA_SYNC
#define CK_TILE 16                       // the mma's M and K: the chunk's blocks of 16 tokens
#define CK_SP (CK_V + 4)                 // a row of the state's copy (problems/kda_fwd.py MMA_SP): a B fragment's
                                         // 32 lanes read 32 different banks
#define CK_STATE_COPY (HEAD_K * CK_SP)
static_assert(CHUNK % CK_TILE == 0 && HEAD_K % CK_TILE == 0 && CK_V == 8 * (CK_THREADS / 32),
              "whole tiles; each warp owns the 8 columns its threads hold");
#else
#define CK_STATE_COPY 0
#endif
// The floats of dynamic shared memory; problems/kda_fwd.py chunked_smem() gives the recipe the same count in bytes.
#define CK_FLOATS \
    (3 * CHUNK * CK_KP + 2 * CHUNK * CK_CP + CK_POWERS + CHUNK * CK_V + HEAD_K + 3 * CHUNK + CK_STATE_COPY)

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
    float* x;      // [HEAD_K][CK_SP]: S for the tiles, then the chunk's update to S (MMA_MMA_SYNC only)
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
    sm.x = sm.rk + CHUNK;
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
// Under MMA_MMA_SYNC only the diagonal 16-token blocks (and the zeros above them): ck_pairs_mma takes the rest.
__device__ __forceinline__ void ck_pairs(const CkShared& sm) {
    for (int i = threadIdx.x; i < CHUNK * CHUNK; i += CK_THREADS) {
        const int t = i / CHUNK, r = i % CHUNK;
#if MMA == MMA_MMA_SYNC
        if (r < t && r / CK_TILE != t / CK_TILE) continue;
#endif
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

#if MMA == MMA_MMA_SYNC
// The m16n8k16 fragments, as the PTX ISA lays them out ("Matrix Fragments for mma.m16n8k16 with floating point
// type"), lane = 4 group + quad: A (16 x 16) a[0] = (group, 2 quad + {0, 1}), a[1] = (group + 8, the same columns),
// a[2] = (group, 2 quad + 8 + {0, 1}), a[3] = (group + 8, the same); B (16 x 8) b[0] = (2 quad + {0, 1}, group),
// b[1] = (2 quad + 8 + {0, 1}, group); C (16 x 8) d[e] = (group + 8 (e / 2), 2 quad + e % 2). `at(row, col)` gives
// an element as a float; it is rounded to bf16 here.
template <class At>
__device__ __forceinline__ void ck_frag_a(unsigned (&a)[4], At at) {
    const int g = threadIdx.x % 32 / 4, c = threadIdx.x % 4 * 2;
    a[0] = ck_pack_bf16(at(g, c), at(g, c + 1));
    a[1] = ck_pack_bf16(at(g + 8, c), at(g + 8, c + 1));
    a[2] = ck_pack_bf16(at(g, c + 8), at(g, c + 9));
    a[3] = ck_pack_bf16(at(g + 8, c + 8), at(g + 8, c + 9));
}

template <class At>
__device__ __forceinline__ void ck_frag_b(unsigned (&b)[2], At at) {
    const int g = threadIdx.x % 32 / 4, r = threadIdx.x % 4 * 2;
    b[0] = ck_pack_bf16(at(r, g), at(r + 1, g));
    b[1] = ck_pack_bf16(at(r + 8, g), at(r + 9, g));
}

__device__ __forceinline__ int ck_c_row(int e) { return threadIdx.x % 32 / 4 + 8 * (e / 2); }
__device__ __forceinline__ int ck_c_col(int e) { return threadIdx.x % 4 * 2 + e % 2; }

// d += A B over `steps` blocks of 16 of the reduction: a_at(row, k) and b_at(k, col) index the tile's operands.
template <class AtA, class AtB>
__device__ __forceinline__ void ck_tile(float (&d)[4], int steps, AtA a_at, AtB b_at) {
    for (int s = 0; s < steps; ++s) {
        unsigned a[4], b[2];
        ck_frag_a(a, [&](int i, int j) { return a_at(i, CK_TILE * s + j); });
        ck_frag_b(b, [&](int i, int j) { return b_at(CK_TILE * s + i, j); });
        ck_mma_16x8x16(d, a, b);
    }
}

// d += A B as above with each operand split into two bf16 parts, x = hi + lo (lo = x - hi, rounded in turn), and
// the three products hi hi, hi lo, lo hi: about 16 bits of each operand rather than 8, for S's update, where the
// rounding would otherwise accumulate in the state over the sequence (docs/kda.md).
__device__ __forceinline__ float ck_bf16_hi(float x) { return __bfloat162float(__float2bfloat16(x)); }

template <class AtA, class AtB>
__device__ __forceinline__ void ck_tile_split(float (&d)[4], int steps, AtA a_at, AtB b_at) {
    for (int s = 0; s < steps; ++s) {
        unsigned a_hi[4], a_lo[4], b_hi[2], b_lo[2];
        const auto a = [&](int i, int j) { return a_at(i, CK_TILE * s + j); };
        const auto b = [&](int i, int j) { return b_at(CK_TILE * s + i, j); };
        ck_frag_a(a_hi, a);
        ck_frag_a(a_lo, [&](int i, int j) { const float x = a(i, j); return x - ck_bf16_hi(x); });
        ck_frag_b(b_hi, b);
        ck_frag_b(b_lo, [&](int i, int j) { const float x = b(i, j); return x - ck_bf16_hi(x); });
        ck_mma_16x8x16(d, a_hi, b_hi);
        ck_mma_16x8x16(d, a_hi, b_lo);
        ck_mma_16x8x16(d, a_lo, b_hi);
    }
}

// N's and B's entries below the diagonal blocks, by tiles of 16 tokens t (block T) x 8 tokens r of an earlier block:
// exp(gc_t - gc_r) = exp(gc_t - gc_m) exp(gc_m - gc_r) at the reference token m = 16 T, the first of block T, so
// that r < m <= t and both exponents are at most zero (a factor that underflows bounds a product smaller still).
// The operands are those factors times k and q, rounded to bf16; the tiles go to the warps in turn.
__device__ __forceinline__ void ck_pairs_mma(const CkShared& sm) {
    constexpr int tiles = (CHUNK / CK_TILE) * (CHUNK / CK_TILE - 1);   // block T has 2 T tiles of 8 columns
    for (int tile = threadIdx.x / 32; tile < tiles; tile += CK_THREADS / 32) {
        int block = 1;
        while (tile >= block * (block + 1)) ++block;
        const int m = CK_TILE * block, r0 = 8 * (tile - block * (block - 1));
        const float* gm = sm.g + m * CK_KP;
        float dn[4] = {0.0f, 0.0f, 0.0f, 0.0f}, db[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        for (int s = 0; s < HEAD_K / CK_TILE; ++s) {
            const int j0 = CK_TILE * s;
            const auto late = [&](const float* x, int i, int j) {   // x_t exp(gc_t - gc_m)
                const int at = (m + i) * CK_KP + j0 + j;
                return x[at] * kda_exp(sm.g[at] - gm[j0 + j]);
            };
            unsigned ak[4], aq[4], b[2];
            ck_frag_a(ak, [&](int i, int j) { return late(sm.k, i, j); });
            ck_frag_a(aq, [&](int i, int j) { return late(sm.q, i, j); });
            ck_frag_b(b, [&](int j, int r) {   // k_r exp(gc_m - gc_r)
                const int at = (r0 + r) * CK_KP + j0 + j;
                return sm.k[at] * kda_exp(gm[j0 + j] - sm.g[at]);
            });
            ck_mma_16x8x16(dn, ak, b);
            ck_mma_16x8x16(db, aq, b);
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int t = m + ck_c_row(e), r = r0 + ck_c_col(e);
            sm.n[t * CK_CP + r] = sm.beta[t] * dn[e];
            sm.b[t * CK_CP + r] = db[e];
        }
    }
}

// S's copy for the tiles: this thread's rows of its column. Each warp's threads hold 8 whole columns, which only
// that warp's tiles read, so a warp barrier orders the copy.
__device__ __forceinline__ void ck_state_copy(const CkShared& sm, const float (&s)[CK_ROWS]) {
    const int lc = threadIdx.x / CK_LANES, lane = threadIdx.x % CK_LANES;
#pragma unroll
    for (int i = 0; i < CK_ROWS; ++i) sm.x[(lane + CK_LANES * i) * CK_SP + lc] = s[i];
    __syncwarp();
}
#endif

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

#if MMA == MMA_MMA_SYNC
// The right-hand side beta_t (v_t - (exp(gc_t) k_t)^T S), zeros past n: warp w takes the 8 columns its threads hold,
// a tile per 16 tokens, S read from the copy. `col` is unused: the tiles' columns are the warp's.
__device__ __forceinline__ void ck_rhs(const CkShared& sm, const float (&s)[CK_ROWS],
                                       const __nv_bfloat16* __restrict__ v, int c0, int n, int heads, int head, int) {
    const int v0 = 8 * (threadIdx.x / 32);
    ck_state_copy(sm, s);
    for (int mt = 0; mt < CHUNK / CK_TILE; ++mt) {
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        ck_tile(d, HEAD_K / CK_TILE, [&](int t, int j) { return sm.k[(CK_TILE * mt + t) * CK_KP + j]; },
                [&](int j, int c) { return sm.x[j * CK_SP + v0 + c]; });
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int t = CK_TILE * mt + ck_c_row(e), c = v0 + ck_c_col(e);
            const size_t at = ((size_t)(c0 + t) * heads + head) * HEAD_V + blockIdx.x * CK_V + c;
            const float value = t < n ? ck_load(v + at) : 0.0f;
            sm.u[t * CK_V + c] = sm.beta[t] * (value - d[e]);
        }
    }
}
#else
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
#endif

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

#if MMA == MMA_MMA_SYNC
// o_t = scale ((exp(gc_t) q_t)^T S + sum_{r<=t} B[t][r] U_r): warp w's 8 columns, a tile per 16 tokens, B U over the
// blocks up to the tile's own (B is lower). `col` is unused, as in ck_rhs.
__device__ __forceinline__ void ck_outputs(const CkShared& sm, const float (&)[CK_ROWS], __nv_bfloat16* __restrict__ o,
                                           int c0, int n, int heads, int head, int, float scale) {
    const int v0 = 8 * (threadIdx.x / 32);
    for (int mt = 0; mt < CHUNK / CK_TILE; ++mt) {
        const int t0 = CK_TILE * mt;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        ck_tile(d, HEAD_K / CK_TILE, [&](int t, int j) { return sm.q[(t0 + t) * CK_KP + j]; },
                [&](int j, int c) { return sm.x[j * CK_SP + v0 + c]; });
        ck_tile(d, mt + 1, [&](int t, int r) { return sm.b[(t0 + t) * CK_CP + r]; },
                [&](int r, int c) { return sm.u[r * CK_V + v0 + c]; });
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int t = t0 + ck_c_row(e), c = blockIdx.x * CK_V + v0 + ck_c_col(e);
            if (t < n) o[((size_t)(c0 + t) * heads + head) * HEAD_V + c] = __float2bfloat16(d[e] * scale);
        }
    }
}

// S <- diag(exp(gc_n)) S + (exp(gc_n - gc) k)^T U: warp w's update to its 8 columns by a tile per 16 rows of K over
// the chunk's tokens (split operands: ck_tile_split), through the copy (which only this warp reads), then each
// thread adds its rows in fp32.
__device__ __forceinline__ void ck_advance(const CkShared& sm, float (&s)[CK_ROWS], int) {
    const int lc = threadIdx.x / CK_LANES, lane = threadIdx.x % CK_LANES, v0 = 8 * (threadIdx.x / 32);
    __syncwarp();   // the warp's outputs have read the copy
    for (int mt = 0; mt < HEAD_K / CK_TILE; ++mt) {
        const int j0 = CK_TILE * mt;
        float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        ck_tile_split(d, CHUNK / CK_TILE, [&](int j, int t) { return sm.g[t * CK_KP + j0 + j]; },
                [&](int t, int c) { return sm.u[t * CK_V + v0 + c]; });
#pragma unroll
        for (int e = 0; e < 4; ++e) sm.x[(j0 + ck_c_row(e)) * CK_SP + v0 + ck_c_col(e)] = d[e];
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < CK_ROWS; ++i) {
        const int j = lane + CK_LANES * i;
        s[i] = s[i] * kda_exp(sm.last[j]) + sm.x[j * CK_SP + lc];
    }
}
#else
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
#endif

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
#if MMA == MMA_MMA_SYNC
        ck_pairs_mma(sm);
#endif
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
