"""What every measurement is attached to: the GPU, its clocks, the driver, CUDA, NVRTC, torch, the peers' code (by
version and source commit) and the compilers that built it. Read without stopping a measurement: a query that
fails is recorded as unknown or absent."""
from __future__ import annotations

import datetime
import platform
import subprocess
from typing import Mapping


def _smi(query: str) -> str:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def clocks() -> str:
    return _smi("clocks.sm,clocks.mem,clocks.max.sm")


def fingerprint(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """GPU, SM count, driver, CUDA, NVRTC, torch and package versions, date: attached to every measurement."""
    import torch
    props = torch.cuda.get_device_properties(0)
    info = {"gpu": props.name, "sm_count": str(props.multi_processor_count),
            "gpu_memory_gib": f"{props.total_memory / 2**30:.0f}", "driver": _smi("driver_version"),
            "cuda_runtime": str(torch.version.cuda), "torch": torch.__version__,
            "python": platform.python_version(), "host": platform.node(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    try:
        from cuda.bindings import driver, nvrtc
        info["cuda_driver_api"] = str(driver.cuDriverGetVersion()[1])
        _, major, minor = nvrtc.nvrtcVersion()
        info["nvrtc"] = f"{major}.{minor}"
        import cuda.core
        info["cuda_core"] = cuda.core.__version__
    except Exception as exc:  # the fingerprint must never stop a measurement
        info["cuda_python"] = f"unavailable: {exc!r}"[:200]
    info.update(package_versions())
    info.update(peer_versions())
    info.update(compiler_versions())
    info.update(extra or {})
    return info


BASELINE_PACKAGES = ("triton", "quack-kernels", "liger-kernel", "nvidia-cutlass-dsl", "rmsnorm-h100")


def package_versions() -> dict[str, str]:
    """Versions of the packages that baselines come from ("absent" where not installed)."""
    from importlib import metadata
    out = {}
    for name in BASELINE_PACKAGES:
        try:
            out[f"pkg.{name}"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[f"pkg.{name}"] = "absent"
    return out


# The peers a bench compares against, by import name: what ran is the code that import finds, which may be a
# source checkout (INT21's kernels are built from one), so each is recorded by distribution version and by the
# git commit of the folder it was imported from.
PEERS = {"int21": "rmsnorm", "quack": "quack", "liger": "liger_kernel"}


def peer_versions(peers: Mapping[str, str] | None = None) -> dict[str, str]:
    """peer.<name>: where its import name resolves, its distribution's version, and the source commit of that
    folder (with "+dirty" for uncommitted changes). Found without importing it (an import may JIT-build)."""
    import importlib.util
    from importlib import metadata
    dists = metadata.packages_distributions()
    out = {}
    for peer, module in (peers or PEERS).items():
        try:
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not (spec.origin or spec.submodule_search_locations):
            out[f"peer.{peer}"] = f"absent (no module {module})"
            continue
        where = spec.origin if spec.origin not in (None, "namespace") else list(spec.submodule_search_locations)[0]
        versions = []
        for dist in dists.get(module, []):
            try:
                versions.append(f"{dist} {metadata.version(dist)}")
            except metadata.PackageNotFoundError:
                pass
        commit = source_commit(where)
        out[f"peer.{peer}"] = "; ".join([f"module {module} at {where}", *versions,
                                         f"commit {commit}" if commit else "no git checkout"])
    return out


def source_commit(path: str) -> str:
    """The git commit of the checkout that holds path (+dirty when it has uncommitted changes), or ""."""
    import os
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    try:
        head = subprocess.run(["git", "-C", folder, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(["git", "-C", folder, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""
    return head.stdout.strip() + ("+dirty" if dirty else "")


def compiler_versions() -> dict[str, str]:
    """The compilers that build the peers' code here: nvcc and the host C++ compiler (INT21's JIT extension via
    torch), Triton (Liger), the CUTLASS DSL (QuACK) and torch's CUDA; "absent" where there is none."""
    from importlib import metadata
    out = {}
    for name, cmd in (("nvcc", ["nvcc", "--version"]), ("cxx", ["c++", "--version"])):
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
            lines = [line for line in run.stdout.splitlines() if line.strip()]
            release = [line for line in lines if "release" in line]   # nvcc: "... release 13.0, V13.0.88"
            out[f"compiler.{name}"] = (release or lines)[0].strip() if run.returncode == 0 and lines else "absent"
        except (OSError, subprocess.SubprocessError):
            out[f"compiler.{name}"] = "absent"
    for dist in ("triton", "nvidia-cutlass-dsl"):
        try:
            out[f"compiler.{dist}"] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[f"compiler.{dist}"] = "absent"
    return out
