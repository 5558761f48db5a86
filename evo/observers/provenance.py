"""Where a run's code came from: the git commit of the installed source and whether its work tree had changes, as
tags for the run's tracking record (a dirty tree means the commit alone does not reproduce the run)."""
from __future__ import annotations

import subprocess
from pathlib import Path


def git_tags(folder: Path = Path(__file__).resolve().parent) -> dict[str, str]:
    """The source's git commit and whether the work tree had changes ({} outside a git checkout)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True,
                                timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=folder,
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    if commit.returncode != 0 or dirty.returncode != 0:
        return {}
    return {"mlflow.source.git.commit": commit.stdout.strip(), "kf.git_commit": commit.stdout.strip(),
            "kf.git_dirty": "true" if dirty.stdout.strip() else "false"}
