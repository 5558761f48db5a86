"""How steady the search's baseline is within one run, on a GPU host: the torch.compile baseline of the RMSNorm
forward on two short cases, measured at setup and re-measured between three candidates (baseline_every_s tiny), in
two evaluators one after the other. Prints one JSON line per evaluator: the setup measurement, the books (each
measurement's geomean relative to the first) and the baseline each candidate was taken against.

    python3 tests/gpu/baseline_spread.py
"""
import json
import tempfile

from kernel_factory.evo.evaluate.gpu import GpuEvaluator
from kernel_factory.evo.types import Candidate, Case, Genome
from kernel_factory.problems.rmsnorm_fwd import problem


def main() -> None:
    for trial in range(2):
        cases = [Case((4096, 1024), "bfloat16"), Case((1024, 8192), "bfloat16")]
        ev = GpuEvaluator(problem, cases, "torch_compile", 0, tempfile.mkdtemp(), compile_workers=4,
                          baseline_every_s=1e-3, graph_below_us=30.0)
        try:
            d = problem.space.defaults()
            res = ev.evaluate([Candidate(Genome.of({**d, "unroll": u})) for u in (1, 2, 4)])
            print(json.dumps({"trial": trial, "setup_baseline_us": ev.baseline_us,
                              "books": ev.accounting()["baseline"],
                              "per_candidate_baseline": [r.baseline_us for r in res]}, default=str), flush=True)
        finally:
            ev.close()


if __name__ == "__main__":   # the compile pool's processes import this module
    main()
