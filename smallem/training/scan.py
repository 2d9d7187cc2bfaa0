"""A gated linear recurrence, in float64, one step at a time: the reference the C scans of
``kernels_c/layers/scan.c`` are checked against.

For each of the BH (batch, head) pairs, with q_t, k_t, v_t vectors of hd numbers and a
log-decay lam_t <= 0 per step (the layer above computes lam = log sigmoid(gate logits) and
scales q; here lam is given)::

    S_0 = 0 (hd x hd),   S_t = exp(lam_t) S_{t-1} + k_t v_t^T,   o_t = S_t^T q_t

so o_t[j] = sum_i q_t[i] S_t[i][j]: each output reads a state that holds every earlier
k v^T product, decayed by the gates since. The backward is reverse-mode on that
recurrence, with every state kept (fine at test sizes): going back from the end with dS,
the gradient of S_t from the steps after t,

    dS += q_t dO_t^T,   dq_t = S_t dO_t,   dk_t = dS v_t,   dv_t = dS^T k_t,
    dlam_t = exp(lam_t) <dS, S_{t-1}>,   dS = exp(lam_t) dS   (now the gradient of S_{t-1}).

Arrays: q, k, v, dout (BH, T, hd); lam (BH, T).
"""

from __future__ import annotations

import numpy as np


def _inputs(*arrays):
    return [np.asarray(a, np.float64) for a in arrays]


def states(q, k, v, lam) -> tuple[np.ndarray, np.ndarray]:
    """(o, every state): o (BH, T, hd) and S_0 .. S_T as (BH, T + 1, hd, hd)."""
    q, k, v, lam = _inputs(q, k, v, lam)
    BH, T, hd = q.shape
    S = np.zeros((BH, T + 1, hd, hd))
    o = np.empty((BH, T, hd))
    for t in range(T):
        S[:, t + 1] = np.exp(lam[:, t])[:, None, None] * S[:, t] + k[:, t, :, None] * v[:, t, None, :]
        o[:, t] = np.einsum("bi,bij->bj", q[:, t], S[:, t + 1])
    return o, S


def reference_forward(q, k, v, lam) -> tuple[np.ndarray, np.ndarray]:
    """(o, final state): o (BH, T, hd) and S_T (BH, hd, hd)."""
    o, S = states(q, k, v, lam)
    return o, S[:, -1]


def checkpoints(q, k, v, lam, chunk: int) -> np.ndarray:
    """The states the C forwards keep: at the start of every chunk of ``chunk`` steps, then
    the final state, (BH, ceil(T / chunk) + 1, hd, hd)."""
    _, S = states(q, k, v, lam)
    T = S.shape[1] - 1
    return S[:, list(range(0, T, chunk)) + [T]]


def reference_backward(q, k, v, lam, dout) -> tuple[np.ndarray, ...]:
    """(dq, dk, dv, dlam): the gradients of sum(dout * o)."""
    q, k, v, lam, dout = _inputs(q, k, v, lam, dout)
    _, S = states(q, k, v, lam)
    BH, T, hd = q.shape
    dq, dk, dv = (np.empty((BH, T, hd)) for _ in range(3))
    dlam = np.empty((BH, T))
    dS = np.zeros((BH, hd, hd))
    for t in reversed(range(T)):
        a = np.exp(lam[:, t])
        dS += q[:, t, :, None] * dout[:, t, None, :]
        dq[:, t] = np.einsum("bij,bj->bi", S[:, t + 1], dout[:, t])
        dk[:, t] = np.einsum("bij,bj->bi", dS, v[:, t])
        dv[:, t] = np.einsum("bij,bi->bj", dS, k[:, t])
        dlam[:, t] = a * np.einsum("bij,bij->b", dS, S[:, t])
        dS *= a[:, None, None]
    return dq, dk, dv, dlam
