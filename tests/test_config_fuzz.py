"""Config fuzzing (issue 33): generated configs, valid and broken (wrong types, NaN, huge numbers, unknown keys,
aliases, bad UTF-8, duplicate keys, control characters, noise, odd overrides), go through the parser, and a bounded
sample through a one-generation replay run of the CLI. Every outcome is a config or a clean run, or one line and exit
2: never a traceback, never past the hang guard (PARSE_S, RUN_S), never more memory than PARSE_BYTES / RUN_BYTES.

Derandomized with a fixed example count, so that it cannot flake in CI; about half a minute on 2 cores."""
from __future__ import annotations

import contextlib
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel_factory.evo import build, config, registry
from kernel_factory.evo.config import ConfigError
from kernel_factory.evo.tools import cli

PARSE_S = 10.0                 # hang guard per parsed config (parsing takes milliseconds)
PARSE_BYTES = 64 << 20         # peak Python allocation while one config is read and checked
RUN_S = 120.0                  # hang guard per one-generation replay run (a few seconds each)
RUN_BYTES = 512 << 20         # growth of resident memory during one run, past what the process held before it

KEYS = ("problem", "dtypes", "shapes", "seed", "out_dir", "observers", "search.population", "search.generations",
        "search.max_evaluations", "search.tournament_size", "search.elitism", "search.init_random", "search.mode",
        "search.policy", "search.lessons", "search.space.threads", "search.operators.gene_mutation.weight",
        "search.surrogate.oversample", "search.warm_start.count", "evaluator.kind", "evaluator.gpu.target_ms",
        "evaluator.gpu.no_such_option", "evaluator.replay.recording", "workers.backend", "workers.count",
        "stop.target_fitness", "stop.patience", "stop.gpu_s", "workload.train", "no_such_key", "search.no_such_key")
# Keys a fuzzed replay run may set, with values a user might write, so that many of its runs get past the parser:
# none that starts a campaign, a Ray cluster or a worker pool, which other test files cover.
NUMBER = st.floats(allow_nan=True, allow_infinity=True)
RUN_VALUES = {
    "search.population": st.one_of(st.integers(1, 40), st.sampled_from([5000, 10 ** 8])),
    "search.tournament_size": st.integers(1, 8), "search.elitism": st.integers(0, 8),
    "search.init_random": st.floats(0, 1), "search.mode": st.sampled_from(["generational", "steady"]),
    "search.policy": st.sampled_from(["static", "bandit"]), "search.lessons": st.booleans(),
    "search.space.threads": st.lists(st.sampled_from([64, 128, 256, 512, 1024]), min_size=1, max_size=3),
    "search.operators.gene_mutation.weight": st.floats(0, 2), "search.surrogate.enabled": st.booleans(),
    "evaluator.gpu.target_ms": st.floats(0.1, 5), "evaluator.gpu.no_such_option": st.integers(),
    "shapes": st.sampled_from(["benchmark", "correctness", "32768x4096", "1x1024,8x4096", "8x3"]),
    "stop.target_fitness": NUMBER, "stop.patience": st.integers(1, 5), "stop.gpu_s": st.floats(0.001, 100),
    "seed": st.integers(0, 2 ** 31), "search.no_such_key": st.integers(),
}
RUN_KEYS = tuple(RUN_VALUES)

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
    NUMBER, st.sampled_from(["", "bandit", "steady", "8x4096", "auto",
                                                                     "replay", "rmsnorm_fwd", "x" * 300]),
    st.text(max_size=20))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


def base() -> dict[str, Any]:
    return {"problem": "rmsnorm_fwd", "dtypes": ["bfloat16"], "search": {"population": 6, "generations": 1}}


def set_key(data: dict[str, Any], key: str, value: Any) -> None:
    *path, last = key.split(".")
    node = data
    for part in path:
        node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else node
    node[last] = value


