"""Launch a problem's plan from a loaded cubin with cuda.core: one or several kernels in order, on torch's current
stream, with thread-block clusters and dynamic shared memory above the 48 KB default. Shared by the GPU worker,
the bench command and the exported library ops. Needs a GPU; imported lazily."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from ..protocols import Launch, launch_steps

PORTABLE_CLUSTER = 8   # CTAs per cluster any sm_90 launch may use; beyond, a kernel must allow non-portable sizes


class Module:
    """One loaded cubin: kernels looked up by name once, opt-in shared memory and non-portable cluster sizes
    allowed once per kernel."""

    def __init__(self, cubin: bytes, default_kernel: str):
        from cuda.core import ObjectCode
        self.code = ObjectCode.from_cubin(cubin)
        self.default_kernel = default_kernel
        self._kernels: dict[str, Any] = {}
        self._smem: dict[str, int] = {}
        self._wide: set[str] = set()

    def kernel(self, name: str) -> Any:
        name = name or self.default_kernel
        if name not in self._kernels:
            self._kernels[name] = self.code.get_kernel(name)
        return self._kernels[name]

    def allow_shared(self, name: str, nbytes: int) -> None:
        """Raise the kernel's dynamic shared memory limit to nbytes. The 48 KB default counts static shared memory
        too, so a plan just under 48 KB of dynamic memory can need it: raise it for any amount not yet allowed."""
        name = name or self.default_kernel
        if nbytes <= self._smem.get(name, 0):
            return
        set_attribute(self.kernel(name), "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", nbytes,
                      f"allow {nbytes} B of dynamic shared memory")
        self._smem[name] = nbytes

    def allow_cluster(self, name: str, cluster: tuple[int, int, int] | None) -> None:
        """Allow clusters above the portable size of 8 CTAs (sm_90 runs 16) for the kernel, once."""
        name = name or self.default_kernel
        if cluster is None or cluster[0] * cluster[1] * cluster[2] <= PORTABLE_CLUSTER or name in self._wide:
            return
        set_attribute(self.kernel(name), "CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED", 1,
                      f"allow clusters of {cluster}")
        self._wide.add(name)


def set_attribute(kernel: Any, which: str, value: int, what: str) -> None:
    from cuda.bindings import driver
    attr = getattr(driver.CUfunction_attribute, which)
    handle = kernel.handle
    if isinstance(handle, driver.CUkernel):
        err, dev = driver.cuCtxGetDevice()
        (err,) = driver.cuKernelSetAttribute(attr, value, handle, dev)
    else:
        (err,) = driver.cuFuncSetAttribute(handle, attr, value)
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cannot {what}: {err.name}")


_CONFIGS: dict[tuple, Any] = {}   # launch configurations by geometry: library ops call with the same few shapes


def config(step: Launch) -> Any:
    from cuda.core import LaunchConfig
    key = (step.grid, step.block, step.shared_bytes, step.cluster)
    if key not in _CONFIGS:
        grid, extra = step.grid, {}
        if step.cluster:
            # Launch.grid counts CTAs; with a cluster, cuda.core's grid counts clusters.
            grid = tuple(g // c for g, c in zip(step.grid, step.cluster))
            extra = {"cluster": step.cluster}
        if len(_CONFIGS) > 4096:
            _CONFIGS.clear()
        _CONFIGS[key] = LaunchConfig(grid=grid, block=step.block, shmem_size=step.shared_bytes, **extra)
    return _CONFIGS[key]


class Prepared:
    """A plan made ready to launch: per step its launch configuration, kernel and arguments (tensors as their
    addresses). With `names` (tensor id -> name), each tensor argument also keeps the name it came under, so that a
    later call can launch the same plan on other tensors of those names (what library ops do on every call)."""

    def __init__(self, module: Module, plan: Launch | Sequence[Launch], names: Mapping[int, str] | None = None):
        from cuda.core import launch
        self._launch = launch
        self.steps = []
        for step in launch_steps(plan):
            module.allow_shared(step.kernel, step.shared_bytes)
            module.allow_cluster(step.kernel, step.cluster)
            tensors = [i for i, a in enumerate(step.args) if hasattr(a, "data_ptr")]
            args = [a.data_ptr() if i in tensors else a for i, a in enumerate(step.args)]
            slots = tuple((i, names[id(step.args[i])]) for i in tensors) if names is not None else ()
            self.steps.append((config(step), module.kernel(step.kernel), args, slots))

    def arguments(self, addresses: Mapping[str, int] | None = None) -> list[list[Any]]:
        """Each step's arguments: as prepared, or with the named tensors at these addresses."""
        if addresses is None:
            return [args for _, _, args, _ in self.steps]
        out = []
        for _, _, args, slots in self.steps:
            args = list(args)
            for i, name in slots:
                args[i] = addresses[name]
            out.append(args)
        return out

    def launch(self, stream: Any, addresses: Mapping[str, int] | None = None) -> None:
        """Enqueue every step on `stream` (a cuda.core Stream)."""
        for (cfg, kernel, _, _), args in zip(self.steps, self.arguments(addresses)):
            self._launch(stream, cfg, kernel, *args)


def launcher(stream: Any, module: Module, plan: Launch | Sequence[Launch]) -> Callable[[], None]:
    """A zero-argument callable that enqueues every step of the plan on `stream` (a cuda.core Stream)."""
    prepared = Prepared(module, plan)
    return lambda: prepared.launch(stream)


_STREAMS: dict[tuple[int, int], Any] = {}


def torch_stream(index: int | None = None) -> Any:
    """torch's current CUDA stream on device `index` (default: the current device) as a cuda.core Stream
    (cuda.core and torch share the primary context); wrapped once per (device, stream), since library ops ask for
    it on every call."""
    import torch
    if index is None:
        index = torch.cuda.current_device()
    handle = torch.cuda.current_stream(index).cuda_stream
    make_current(index)
    stream = _STREAMS.get((index, handle))
    if stream is None:
        from cuda.core import Stream
        if len(_STREAMS) > 256:
            _STREAMS.clear()
        stream = _STREAMS[(index, handle)] = Stream.from_handle(handle)
    return stream


_PRIMARY: dict[int, int] = {}   # device index -> its primary context's handle


def make_current(index: int) -> None:
    """Bind device `index`'s primary context to the calling thread unless it is bound already. cuda.core launches
    through the driver API, which needs a context on the thread; a thread torch started (autograd runs backward
    on its own) may have none yet when nothing there has touched the CUDA runtime."""
    from cuda.bindings import driver
    _, ctx = driver.cuCtxGetCurrent()
    if index in _PRIMARY and int(ctx) == _PRIMARY[index]:
        return
    from cuda.core import Device
    Device(index).set_current()
    _PRIMARY[index] = int(driver.cuCtxGetCurrent()[1])
