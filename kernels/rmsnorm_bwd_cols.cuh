// small_m=cols: the column split for few rows (rmsnorm_bwd.cu includes this file after its genes and elem_t).
// A row of a few rows and very many columns is one CTA's (or one cluster's) work in the row kernels, so a handful of
// rows leaves most SMs idle. Here C CTAs split the columns instead, CTA b owning columns [b * chunk, (b + 1) * chunk)
// of every row, in two launches:
//  rmsnorm_bwd_cols_dot  dot[r * C + b] = the sum over its columns of dy * w * x, for each row r < M
//  rmsnorm_bwd_cols      each row's c = rstd * (the sum over b of dot[r * C + b], in order) / N; then dx of its columns
//                        and dw of its columns, summed over the M rows in order (a CTA owns its dw columns: no partial
//                        rows and no third launch)
// x and dy are read twice (the second time mostly from L2 at the sizes where this plan is meant to run). Thread t
// takes columns b * chunk + t, + COLS_THREADS, ..., one element at a time (coalesced). Every sum has a fixed order:
// two launches give bitwise the same dx, dw. The plan (problems/rmsnorm_bwd_plan.py) runs it at M <= COLS_ROWS.
#if SMALL_M == SMALL_M_COLS   // in the binaries of small_m=cols genomes only
constexpr int COLS_THREADS = 256;
constexpr int COLS_ROWS = 64;

__device__ __forceinline__ float cols_in(elem_t v) {
#if DTYPE == DTYPE_BFLOAT16
  return __bfloat162float(v);
#elif DTYPE == DTYPE_FLOAT16
  return __half2float(v);
#else
  return v;
#endif
}

__device__ __forceinline__ elem_t cols_out(float v) {
#if DTYPE == DTYPE_BFLOAT16
  return __float2bfloat16(v);
#elif DTYPE == DTYPE_FLOAT16
  return __float2half(v);
#else
  return v;
#endif
}

// The CTA's sum of v, handed to every thread: a tree in shared memory (no shuffles, so that the binary's SHFL
// opcodes stay the gene reduce's alone, which the SASS checks read).
__device__ __forceinline__ float cols_block_sum(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int s = COLS_THREADS / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];
    __syncthreads();
  }
  const float sum = red[0];
  __syncthreads();   // red serves the next sum
  return sum;
}

extern "C" __global__ void __launch_bounds__(COLS_THREADS)
rmsnorm_bwd_cols_dot(const elem_t* __restrict__ x, const float* __restrict__ w, const elem_t* __restrict__ dy,
                     float* __restrict__ dot, int M, int N, int chunk) {
  __shared__ float red[COLS_THREADS];
  const int c0 = blockIdx.x * chunk, c1 = min(N, c0 + chunk);
  for (int r = 0; r < M; ++r) {
    const elem_t* xr = x + (size_t)r * N;
    const elem_t* dr = dy + (size_t)r * N;
    float s = 0.f;
    for (int c = c0 + threadIdx.x; c < c1; c += COLS_THREADS) s = fmaf(cols_in(dr[c]) * w[c], cols_in(xr[c]), s);
    s = cols_block_sum(s, red);
    if (threadIdx.x == 0) dot[(size_t)r * gridDim.x + blockIdx.x] = s;
  }
}

extern "C" __global__ void __launch_bounds__(COLS_THREADS)
rmsnorm_bwd_cols(const elem_t* __restrict__ x, const float* __restrict__ w, const elem_t* __restrict__ dy,
                 const float* __restrict__ rstd, const float* __restrict__ dot, elem_t* __restrict__ dx,
                 float* __restrict__ dw, int M, int N, int chunk) {
  __shared__ float red[COLS_THREADS];
  __shared__ float rs[COLS_ROWS], cr[COLS_ROWS];
  const int C = gridDim.x;
  for (int r = 0; r < M; ++r) {   // each row's c from every CTA's partial dot, in order
    float s = 0.f;
    for (int b = threadIdx.x; b < C; b += COLS_THREADS) s += dot[(size_t)r * C + b];
    s = cols_block_sum(s, red);
    if (threadIdx.x == 0) {
      rs[r] = rstd[r];
      cr[r] = rstd[r] * s / (float)N;
    }
  }
  __syncthreads();
  const int c0 = blockIdx.x * chunk, c1 = min(N, c0 + chunk);
  for (int c = c0 + threadIdx.x; c < c1; c += COLS_THREADS) {
    const float wc = w[c];
    float acc = 0.f;
    for (int r = 0; r < M; ++r) {
      const size_t at = (size_t)r * N + c;
      const float df = cols_in(dy[at]), xh = cols_in(x[at]) * rs[r];
      dx[at] = cols_out(rs[r] * fmaf(-xh, cr[r], df * wc));
      acc = fmaf(df, xh, acc);
    }
    dw[c] = acc;
  }
}
#endif