def breakage(text: str, kind: str, where: int) -> bytes:
    """The YAML text of a config broken one way at a drawn place."""
    lines = text.splitlines(keepends=True)
    at = where % (len(lines) + 1)
    if kind == "latin1":
        return "".join(lines[:at]).encode() + b"# caf\xe9\n" + "".join(lines[at:]).encode()
    if kind == "duplicate" and lines:
        line = lines[where % len(lines)]
        return (text + line if not line.startswith(" ") else text + line.lstrip()).encode()
    if kind == "bomb":
        bomb = ["evaluator:", "  replay:", "    a0: &a0 [x, x, x, x, x, x, x, x, x]"]
        bomb += [f"    a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 1 + where % 9)]
        return (text + "\n".join(bomb) + "\n").encode()
    if kind == "control":   # a NUL, a bell or an escape in the text
        return (text[:where % (len(text) + 1)] + chr(where % 32) + text[where % (len(text) + 1):]).encode()
    if kind == "truncate":
        return text[:where % (len(text) + 1)].encode()
    if kind == "noise":
        return bytes((where * 7919 + i * 104729) % 256 for i in range(where % 4096))
    return text.encode()


@st.composite
def config_files(draw: Any, plausible: bool = False) -> bytes:
    """YAML bytes: the base config with up to four keys set to drawn values, then valid or broken one way."""
    data = base()
    for key in draw(st.lists(st.sampled_from(RUN_KEYS if plausible else KEYS), max_size=4)):
        value = VALUES if not plausible else st.one_of(RUN_VALUES[key], RUN_VALUES[key], RUN_VALUES[key], VALUES)
        set_key(data, key, draw(value))
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    kinds = ["valid"] * (6 if plausible else 2) + ["latin1", "duplicate", "bomb", "control", "truncate", "noise"]
    return breakage(text, draw(st.sampled_from(kinds)), draw(st.integers(0, 10 ** 6)))


def resident_peak() -> int:
    """This process's resident high-water mark in bytes (Linux VmHWM)."""
    status = Path("/proc/self/status").read_text()
    return int(status.split("VmHWM:")[1].split()[0]) * 1024


def peak_from_now() -> int:
    """Where the next VmHWM reading starts from: the high-water mark lowered to the memory held now, so that it
    measures what runs in between, not the tests before. Where the kernel refuses that reset, the mark as it stands:
    a run that stays below an earlier test's peak then reads as no growth (checked less, never falsely)."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")
    return resident_peak()


def one_line(exc: BaseException) -> bool:
    return "\n" not in str(exc) and "Traceback" not in str(exc)


@settings(max_examples=500, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(raw=config_files(), overrides=st.lists(st.one_of(st.text(max_size=30), st.sampled_from(
    ["search.population=.nan", "search=1", "stop.gpu_s=1.0e+999", "seed=[1", "a..b=2", "=3", "shapes=8x8,8"])),
    max_size=2))
def test_the_parser_gives_a_config_or_one_line(raw: bytes, overrides: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_bytes(raw)
        started = time.monotonic()
        tracemalloc.start()
        try:
            cfg = config.load(path, tuple(overrides))
            build.prepare(cfg)
        except (ConfigError, registry.PluginError) as exc:   # what the CLI turns into one line and exit 2
            assert one_line(exc), str(exc)
        finally:
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        assert time.monotonic() - started < PARSE_S and peak < PARSE_BYTES, (time.monotonic() - started, peak)


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                 HealthCheck.function_scoped_fixture])
@given(raw=config_files(plausible=True))
def test_a_one_generation_replay_is_a_clean_run_or_one_line(raw: bytes, capsys: pytest.CaptureFixture) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_bytes(raw)
        started, before = time.monotonic(), peak_from_now()
        code = cli.main(["run", str(path), "-o", "search.generations=1", "-o", f"out_dir={tmp}/runs",
                         "-o", "evaluator.kind=replay", "-o", "observers=[console, journal]",
                         "-o", f"tracking.store={tmp}/m.db", "-o", f"tracking.artifacts={tmp}/art"])
        grown = resident_peak() - before
        out, err = capsys.readouterr()
        assert time.monotonic() - started < RUN_S and grown < RUN_BYTES, (time.monotonic() - started, grown)
    assert "Traceback" not in out + err, err
    if code == cli.EXIT_BAD_INPUT:
        errors = [line for line in err.splitlines() if line.startswith("kernel-factory: error: ")]
        assert len(errors) == 1 and err.rstrip().endswith(errors[0]), err
    else:   # a clean run: done, with a best (0) or none correct (1)
        assert code in (0, 1) and "done:" in err + out, (code, err)
