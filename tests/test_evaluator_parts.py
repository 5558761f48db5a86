"""Small evaluator pieces on the CPU: timing summaries, the throughput figure, recordings of a grown gene space,
restricted spaces, the launcher's kernel attributes, and the GPU worker's setup errors."""
import random

import pytest

from kernel_factory.evo.evaluate import measure, recording
from kernel_factory.evo.protocols import throughput
from kernel_factory.evo.types import EvalResult, Gene, GeneSpace, Genome, Status


def test_summary_is_median_and_iqr_and_says_which_ran_last():
    t = measure.summarize([5.0, 1.0, 3.0, 2.0, 4.0], last=1, graph=True)
    assert (t.median_us, t.iqr_us, t.reps, t.last, t.graph) == (3.0, 2.0, 5, 1, True)


def test_throughput_counts_only_live_timed_candidates():
    live = [EvalResult("a", Status.OK, 1.0, {"c": 1.0}, evaluator="gpu", gpu_s=0.3),
            EvalResult("b", Status.INCORRECT, evaluator="gpu", gpu_s=0.3),
            EvalResult("c", Status.OK, 1.0, {"c": 1.0}, evaluator="gpu", gpu_s=0.0),      # a reused answer
            EvalResult("d", Status.OK, 1.0, {"c": 1.0}, evaluator="replay", gpu_s=0.5)]   # replayed
    assert throughput(live) == pytest.approx(1 / (0.6 / 60))
    assert throughput(live[2:]) == 0.0


SPACE = GeneSpace((Gene("a", (1, 2), 1), Gene("b", ("x", "y"), "x"), Gene("new", (False, True), False)),
                  rule=lambda g: "no" if g["a"] == 2 and g["b"] == "y" else None)


def test_a_recording_of_an_older_space_answers_at_the_new_genes_defaults():
    old = Genome.of({"a": 2, "b": "x"})
    rec = recording.Recording({"space": {"a": [1, 2], "b": ["x", "y"]}},
                              {old.id: (old, EvalResult(old.id, Status.OK, times_us={"k": 1.0}))}, None)
    grown = recording.expand(rec, SPACE)
    (genome, result), = grown.entries.values()
    assert genome.gene_dict == {"a": 2, "b": "x", "new": False} and result.candidate_id == genome.id
    choices = recording.covered_choices(rec.header, SPACE)
    assert choices == {"a": (1, 2), "b": ("x", "y"), "new": (False,)}
    narrow = SPACE.restricted(choices)
    assert narrow["new"].choices == (False,) and len(list(narrow.enumerate())) == 3


def test_restricting_to_nothing_is_an_error():
    with pytest.raises(ValueError, match="gene a"):
        SPACE.restricted({"a": (7,)})


def _module(monkeypatch):
    """A launcher.Module over fake kernels "K" (main) and "D" (dw), recording the attributes it sets."""
    from kernel_factory.evo.evaluate import launcher
    calls = []
    monkeypatch.setattr(launcher, "set_attribute", lambda kernel, which, value, what: calls.append((kernel, which,
                                                                                                   value)))
    module = launcher.Module.__new__(launcher.Module)
    module.default_kernel, module._kernels, module._smem, module._wide = "main", {"main": "K", "dw": "D"}, {}, set()
    return module, calls


def test_dynamic_shared_memory_is_allowed_even_below_48_kb(monkeypatch):
    """The 48 KB default includes static shared memory: 47232 B dynamic beside 2064 B static fails to launch
    unless the kernel's limit is raised, so any dynamic amount not yet allowed is set (once)."""
    module, calls = _module(monkeypatch)
    for name, nbytes in (("main", 0), ("main", 47232), ("", 40000), ("main", 47232), ("dw", 100000)):
        module.allow_shared(name, nbytes)
    smem = "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES"
    assert calls == [("K", smem, 47232), ("D", smem, 100000)]


def test_clusters_above_eight_ctas_are_allowed_once_per_kernel(monkeypatch):
    """sm_90 launches clusters of up to 8 CTAs; 16 needs the kernel's non-portable attribute, set once."""
    module, calls = _module(monkeypatch)
    for name, cluster in (("main", None), ("main", (8, 1, 1)), ("main", (16, 1, 1)), ("", (16, 1, 1)),
                          ("dw", (4, 4, 1))):
        module.allow_cluster(name, cluster)
    wide = "CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED"
    assert calls == [("K", wide, 1), ("D", wide, 1)]


