"""Compile rendered CUDA source to sm_90a cubins with NVRTC (through cuda-python), in parallel on the CPU cores,
with an on-disk cache keyed by everything that changes the binary. Needs no GPU and no driver."""
from __future__ import annotations

import concurrent.futures as cf
import hashlib
import io
import json
import multiprocessing
import os
import re
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from ..types import BuildInfo, canonical_json

ARCH = "sm_90a"
STD = "c++17"


class ToolchainError(RuntimeError):
    """NVRTC or the CUDA headers are missing: an installation problem, not a candidate's failure."""


@dataclass(frozen=True)
class CompileJob:
    key: str
    source: str
    name: str          # file name shown in compiler messages
    sass: bool = False  # also disassemble the cubin and count its SASS opcodes (in the pool process)


@dataclass(frozen=True)
class CompileOutput:
    key: str
    cubin: bytes | None
    info: BuildInfo
    error: str | None  # the compiler log when compilation failed
    opcodes: dict[str, int] | None = None  # SASS mnemonic -> count, when the job asked for it and it worked


def nvrtc_version() -> str:
    try:
        from cuda.bindings import nvrtc
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:
        raise ToolchainError(f"NVRTC is not usable here: {exc}. Install cuda-toolkit[nvrtc]==13.0.*") from exc
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError(f"nvrtcVersion failed: {err}")
    return f"{major}.{minor}"


def include_dirs() -> list[str]:
    """cudart's headers (cuda_bf16.h, cuda_fp16.h) are required; CCCL's (cuda/std, cooperative groups) are used
    when present. Pip wheels first, then a system CUDA toolkit (GPU hosts often have one and no cccl wheel)."""
    import cuda.pathfinder as pathfinder
    dirs = {lib: pathfinder.find_nvidia_header_directory(lib) for lib in ("cudart", "cccl")}
    system = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include"
    if not dirs["cudart"] and (system / "cuda_bf16.h").is_file():
        dirs["cudart"] = str(system)
    if not dirs["cccl"] and (system / "cccl").is_dir():
        dirs["cccl"] = str(system / "cccl")
    if not dirs["cudart"]:
        raise ToolchainError("CUDA headers (cuda_bf16.h) not found; install cuda-toolkit[cudart,cccl]==13.0.*")
    return [d for d in dirs.values() if d]


def cache_key(body: str, toolchain: str) -> str:
    payload = canonical_json({"body": body, "arch": ARCH, "std": STD, "ptxas": ["-v"], "nvrtc": toolchain})
    return hashlib.sha256(payload.encode()).hexdigest()


_PTXAS = {
    "registers": re.compile(r"Used (\d+) registers"),
    "shared_bytes": re.compile(r"(\d+) bytes smem"),
    "local_bytes": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
}


def parse_ptxas(log: str) -> dict[str, int]:
    """Registers, shared memory, stack frame and spills from a `ptxas -v` report (first kernel listed)."""
    out = {}
    for field, pattern in _PTXAS.items():
        m = pattern.search(log)
        if m:
            out[field] = int(m.group(1))
    return out


def compile_one(job: CompileJob) -> CompileOutput:
    """Runs in a pool process. A compiler rejection is a value; a missing toolchain raises ToolchainError."""
    from cuda.core import Program, ProgramOptions
    opts = ProgramOptions(arch=ARCH, std=STD, ptxas_options=["-v"], name=job.name, include_path=include_dirs())
    log = io.StringIO()
    start = time.perf_counter()
    try:
        obj = Program(job.source, "c++", opts).compile("cubin", logs=log)
    except Exception as exc:
        if "DynamicLibNotFoundError" in type(exc).__name__:
            raise ToolchainError(str(exc)) from exc
        text = (log.getvalue() + "\n" + str(exc)).replace("\x00", "").strip()
        return CompileOutput(job.key, None, BuildInfo(compile_s=time.perf_counter() - start, log=text), text)
    text = log.getvalue().replace("\x00", "").strip()
    info = BuildInfo(compile_s=time.perf_counter() - start, log=text, **parse_ptxas(text))
    cubin = bytes(obj.code)
    return CompileOutput(job.key, cubin, info, None, count_opcodes(cubin) if job.sass else None)


