"""Shared test setup: the --gpu switch for tests marked `gpu`, and a small synthetic recording for loop tests.

GPU tests never skip silently on a GPU host: with --gpu they run (and fail if no GPU is usable); without it they
are reported as skipped with the reason.
"""
from __future__ import annotations

import gc
import json
import math
import random
import sys
from pathlib import Path

import pytest
import yaml

from kernel_factory.evo.evaluate import recording
from kernel_factory.evo.types import BuildInfo, Case, EvalResult, Genome, Status


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--gpu", action="store_true", help="run tests marked gpu (needs an NVIDIA GPU)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--gpu"):
        return
    skip = pytest.mark.skip(reason="GPU test: run `pytest -m gpu --gpu` on a GPU host")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def synthetic_time_us(genes: dict, case: Case) -> float:
    """A made-up, deterministic cost model with interactions between genes (tests only, never reported)."""
    m, n = case.shape
    bytes_moved = 4 * m * n
    tpr = genes["threads"] // genes["rows_per_cta"]
    fit = abs(math.log2(max(n // 8, 32) / tpr)) if n // 8 >= 32 else 0.5
    eff = 0.95 - 0.06 * fit - (0.04 if genes["vec_bytes"] == 8 else 0.0)
    eff -= 0.03 if genes["load"] == "plain" else 0.0
    eff += 0.02 if (genes["keep_x"] and n <= 16384) else 0.0
    eff -= 0.02 * abs(genes["unroll"] - 2)
    return bytes_moved / (max(eff, 0.05) * 4.2e3) / 1e3


def write_synthetic_recording(path: Path, problem, cases: list[Case], baseline: str = "torch_eager",
                              choices: dict[str, list] | None = None,
                              sampling: str = "exhaustive (synthetic, tests only)") -> Path:
    """A recording in the real format over the problem's whole space (or the part of it that `choices` names, gene
    -> the values kept), from synthetic_time_us; `sampling` is what its header says of how the genomes were chosen."""
    space = problem.space.restricted(choices) if choices else problem.space
    header = {"problem": problem.name, "problem_version": problem.version,
              "space": {g.name: list(g.choices) for g in space.genes},
              "cases": [c.key for c in cases], "baseline": baseline,
              "baseline_us": {c.key: synthetic_time_us(problem.space.defaults(), c) * 1.3 for c in cases},
              "copy_gbps": 4200.0, "sampling": sampling,
              "fingerprint": {"gpu": "SYNTHETIC test data", "date": "2026-01-01"}}
    rng = random.Random(7)

    def result(genes: dict, genome: Genome) -> EvalResult:
        roll = rng.random()
        if roll < 0.03:
            return EvalResult(genome.id, Status.COMPILE_ERROR, message="synthetic compile error")
        if roll < 0.06:
            return EvalResult(genome.id, Status.INCORRECT, message="synthetic mismatch")
        times = {c.key: synthetic_time_us(genes, c) for c in cases}
        return EvalResult(genome.id, Status.OK, times_us=times, iqr_us={k: 0.01 * t for k, t in times.items()},
                          build={"bfloat16": BuildInfo(registers=40)}, gpu_s=0.05)

    writer = recording.Writer(path, header)
    writer.add_all((genome, result(genes, genome)) for genes in space.enumerate()
                   for genome in [Genome.of(genes)])
    return writer.finish()


@pytest.fixture(scope="session")
def rmsnorm():
    from kernel_factory.problems.rmsnorm_fwd import problem
    return problem


@pytest.fixture(scope="session")
def bench_cases(rmsnorm) -> list[Case]:
    return [Case(s, "bfloat16") for s in rmsnorm.shape_sets["benchmark"]]


@pytest.fixture(scope="session")
def synthetic_recording(tmp_path_factory, rmsnorm, bench_cases) -> Path:
    return write_synthetic_recording(tmp_path_factory.mktemp("rec") / "rmsnorm_fwd-synthetic.jsonl.gz", rmsnorm,
                                     bench_cases)


def config_writer(folder: Path, base: dict):
    """A function that writes `base` edited (keyword a__b for key a.b) to a new run-N.yaml in folder, returning
    its path."""
    def write(**edits) -> Path:
        cfg = json.loads(json.dumps(base))
        for key, value in edits.items():
            *path, last = key.split("__")
            node = cfg
            for part in path:
                node = node.setdefault(part, {})
            node[last] = value
        path = folder / f"run-{len(list(folder.glob('run-*.yaml')))}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        return path
    return write


@pytest.fixture
def replay_config(tmp_path, synthetic_recording):
    """A config dict for a small replay run into a temporary MLflow store."""
    return {"problem": "rmsnorm_fwd", "dtypes": ["bfloat16"], "seed": 3, "out_dir": str(tmp_path / "runs"),
            "search": {"population": 12, "generations": 4},
            "evaluator": {"kind": "replay", "replay": {"recording": str(synthetic_recording)}},
            "tracking": {"store": str(tmp_path / "runs" / "mlflow.db"),
                         "artifacts": str(tmp_path / "runs" / "artifacts")}}


@pytest.fixture(scope="module", autouse=True)
def release_gpu_memory():
    """GPU test modules share one process: after each module, return what its tensors held to the device (torch's
    caching allocator keeps freed blocks), so that a later module's evaluator worker, another process, finds the
    memory free. Set up before a module's other fixtures, so torn down after them."""
    yield
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        gc.collect()
        torch.cuda.empty_cache()
