"""Load and launch the exported kernels for the library op, with torch and cuda-python's driver bindings only.

The kernel is decided once per (device, dtype, M, N): the table's rule, then first-call tuning among the dtype's
kernels (kernels/tune.py; KF_TUNE=0: the rule alone). The launch is decided once per (device, table, kernel, dtype,
M, N, pointer alignments) and cached as a `Launcher`: loaded
functions, a prebuilt CUlaunchConfig per step and a packed argument buffer, so that a call only writes its tensors'
addresses into that buffer and calls cuLaunchKernelEx (profiled in docs/op.md). On a GPU that is not sm_90 the
source shipped with the table is JIT-compiled for that GPU with NVRTC when it compiles there; the op says once, with
a warning, when it must run its torch reference instead.
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

from . import recipe as recipes
from . import tune
from .table import Kernel, Table, TableError

OPS_DIR = Path(__file__).resolve().parent / "ops"
PORTABLE_CLUSTER = 8      # CTAs per cluster any sm_90 launch may use; beyond, a kernel must allow non-portable sizes
DTYPE_NAMES = {"torch.bfloat16": "bfloat16", "torch.float16": "float16", "torch.float32": "float32"}


class _Dim3Cluster(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class _LaunchAttribute(ctypes.Structure):
    """CUlaunchAttribute: an id, 4 bytes of padding and a 64-byte value union (here its clusterDim member)."""
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("cluster", _Dim3Cluster),
                ("rest", ctypes.c_char * (64 - ctypes.sizeof(_Dim3Cluster)))]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig, as cuLaunchKernelEx reads it."""
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


CLUSTER_DIMENSION = 4          # CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
_LIBCUDA: Any = None


def _libcuda() -> Any:
    """The driver's cuLaunchKernelEx through ctypes: a launch costs about a microsecond of host time this way, a
    few times less than through the bindings' object conversions (measured in docs/results/op/)."""
    global _LIBCUDA
    if _LIBCUDA is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuLaunchKernelEx.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        lib.cuLaunchKernelEx.restype = ctypes.c_int
        _LIBCUDA = lib
    return _LIBCUDA


class LaunchError(RuntimeError):
    """A driver call failed while loading or launching an exported kernel; the message names the call."""


def _check(result: tuple, what: str) -> Any:
    from cuda.bindings import driver
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        raise LaunchError(f"{what} failed: {err.name}")
    return result[1] if len(result) > 1 else None


