// Generated from the gene space of problem rmsnorm_bwd by `kernel-factory genes`: do not edit
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
// rows_per_cta (structure): 1 | 2 | 4 | 8 | 16 | 32 | 64
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
#ifndef LOAD
#define LOAD LOAD_NC
#endif
// store (ptx)
#define STORE_PLAIN 0
#define STORE_CS 1
#ifndef STORE
#define STORE STORE_PLAIN
#endif
// reg_vecs (structure): 1 | 2 | 4 | 8
#ifndef REG_VECS
#define REG_VECS 2
#endif
// dw_acc (structure)
#define DW_ACC_REGS 0
#define DW_ACC_SMEM 1
#ifndef DW_ACC
#define DW_ACC DW_ACC_REGS
#endif
// ctas_per_sm (structure): 1 | 2 | 4
#ifndef CTAS_PER_SM
#define CTAS_PER_SM 2
#endif
// cluster (structure): 1 | 2 | 4 | 8 | 16
#ifndef CLUSTER
#define CLUSTER 1
#endif
// reduce (ptx)
#define REDUCE_SHFL 0
#define REDUCE_SMEM 1
#ifndef REDUCE
#define REDUCE REDUCE_SHFL
#endif
// cluster_sum (ptx)
#define CLUSTER_SUM_CTA 0
#define CLUSTER_SUM_WARPS 1
#ifndef CLUSTER_SUM
#define CLUSTER_SUM CLUSTER_SUM_CTA
#endif
// prefetch (structure): 0 | 1
#ifndef PREFETCH
#define PREFETCH 1
#endif
// stages (structure): 0 | 2 | 3 | 4
#ifndef STAGES
#define STAGES 0
#endif
// stream_batch (structure): 1 | 2 | 4
#ifndef STREAM_BATCH
#define STREAM_BATCH 1
#endif
// narrow (structure): 0 | 1
#ifndef NARROW
#define NARROW 0
#endif
// tail (structure)
#define TAIL_NONE 0
#define TAIL_PEEL 1
#ifndef TAIL
#define TAIL TAIL_NONE
#endif
// small_m (structure)
#define SMALL_M_NONE 0
#define SMALL_M_DIRECT 1
#define SMALL_M_GROUPED 2
#define SMALL_M_COLS 3
#ifndef SMALL_M
#define SMALL_M SMALL_M_NONE
#endif
