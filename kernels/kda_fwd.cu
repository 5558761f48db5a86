// KDA forward (problems/kda_fwd.py). The gene `form` picks one of two kernels, both one CTA per (slice of V
// columns, head, packed sequence):
//   S <- diag(exp(g_t)) S;  u = beta_t (v_t - k_t^T S);  S <- S + k_t u;  o_t = scale q_t^T S
// with q and k L2-normalized, beta = sigmoid(beta_raw) and g = LOWER * sigmoid(exp(A_log) (g_raw + dt_bias)).
// The recurrent form (below), the first kernel of issue 31 and the one the chunked form must beat, walks its
// sequence token by token; each V column's state (K = 128 rows, fp32) lives in the registers of K_LANES threads,
// ROWS rows each. Per token the CTA stages q, k and the decay factors exp(g) in shared memory (double-buffered by
// token parity), one warp takes q's and k's norms, and every column then decays, reads k's value, writes the delta
// and reads q's output. The chunked form is in kda_chunked.cuh.
#include <cuda_bf16.h>

#include "kda_fwd_genes.cuh"

#define HEAD_K 128
#define HEAD_V 128
#define GATE_LOWER (-5.0f)
#define NORM_EPS 1e-6f

__device__ __forceinline__ float kda_exp(float x) {
#if EXP == EXP_APPROX
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.4426950408889634f));
    return y;
#else
    return expf(x);
#endif
}

__device__ __forceinline__ float kda_sigmoid(float x) { return 1.0f / (1.0f + kda_exp(-x)); }

__device__ __forceinline__ float kda_load(const __nv_bfloat16* p) {
#if LOAD == LOAD_NC
    unsigned short bits;
    asm volatile("ld.global.nc.u16 %0, [%1];" : "=h"(bits) : "l"(p));
    return __bfloat162float(__ushort_as_bfloat16(bits));
#else
    return __bfloat162float(*p);
#endif
}

__device__ __forceinline__ float kda_gate(float g_raw, float dt_bias, float rate) {   // the safe gate, <= 0
    return GATE_LOWER * kda_sigmoid(rate * (g_raw + dt_bias));
}

#if FORM == FORM_RECURRENT
#define THREADS (V_BLOCK * K_LANES)
#define ROWS (HEAD_K / K_LANES)

static_assert(THREADS % 32 == 0 && THREADS <= 1024, "whole warps, at most 1024 threads");
static_assert(32 % K_LANES == 0 && HEAD_K % K_LANES == 0, "a column's lanes share a warp and split K evenly");
static_assert(HEAD_V % V_BLOCK == 0, "V splits into whole slices");

__device__ __forceinline__ float lanes_sum(float x) {   // over the K_LANES threads of one column
#pragma unroll
    for (int off = K_LANES / 2; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

extern "C" __global__ void __launch_bounds__(THREADS) kda_fwd(
    const __nv_bfloat16* __restrict__ q, const __nv_bfloat16* __restrict__ k, const __nv_bfloat16* __restrict__ v,
    const __nv_bfloat16* __restrict__ g_raw, const __nv_bfloat16* __restrict__ beta_raw,
    const float* __restrict__ a_log, const float* __restrict__ dt_bias, const int* __restrict__ cu_seqlens,
    const float* __restrict__ initial_state, __nv_bfloat16* __restrict__ o, float* __restrict__ final_state,
    int heads, float scale) {
    __shared__ float sq[2][HEAD_K], sk[2][HEAD_K], sdecay[2][HEAD_K], sbeta[2], snorm[2][2];
    const int head = blockIdx.y, seq = blockIdx.z;
    const int col = blockIdx.x * V_BLOCK + threadIdx.x / K_LANES;
    const int lane = threadIdx.x % K_LANES;
    const int start = cu_seqlens[seq], end = cu_seqlens[seq + 1];
    const size_t state = ((size_t)seq * heads + head) * HEAD_K * HEAD_V;
    const float rate = expf(a_log[head]);

    float s[ROWS];   // rows lane, lane + K_LANES, ...: neighbouring lanes read neighbouring shared words
#pragma unroll
    for (int i = 0; i < ROWS; ++i) s[i] = initial_state[state + (size_t)(lane + K_LANES * i) * HEAD_V + col];

    for (int t = start; t < end; ++t) {
        const int buf = t & 1;
        const size_t row = ((size_t)t * heads + head) * HEAD_K;
        for (int j = threadIdx.x; j < HEAD_K; j += THREADS) {
            sq[buf][j] = kda_load(q + row + j);
            sk[buf][j] = kda_load(k + row + j);
            sdecay[buf][j] = kda_exp(kda_gate(kda_load(g_raw + row + j), dt_bias[head * HEAD_K + j], rate));
        }
        if (threadIdx.x == 0) sbeta[buf] = kda_sigmoid(kda_load(beta_raw + (size_t)t * heads + head));
        __syncthreads();
        if (threadIdx.x < 32) {   // the norms of q and k, by the first warp
            float nq = 0.0f, nk = 0.0f;
            for (int j = threadIdx.x; j < HEAD_K; j += 32) {
                nq += sq[buf][j] * sq[buf][j];
                nk += sk[buf][j] * sk[buf][j];
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                nq += __shfl_xor_sync(0xffffffffu, nq, off);
                nk += __shfl_xor_sync(0xffffffffu, nk, off);
            }
            if (threadIdx.x == 0) {
                snorm[buf][0] = rsqrtf(nq + NORM_EPS);
                snorm[buf][1] = rsqrtf(nk + NORM_EPS);
            }
        }
        __syncthreads();
        const float rq = snorm[buf][0], rk = snorm[buf][1];
        float read = 0.0f;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            s[i] *= sdecay[buf][lane + K_LANES * i];
            read += sk[buf][lane + K_LANES * i] * s[i];
        }
        read = lanes_sum(read) * rk;
        const float value = kda_load(v + ((size_t)t * heads + head) * HEAD_V + col);
        const float delta = sbeta[buf] * (value - read) * rk;
        float out = 0.0f;
#pragma unroll
        for (int i = 0; i < ROWS; ++i) {
            s[i] += sk[buf][lane + K_LANES * i] * delta;
            out += sq[buf][lane + K_LANES * i] * s[i];
        }
        out = lanes_sum(out);
        if (lane == 0) o[((size_t)t * heads + head) * HEAD_V + col] = __float2bfloat16(out * rq * scale);
    }
#pragma unroll
    for (int i = 0; i < ROWS; ++i) final_state[state + (size_t)(lane + K_LANES * i) * HEAD_V + col] = s[i];
}
#else
#if MMA == MMA_MMA_SYNC
#include "kda_mma.cuh"
#endif
#include "kda_chunked.cuh"
#endif