def cache_dir() -> Path:
    """Where cubins JIT-built for other GPUs are kept: the per-user cache folder (XDG), kernel-factory/ops."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kernel-factory" / "ops"


def _context(index: int) -> None:
    """Make device `index`'s primary context (the one torch uses) current on this thread."""
    from cuda.bindings import driver
    ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(ctx) != 0 and _CONTEXTS.get(index) == int(ctx):
        return
    device = _check(driver.cuDeviceGet(index), "cuDeviceGet")
    primary = _check(driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
    _check(driver.cuCtxSetCurrent(primary), "cuCtxSetCurrent")
    _CONTEXTS[index] = int(primary)


_CONTEXTS: dict[int, int] = {}


def jit_cubin(kernel: Kernel, arch: str) -> bytes | None:
    """The kernel's shipped source compiled with NVRTC for `arch` (e.g. "sm_100a"), cached per user; None when no
    source was shipped or it does not compile for that GPU."""
    source = kernel.source()
    if source is None:
        return None
    import hashlib
    key = hashlib.sha256(f"{arch}\n{source}".encode()).hexdigest()[:24]
    path = cache_dir() / f"{key}.cubin"
    if path.is_file():
        return path.read_bytes()
    from cuda.core import Program, ProgramOptions
    try:
        program = Program(source, "c++", ProgramOptions(arch=arch, std="c++17"))
        cubin = bytes(program.compile("cubin").code)
    except Exception:   # NVRTC's own error: the template needs features this GPU lacks (clusters, TMA)
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(cubin)
    return cubin


class Module:
    """One cubin loaded in one device's primary context; functions looked up once. A function's dynamic shared
    memory limit only ever rises (an attribute of the function, shared by every launch of it), and non-portable
    cluster sizes are allowed once."""

    def __init__(self, cubin: bytes):
        from cuda.bindings import driver
        self.handle = _check(driver.cuModuleLoadData(cubin), "cuModuleLoadData")
        self.functions: dict[str, Any] = {}
        self.smem: dict[str, int] = {}
        self.wide: set[str] = set()

    def function(self, name: str, smem: int, cluster: int) -> Any:
        from cuda.bindings import driver
        if name not in self.functions:
            self.functions[name] = _check(driver.cuModuleGetFunction(self.handle, name.encode()),
                                          f"cuModuleGetFunction({name})")
        fn, attr = self.functions[name], driver.CUfunction_attribute
        if smem > self.smem.get(name, 0):
            _check(driver.cuFuncSetAttribute(fn, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
                   f"allowing {smem} B of dynamic shared memory for {name}")
            self.smem[name] = smem
        if cluster > PORTABLE_CLUSTER and name not in self.wide:
            _check(driver.cuFuncSetAttribute(fn, attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
                   f"allowing clusters of {cluster} for {name}")
            self.wide.add(name)
        return fn


class Launcher:
    """A recipe evaluated for one (M, N, alignments) and made ready: per step the function, a CUlaunchConfig and a
    packed argument buffer (one 8-byte slot per argument). launch() writes the tensors' addresses into their slots,
    sets the stream and calls cuLaunchKernelEx: nothing else happens per call."""

    def __init__(self, module: Module, plan: recipes.Plan):
        self.buffers = plan.buffers
        self.steps: list[tuple[int, _LaunchConfig, int, int, list[tuple[int, str]], Any, Any]] = []
        for step in plan.steps:
            (gx, gy, gz), (bx, by, bz), cluster = step.grid3, step.block3, step.cluster3
            fn = module.function(step.kernel, step.smem, cluster[0] * cluster[1] * cluster[2])
            cfg = _LaunchConfig(gx, gy, gz, bx, by, bz, step.smem, None, None, 0)
            attrs = None
            if cluster != (1, 1, 1):
                attrs = (_LaunchAttribute * 1)()
                attrs[0].id, attrs[0].cluster = CLUSTER_DIMENSION, _Dim3Cluster(*cluster)
                cfg.attrs, cfg.numAttrs = attrs, 1
            values = (ctypes.c_uint64 * len(step.args))()
            slots = []
            for i, (kind, arg) in enumerate(step.args):
                if kind == "ptr":
                    slots.append((i, arg))
                else:   # the value's bits in the slot's low bytes (little-endian)
                    values[i] = recipes.pack(kind, arg)
            pointers = (ctypes.c_void_p * len(step.args))(
                *(ctypes.addressof(values) + 8 * i for i in range(len(step.args))))
            self.steps.append((int(fn), cfg, ctypes.addressof(cfg), ctypes.addressof(pointers), slots, values,
                               (pointers, attrs)))
        self.lock = threading.Lock()
        self.driver = _libcuda()

    def launch(self, stream: int, tensors: Mapping[str, Any]) -> None:
        """Launch every step on the raw CUstream handle `stream`."""
        with self.lock:
            for fn, cfg, cfg_address, params, slots, values, _ in self.steps:
                for i, name in slots:
                    values[i] = tensors[name].data_ptr()
                cfg.hStream = stream
                err = self.driver.cuLaunchKernelEx(cfg_address, fn, params, None)
                if err:
                    from cuda.bindings import driver
                    raise LaunchError(f"cuLaunchKernelEx failed: {driver.CUresult(err).name}")


_EVERY: list["Kernels"] = []   # every Kernels made in this process, for picks()


def picks(dtype: str, m: int, n: int) -> dict[str, dict[str, str]]:
    """What this process's ops ran for (dtype, M, N) so far, per problem: the genome first-call tuning kept
    ('kernel', on any device) and the table rule's own pick ('rule'), so that a bench can say which kernel the op's
    time is."""
    out = {}
    for kernels in list(_EVERY):
        tuned = [k for (_, d, mm, nn), k in list(kernels._tuned.items()) if (d, mm, nn) == (dtype, m, n)]
        rule = kernels._chosen.get((dtype, m, n))
        if tuned or rule is not None:
            out[kernels.problem] = {**({"kernel": tuned[0].genome} if tuned else {}),
                                    **({"rule": rule.genome} if rule is not None else {})}
    return out


class Kernels:
    """One problem's exported kernels as the op runs them: the table read lazily, a module per (cubin, device), a
    Launcher per (device, dtype, M, N, alignments)."""

    def __init__(self, problem: str, table_path: str | Path | None = None):
        _EVERY.append(self)
        self.problem = problem
        self.table_path = Path(table_path) if table_path else OPS_DIR / f"{problem}.json"
        self._table: Table | None = None
        self._modules: dict[tuple[str, int], Module | None] = {}
        self._launchers: dict[tuple, Launcher] = {}
        self._why: dict[tuple[int, str], str | None] = {}
        self._aligned: dict[tuple[str, str], list[str]] = {}   # the tensors whose alignment a recipe reads
        self._chosen: dict[tuple[str, int, int], Kernel | None] = {}
        self._fast: dict[tuple, Launcher] = {}   # (device, dtype, M, N, eps, tuning) -> launcher, for recipes that
        self._lock = threading.Lock()            # read no alignment (the common case: one dict lookup per call)
        self._tuned: dict[tuple[int, str, int, int], Kernel] = {}   # (device, dtype, M, N) -> the tuned pick
        self._tune_lock = threading.Lock()
        self._choices: tune.Choices | None = None
        self._names: dict[int, str] = {}

    @property
    def table(self) -> Table:
        if self._table is None:
            self._table = Table(self.table_path)
        return self._table

    def why_not(self, index: int, dtype: str, capability: Callable[[int], tuple[int, int]]) -> str | None:
        """None when (device index, dtype) can run an exported kernel, else why the reference runs (decided once)."""
        key = (index, dtype)
        if key not in self._why:
            self._why[key] = self._why_not(index, dtype, capability)
        return self._why[key]

    def _why_not(self, index: int, dtype: str, capability: Callable[[int], tuple[int, int]]) -> str | None:
        try:
            kernel = self.table.kernel(dtype, 1, 1)
        except TableError as exc:
            return str(exc)
        if kernel is None:
            return f"the {self.problem} table has no {dtype} kernels"
        major, minor = capability(index)
        if (major, minor) == (9, 0):
            return None
        return None if self.module(kernel, index) is not None else (
            f"cuda:{index} is sm_{major}{minor}: the shipped cubins are {kernel.arch} and the kernel's source does "
            f"not compile for this GPU")

    def module(self, kernel: Kernel, index: int) -> Module | None:
        key = (f"{kernel.genome}:{kernel.dtype}", index)
        with self._lock:
            if key not in self._modules:
                _context(index)
                import torch
                major, minor = torch.cuda.get_device_capability(index)
                cubin = kernel.cubin() if (major, minor) == (9, 0) else jit_cubin(kernel, f"sm_{major}{minor}a")
                self._modules[key] = Module(cubin) if cubin is not None else None
            return self._modules[key]

    def loaded(self, kernel: Kernel, index: int) -> Module:
        """module(), or LaunchError where the kernel has no cubin for this GPU (not a tuning candidate there)."""
        found = self.module(kernel, index)
        if found is None:
            raise LaunchError(f"{kernel.genome}:{kernel.dtype} has no cubin for this GPU")
        return found

    def kernel(self, dtype: str, m: int, n: int) -> Kernel | None:
        """The table's choice for (dtype, M, N), decided once."""
        key = (dtype, m, n)
        if key not in self._chosen:
            if len(self._chosen) > 65536:
                self._chosen.clear()
            self._chosen[key] = self.table.kernel(dtype, n, m)
        return self._chosen[key]

    def launcher(self, index: int, dtype: str, m: int, n: int, eps: float,
                 tensors: Mapping[str, Any]) -> Launcher:
        """The cached launcher for this call's key; made (kernel chosen, tuned on first use unless tuning is off,
        recipe evaluated, functions loaded) on first use."""
        tuning = tune.enabled()
        fast = self._fast.get((index, dtype, m, n, eps, tuning))
        if fast is not None:
            return fast
        kernel, final = self.kernel(dtype, m, n), True
        if tuning:
            kernel, final = self.tuned(index, dtype, m, n, kernel,
                                       lambda k: self._runner(index, k, dtype, m, n, eps, tensors))
        found, anywhere = self._made(index, kernel, dtype, m, n, eps, tensors)
        if anywhere and final:
            self._fast[(index, dtype, m, n, eps, tuning)] = found
        return found

    def _made(self, index: int, kernel: Kernel, dtype: str, m: int, n: int, eps: float,
              tensors: Mapping[str, Any]) -> tuple[Launcher, bool]:
        """(kernel's launcher for this call, whether it serves any pointer alignment)."""
        names = self._aligned.get((kernel.genome, dtype))
        if names is None:
            names = self._aligned[(kernel.genome, dtype)] = recipes.aligned_names(kernel.recipe)
        # Scratch buffers the op allocates per call come from torch's allocator: 256-byte aligned.
        addresses = {t: tensors[t].data_ptr() if t in tensors else 256 for t in names}
        key = (index, kernel.genome, dtype, m, n, eps, tuple(recipes.alignment(a) for a in addresses.values()))
        found = self._launchers.get(key)
        if found is None:
            plan = recipes.evaluate(kernel.recipe, m, n, eps, addresses)
            found = Launcher(self.loaded(kernel, index), plan)
            if len(self._launchers) > 4096:
                self._launchers.clear()
                self._fast.clear()
            self._launchers[key] = found
        return found, not names

    def _runner(self, index: int, kernel: Kernel, dtype: str, m: int, n: int, eps: float,
                tensors: Mapping[str, Any]) -> Callable[[], None]:
        """A launch of `kernel` on this call's tensors (with scratch buffers of its own), for tuning."""
        return runner(self._made(index, kernel, dtype, m, n, eps, tensors)[0], index, tensors)

    def in_reach(self, dtype: str, m: int, n: int, rule: Kernel | None = None) -> dict[str, Kernel]:
        """By genome id, every kernel a call of (dtype, M, N) may run: the rule's pick and each tuning candidate of the
        dtype whose region holds the call (what first-call tuning times)."""
        rule = rule or self.kernel(dtype, m, n)
        return {rule.genome: rule, **{k.genome: k for k in self.table.kernels_of(dtype, m, n)}}

    def tuned(self, index: int, dtype: str, m: int, n: int, rule: Kernel,
              runner_of: Callable[[Kernel], Callable[[], None]],
              timer: Callable[..., Mapping[str, Any]] | None = None) -> tuple[Kernel, bool]:
        """(the kernel this shape runs, whether that pick is for good): a pick made before (this process, then the
        table's choices on disk), else every kernel of the dtype timed on this call (kernels/tune.py) and the
        fastest kept. A call captured into a CUDA graph gets the rule's pick, not kept (False)."""
        key = (index, dtype, m, n)
        pick = self._tuned.get(key)
        if pick is not None:
            return pick, True
        with self._tune_lock:
            pick = self._tuned.get(key)
            if pick is not None:
                return pick, True
            if self._choices is None:
                self._choices = tune.Choices(tune.cache_path(self.problem, self.table.sha256, cache_dir().parent
                                                             / "tuned"))
            where = tune.Choices.key(self._device_name(index), dtype, m, n)
            kernels = self.in_reach(dtype, m, n, rule)
            gid = self._choices.get(where)
            if gid not in kernels:
                if tune.capturing():
                    return rule, False
                gid = rule.genome
                if len(kernels) > 1:
                    launches = {}
                    for g, k in kernels.items():
                        try:
                            launches[g] = runner_of(k)
                        except Exception:   # not loadable here (no cubin for this GPU, a damaged one): not a
                            continue        # candidate; the rule's pick fails on its own if it is the one
                    gid = tune.fastest((timer or tune.time_candidates)(launches, index)) or rule.genome
                self._choices.put(where, gid)
            self._tuned[key] = pick = kernels[gid]
            return pick, True

    def _device_name(self, index: int) -> str:
        if index not in self._names:
            import torch
            self._names[index] = torch.cuda.get_device_name(index)
        return self._names[index]


def runner(launcher: Launcher, index: int, tensors: Mapping[str, Any]) -> Callable[[], None]:
    """A zero-argument launch of `launcher` on `tensors` and scratch buffers of its own, on device index's current
    stream (as the call's own launch will be)."""
    import torch
    first = next(iter(tensors.values()))
    own = {**tensors, **{name: first.new_empty(shape, dtype=getattr(torch, dt))
                         for name, (dt, shape) in launcher.buffers.items()}}
    stream = torch._C._cuda_getCurrentRawStream(index)
    return lambda: launcher.launch(stream, own)
