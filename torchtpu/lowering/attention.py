"""Scaled dot-product attention as one op each way (csrc/aten/attention.cpp routes
``F.scaled_dot_product_attention`` on tpu tensors here through PyTorch's "overrideable" backend).

``torchtpu_attn::sdpa(q, k, v, attn_mask?, is_causal, scale?, dropout_p) -> (out, logsumexp, rng_state)`` and its
backward are ops of the op table like any other: in eager each is one program (the math path PyTorch uses otherwise
is about 19 ops forward), in fused mode they fuse with their neighbours, and the varying-length eager path has a
rule for them (shapes/rules_spatial.py) that keeps the (B, heads, L, L) scores inside the op instead of compacting
them between ops. The arithmetic follows PyTorch's math path: scores in float32 for half types, a boolean mask keeps
where True, a float mask adds, ``is_causal`` keeps the lower triangle aligned at the top left, a row with every key
masked gives zeros (torch's ``_safe_softmax``), and grouped query attention shares each key/value head among
``heads_q // heads_kv`` query heads. Dropout keeps each probability with chance 1 - p (scaled by 1 / (1 - p)), drawn
from the tpu generator's Philox stream as the random ops draw; the forward returns the state it drew from (PyTorch
saves it as philox_seed) and the backward draws the same mask from it. The backward recomputes the probabilities
from the scores as the forward did (the saved logsumexp, ``+inf`` for a fully masked row, is PyTorch's interface;
recomputing from it rounds every probability by the logsumexp's ulp, 1e-4 off CPU's float32 gradients on OpInfo's
samples).
"""

from __future__ import annotations

import math

import torch

from .. import emit as E
from .. import jaxfn
from ..tables import RULES

NAMESPACE = "torchtpu_attn"
_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define(
    "sdpa(Tensor q, Tensor k, Tensor v, Tensor? attn_mask, bool is_causal, float? scale, float dropout_p)"
    " -> (Tensor, Tensor, Tensor)"
)
_lib.define(
    "sdpa_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? attn_mask, Tensor out, Tensor logsumexp, "
    "bool is_causal, float? scale, float dropout_p, Tensor rng_state) -> (Tensor, Tensor, Tensor)"
)
SDPA = f"{NAMESPACE}::sdpa"
SDPA_BACKWARD = f"{NAMESPACE}::sdpa_backward"


@torch.library.register_fake(SDPA, lib=_lib)
def _sdpa_fake(q, k, v, attn_mask, is_causal, scale, dropout_p):
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))
    return out, q.new_empty(q.shape[:-1], dtype=torch.float32), q.new_empty((2,), dtype=torch.int64)


@torch.library.register_fake(SDPA_BACKWARD, lib=_lib)
def _sdpa_backward_fake(grad, q, k, v, attn_mask, out, logsumexp, is_causal, scale, dropout_p, rng_state):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _static(mask, is_causal, scale, q, dropout_p):
    """What selects the JAX function besides the argument types: the mask's kind, causality, the scale and the
    dropout probability (0: none)."""
    s = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    p = float(dropout_p) if dropout_p else 0.0
    return ("none" if mask is None else "bool" if mask.dtype == torch.bool else "add", bool(is_causal), s, p)


def _keep(bits, p):
    """The dropout's keep mask scaled by 1 / (1 - p), from 32 random bits per score (uniform [0, 1) from their top
    23 bits, as lowering/random.py draws): kept with probability 1 - p, as torch's bernoulli(1 - p) does."""
    import jax
    import jax.numpy as jnp

    u = jax.lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000), jnp.float32) - 1.0
    return jnp.where(u < 1.0 - p, jnp.float32(1.0 / (1.0 - p)), jnp.float32(0.0))


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


def _forward(kind, causal, scale, dropout):
    def f(q, k, v, *extra):
        import jax.numpy as jnp

        mask, bits = _extra(extra, kind, dropout)
        s, groups = _scores(q, k, mask, kind, causal, scale)
        p, lse = _probs(s)
        if dropout:
            p = p * _keep(bits, dropout).astype(p.dtype)
        vv = jnp.repeat(v, groups, axis=1) if groups > 1 else v
        out = jnp.einsum("bhqk,bhkd->bhqd", p, vv.astype(p.dtype))
        return out.astype(q.dtype), lse.astype(jnp.float32)

    return f


def _extra(extra, kind, dropout):
    """The mask and the dropout's random bits among a JAX function's trailing arguments (each only when used)."""
    extra = list(extra)
    mask = extra.pop(0) if kind != "none" else None
    return mask, (extra.pop(0) if dropout else None)


def _backward(kind, causal, scale, dropout):
    def f(g, q, k, v, out, lse, *extra):
        import jax.numpy as jnp

        mask, bits = _extra(extra, kind, dropout)
        s, groups = _scores(q, k, mask, kind, causal, scale)
        acc = s.dtype
        p = _probs(s)[0]  # recomputed as the forward did (lse is the op's interface, unused: see _probs)
        keep = _keep(bits, dropout).astype(acc) if dropout else None
        vv = jnp.repeat(v, groups, axis=1) if groups > 1 else v
        kk = jnp.repeat(k, groups, axis=1) if groups > 1 else k
        ga, va = g.astype(acc), vv.astype(acc)
        gv = jnp.einsum("bhqk,bhqd->bhkd", p if keep is None else p * keep, ga)
        gp = jnp.einsum("bhqd,bhkd->bhqk", ga, va)
        if keep is not None:  # out = (p * keep) v: the gradient reaching p is keep * (g v)
            gp = gp * keep
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


def _bits(tr, state, q, k):
    """32 random bits per score from the Philox state (the generator's, advanced by the forward)."""
    shape = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    return E.rng_bit_generator(state, shape, torch.uint32)[1]


def sdpa(tr, q, k, v, attn_mask, is_causal, scale, dropout_p):
    _check("scaled_dot_product_attention", q, k, v, attn_mask)
    static = _static(attn_mask, is_causal, scale, q, dropout_p)
    args = [q, k, v] + ([attn_mask] if attn_mask is not None else [])
    if static[3]:
        state = tr.rng_state(None, q.shape[0] * q.shape[1] * q.shape[2] * k.shape[2])
        args.append(_bits(tr, state, q, k))
        rng = E.bitcast(state, torch.int64)
    else:
        rng = E.const(tr.fn, 0, torch.int64, (2,))
    out, lse = jaxfn.call(tr, "sdpa", _forward(*static), args, static)
    return out, lse, rng


def sdpa_backward(tr, grad, q, k, v, attn_mask, out, logsumexp, is_causal, scale, dropout_p, rng_state):
    _check("scaled_dot_product_attention backward", q, k, v, attn_mask)
    static = _static(attn_mask, is_causal, scale, q, dropout_p)
    args = [grad, q, k, v, out, logsumexp] + ([attn_mask] if attn_mask is not None else [])
    if static[3]:  # the forward's keep mask, drawn again from the state it drew it from
        args.append(_bits(tr, E.bitcast(rng_state, torch.uint64), q, k))
    return tuple(jaxfn.call(tr, "sdpa_bwd", _backward(*static), args, static))


RULES[SDPA] = sdpa
RULES[SDPA_BACKWARD] = sdpa_backward
