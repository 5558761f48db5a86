"""torch.compile baselines that prove they measured compiled code.

A compiled function's cache lives on its code object, and dynamo stops compiling a code object after
`recompile_limit` shapes: past it, the wrapper silently runs the Python function eagerly, and a "torch.compile"
time is eager's. So each case gets a fresh code object (its own cache, compiled for exactly its shapes), and a
backend that counts the calls into the compiled graph: a call that did not enter it raises NotCompiled, so a
baseline can never report eager time under torch.compile's name. Problem plugins import this module (like
protocols and inputs).
"""
from __future__ import annotations

import re
import types
from typing import Any, Callable

COMPILE_BACKEND = "inductor"   # what torch.compile uses by default; tests swap in "eager" (same dynamo, no codegen)
_BY_KEY: dict[str, "CompiledBaseline"] = {}


class NotCompiled(RuntimeError):
    """A torch.compile baseline's call ran outside its compiled graph (recompile limit hit, or a graph break)."""


class CompiledBaseline:
    """`fn` compiled (fullgraph, static shapes) for one case under its own code object; calling it returns fn's
    result and raises NotCompiled unless exactly one call into the compiled graph happened."""

    def __init__(self, fn: Callable[..., Any], key: str, backend: str | None = None, fullgraph: bool = True):
        import torch
        self.key = key
        self.backend = backend or COMPILE_BACKEND
        self.graph_calls = 0
        self.compiles = 0
        name = f"{fn.__name__}__{re.sub(r'[^0-9A-Za-z_]', '_', key)}"
        code = fn.__code__.replace(co_name=name, co_qualname=name)
        fresh = types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)
        self.compiled = torch.compile(fresh, backend=self._count, dynamic=False, fullgraph=fullgraph)

    def _count(self, gm: Any, example_inputs: Any) -> Callable[..., Any]:
        from torch._dynamo.backends.registry import lookup_backend
        inner = lookup_backend(self.backend)(gm, example_inputs)
        self.compiles += 1

        def run(*args: Any) -> Any:
            self.graph_calls += 1
            return inner(*args)
        return run

    def __call__(self, *args: Any) -> Any:
        import torch
        before = self.graph_calls
        try:
            out = self.compiled(*args)
        except (torch._dynamo.exc.Unsupported, torch._dynamo.exc.FailOnRecompileLimitHit) as exc:
            # fullgraph: a graph break or the recompile limit is dynamo's own error rather than eager code
            raise NotCompiled(f"torch.compile baseline for {self.key} cannot run compiled: {exc}"[:2000]) from exc
        if self.graph_calls != before + 1:
            raise NotCompiled(f"torch.compile baseline for {self.key} ran {self.graph_calls - before} compiled "
                              f"graph calls instead of 1 (recompile limit or graph break): its time would be "
                              f"eager's, not torch.compile's")
        return out


def compiled_for(fn: Callable[..., Any], key: str) -> CompiledBaseline:
    """The compiled baseline of fn for a case key (and device), made once per process and reused for that key."""
    full = f"{fn.__module__}.{fn.__name__}:{key}:{COMPILE_BACKEND}"
    if full not in _BY_KEY:
        _BY_KEY[full] = CompiledBaseline(fn, key)
    return _BY_KEY[full]
