"""Configs that used to crash or explode (issue 33, items 7-10): bytes that are not UTF-8, alias bombs, duplicate
keys, NaN and infinity, values past the limits, a folder given as the config, options of the evaluator kind not in
use, a replay's population larger than its recording. Each is one line naming the file or key, exit 2."""
from __future__ import annotations

import random
import time
from pathlib import Path

import pytest

from kernel_factory.evo import build, config, limits, yamltext
from kernel_factory.evo.config import ConfigError
from kernel_factory.evo.tools import cli

ROOT = Path(__file__).resolve().parent.parent


def cli_error(capsys, *argv: str) -> str:
    """Run the CLI, expect exit 2, and return its stderr, which must be exactly one line."""
    assert cli.main(list(argv)) == cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("kernel-factory: error: "), err
    return err


def test_a_latin1_byte_in_a_comment_names_the_file_and_offset(tmp_path, capsys):
    path = tmp_path / "latin.yaml"
    path.write_bytes(b"problem: rmsnorm_fwd\n# caf\xe9\n")
    err = cli_error(capsys, "run", str(path))
    assert f"config file '{path}' is not UTF-8 text: byte 0xe9 at offset 26 (line 2)" in err


def test_random_bytes_are_one_line(tmp_path, capsys):
    path = tmp_path / "noise.yaml"
    path.write_bytes(random.Random(4).randbytes(4096))
    assert "is not UTF-8 text: byte 0x" in cli_error(capsys, "run", str(path))


def test_a_folder_given_as_the_config_says_so(tmp_path, capsys):
    assert f"config file '{tmp_path}' is a folder, not a file" in cli_error(capsys, "run", str(tmp_path))


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text("problem: rmsnorm_fwd\n" + "#" * yamltext.MAX_FILE_BYTES + "\n")
    with pytest.raises(ConfigError, match=f"is larger than {yamltext.MAX_FILE_BYTES} bytes"):
        config.load(path)


