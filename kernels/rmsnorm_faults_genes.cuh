// Generated from the gene space of problem rmsnorm_faults by `kernel-factory genes`: do not edit
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
// fault (structure)
#define FAULT_NONE 0
#define FAULT_COMPILE_ERROR 1
#define FAULT_PTXAS_OVERFLOW 2
#define FAULT_ILLEGAL_ADDRESS 3
#define FAULT_MISALIGNED 4
#define FAULT_HANG 5
#define FAULT_TRAP 6
#define FAULT_NAN_OUTPUT 7
#define FAULT_HALF_OUTPUT 8
#define FAULT_PAST_END 9
#define FAULT_HELDOUT_ONLY 10
#define FAULT_STALE 11
#define FAULT_RACE 12
#ifndef FAULT
#define FAULT FAULT_NONE
#endif
// threads (structure): 128 | 256 | 512 | 1024
#ifndef THREADS
#define THREADS 256
#endif
