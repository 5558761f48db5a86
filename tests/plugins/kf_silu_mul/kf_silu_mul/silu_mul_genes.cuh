// Generated from the gene space of problem silu_mul by `kernel-factory genes`: do not edit
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
// threads (structure): 128 | 256 | 512
#ifndef THREADS
#define THREADS 256
#endif
// rows_per_cta (structure): 1 | 2 | 4
#ifndef ROWS_PER_CTA
#define ROWS_PER_CTA 1
#endif
// load (ptx)
#define LOAD_PLAIN 0
#define LOAD_NC 1
#ifndef LOAD
#define LOAD LOAD_NC
#endif
