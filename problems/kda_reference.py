"""Kimi Delta Attention (KDA) forward, the math of issue 31's problem: FlashKDA's in-kernel pre-processing, the
step-by-step recurrence that defines the op, and the same op by chunks, fast enough to be the gate's reference on
FlashKDA's workloads (`8192` tokens, `96` heads).

Per head, with a state S of K x V, for each token t of a sequence:
    S <- diag(exp(g_t)) S;   S <- S + beta_t k_t (v_t - k_t^T S)^T;   o_t = scale * q_t^T S
q and k are L2-normalized first, beta = sigmoid(beta_raw), and the per-channel log-decay is the safe gate
g = lower * sigmoid(exp(A_log) * (g_raw + dt_bias)), in [lower, 0). Sequences are packed along the token axis
(batch 1) and delimited by `cu_seqlens`; each starts from its own initial state (or zeros) and ends in its own
final state.

By chunks of C tokens (G the decay summed within the chunk, per channel; S0 the state at the chunk's start), the
update each token makes is u_s = beta_s (v_s - (e^{G_s} k_s)^T S0 - sum_{r<s} A_sr u_r), with
A_sr = sum_k k_s k_r e^{G_s - G_r}: a unit lower-triangular system (I + diag(beta) A) U = diag(beta) (V - K_d S0),
solved by forward substitution. Then o_t = scale ((e^{G_t} q_t)^T S0 + sum_{r<=t} B_tr u_r) with
B_tr = sum_k q_t k_r e^{G_t - G_r}, and S_C = diag(e^{G_C}) S0 + sum_r (e^{G_C - G_r} k_r) u_r^T. Every exponent
is at most zero, so nothing overflows however long the chunk.
"""
from __future__ import annotations

import itertools
from typing import Any, Sequence

LOWER = -5.0          # FlashKDA's safe-gate bound: each token decays a channel by at most e^-5
NORM_EPS = 1e-6       # the L2 normalization's floor


def _torch():
    import torch
    return torch


def safe_gate(g_raw: Any, a_log: Any, dt_bias: Any, lower: float = LOWER) -> Any:
    """g = lower * sigmoid(exp(A_log) * (g_raw + dt_bias)) for g_raw [T, H, K], A_log [H], dt_bias [H, K]."""
    torch = _torch()
    rate = torch.exp(a_log.float())[:, None]
    return lower * torch.sigmoid(rate * (g_raw.float() + dt_bias.float()))


def l2norm(x: Any) -> Any:
    torch = _torch()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + NORM_EPS)


def prepare(inputs: dict[str, Any], dtype: Any = None) -> dict[str, Any]:
    """The raw inputs (q, k, v, g_raw, beta_raw, A_log, dt_bias) as the recurrence takes them: q and k normalized,
    beta a sigmoid, g the safe gate; in `dtype` (fp32 unless asked), on the inputs' device."""
    torch = _torch()
    dtype = dtype or torch.float32
    return {"q": l2norm(inputs["q"].to(dtype)), "k": l2norm(inputs["k"].to(dtype)), "v": inputs["v"].to(dtype),
            "g": safe_gate(inputs["g_raw"], inputs["A_log"], inputs["dt_bias"]).to(dtype),
            "beta": torch.sigmoid(inputs["beta_raw"].to(dtype))}


def bounds(cu_seqlens: Any) -> list[tuple[int, int]]:
    """[(start, end)] of each packed sequence; a bad cu_seqlens raises ValueError saying why."""
    cu = [int(c) for c in cu_seqlens]
    if len(cu) < 2 or cu[0] != 0 or any(b < a for a, b in zip(cu, cu[1:])):
        raise ValueError(f"cu_seqlens {cu}: starts at 0, holds at least one sequence and never decreases")
    return list(zip(cu, cu[1:]))


def _initial(state: Any, n: int, h: int, kd: int, vd: int, like: Any) -> Any:
    torch = _torch()
    if state is None:
        return torch.zeros(n, h, kd, vd, dtype=like.dtype, device=like.device)
    if tuple(state.shape) != (n, h, kd, vd):
        raise ValueError(f"initial_state has shape {tuple(state.shape)}; want (sequences, heads, K, V) = "
                         f"{(n, h, kd, vd)}")
    return state.to(like.dtype)


def recurrent(q: Any, k: Any, v: Any, g: Any, beta: Any, cu_seqlens: Sequence[int], scale: float | None = None,
              initial_state: Any = None) -> tuple[Any, Any]:
    """(o [T, H, V], final state [N, H, K, V]) token by token, in the inputs' dtype: the op's definition. q, k, g
    [T, H, K]; v [T, H, V]; beta [T, H]; already prepared (see prepare)."""
    torch = _torch()
    t_total, h, kd = q.shape
    vd = v.shape[-1]
    scale = kd ** -0.5 if scale is None else scale
    spans = bounds(cu_seqlens)
    states = _initial(initial_state, len(spans), h, kd, vd, q).clone()
    o = torch.empty(t_total, h, vd, dtype=q.dtype, device=q.device)
    for i, (start, end) in enumerate(spans):
        s = states[i]
        for t in range(start, end):
            s = s * torch.exp(g[t])[..., None]
            u = beta[t][:, None] * (v[t] - torch.einsum("hk,hkv->hv", k[t], s))
            s = s + k[t][..., None] * u[:, None, :]
            o[t] = scale * torch.einsum("hk,hkv->hv", q[t], s)
        states[i] = s
    return o, states


