"""Backward at the widest row: times variants side by side (CUDA events), or launches one for ncu.
python3 .gpu/profile_bwd.py time | python3 .gpu/profile_bwd.py one NAME"""
import sys
import torch
from kernel_factory.evo import registry
from kernel_factory.evo.evaluate import render, launcher
from kernel_factory.evo.evaluate.compile import CompileJob, compile_one
from kernel_factory.evo.types import Candidate, Genome, Case

P = registry.load("problem", "rmsnorm_bwd")
D = P.space.defaults()
G = {
    "table": dict(cluster=16, ctas_per_sm=2, dw_acc="smem", load="plain", prefetch=False, reg_vecs=1, stages=2,
                  store="cs", threads=512, vec_bytes=8),
    "best": dict(cluster=16, ctas_per_sm=1, dw_acc="smem", prefetch=False, reg_vecs=4, stages=2, threads=512),
    "int21like": dict(threads=256, cluster=16, ctas_per_sm=1, reg_vecs=8, stages=2, prefetch=False),
    "int21like_s3": dict(threads=256, cluster=16, ctas_per_sm=1, reg_vecs=8, stages=3, prefetch=False),
    "c8_131k": dict(cluster=8, ctas_per_sm=2, dw_acc="smem", prefetch=False, reg_vecs=4, stages=2, threads=256,
                    store="cs"),
}
PATCHES = {   # template text edits, to see what a piece costs
    "cta": ("mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64", "mbarrier.try_wait.parity.shared::cta.b64"),
}


def build(name):
    base, _, patch = name.partition("+")
    g = {**D, **G[base]}
    src = render.render(P, Candidate(Genome.of(g)), "bfloat16")
    if patch:
        old, new = PATCHES[patch]
        assert old in src, patch
        src = src.replace(old, new)
    out = compile_one(CompileJob(name, src, name + ".cu"))
    assert out.error is None, out.error
    return g, launcher.Module(out.cubin, "rmsnorm_bwd")


def runner(name, case, inputs, outputs, stream):
    if name == "int21":
        return P.baseline("int21", case, inputs)
    g, mod = build(name)
    return launcher.launcher(stream, mod, P.launch(g, case, inputs, outputs))


def main():
    launcher.make_current(0)
    stream = launcher.torch_stream()
    shapes = [(8192, 262144), (16384, 131072)]
    if sys.argv[1] == "one":
        case = Case(shapes[0], "bfloat16")
        inputs, outputs = P.make_inputs(case, 0, "cuda"), P.make_outputs(case, "cuda")
        fn = runner(sys.argv[2], case, inputs, outputs, stream)
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        return
    names = list(G) + ["table+cta", "best+cta", "int21like+cta", "int21"]
    for shape in shapes:
        case = Case(shape, "bfloat16")
        inputs, outputs = P.make_inputs(case, 0, "cuda"), P.make_outputs(case, "cuda")
        fns = {n: runner(n, case, inputs, outputs, stream) for n in names}
        times = {n: [] for n in names}
        for n in names:
            fns[n]()
        for _ in range(8):
            for n in names:   # interleaved
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record(); fns[n](); e1.record(); torch.cuda.synchronize()
                times[n].append(e0.elapsed_time(e1) * 1e3)
        gb = P.bytes_moved(case) / 1e9
        for n in names:
            t = sorted(times[n])[len(times[n]) // 2]
            print(f"{shape[0]}x{shape[1]} {n:16s} {t:9.1f} us {gb / t * 1e6:7.0f} GB/s", flush=True)
        del inputs, outputs, fns
        torch.cuda.empty_cache()


main()
