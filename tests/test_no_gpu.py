"""Without a GPU, clear words: a problem with no recording to replay says that no GPU was found and how to record
one (exit 2, one line, no run folder); kind gpu says so and points to the recording only where one exists; record
says it needs a GPU, whatever the config's kind."""
from __future__ import annotations

import pytest
import yaml

from kernel_factory.evo import registry
from kernel_factory.evo.evaluate import gpu
from kernel_factory.evo.tools import cli, scaffold

NO_GPU = "no NVIDIA driver or GPU found (cudaErrorNoDevice)"


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(gpu, "gpu_unavailable_reason", lambda: NO_GPU)


@pytest.fixture(scope="module")
def fresh_plugin(tmp_path_factory):
    """A plugin with no recording (scaffolded), loaded from its source."""
    root = scaffold.scaffold("unrecorded", tmp_path_factory.mktemp("plugin"))
    return root, scaffold.load(root, "unrecorded")


def main(monkeypatch, capsys, problem, tmp_path, *args, **cfg):
    real = registry.load
    monkeypatch.setattr(registry, "load", lambda kind, name: problem if (kind, name) == ("problem", problem.name)
                        else real(kind, name))
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"problem": problem.name, "out_dir": str(tmp_path / "runs"), **cfg}))
    code = cli.main([args[0], str(path), *args[1:]])
    out, err = capsys.readouterr()
    return code, out, err


def test_no_gpu_and_no_recording_says_how_to_record_one(no_gpu, fresh_plugin, monkeypatch, capsys, tmp_path):
    root, problem = fresh_plugin
    code, out, err = main(monkeypatch, capsys, problem, tmp_path, "run")
    assert code == cli.EXIT_BAD_INPUT and out == ""
    (line,) = err.strip().splitlines()
    assert line.startswith(f"kernel-factory: error: no GPU found ({NO_GPU}) and no recording for problem "
                           "'unrecorded'; record one on a GPU host with `kernel-factory record RECORD_CONFIG --out ")
    assert f"{root.resolve()}/kf_unrecorded/recorded/unrecorded-bfloat16-<gpu>.jsonl.gz`" in line
    assert "evaluator.replay" in line and "-o evaluator.replay.recording=PATH" in line   # the only key it names
    assert not (tmp_path / "runs").exists()


def test_kind_gpu_without_a_gpu_points_to_the_recording_only_where_one_exists(no_gpu, fresh_plugin, monkeypatch,
                                                                             capsys, tmp_path):
    _, problem = fresh_plugin
    code, _, err = main(monkeypatch, capsys, problem, tmp_path, "run", evaluator={"kind": "gpu"})
    assert code == cli.EXIT_BAD_INPUT
    assert err.strip() == (f"kernel-factory: error: config key 'evaluator.kind' is 'gpu', but no GPU was found here "
                           f"({NO_GPU}), and problem 'unrecorded' has no recording to replay")
    softmax = registry.load("problem", "softmax_fwd")
    code, _, err = main(monkeypatch, capsys, softmax, tmp_path, "run", evaluator={"kind": "gpu"})
    assert code == cli.EXIT_BAD_INPUT and "replay its recorded measurements" in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("kind, says", [
    ("replay", "config key 'evaluator.kind' is 'replay', but record measures on a GPU: set it to gpu (or auto)"),
    ("auto", f"record measures on a GPU, and none was found here ({NO_GPU}); run it on a GPU host"),
    ("gpu", f"record measures on a GPU, and none was found here ({NO_GPU}); run it on a GPU host"),
])
def test_record_without_a_gpu_says_so(no_gpu, fresh_plugin, monkeypatch, capsys, tmp_path, kind, says):
    _, problem = fresh_plugin
    code, _, err = main(monkeypatch, capsys, problem, tmp_path, "record", evaluator={"kind": kind})
    assert code == cli.EXIT_BAD_INPUT
    (line,) = err.strip().splitlines()
    assert line.startswith(f"kernel-factory: error: {says}") and "None" not in line