def chunked(q: Any, k: Any, v: Any, g: Any, beta: Any, cu_seqlens: Sequence[int], scale: float | None = None,
            initial_state: Any = None, chunk: int = 64) -> tuple[Any, Any]:
    """recurrent()'s outputs computed by chunks of `chunk` tokens (the module's docstring has the algebra)."""
    torch = _torch()
    t_total, h, kd = q.shape
    vd = v.shape[-1]
    scale = kd ** -0.5 if scale is None else scale
    spans = bounds(cu_seqlens)
    states = _initial(initial_state, len(spans), h, kd, vd, q).clone()
    o = torch.empty(t_total, h, vd, dtype=q.dtype, device=q.device)
    for i, (start, end) in enumerate(spans):
        s = states[i]
        for c0 in range(start, end, chunk):
            c1 = min(c0 + chunk, end)
            qc, kc, vc, bc = (x[c0:c1].transpose(0, 1) for x in (q, k, v, beta))   # heads first
            gc = g[c0:c1].transpose(0, 1).cumsum(1)                                  # [H, C, K]
            n = c1 - c0
            gap = gc[:, :, None, :] - gc[:, None, :, :]                              # [H, C(t), C(r), K]
            strictly, upto = (torch.ones(n, n, dtype=torch.bool, device=q.device).tril(d) for d in (-1, 0))
            decay = torch.exp(gap.masked_fill(~upto[None, :, :, None], 0.0))
            a = torch.einsum("hsk,hrk,hsrk->hsr", kc, kc, decay) * strictly
            b = torch.einsum("htk,hrk,htrk->htr", qc, kc, decay) * upto
            rhs = bc[..., None] * (vc - torch.einsum("hck,hkv->hcv", torch.exp(gc) * kc, s))
            lower = torch.eye(n, dtype=q.dtype, device=q.device) + bc[..., None] * a
            u = torch.linalg.solve_triangular(lower, rhs, upper=False, unitriangular=True)
            out = torch.einsum("hck,hkv->hcv", torch.exp(gc) * qc, s) + b @ u
            o[c0:c1] = (scale * out).transpose(0, 1)
            last = gc[:, -1:, :]                                                      # [H, 1, K]
            s = torch.exp(last[:, 0, :])[..., None] * s + \
                torch.einsum("hrk,hrv->hkv", torch.exp(last - gc) * kc, u)
        states[i] = s
    return o, states


def make_inputs(lengths: Sequence[int], heads: int, seed: int, device: str = "cpu", head_k: int = 128,
                head_v: int = 128, dtype: Any = None, initial: bool = True) -> dict[str, Any]:
    """Raw inputs with FlashKDA's statistics for sequences of `lengths` packed in batch 1 (tensors [T, H, ...]; the
    batch axis is left out), drawn from `seed`: q, k, v normal; g_raw and beta_raw normal; A_log and dt_bias as a
    trained model holds them (decay rates spread over two orders of magnitude); an fp32 initial state of scale 0.1
    when `initial`."""
    torch = _torch()
    if not lengths or min(lengths) < 1:
        raise ValueError(f"lengths {list(lengths)}: one or more sequences of at least one token")
    dtype = dtype or torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(seed)
    t_total = sum(lengths)

    def normal(*shape: int, std: float = 1.0) -> Any:
        return torch.randn(*shape, generator=gen, device=device) * std

    out = {"q": normal(t_total, heads, head_k).to(dtype), "k": normal(t_total, heads, head_k).to(dtype),
           "v": normal(t_total, heads, head_v).to(dtype), "g_raw": normal(t_total, heads, head_k).to(dtype),
           "beta_raw": normal(t_total, heads).to(dtype),
           "A_log": torch.log(torch.empty(heads, device=device).uniform_(0.5, 16.0, generator=gen)),
           "dt_bias": normal(heads, head_k, std=0.5),
           "cu_seqlens": torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)}
    if initial:
        out["initial_state"] = normal(len(lengths), heads, head_k, head_v, std=0.1)
    return out


def reference(inputs: dict[str, Any], chunk: int = 64) -> dict[str, Any]:
    """The gate's expected outputs in fp32: o [T, H, V] and final_state [N, H, K, V]."""
    p = prepare(inputs)
    o, state = chunked(p["q"], p["k"], p["v"], p["g"], p["beta"], inputs["cu_seqlens"].tolist(),
                       initial_state=inputs.get("initial_state"), chunk=chunk)
    return {"o": o, "final_state": state}
