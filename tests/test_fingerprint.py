"""The environment fingerprint names every peer's code: its distribution version and the git commit of the folder
it is imported from (INT21's kernels come from a source checkout), and the compilers that build peers here."""
import subprocess
import sys

from kernel_factory.evo.evaluate import fingerprint


def test_every_peer_is_fingerprinted():
    assert set(fingerprint.PEERS) == {"int21", "quack", "liger"}
    assert fingerprint.PEERS["int21"] == "rmsnorm" and fingerprint.PEERS["liger"] == "liger_kernel"


def test_a_peer_from_a_checkout_is_recorded_by_commit(tmp_path, monkeypatch):
    pkg = tmp_path / "checkout" / "kf_fake_peer_mod"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("RAISE = 1 / 0   # importing it would fail: the fingerprint must not import\n")
    git = ["git", "-C", str(tmp_path / "checkout"), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "peer"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.syspath_prepend(str(tmp_path / "checkout"))
    got = fingerprint.peer_versions({"fake": "kf_fake_peer_mod", "gone": "kf_no_such_module_here"})
    assert got["peer.fake"].endswith(f"commit {head}") and str(pkg) in got["peer.fake"]
    assert got["peer.gone"].startswith("absent")
    (pkg / "__init__.py").write_text("X = 2\n")
    assert fingerprint.peer_versions({"fake": "kf_fake_peer_mod"})["peer.fake"].endswith(f"commit {head}+dirty")
    assert "kf_fake_peer_mod" not in sys.modules


def test_an_installed_peer_is_recorded_by_version():
    got = fingerprint.peer_versions({"np": "numpy"})["peer.np"]
    import numpy
    assert f"numpy {numpy.__version__}" in got


def test_compilers_are_named():
    got = fingerprint.compiler_versions()
    assert set(got) == {"compiler.nvcc", "compiler.cxx", "compiler.triton", "compiler.nvidia-cutlass-dsl"}
    assert all(v for v in got.values())
