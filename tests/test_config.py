"""Strict config: unknown keys, wrong types and bad values are errors that name the key and what is valid."""
import pytest

from kernel_factory.evo import build, config
from kernel_factory.evo.config import ConfigError


def test_defaults_fill_in():
    cfg = config.parse({"problem": "rmsnorm_fwd"})
    assert cfg.search.population == 8 and cfg.evaluator.kind == "auto" and cfg.search.surrogate.enabled
    assert set(cfg.search.operators) == {"gene_mutation", "uniform_crossover", "ptx_mutation"}


@pytest.mark.parametrize("data, needle", [
    ({"problem": "rmsnorm_fwd", "serach": {}}, "'serach' is unknown; valid keys at the top level: problem"),
    ({"problem": "rmsnorm_fwd", "search": {"populaton": 3}}, "'search.populaton' is unknown; valid keys under 'search'"),
    ({"problem": "rmsnorm_fwd", "search": {"population": "ten"}}, "'search.population' must be an int, got 'ten'"),
    ({"problem": "rmsnorm_fwd", "search": {"population": True}}, "'search.population' must be an int"),
    ({"problem": "rmsnorm_fwd", "dtypes": "bfloat16"}, "'dtypes' must be a list of a string"),
    ({"problem": "rmsnorm_fwd", "search": {"population": 0}}, "'search.population' must be >= 1"),
    ({"problem": "rmsnorm_fwd", "evaluator": {"kind": "tpu"}}, "'evaluator.kind' must be one of auto, gpu, replay"),
    ({"search": {}}, "'problem' is required"),
    ({"problem": "rmsnorm_fwd", "search": {"operators": {"gene_mutation": {"weight": -1}}}}, "must be >= 0"),
])
def test_bad_config_names_the_key(data, needle):
    with pytest.raises(ConfigError) as err:
        config.parse(data)
    assert needle in str(err.value)


def test_overrides_are_checked_like_the_file():
    cfg = config.parse({"problem": "rmsnorm_fwd"}, ("search.population=7", "evaluator.kind=replay"))
    assert cfg.search.population == 7 and cfg.evaluator.kind == "replay"
    with pytest.raises(ConfigError, match="'search.popsize' is unknown"):
        config.parse({"problem": "rmsnorm_fwd"}, ("search.popsize=7",))
    with pytest.raises(ConfigError, match="must look like key.path=value"):
        config.parse({"problem": "rmsnorm_fwd"}, ("search.population",))


def test_missing_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("problem: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.load(bad)


@pytest.mark.parametrize("data, needle", [
    ({"problem": "gemm_fp8"}, "unknown problem 'gemm_fp8'; installed: "),
    ({"problem": "rmsnorm_fwd", "search": {"operators": {"flip": {}}}}, "unknown operator 'flip'"),
    ({"problem": "rmsnorm_fwd", "search": {"operators": {"gene_mutation": {"rate": 0.1}}}},
     "'search.operators.gene_mutation.rate' is unknown; valid keys under 'search.operators.gene_mutation': per_gene_p"),
    ({"problem": "rmsnorm_fwd", "search": {"operators": {"gene_mutation": {"per_gene_p": 3.0}}}}, "per_gene_p must be in"),
    ({"problem": "rmsnorm_fwd", "dtypes": ["int8"]}, "'dtypes': 'int8' is not supported"),
    ({"problem": "rmsnorm_fwd", "shapes": "huge"}, "'shapes': 'huge' is not a shape; use one of benchmark, correctness, "
                                                   "heldout or a comma list of MxN"),
    ({"problem": "rmsnorm_fwd", "shapes": "64x0"}, "'shapes': '64x0' is not a shape"),
    ({"problem": "rmsnorm_fwd", "shapes": "64x8x2"}, "'shapes': '64x8x2' is not a shape"),
    ({"problem": "rmsnorm_fwd", "evaluator": {"baseline": "cublas"}}, "'cublas' is not a baseline of rmsnorm_fwd"),
    ({"problem": "rmsnorm_bwd", "search": {"space": {"stage": [2]}}},
     "'search.space.stage': no such gene; the genes are threads, rows_per_cta"),
    ({"problem": "rmsnorm_bwd", "search": {"space": {"stages": [2, 5]}}},
     "'search.space.stages': [5] not among the choices 0, 2, 3, 4"),
    ({"problem": "rmsnorm_bwd", "search": {"space": {"cluster": []}}}, "'search.space.cluster': an empty list"),
    ({"problem": "rmsnorm_bwd", "search": {"space": {"stages": [3], "prefetch": [True]}}},
     "no genome with these choices passes the problem's rule"),
    ({"problem": "rmsnorm_bwd", "search": {"space": ["stages"]}}, "'search.space' must be a mapping"),
])
def test_bad_plugins_and_values_fail_before_any_work(data, needle):
    with pytest.raises(ConfigError) as err:
        build.prepare(config.parse(data))
    assert needle in str(err.value)


def test_shapes_may_be_listed():
    run = build.prepare(config.parse({"problem": "rmsnorm_fwd", "shapes": "32768x65536, 8192x262144",
                                      "dtypes": ["bfloat16", "float16"]}))
    assert [c.key for c in run.cases] == ["bfloat16:32768x65536", "bfloat16:8192x262144", "float16:32768x65536",
                                          "float16:8192x262144"]


def test_a_run_may_narrow_the_gene_space():
    cfg = config.parse({"problem": "rmsnorm_bwd", "search": {"space": {"stages": [2, 4], "prefetch": [False]}}})
    space = build.restrict_space(build.prepare(cfg).problem.space, cfg.search.space)
    assert space["stages"].choices == (2, 4) and space["stages"].default == 2 and space["prefetch"].choices == (False,)
    assert space["cluster"].choices == (1, 2, 4, 8, 16)
    assert all(g["stages"] in (2, 4) and not g["prefetch"] for g in space.enumerate())


def test_unknown_evaluator_option_is_named(synthetic_recording):
    cfg = config.parse({"problem": "rmsnorm_fwd", "evaluator": {"kind": "replay", "replay": {"recordng": "x"}}})
    with pytest.raises(ConfigError, match="'evaluator.replay.recordng' is unknown; valid keys under "
                                          "'evaluator.replay': recording"):
        build.make_evaluator(build.prepare(cfg), "replay")


def test_every_shipped_config_is_valid():
    from pathlib import Path
    configs = sorted(Path(__file__).parent.parent.joinpath("configs").glob("*.yaml"))
    assert configs, "no configs found"
    for path in configs:
        build.prepare(config.load(path))


def test_resolved_config_round_trips():
    cfg = config.parse({"problem": "rmsnorm_fwd", "search": {"operators": {"gene_mutation": {"weight": 2, "per_gene_p": 0.4}}}})
    assert config.parse(cfg.to_json()) == cfg
