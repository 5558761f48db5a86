"""FLA's chunk_kda, called once on every KDA benchmark workload, so that Triton's compiles of its kernels (every
autotuned configuration of each) land in the host's Triton cache before a bench times it. On an H100 those first
calls took more than 180 s in all: two device calls' KDA benches (2026-12-07, 2026-12-08) ended before their first
case. host_setup.sh's fla_warm runs this in the background at a call's start; fla_wait waits for its last line.

    python3 tests/gpu/fla_warm.py     (prints one line per workload, then "warmed")"""
from __future__ import annotations

import time


def main() -> None:
    import torch
    from kernel_factory.evo.types import Case
    from kernel_factory.problems.kda_fwd import problem
    began = time.monotonic()
    for shape in problem.shape_sets["benchmark"]:
        case = Case(tuple(shape), "bfloat16")
        inputs = problem.make_inputs(case, seed=1, device="cuda")
        problem.baseline("fla", case, inputs)()
        torch.cuda.synchronize()
        print(f"{case.key}: {time.monotonic() - began:.0f} s", flush=True)
    print("warmed", flush=True)


if __name__ == "__main__":
    main()
