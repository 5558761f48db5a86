// Generated from the gene space of problem rmsnorm_fwd by `kernel-factory genes`: do not edit
// (change the gene space, then run the command again; a CPU test fails while this file is stale).
//
// A rendered candidate starts with `#define DTYPE DTYPE_<ITS DTYPE>` and one #define per gene, so the
// #ifndef defaults below serve only the template compiled as-is. Macros a template may rely on:
// - DTYPE: the candidate's element type, one of the DTYPE_* codes below, all of them defined whatever
//   the problem's dtypes (bfloat16, float16, float32). Choose with `#if DTYPE == DTYPE_FLOAT16`.
// - one macro per gene, its name in capitals: an int as-is, a boolean as 0 or 1, a named choice as the
//   constant GENE_CHOICE (compare e.g. `#if LOAD == LOAD_NC`, never with a number).
#define DTYPE_BFLOAT16 0
#define DTYPE_FLOAT16 1
#define DTYPE_FLOAT32 2
#ifndef DTYPE
#define DTYPE DTYPE_BFLOAT16
#endif
// threads (structure): 128 | 256 | 512 | 1024
#ifndef THREADS
#define THREADS 256
#endif
// rows_per_cta (structure): 1 | 2 | 4 | 8 | 16 | 32 | 64 | 128
#ifndef ROWS_PER_CTA
#define ROWS_PER_CTA 1
#endif
// vec_bytes (structure): 8 | 16
#ifndef VEC_BYTES
#define VEC_BYTES 16
#endif
// load (ptx)
#define LOAD_PLAIN 0
#define LOAD_NC 1
#define LOAD_NC_NA 2
#define LOAD_CP_ASYNC 3
#ifndef LOAD
#define LOAD LOAD_NC
#endif
// store (ptx)
#define STORE_PLAIN 0
#define STORE_CS 1
#ifndef STORE
#define STORE STORE_PLAIN
#endif
// keep_x (structure): 0 | 1
#ifndef KEEP_X
#define KEEP_X 1
#endif
// reduce (ptx)
#define REDUCE_SHFL 0
#define REDUCE_SMEM 1
#ifndef REDUCE
#define REDUCE REDUCE_SHFL
#endif
// rsqrt (ptx)
#define RSQRT_APPROX 0
#define RSQRT_PRECISE 1
#ifndef RSQRT
#define RSQRT RSQRT_APPROX
#endif
// unroll (structure): 1 | 2 | 4
#ifndef UNROLL
#define UNROLL 2
#endif
// stage (structure)
#define STAGE_NONE 0
#define STAGE_SMEM 1
#ifndef STAGE
#define STAGE STAGE_NONE
#endif
// stage_copy (ptx)
#define STAGE_COPY_CP_ASYNC 0
#define STAGE_COPY_BULK 1
#ifndef STAGE_COPY
#define STAGE_COPY STAGE_COPY_CP_ASYNC
#endif
// cluster (structure): 1 | 2 | 4 | 8 | 16
#ifndef CLUSTER
#define CLUSTER 1
#endif
// persistent (structure): 0 | 1
#ifndef PERSISTENT
#define PERSISTENT 0
#endif
// tail (structure)
#define TAIL_SCALAR 0
#define TAIL_PEEL 1
#ifndef TAIL
#define TAIL TAIL_SCALAR
#endif
// w_ahead (ptx)
#define W_AHEAD_NONE 0
#define W_AHEAD_L2 1
#define W_AHEAD_REGS 2
#ifndef W_AHEAD
#define W_AHEAD W_AHEAD_NONE
#endif
