// cp.async of one vector (VEC_BYTES) from global into shared memory, in commit groups: 16 bytes through L2 only
// (.cg), 8 bytes through L1 (.ca). Shared by the forward and backward templates' device helpers, which define
// elem_t and VEC_BYTES before including it.
__device__ __forceinline__ void cp_async_vec(void* smem, const elem_t* gmem) {
  const unsigned int s = (unsigned int)__cvta_generic_to_shared(smem);
#if VEC_BYTES == 16
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(s), "l"(gmem) : "memory");
#else
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" :: "r"(s), "l"(gmem) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" :: "n"(N) : "memory");
}
