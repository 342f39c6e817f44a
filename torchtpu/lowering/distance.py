"""Pairwise distances: cdist, pdist and their gradients, written as JAX functions (one jaxfn.call each).

Semantics follow PyTorch's CPU kernels: p=2 uses the matmul expansion |a|²+|b|²-2a·b when the compute mode
asks for it (the default does for more than 25 rows), every other p the direct |a-b|_p; gradients are zero
where the distance is zero.
"""

from __future__ import annotations

import math

from .. import emit as E
from .. import jaxfn
from ..tables import lowering, out_meta


def _direct(x1, x2, p):
    import jax.numpy as jnp

    diff = jnp.abs(x1[..., :, None, :] - x2[..., None, :, :])
    if p == 0:
        return jnp.sum((diff != 0).astype(x1.dtype), -1)
    if p == 1:
        return jnp.sum(diff, -1)
    if p == 2:
        return jnp.sqrt(jnp.sum(diff * diff, -1))
    if math.isinf(p):
        return jnp.max(diff, -1, initial=0)
    return jnp.sum(diff**p, -1) ** (1.0 / p)


def _euclid(x1, x2):
    """PyTorch's expansion, one matmul over [-2a, |a|², 1]·[b, 1, |b|²] (same terms, same rounding shape)."""
    import jax.numpy as jnp

    n1 = jnp.sum(x1 * x1, -1, keepdims=True)
    n2 = jnp.sum(x2 * x2, -1, keepdims=True)
    a = jnp.concatenate([-2 * x1, n1, jnp.ones_like(n1)], -1)
    b = jnp.concatenate([x2, jnp.ones_like(n2), n2], -1)
    sq = jnp.matmul(a, jnp.swapaxes(b, -1, -2), precision="highest")
    return jnp.sqrt(jnp.maximum(sq, 0))


def _grad_terms(g, x1, x2, p, dist):
    """sum_j g_ij * d dist_ij / d x1_i, zero where dist_ij == 0."""
    import jax.numpy as jnp

    diff = x1[..., :, None, :] - x2[..., None, :, :]
    g = g[..., None]
    d = dist[..., None]
    zero = d == 0
    safe = jnp.where(zero, 1, d)
    if p == 0:
        t = jnp.zeros_like(diff)
    elif p == 1:
        t = g * jnp.sign(diff)
    elif p == 2:
        t = g * diff / safe
    elif math.isinf(p):
        t = g * jnp.sign(diff) * (jnp.abs(diff) == d)
    elif p < 2:
        t = jnp.sign(diff) * jnp.abs(diff) ** (p - 1) * g / safe ** (p - 1)
    else:
        t = diff * jnp.abs(diff) ** (p - 2) * g / safe ** (p - 1)
    return jnp.sum(jnp.where(zero, 0, t), -2)


def _call(tr, name, f, args, static):
    out = out_meta(tr)
    if any(a.numel == 0 for a in args):  # an empty batch or matrix: nothing to sum, zeros (as CPU returns)
        return E.const(tr.fn, 0, out.dtype, out.shape)
    cdt = E.acc_dtype(out.dtype)
    res = jaxfn.call(tr, name, f, [E.convert(a, cdt) for a in args], static)[0]
    return E.broadcast_to(E.convert(res, out.dtype), tuple(out.shape))


@lowering("_cdist_forward")
def cdist_forward(tr, x1, x2, p, compute_mode=None):
    rows = max(x1.shape[-2], x2.shape[-2])
    use_mm = p == 2 and (compute_mode == 1 or (compute_mode in (None, 0) and rows > 25))
    return _call(
        tr, "cdist", (lambda a, b: _euclid(a, b)) if use_mm else (lambda a, b: _direct(a, b, p)), [x1, x2], (p, use_mm)
    )


@lowering("_euclidean_dist")
def euclidean_dist(tr, x1, x2):
    return _call(tr, "euclidean_dist", _euclid, [x1, x2], ())


@lowering("_cdist_backward")
def cdist_backward(tr, grad, x1, x2, p, dist):
    return _call(tr, "cdist_backward", lambda g, a, b, d: _grad_terms(g, a, b, p, d), [grad, x1, x2, dist], (p,))


def _pairs(n):
    import numpy as np

    return np.triu_indices(n, 1)


@lowering("_pdist_forward")
def pdist_forward(tr, x, p=2.0):
    n = x.shape[0]
    if n < 2:
        return E.const(tr.fn, 0, out_meta(tr).dtype, out_meta(tr).shape)

    def f(a):
        i, j = _pairs(n)
        return _direct(a, a, p)[i, j]

    return _call(tr, "pdist", f, [x], (p,))


@lowering("_pdist_backward")
def pdist_backward(tr, grad, x, p, dist):
    n = x.shape[0]
    if n < 2:
        return E.const(tr.fn, 0, out_meta(tr).dtype, out_meta(tr).shape)

    def f(g, a, d):
        import jax.numpy as jnp

        i, j = _pairs(n)
        full = lambda v: jnp.zeros((n, n), v.dtype).at[i, j].set(v).at[j, i].set(v)  # noqa: E731
        return _grad_terms(full(g), a, a, p, full(d))

    return _call(tr, "pdist_backward", f, [grad, x, dist], (p,))
