// small_m=cols: the column split for few rows (rmsnorm_bwd.cu includes this file after its genes and elem_t).
// A row of a few rows and very many columns is one CTA's (or one cluster's) work in the row kernels, so a handful of
// rows leaves most SMs idle. Here the columns are split into C chunks of `chunk` columns, in two launches:
//  rmsnorm_bwd_cols_dot  grid (C, G): CTA (b, g) takes chunk b of the rows of group g (COLS_GROUP rows a group) and
//                        writes each row's partial dot, the sum over its columns of dy * w * x, to dot[r * C + b],
//                        and its group's partial dw of each column, the sum over its rows of dy * x * rstd, to
//                        dwp[g * N + c]
//  rmsnorm_bwd_cols      grid (C, M): CTA (b, r) sums row r's C partial dots (its c = rstd * dot / N), writes dx of
//                        row r in chunk b; the CTAs of row 0 also write dw of chunk b, the sum of the G partials
// A thread loads a column of every row of its group before it sums anything (2 * COLS_GROUP loads in flight, one
// element each, coalesced, with the genome's load and store instructions: load_elem, store_elem of
// rmsnorm_bwd_device.cuh), and a CTA sums its group's rows together in one tree of barriers. Every sum has a fixed
// order: two launches give bitwise the same dx, dw. The plan (problems/rmsnorm_bwd_plan.py) runs it at
// M <= COLS_ROWS.
#if SMALL_M == SMALL_M_COLS   // in the binaries of small_m=cols genomes only
constexpr int COLS_THREADS = 256;
constexpr int COLS_ROWS = 64;
constexpr int COLS_GROUP = 8;

// The CTA's sums of K values per thread, left in red[k][0]: one tree in shared memory for all K (no shuffles, so
// that the binary's SHFL opcodes stay the gene reduce's alone, which the SASS checks read).
template <int K>
__device__ __forceinline__ void cols_block_sums(const float (&v)[K], float (*red)[COLS_THREADS]) {
#pragma unroll
  for (int k = 0; k < K; ++k) red[k][threadIdx.x] = v[k];
  __syncthreads();
  for (int s = COLS_THREADS / 2; s > 0; s >>= 1) {
    if ((int)threadIdx.x < s) {
#pragma unroll
      for (int k = 0; k < K; ++k) red[k][threadIdx.x] += red[k][threadIdx.x + s];
    }
    __syncthreads();
  }
}

extern "C" __global__ void __launch_bounds__(COLS_THREADS)
rmsnorm_bwd_cols_dot(const elem_t* __restrict__ x, const float* __restrict__ w, const elem_t* __restrict__ dy,
                     const float* __restrict__ rstd, float* __restrict__ dot, float* __restrict__ dwp, int M, int N,
                     int chunk) {
  __shared__ float red[COLS_GROUP][COLS_THREADS];
  const int c0 = blockIdx.x * chunk, c1 = min(N, c0 + chunk);
  const int r0 = blockIdx.y * COLS_GROUP, rows = min(COLS_GROUP, M - r0);
  float rs[COLS_GROUP], part[COLS_GROUP];
#pragma unroll
  for (int i = 0; i < COLS_GROUP; ++i) {
    rs[i] = i < rows ? rstd[r0 + i] : 0.f;
    part[i] = 0.f;
  }
  for (int c = c0 + threadIdx.x; c < c1; c += COLS_THREADS) {
    float xv[COLS_GROUP], dv[COLS_GROUP];
#pragma unroll
    for (int i = 0; i < COLS_GROUP; ++i) {   // every row's loads first: they are in flight together
      const size_t at = (size_t)(r0 + (i < rows ? i : 0)) * N + c;
      xv[i] = load_elem(x + at);
      dv[i] = load_elem(dy + at);
    }
    const float wc = w[c];
    float dw = 0.f;
#pragma unroll
    for (int i = 0; i < COLS_GROUP; ++i) {
      if (i < rows) {
        part[i] = fmaf(dv[i] * wc, xv[i], part[i]);
        dw = fmaf(dv[i], xv[i] * rs[i], dw);
      }
    }
    dwp[(size_t)blockIdx.y * N + c] = dw;
  }
  cols_block_sums<COLS_GROUP>(part, red);
  if ((int)threadIdx.x < rows) dot[(size_t)(r0 + threadIdx.x) * gridDim.x + blockIdx.x] = red[threadIdx.x][0];
}

extern "C" __global__ void __launch_bounds__(COLS_THREADS)
rmsnorm_bwd_cols(const elem_t* __restrict__ x, const float* __restrict__ w, const elem_t* __restrict__ dy,
                 const float* __restrict__ rstd, const float* __restrict__ dot, const float* __restrict__ dwp,
                 elem_t* __restrict__ dx, float* __restrict__ dw, int M, int N, int chunk, int groups) {
  __shared__ float red[1][COLS_THREADS];
  const int C = gridDim.x, r = blockIdx.y;
  float s[1] = {0.f};
  for (int b = threadIdx.x; b < C; b += COLS_THREADS) s[0] += dot[(size_t)r * C + b];
  cols_block_sums<1>(s, red);
  const float rs = rstd[r], cr = rs * red[0][0] / (float)N;
  const int c0 = blockIdx.x * chunk, c1 = min(N, c0 + chunk);
  const size_t row = (size_t)r * N;
  for (int c = c0 + threadIdx.x; c < c1; c += COLS_THREADS) {
    const float df = load_elem(dy + row + c), xh = load_elem(x + row + c) * rs;
    store_elem(dx + row + c, rs * fmaf(-xh, cr, df * w[c]));
  }
  if (r == 0) {   // dw of this chunk: the groups' partials in order
    for (int c = c0 + threadIdx.x; c < c1; c += COLS_THREADS) {
      float acc = 0.f;
      for (int g = 0; g < groups; ++g) acc += dwp[(size_t)g * N + c];
      dw[c] = acc;
    }
  }
}
#endif
