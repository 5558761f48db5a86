// Generated from the gene space of problem kda_fwd by `kernel-factory genes`: do not edit
// (change the gene space, then run the command again; a CPU test fails while this file is stale).
//
// A rendered candidate starts with `#define DTYPE DTYPE_<ITS DTYPE>` and one #define per gene, so the
// #ifndef defaults below serve only the template compiled as-is. Macros a template may rely on:
// - DTYPE: the candidate's element type, one of the DTYPE_* codes below, all of them defined whatever
//   the problem's dtypes (bfloat16). Choose with `#if DTYPE == DTYPE_FLOAT16`.
// - one macro per gene, its name in capitals: an int as-is, a boolean as 0 or 1, a named choice as the
//   constant GENE_CHOICE (compare e.g. `#if LOAD == LOAD_NC`, never with a number).
#define DTYPE_BFLOAT16 0
#define DTYPE_FLOAT16 1
#define DTYPE_FLOAT32 2
#ifndef DTYPE
#define DTYPE DTYPE_BFLOAT16
#endif
// v_block (structure): 32 | 64 | 128
#ifndef V_BLOCK
#define V_BLOCK 64
#endif
// k_lanes (structure): 1 | 2 | 4 | 8
#ifndef K_LANES
#define K_LANES 4
#endif
// exp (ptx)
#define EXP_APPROX 0
#define EXP_PRECISE 1
#ifndef EXP
#define EXP EXP_APPROX
#endif
// load (ptx)
#define LOAD_PLAIN 0
#define LOAD_NC 1
#ifndef LOAD
#define LOAD LOAD_NC
#endif
// form (structure)
#define FORM_RECURRENT 0
#define FORM_CHUNKED 1
#ifndef FORM
#define FORM FORM_RECURRENT
#endif
// chunk (structure): 16 | 32 | 64
#ifndef CHUNK
#define CHUNK 64
#endif
// solve (structure)
#define SOLVE_SUBSTITUTION 0
#define SOLVE_NEUMANN 1
#ifndef SOLVE
#define SOLVE SOLVE_SUBSTITUTION
#endif
// mma (ptx)
#define MMA_FMA 0
#define MMA_MMA_SYNC 1
#ifndef MMA
#define MMA MMA_FMA
#endif