def alias_bomb(levels: int) -> str:
    """About 1 KB of YAML that expands to 9**levels strings."""
    lines = ["problem: rmsnorm_fwd", "evaluator:", "  replay:", "    l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels + 1):
        lines.append(f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    """The issue's 1 KB config made an 80 MB journal; the count is memoised per node, so refusing it is quick (the
    bound is a hang guard, far above the milliseconds it takes)."""
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(9))
    started = time.monotonic()
    with pytest.raises(ConfigError, match=f"expands to more than {yamltext.MAX_VALUES} values or"):
        config.load(path)
    assert time.monotonic() - started < 10


def test_a_long_string_used_by_many_aliases_counts_each_use(tmp_path):
    """Few values, many characters: 200 KB written once and used 20 times would be 4 MB in the journal."""
    path = tmp_path / "long.yaml"
    path.write_text("problem: rmsnorm_fwd\nevaluator:\n  replay:\n    s: &s " + "x" * 200_000 + "\n"
                    "    l: [" + ", ".join(["*s"] * 20) + "]\n")
    with pytest.raises(ConfigError, match=f"or {yamltext.MAX_EXPANDED_CHARS} characters at line 5"):
        config.load(path)


def test_aliases_within_the_limit_still_work(tmp_path):
    path = tmp_path / "shared.yaml"
    path.write_text("problem: rmsnorm_fwd\nsearch:\n  operators:\n    gene_mutation: &w {weight: 0.5}\n"
                    "    uniform_crossover: *w\n")
    cfg = config.load(path)
    assert cfg.search.operators["uniform_crossover"].weight == 0.5


@pytest.mark.parametrize("text, needle", [
    ("problem: rmsnorm_fwd\nevaluator: {replay: &a {x: *a}}\n", "has an alias inside the value it names (a cycle"),
    ("problem: " + "[" * 100 + "]" * 100 + "\n", "nests lists or mappings deeper than 32 levels"),
    ("problem: rmsnorm_fwd\nworkload: {searched_from: 2024-01-01}\n", "a value tagged 'timestamp' (line 2)"),
    ("problem: rmsnorm_fwd\nseed: !!binary aGVsbG8=\n", "a value tagged 'binary'"),
    ("problem: rmsnorm_fwd\nseed: 1\nout_dir: x\nseed: 2\n", "has the key 'seed' twice in one mapping (lines 2 and 4)"),
    ("problem: rmsnorm_fwd\nsearch:\n  population: 4\n  generations: 2\n  population: 8\n",
     "has the key 'population' twice in one mapping (lines 3 and 5)"),
    ("problem: [unclosed\n", "is not valid YAML: line 2, column 1:"),
    ("problem: rmsnorm\0fwd\n", "is not valid YAML: line 1: character #x0000 is not allowed in YAML"),
])
def test_yaml_that_is_not_strict_data_is_one_line(tmp_path, text, needle):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert needle in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("data, overrides, needle", [
    ({"stop": {"target_fitness": float("nan")}}, (), "'stop.target_fitness' must be a finite number, got nan"),
    ({}, ("stop.target_fitness=.nan",), "'stop.target_fitness' must be a finite number, got nan"),
    ({}, ("search.wall_clock_s=.inf",), "'search.wall_clock_s' must be a finite number, got inf"),
    ({}, ("stop.gpu_s=1.0e+400",), "'stop.gpu_s' must be a finite number, got inf"),
    ({"evaluator": {"gpu": {"target_ms": float("-inf")}}}, (), "'evaluator.gpu.target_ms' must be a finite number"),
    ({"search": {"space": {"threads": [128, float("nan")]}}}, (), "'search.space.threads[1]' must be a finite"),
    ({"search": {"population": 100000000}}, (), "'search.population' must be at most 10000, got 100000000"),
    ({}, ("search.generations=1000001",), "'search.generations' must be at most 100000"),
    ({"workers": {"count": 5000}}, (), "'workers.count' must be at most 1024"),
    ({"shapes": ",".join(["8x8"] * 1025)}, (), "'shapes' lists 1025 shapes; at most 1024"),
    ({"shapes": "8x99999999999"}, (), "'shapes': '8x99999999999' has a size over"),
    ({"workload": {"n": [1, 10 ** 30]}}, (), "'workload.n' must stay at most 2147483648"),
    ({"tracking": {"experiment": "e" * 501}}, (), "'tracking.experiment' is 501 characters long; at most 500"),
    ({}, ("search.population=[1",), "override 'search.population=[1': the value is not valid YAML"),
    ({}, ("out_dir=a\0b",), "the value is not valid YAML: line 1: character #x0000 is not allowed"),
    ({}, ("search.wall_clock_s=-1",), "'search.wall_clock_s' must be >= 0 (or null for no limit), got -1.0"),
])
def test_numbers_must_be_finite_and_within_the_limits(data, overrides, needle):
    with pytest.raises(ConfigError) as err:
        config.parse({"problem": "rmsnorm_fwd", **data}, overrides)
    assert needle in str(err.value)


def test_every_limit_names_a_real_key_and_its_default_is_within_it():
    cfg = config.parse({"problem": "rmsnorm_fwd", "workload": {}})
    for key, most in limits.LIMITS.items():
        value = limits._get(cfg, key)   # an AttributeError here is a limit on a key that does not exist
        assert value is None or value <= most, key


def test_the_population_limit_is_refused_by_the_cli_in_one_line(capsys):
    err = cli_error(capsys, "run", str(ROOT / "configs/quickstart.yaml"), "-o", "search.population=100000000")
    assert "'search.population' must be at most 10000" in err and "docs/edges.md" in err


def test_unknown_gpu_options_are_refused_when_replaying():
    cfg = config.parse({"problem": "rmsnorm_fwd", "evaluator": {"kind": "replay", "gpu": {"target_mss": 2}}})
    with pytest.raises(ConfigError, match="'evaluator.gpu.target_mss' is unknown; valid keys under 'evaluator.gpu': "
                                          "compile_workers"):
        build.make_evaluator(build.prepare(cfg), "replay")


def test_a_replay_population_larger_than_its_recording_is_refused():
    """The issue's population 20000 timed all 4272 recorded genomes, then stalled."""
    cfg = config.parse({"problem": "rmsnorm_fwd", "dtypes": ["bfloat16"], "evaluator": {"kind": "replay"},
                        "search": {"population": 5000}})
    with pytest.raises(ConfigError, match=r"'search.population' is 5000, more than the \d+ genomes the replayed "
                                          r"recording rmsnorm_fwd-bfloat16-\w+\.jsonl\.gz holds"):
        build.make_evaluator(build.prepare(cfg), "replay")


def test_other_yaml_files_refuse_nan_too(tmp_path):
    """build() reads other commands' files (gap targets, bench suites) with the same checks."""
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class Target:
        speedup: float

    with pytest.raises(ConfigError, match="'targets.speedup' must be a finite number, got inf"):
        config.build(Target, {"speedup": float("inf")}, "targets")
