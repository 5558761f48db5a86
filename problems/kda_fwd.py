"""KDA forward (Kimi Delta Attention, issue 31): the problem plugin. The math, FlashKDA's pre-processing and the
inputs' statistics are in kda_reference.py; the kernel template is kernels/kda_fwd.cu.

A shape is (heads, then each packed sequence's length): batch 1, sequences packed along the token axis and
delimited by `cu_seqlens` (RaggedShapes). K = V = 128, bf16 inputs, an fp32 initial state per sequence; the outputs
are o [T, H, V] (bf16) and the final state [N, H, K, V] (fp32). The template has two forms, chosen by the gene `form`:
the recurrent one, token by token, and the chunked one (kernels/kda_chunked.cuh), a triangular solve per chunk of
tokens, compiled and checked on the CPU but not yet run on a GPU (so `form` stays "recurrent" by default).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from ..evo.protocols import Launch, MissingBaseline, Peer, launch_from_recipe
from ..evo.types import Case, Gene, GeneSpace, GeneValue
from ..kernels import templates
from . import kda_reference as kda

HEAD = 128   # K and V

CHUNK_V = 64         # the chunked form's V slice: columns per CTA
CHUNK_THREADS = 256  # the chunked form's CTA: 4 threads per V column of the slice
K_PAD = HEAD + 1     # the chunked form's shared rows of K floats, padded so that rows start in different banks
RECURRENT_ONLY = ("v_block", "k_lanes")
CHUNKED_ONLY = ("chunk", "solve", "mma")
MMA_SP = CHUNK_V + 4  # the chunked form's shared copy of the state under mma=mma_sync: a row of CHUNK_V floats, padded

GENES = (
    Gene("v_block", (32, 64, 128), 64, doc="V columns per CTA (the grid has 128 / v_block slices per head)"),
    Gene("k_lanes", (1, 2, 4, 8), 4, doc="threads per V column, each holding 128 / k_lanes state rows in registers"),
    Gene("exp", ("approx", "precise"), "approx", kind="ptx",
         doc="ex2.approx.ftz.f32 of x * log2(e) | expf, for the decay and the sigmoids"),
    Gene("load", ("plain", "nc"), "nc", kind="ptx", doc="ld.global | ld.global.nc for the bf16 inputs"),
    Gene("form", ("recurrent", "chunked"), "recurrent",
         doc="token by token | by chunks of tokens, a unit lower-triangular solve per chunk (CPU-checked only)"),
    Gene("chunk", (16, 32, 64), 64, doc="chunked form: tokens per chunk"),
    Gene("solve", ("substitution", "neumann"), "substitution",
         doc="chunked form: forward substitution row by row | the product (I - N)(I + N^2)(I + N^4)... of "
             "the strictly lower N's powers, exact since N^chunk = 0 (chunks of NEUMANN_CHUNK only)"),
    Gene("mma", ("fma", "mma_sync"), "fma", kind="ptx",
         doc="chunked form: the chunk's dense products by CUDA-core FMAs | by mma.sync.m16n8k16 tiles (bf16 operands, "
             "fp32 accumulate; the state itself stays fp32)"),
)
# The product form's powers N^(2^j) grow like binomials where N's entries near 1 (alike keys, beta near 1, little
# decay): past chunks of 16 their fp32 sums cancel catastrophically (tests/test_kda_chunked.py), while random inputs,
# which the gate draws, hide it. Substitution stays exact there.
NEUMANN_CHUNK = 16
DEFAULTS = {g.name: g.default for g in GENES}


def _rule(g: Mapping[str, GeneValue]) -> str | None:
    """Each form reads only its own genes: the other form's stay at their defaults, so that they do not multiply
    the space with genomes that compile alike. The product form is kept to the chunks where fp32 holds it."""
    idle = CHUNKED_ONLY if g["form"] == "recurrent" else RECURRENT_ONLY
    for name in idle:
        if g[name] != DEFAULTS[name]:
            return f"{name}={g[name]!r} means nothing to form={g['form']}: keep it at its default {DEFAULTS[name]!r}"
    if g["form"] == "chunked" and g["solve"] == "neumann" and g["chunk"] != NEUMANN_CHUNK:
        return (f"solve=neumann loses fp32 to its powers of N at chunk={g['chunk']} where keys are alike: "
                f"needs chunk={NEUMANN_CHUNK}, or solve=substitution")
    return None


SPACE = GeneSpace(genes=GENES, rule=_rule)


def chunked_smem(g: Mapping[str, GeneValue]) -> int:
    """Bytes of dynamic shared memory the chunked kernel lays out (kda_chunked.cuh's CK_FLOATS; the kernel traps
    when given less): q, k and the cumulative gate as chunk x K_PAD floats; the solve's N, the output's B and, for
    the product form, N's powers as chunk x (chunk + 1); the updates chunk x CHUNK_V; the last cumulative gate per
    channel; beta and the two norms per token; under mma=mma_sync, a copy of the state (HEAD x MMA_SP)."""
    c = int(g["chunk"])
    square = c * (c + 1) * (3 if g["solve"] == "neumann" else 2)
    state_copy = HEAD * MMA_SP if g["mma"] == "mma_sync" else 0   # the tiles' copy of S, then the chunk's update
    return 4 * (3 * c * K_PAD + square + c * CHUNK_V + HEAD + 3 * c + state_copy)


# FlashKDA's benchmark (T = 8192 packed: one sequence, six mixed lengths, eight of 1024; H 96 and 64) and FLA's
# B4_T4096_H64; held out: other lengths and head counts, never searched.
MIXED = (1300, 547, 2048, 963, 271, 3063)
BENCHMARK = ((96, 8192), (96, *MIXED), (96, *(1024,) * 8), (64, 8192), (64, *MIXED), (64, *(1024,) * 8),
             (64, 4096, 4096, 4096, 4096))
CORRECTNESS = ((2, 5), (3, 1, 70, 17), (1, 130), (4, 64, 64))
HELDOUT = ((48, 3000, 5192), (128, 2048, 2048, 2048, 2048), (32, 777, 100, 4000, 1))
INPUTS = ("q", "k", "v", "g_raw", "beta_raw", "A_log", "dt_bias", "cu_seqlens", "initial_state")   # the op's order
# FLA's chunk_kda (Triton) with FlashKDA's pre-processing inside the call, and its own FlashKDA backend switched off
# (FLA_FLASH_KDA=0, as issue 31 asks): the wheels fla-core, flash-linear-attention and einops go to an offline host in
# a carry folder (docs/gpu-host.md).
PEERS = (Peer("fla", "FLA chunk_kda", "fla.ops.kda"), Peer("torch_eager", "torch chunked"))


class KdaForward:
    name = "kda_fwd"
    version = "1"
    description = ("Kimi Delta Attention forward (FlashKDA's pre-processing: L2-normalized q and k, sigmoid beta, "
                   "the safe gate in [-5, 0)); packed sequences by cu_seqlens, K = V = 128, bf16 inputs, fp32 state.")
    kernel_name = "kda_fwd"
    space = SPACE
    dtypes = ("bfloat16",)
    shape_sets = {"benchmark": BENCHMARK, "correctness": CORRECTNESS, "heldout": HELDOUT}
    baselines = ("torch_eager", "fla")
    declared_peers = PEERS
    peers = ("fla",)        # the best peer (torch's chunked form is a baseline, not a published kernel)
    fixed_dims = 1          # RaggedShapes: heads, then the sequences' lengths
    row_outputs = ()        # RowReference: a token's output depends on every token before it; compared whole
    deterministic = True

    def template(self) -> str:
        return templates.read("kda_fwd.cu")

    def bytes_moved(self, case: Case) -> int:
        heads, lengths = case.shape[0], case.shape[1:]
        tokens = sum(lengths) * heads
        # q, k, v and g_raw in, o out (bf16); beta_raw; each sequence's state in and out (fp32)
        return tokens * (5 * HEAD * 2 + 2) + 2 * len(lengths) * heads * HEAD * HEAD * 4

    def tolerance(self, dtype: str) -> tuple[float, float]:
        # o is bf16 (half an ulp: 2^-9 relative); the recurrence's fp32 sums over K and tokens add little beside it
        return (2e-2, 2e-2)

    def make_inputs(self, case: Case, seed: int, device: str) -> dict[str, Any]:
        return kda.make_inputs(case.shape[1:], case.shape[0], seed, device)

    def make_outputs(self, case: Case, device: str) -> dict[str, Any]:
        import torch
        heads, lengths = case.shape[0], case.shape[1:]
        return {"o": torch.empty(sum(lengths), heads, HEAD, dtype=torch.bfloat16, device=device),
                "final_state": torch.empty(len(lengths), heads, HEAD, HEAD, dtype=torch.float32, device=device)}

    def reference(self, inputs: Mapping[str, Any]) -> dict[str, Any]:
        return kda.reference(dict(inputs))

    def reference_rows(self, inputs: Mapping[str, Any], rows: Any) -> dict[str, Any]:
        return self.reference(inputs)

    def recipe(self, genes: Mapping[str, GeneValue], dtype: str) -> dict[str, Any]:
        """One CTA per (V slice, head, sequence), the sizes read off the tensors (heads from q, sequences from
        cu_seqlens); the op section: the raw inputs in, o like v and the final state like the initial state out.
        The recurrent form's slice is v_block columns of k_lanes threads each, in static shared memory; the
        chunked form's is CHUNK_V columns of CHUNK_THREADS threads, its chunk's matrices in dynamic shared memory."""
        if genes["form"] == "chunked":
            block, threads, smem = CHUNK_V, CHUNK_THREADS, {"smem": chunked_smem(genes)}
        else:
            block, smem = int(genes["v_block"]), {}
            threads = block * int(genes["k_lanes"])
        return {"let": [["heads", ["size", "q", 1]], ["sequences", ["sub", ["size", "cu_seqlens", 0], 1]]],
                "steps": [{"kernel": self.kernel_name,
                           "grid": {"x": HEAD // block, "y": "heads", "z": "sequences"},
                           "block": {"x": threads}, **smem,
                           "args": [*(["ptr", name] for name in (*INPUTS, "o", "final_state")),
                                    ["i32", "heads"], ["f32", HEAD ** -0.5]]}],
                "op": {"inputs": list(INPUTS),
                       "outputs": {"o": {"like": "v"}, "final_state": {"like": "initial_state"}},
                       "returns": ["o", "final_state"]}}

    def launch(self, genes: Mapping[str, GeneValue], case: Case, inputs: Mapping[str, Any],
               outputs: Mapping[str, Any]) -> tuple[Launch, ...]:
        return launch_from_recipe(self.recipe(genes, case.dtype), case, {**inputs, **outputs})

    def expected_sass(self, genes: Mapping[str, GeneValue], dtype: str) -> list[tuple[str, bool, str]]:
        """What each PTX choice leaves in the binary (opcode regex, present?, why); the GPU evaluator flags a
        candidate whose SASS contradicts its genes, and tests/test_kda_chunked.py checks the same on the CPU. The
        recurrent form's loads take the read-only path under either choice and its expf of A_log leaves expf's
        opcodes under either exp, so only load=nc is checked there; the chunked form writes ld.global out and takes
        A_log's exponential by the gene, so each choice of both genes shows, and mma=mma_sync alone has HMMA."""
        nc = genes["load"] == "nc"
        if genes["form"] == "recurrent":
            return [("LDG.E.U16.CONSTANT", True, "load=nc is ld.global.nc")] if nc else []
        return [(r"LDG\.E\.U16\.CONSTANT", nc, "load=nc reads the bf16 inputs by ld.global.nc"),
                (r"LDG\.E\.U16$", not nc, "load=plain reads the bf16 inputs by a plain ld.global"),
                (r"FFMA\.SAT", genes["exp"] == "precise", "exp=precise is expf, whose range reduction saturates; "
                                                           "exp=approx is ex2.approx.ftz alone"),
                (r"HMMA", genes["mma"] == "mma_sync", "mma=mma_sync takes the chunk's products on tensor cores; "
                                                      "mma=fma on CUDA cores only")]

    def baseline(self, name: str, case: Case, inputs: Mapping[str, Any]) -> Callable[[], Mapping[str, Any]]:
        if name == "torch_eager":   # the chunked form in torch, fp32 (chunks of 64 tokens)
            return lambda: kda.reference(dict(inputs))
        if name == "fla":
            return _fla(inputs)
        raise MissingBaseline(f"unknown baseline {name!r}; this problem has {', '.join(self.baselines)}")


def _fla(inputs: Mapping[str, Any]) -> Callable[[], Mapping[str, Any]]:
    """FLA's chunk_kda on the raw inputs (batch 1, packed), FlashKDA's gate, norms and sigmoid computed inside it."""
    os.environ.setdefault("FLA_FLASH_KDA", "0")
    try:
        from fla.ops.kda import chunk_kda
    except ImportError as exc:
        raise MissingBaseline(f"FLA is not installed here (fla-core: {exc})") from exc
    q, k, v, g, beta = (inputs[n][None] for n in ("q", "k", "v", "g_raw", "beta_raw"))
    cu = inputs["cu_seqlens"].long()
    dt_bias = inputs["dt_bias"].reshape(-1)

    def call() -> Mapping[str, Any]:
        o, state = chunk_kda(q, k, v, g, beta, scale=HEAD ** -0.5, initial_state=inputs["initial_state"],
                             output_final_state=True, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                             use_beta_sigmoid_in_kernel=True, safe_gate=True, lower_bound=kda.LOWER,
                             A_log=inputs["A_log"], dt_bias=dt_bias, cu_seqlens=cu)
        return {"o": o[0], "final_state": state}
    return call


problem = KdaForward()
