"""Scaled dot-product attention as one op each way (csrc/aten/attention.cpp routes
``F.scaled_dot_product_attention`` on tpu tensors here through PyTorch's "overrideable" backend).

``torchtpu_attn::sdpa(q, k, v, attn_mask?, is_causal, scale?) -> (out, logsumexp)`` and its backward are ops of
the op table like any other: in eager each is one program (the math path PyTorch uses otherwise is about 19 ops
forward), in fused mode they fuse with their neighbours, and the varying-length eager path has a rule for them
(shapes/rules_spatial.py) that keeps the (B, heads, L, L) scores inside the op instead of compacting them between
ops. The arithmetic follows PyTorch's math path: scores in float32 for half types, a boolean mask keeps where True,
a float mask adds, ``is_causal`` keeps the lower triangle aligned at the top left, a row with every key masked gives
zeros (torch's ``_safe_softmax``), and grouped query attention shares each key/value head among
``heads_q // heads_kv`` query heads. The backward recomputes the probabilities from the scores as the forward
did (the saved logsumexp, ``+inf`` for a fully masked row, is PyTorch's interface; recomputing from it rounds
every probability by the logsumexp's ulp, 1e-4 off CPU's float32 gradients on OpInfo's samples).
"""

from __future__ import annotations

import math

import torch

from .. import jaxfn
from ..tables import RULES

NAMESPACE = "torchtpu_attn"
_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define("sdpa(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool is_causal, float? scale) -> (Tensor, Tensor)")
_lib.define(
    "sdpa_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? attn_mask, Tensor out, Tensor logsumexp, "
    "bool is_causal, float? scale) -> (Tensor, Tensor, Tensor)"
)
SDPA = f"{NAMESPACE}::sdpa"
SDPA_BACKWARD = f"{NAMESPACE}::sdpa_backward"


@torch.library.register_fake(SDPA, lib=_lib)
def _sdpa_fake(q, k, v, attn_mask, is_causal, scale):
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.register_fake(SDPA_BACKWARD, lib=_lib)
def _sdpa_backward_fake(grad, q, k, v, attn_mask, out, logsumexp, is_causal, scale):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _static(mask, is_causal, scale, q):
    """What selects the JAX function besides the argument types: the mask's kind, causality and the scale."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return ("none" if mask is None else "bool" if mask.dtype == torch.bool else "add", bool(is_causal), s)


def _scores(q, k, mask, kind, causal, scale):
    """(B, Hq, Lq, Lk) scaled scores in float32 (or float64) with the masks applied as -inf, and the key/value head
    repeat factor."""
    import jax.numpy as jnp

    acc = jaxfn.acc_dtype(q.dtype)
    groups = q.shape[1] // k.shape[1]
    kk = jnp.repeat(k, groups, axis=1) if groups > 1 else k
    s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(acc), kk.astype(acc)) * jnp.asarray(scale, acc)
    neg = jnp.asarray(-jnp.inf, acc)
    if kind == "bool":
        s = jnp.where(mask, s, neg)
    elif kind == "add":
        s = s + mask.astype(acc)
    if causal:
        lq, lk = s.shape[-2:]
        s = jnp.where(jnp.tril(jnp.ones((lq, lk), bool)), s, neg)
    return s, groups


def _probs(s):
    """Softmax over the keys, by the row maximum (as PyTorch's kernels do: exp of the scores less the max loses
    less than exp of the scores less the logsumexp, whose rounding scales every probability), 0 where every key is
    masked; and the logsumexp (+inf for such a row)."""
    import jax.numpy as jnp

    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)
    e = jnp.exp(s - m)
    total = jnp.sum(e, axis=-1, keepdims=True)
    some = total > 0
    p = e / jnp.where(some, total, 1)
    return p, jnp.where(some, m + jnp.log(jnp.where(some, total, 1)), jnp.inf)[..., 0]


def _forward(kind, causal, scale):
    def f(q, k, v, *mask):
        import jax.numpy as jnp

        s, groups = _scores(q, k, mask[0] if mask else None, kind, causal, scale)
        p, lse = _probs(s)
        vv = jnp.repeat(v, groups, axis=1) if groups > 1 else v
        out = jnp.einsum("bhqk,bhkd->bhqd", p, vv.astype(p.dtype))
        return out.astype(q.dtype), lse.astype(jnp.float32)

    return f


def _backward(kind, causal, scale):
    def f(g, q, k, v, out, lse, *mask):
        import jax.numpy as jnp

        s, groups = _scores(q, k, mask[0] if mask else None, kind, causal, scale)
        acc = s.dtype
        p = _probs(s)[0]  # recomputed as the forward did (lse is the op's interface, unused: see _probs)
        vv = jnp.repeat(v, groups, axis=1) if groups > 1 else v
        kk = jnp.repeat(k, groups, axis=1) if groups > 1 else k
        ga, va = g.astype(acc), vv.astype(acc)
        gv = jnp.einsum("bhqk,bhqd->bhkd", p, ga)
        gp = jnp.einsum("bhqd,bhkd->bhqk", ga, va)
        rowdot = jnp.sum(ga * out.astype(acc), axis=-1, keepdims=True)
        gs = p * (gp - rowdot) * jnp.asarray(scale, acc)
        gq = jnp.einsum("bhqk,bhkd->bhqd", gs, kk.astype(acc))
        gk = jnp.einsum("bhqk,bhqd->bhkd", gs, q.astype(acc))
        if groups > 1:  # each key/value head's gradient sums over the query heads that shared it
            b, hk = k.shape[:2]
            gk = gk.reshape(b, hk, groups, *gk.shape[2:]).sum(2)
            gv = gv.reshape(b, hk, groups, *gv.shape[2:]).sum(2)
        return gq.astype(q.dtype), gk.astype(k.dtype), gv.astype(v.dtype)

    return f


def _check(name, q, k, v, mask):
    if q.rank != 4 or k.rank != 4 or v.rank != 4 or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"{name}: query {list(q.shape)}, key {list(k.shape)} and value {list(v.shape)} must be (batch, heads, "
            "length, dim) with the query's heads a multiple of the key's"
        )
    if mask is not None:
        torch.broadcast_shapes(tuple(mask.shape), (q.shape[0], q.shape[1], q.shape[2], k.shape[2]))


def sdpa(tr, q, k, v, attn_mask, is_causal, scale):
    _check("scaled_dot_product_attention", q, k, v, attn_mask)
    static = _static(attn_mask, is_causal, scale, q)
    args = [q, k, v] + ([attn_mask] if attn_mask is not None else [])
    return tuple(jaxfn.call(tr, "sdpa", _forward(*static), args, static))


def sdpa_backward(tr, grad, q, k, v, attn_mask, out, logsumexp, is_causal, scale):
    _check("scaled_dot_product_attention backward", q, k, v, attn_mask)
    static = _static(attn_mask, is_causal, scale, q)
    args = [grad, q, k, v, out, logsumexp] + ([attn_mask] if attn_mask is not None else [])
    return tuple(jaxfn.call(tr, "sdpa_bwd", _backward(*static), args, static))


RULES[SDPA] = sdpa
RULES[SDPA_BACKWARD] = sdpa_backward