class FakeGpu:
    """Pools of known sizes in a GPU of `capacity` GiB: making one that does not fit raises torch's OOM."""

    def __init__(self, capacity: float):
        self.capacity, self.used, self.made, self.freed = capacity, 0.0, [], 0

    def make(self, case):
        import torch
        from types import SimpleNamespace
        size = case.shape[0] * case.shape[1] * 4 / 2**30
        if self.used + size > self.capacity:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size:.2f} GiB")
        self.used += size
        self.made.append(case.key)
        return SimpleNamespace(nbytes=int(size * 2**30), size=size)


def _pools(gpu):
    from kernel_factory.evo.evaluate import bench_pools

    def release():   # what freed pools held goes back (the worker's release_memory: gc, empty_cache)
        gpu.used = sum(p.size for p in pools.held.values())
        gpu.freed += 1
    pools = bench_pools.Pools(gpu.make, release)
    return pools


def test_pools_that_do_not_fit_together_are_made_when_used_the_least_recently_used_freed():
    """An fp32 panel with the benchmark rows did not fit in GPU memory together: the worker then made none. Now what
    fits is made up front, the rest when used, and a case is made again (the same seeds) after being freed."""
    from kernel_factory.evo.evaluate import bench_pools
    from kernel_factory.evo.types import Case
    gpu = FakeGpu(capacity=20.0)
    cases = [Case((1024 * k, 1 << 20), "float32") for k in (2, 3, 1, 2, 4)]   # 8, 12, 4, 8, 16 GiB
    pools = _pools(gpu)
    bench_pools.allocate_pools(pools, cases, 20 * 2**30)
    # 20 GiB: the third did not fit beside the first two; it fits alone, made with the oldest freed for room
    assert gpu.made == [c.key for c in cases[:3]] and list(pools.held) == [cases[1].key, cases[2].key]
    assert pools.get(cases[1]) and list(pools.held) == [cases[2].key, cases[1].key]   # used: now the most recent
    assert gpu.made.count(cases[1].key) == 1
    assert pools.get(cases[4]).size == 16 and list(pools.held) == [cases[4].key] and pools.remade == 3
    assert pools.get(cases[0]) and gpu.made.count(cases[0].key) == 2   # made again when used again


def test_a_case_that_does_not_fit_alone_is_a_clear_setup_error():
    import pytest
    from kernel_factory.evo.evaluate import bench_pools
    from kernel_factory.evo.types import Case
    wide = Case((8192, 262144 * random.choice((4, 5))), "float32")
    for cases in ([wide], [Case((8, 1 << 20), "float32"), wide]):
        with pytest.raises(bench_pools.SetupError) as err:
            bench_pools.allocate_pools(_pools(FakeGpu(capacity=20.0)), cases, 20 * 2**30)
        assert f"benchmark case {wide.key} does not fit in GPU memory (20 GiB on the GPU) even alone" in str(err.value)
        assert "-o shapes=MxN" in str(err.value)


def test_a_setup_error_reaches_the_parent_as_its_message_alone(monkeypatch):
    from kernel_factory.evo.evaluate import worker

    class Conn:
        def __init__(self):
            self.sent, self.inbox = [], [{"op": "setup"}]

        def recv(self):
            if not self.inbox:
                raise EOFError
            return self.inbox.pop(0)

        def send(self, msg):
            self.sent.append(msg)

    def start(msg):
        raise worker.SetupError("the input sets do not fit")
    monkeypatch.setattr(worker, "start", start)
    conn = Conn()
    worker.serve(conn)
    assert conn.sent == [{"op": "error", "message": "the input sets do not fit"}]


def test_a_worker_taken_over_frees_the_last_runs_pools_before_making_the_next(monkeypatch):
    """A campaign hands one worker from run to run (worker_process.parked_workers): the last run's input pools must be gone
    before the next run's are allocated, or both runs' inputs must fit at once (an H200 ran out of memory so)."""
    import multiprocessing
    import weakref
    from kernel_factory.evo.evaluate import worker

    class Bench:
        pass
    made, alive_at_setup = [], []

    def start(msg):
        alive_at_setup.append(made[-1]() is not None if made else None)
        bench = Bench()
        made.append(weakref.ref(bench))
        return bench, {"op": "ready"}
    monkeypatch.setattr(worker, "start", start)
    monkeypatch.setattr(worker, "release_memory", lambda: None)
    ours, theirs = multiprocessing.Pipe()
    for msg in ({"op": "setup"}, {"op": "setup"}, {"op": "stop"}):
        ours.send(msg)
    worker.serve(theirs)
    assert alive_at_setup == [None, False]
    assert ours.recv() == {"op": "ready"} and ours.recv() == {"op": "ready"}
