"""Backward genomes shared by its CPU tests: the defaults, a spread that takes every gene value between them, and a
feasible genome from keyword changes."""
from kernel_factory.problems import rmsnorm_bwd as mod

P = mod.problem
DEFAULT = P.space.defaults()
# Genomes that between them take every gene value (each one feasible; checked below).
SPREAD = [dict(), dict(threads=128, rows_per_cta=2, ctas_per_sm=4, reg_vecs=1, vec_bytes=8, small_m="grouped",
               narrow=True),
          dict(threads=256, rows_per_cta=8, ctas_per_sm=4, reg_vecs=1, prefetch=False, load="plain", dw_acc="smem",
               small_m="direct"),
          dict(threads=512, cluster=4, ctas_per_sm=1, reg_vecs=4, vec_bytes=8, load="nc_na", store="cs", tail="peel"),
          dict(threads=1024, cluster=8, ctas_per_sm=1, reg_vecs=1, dw_acc="smem", reduce="smem", prefetch=False),
          dict(threads=512, cluster=2, ctas_per_sm=1, reg_vecs=2, dw_acc="smem", prefetch=False),
          dict(threads=512, rows_per_cta=4, ctas_per_sm=1, reg_vecs=4, vec_bytes=8, reduce="smem", small_m="cols"),
          dict(threads=512, cluster=16, ctas_per_sm=1, reg_vecs=4, stages=2, prefetch=False, dw_acc="smem"),
          dict(threads=256, ctas_per_sm=2, reg_vecs=2, stages=3, prefetch=False, tail="peel"),
          dict(threads=512, cluster=8, ctas_per_sm=1, reg_vecs=2, stages=4, prefetch=False, vec_bytes=8),
          dict(threads=256, cluster=16, ctas_per_sm=1, reg_vecs=8, stages=2, prefetch=False, cluster_sum="warps"),
          dict(threads=128, cluster=2, ctas_per_sm=1, reg_vecs=8, stages=3, prefetch=False, dw_acc="smem"),
          dict(threads=512, cluster=16, ctas_per_sm=1, reg_vecs=1, prefetch=False, dw_acc="smem",
               cluster_sum="warps", stream_batch=4),
          dict(threads=256, cluster=8, ctas_per_sm=2, reg_vecs=1, stages=2, prefetch=False, dw_acc="smem",
               stream_batch=2, tail="peel"),
          # sub-warp rows (tests/test_rmsnorm_bwd_subwarp.py has more): 2 and 8 threads a row, rows_per_cta 16 to 64
          dict(threads=128, rows_per_cta=64, ctas_per_sm=4, reg_vecs=1, vec_bytes=8),
          dict(threads=256, rows_per_cta=32, ctas_per_sm=2, stages=2, prefetch=False),
          dict(threads=128, rows_per_cta=16, ctas_per_sm=4, reg_vecs=1, prefetch=False, dw_acc="smem",
               stream_batch=2, small_m="direct"),
          # 16 or 32 rows of a warp or more per CTA: their global partials once wrote past the scratch at M <= 5
          *(dict(threads=t, rows_per_cta=r, ctas_per_sm=1, reg_vecs=1, prefetch=False, vec_bytes=8, small_m=m)
            for t, r, m in ((512, 16, "grouped"), (1024, 16, "grouped"), (1024, 32, "none")))]


def genes(**kw):
    g = {**DEFAULT, **kw}
    assert P.space.why_infeasible(g) is None, (kw, P.space.why_infeasible(g))
    return g
