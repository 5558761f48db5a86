"""The card's folders (evo/, operators/, problems/, kernels/) install as kernel_factory.* and shadow nothing: the
`kernels` and `evo` packages of the same names stay importable next to ours, even from the repository root, where
the folders of the same names sit first on sys.path."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

PROBE = """
import evo, kernels, kernel_factory.kernels.templates as t, kernel_factory.evo.types
print(kernels.__file__); print(evo.__file__); print(t.__file__)
print(hasattr(kernels, "get_kernel"))
"""


def test_published_namesakes_win_from_the_repo_root():
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    hf_kernels, other_evo, ours, has_get_kernel = out.stdout.split()
    assert "site-packages" in hf_kernels and not hf_kernels.startswith(str(ROOT / "kernels"))
    assert "site-packages" in other_evo and not other_evo.startswith(str(ROOT / "evo"))
    assert ours == str(ROOT / "kernels" / "templates.py")
    assert has_get_kernel == "True", "that must be Hugging Face's kernels package"


def test_card_folders_have_no_top_level_init():
    # a regular package here would shadow the installed namesake whenever the repo root is on sys.path
    for folder in ("evo", "operators", "problems", "kernels"):
        assert not (ROOT / folder / "__init__.py").exists(), folder