def count_opcodes(cubin: bytes) -> dict[str, int] | None:
    """SASS opcode counts, or None where cuobjdump is missing or fails (the caller reports that)."""
    from . import sass
    try:
        return dict(sass.opcodes(sass.disassemble(cubin)))
    except (sass.SassUnavailable, RuntimeError, OSError, subprocess.SubprocessError):
        return None


class CompileCache:
    """cubin + build report per key, under DIR/ab/abcdef....{cubin,json}. Failures are cached too."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def _paths(self, key: str) -> tuple[Path, Path]:
        base = self.root / key[:2] / key
        return base.with_suffix(".cubin"), base.with_suffix(".json")

    def get(self, key: str) -> CompileOutput | None:
        cubin_path, meta_path = self._paths(key)
        try:
            meta = json.loads(meta_path.read_text())
            cubin = cubin_path.read_bytes() if meta["error"] is None else None
        except (OSError, ValueError, KeyError):
            return None
        info = BuildInfo(**{**meta["info"], "cached": True})
        return CompileOutput(key, cubin, info, meta["error"], meta.get("opcodes"))

    def put(self, out: CompileOutput) -> None:
        cubin_path, meta_path = self._paths(out.key)
        cubin_path.parent.mkdir(parents=True, exist_ok=True)
        if out.cubin is not None:
            _atomic_write(cubin_path, out.cubin)
        _atomic_write(meta_path, json.dumps({"info": out.info.to_json(), "error": out.error,
                                             "opcodes": out.opcodes}).encode())


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def lower_priority() -> None:
    """A compile process yields the CPU to the GPU worker: compiles may wait, a timing may not."""
    try:
        os.nice(10)
    except OSError:
        pass


class Compiler:
    """A pool of compile processes in front of the cache. compile_many yields outputs as they finish."""

    def __init__(self, cache_dir: str | Path, workers: int | None = None):
        self.cache = CompileCache(cache_dir)
        self.toolchain = nvrtc_version()
        include_dirs()  # fail early and clearly when headers are missing
        # One core is left to the GPU worker and the loop: a timed call's host path (a torch.compile baseline's
        # guards, a Triton launcher) starved by compiles leaks into its CUDA-event time.
        self.workers = max(1, workers or (os.cpu_count() or 2) - 1)
        self._pool: cf.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.compile_s = 0.0   # host seconds spent compiling (cache hits cost none): the run's accounting
        self.compiled = 0

    def key(self, body: str) -> str:
        return cache_key(body, self.toolchain)

    def compile_many(self, jobs: Iterable[CompileJob]) -> Iterator[CompileOutput]:
        pending = []
        for job in jobs:
            hit = self.cache.get(job.key)
            if hit is not None and (hit.opcodes is not None or not job.sass or hit.error is not None):
                yield hit
            else:
                pending.append(job)
        if pending:
            yield from self._compile(pending)

    def _compile(self, pending: list[CompileJob]) -> Iterator[CompileOutput]:
        """Compile what the cache does not hold, on the process pool (ray_backend.RayCompiler: as Ray tasks)."""
        with self._lock:   # steady-state search compiles from several threads
            if self._pool is None:
                self._pool = cf.ProcessPoolExecutor(self.workers, mp_context=multiprocessing.get_context("spawn"),
                                                    initializer=lower_priority)
        futures = [self._pool.submit(compile_one, job) for job in pending]
        for fut in cf.as_completed(futures):
            out = fut.result()
            self.done(out)
            yield out

    def done(self, out: CompileOutput) -> None:
        """A fresh compile: cached, and counted in the host's compile seconds."""
        self.cache.put(out)
        with self._lock:
            self.compile_s += out.info.compile_s
            self.compiled += 1

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None
