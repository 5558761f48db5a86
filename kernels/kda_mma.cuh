// KDA forward, the chunked form under mma=mma_sync: the two pieces of inline PTX its tensor-core products rest on,
// included by kda_fwd.cu before kda_chunked.cuh. They are the only device code of that path that a CPU cannot run,
// so they sit behind this small boundary: tests/test_kda_chunked_host.py builds kda_chunked.cuh with a C++ emulation
// of both in their place (the mma warp-collectively, from the PTX ISA's fragment tables).

// Two floats as one .b32 of bf16x2, each rounded to nearest even, `lo` in the low half (the fragments' lower-indexed
// element). cvt's first source goes to the upper half.
__device__ __forceinline__ unsigned ck_pack_bf16(float lo, float hi) {
    unsigned packed;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(hi), "f"(lo));
    return packed;
}

// d += A B for one 16 x 8 tile over 16 of the reduction, A (16 x 16) and B (16 x 8) bf16 and d fp32, held as the
// PTX ISA's m16n8k16 fragments (kda_chunked.cuh ck_frag_a, ck_frag_b, ck_c_row). All 32 lanes of the warp take part.
__device__ __forceinline__ void ck_mma_16x8x16(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
