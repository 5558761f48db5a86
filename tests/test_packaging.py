"""What the package declares: every third-party import of the installed folders is a declared dependency (or an
optional peer that a plugin declares at run time), test tools live in the `test` extra, and the extra brings what
the comparison tests need so that they run in CI instead of skipping."""
import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions, requires
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Baselines that problems load only when installed (each says what it needs), Kernel Tuner (bench/test extras), Ray
# (the `ray` extra) and playwright (the screenshots tool: the `test` extra, it says so when missing).
OPTIONAL_PEERS = {"liger_kernel", "rmsnorm", "kernel_tuner", "quack", "ray", "playwright", "fla"}


def name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def declared(requirements) -> set[str]:
    """The names, and (one level down) what they require: cuda-python brings cuda-bindings and cuda-core."""
    out = set()
    for req in requirements:
        out.add(name(req))
        out.update(name(r) for r in (requires(name(req)) or []) if "extra ==" not in r)
    return out


def third_party_imports() -> dict[str, str]:
    found = {}
    for folder in ("evo", "operators", "problems", "kernels"):
        for path in (ROOT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
                for mod in mods:
                    top = mod.split(".")[0]
                    if top not in sys.stdlib_module_names and top != "kernel_factory":
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_import_is_declared():
    runtime = declared(PROJECT["dependencies"])
    dists = packages_distributions()
    missing = {top: where for top, where in third_party_imports().items()
               if top not in OPTIONAL_PEERS and not {name(d) for d in dists.get(top, [top])} & runtime}
    assert not missing, f"imported but not declared in [project].dependencies: {missing}"


def test_pytest_is_a_test_tool_and_the_test_extra_runs_the_comparisons():
    runtime = {name(r) for r in PROJECT["dependencies"]}
    test = {name(r) for r in PROJECT["optional-dependencies"]["test"]}
    assert "pytest" not in runtime and "pytest" in test
    assert {"matplotlib", "openai", "nvidia-ml-py"} <= runtime
    assert "kernel-tuner==1.5.0" in PROJECT["optional-dependencies"]["test"]
    import kernel_tuner  # noqa: F401  - installed with the test extra: its comparison tests must not skip


def test_the_install_line_is_the_same_in_the_readme_and_ci():
    line = 'pip install -e ".[test]" ./tests/plugins/kf_softmax ./tests/plugins/kf_silu_mul "torch==2.13.0"'
    assert line in (ROOT / ".ci" / "run").read_text() and line in (ROOT / "README.md").read_text()
