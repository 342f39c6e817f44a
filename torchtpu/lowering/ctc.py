"""CTC loss (`_ctc_loss`, `_ctc_loss_backward`, list and tensor lengths): the alpha/beta recursions as JAX scans
over time, batched over the batch and the 2S+1 extended-label states, in float32 log space.

The lengths travel as device tensors (never baked into the program), so batches of other lengths reuse the
compiled executable, and no host sync is needed. log_alpha is (N, T, 2S+1) with S the padded target width
(targets.size(1), or the total length for concatenated 1-d targets) where CPU uses the longest target: only
the backward reads it, and the loss is the same.
"""

from __future__ import annotations

import torch

from .. import emit as E
from .. import jaxfn
from ..tables import META, lowering, out_meta

_NEG = float("-inf")


def _width(targets, target_lengths):
    if targets.dim() == 2:
        return targets.shape[1]
    if isinstance(target_lengths, (list, tuple)):
        return max(target_lengths, default=0)
    return targets.shape[0]


def _meta(log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    batched = log_probs.dim() == 3
    n = log_probs.shape[1] if batched else 1
    s = _width(targets, target_lengths)
    return (log_probs.new_empty((n,) if batched else ()), log_probs.new_empty((n, log_probs.shape[0], 2 * s + 1)))


def _backward_meta(grad, log_probs, *rest, **kwargs):
    return log_probs.new_empty(log_probs.shape)


META["_ctc_loss"] = META["_ctc_loss.Tensor"] = _meta
META["_ctc_loss_backward"] = META["_ctc_loss_backward.Tensor"] = _backward_meta


def _padded(jnp, tg, il, tl, width):
    """(N, width) targets from padded 2-d or concatenated 1-d targets; lengths as (N,) int64."""
    n = il.shape[0]
    if tg.ndim == 2:
        return tg[:n, :width]
    offsets = jnp.cumsum(tl) - tl
    pos = offsets[:, None] + jnp.arange(width)[None, :]
    return (
        jnp.where(jnp.arange(width)[None, :] < tl[:, None], tg[jnp.clip(pos, 0, max(tg.shape[0] - 1, 0))], 0)
        if tg.shape[0]
        else jnp.zeros((n, width), tg.dtype)
    )


def _setup(lp, tg, il, tl, blank, width):
    """Per-batch extended labels, their log-probs (N, T, L), the skip mask and the valid-state mask."""
    import jax.numpy as jnp

    lp = jnp.transpose(lp, (1, 0, 2))  # (N, T, C)
    n, t_max, _ = lp.shape
    big_l = 2 * width + 1
    s = jnp.arange(big_l)
    tg = _padded(jnp, tg, il, tl, width).astype(jnp.int32)
    lab = jnp.where(s % 2 == 0, blank, tg[:, jnp.clip((s - 1) // 2, 0, max(width - 1, 0))] if width else blank)
    lab = jnp.broadcast_to(lab, (n, big_l))
    prev2 = jnp.concatenate([jnp.full((n, 2), -1, lab.dtype), lab[:, :-2]], 1)
    skip = (s % 2 == 1)[None, :] & (s >= 2)[None, :] & (lab != prev2)
    valid = s[None, :] < (2 * tl[:, None] + 1)
    lpl = jnp.take_along_axis(lp, jnp.broadcast_to(lab[:, None, :], (n, t_max, big_l)), axis=2)
    return lp, lab, skip, valid, lpl


def _lse3(a, b, c):
    import jax.numpy as jnp

    m = jnp.maximum(jnp.maximum(a, b), c)
    m0 = jnp.where(jnp.isneginf(m), 0.0, m)
    return jnp.log(jnp.exp(a - m0) + jnp.exp(b - m0) + jnp.exp(c - m0)) + m0


def _shift(jnp, x, k):
    return jnp.concatenate([jnp.full(x.shape[:-1] + (k,), _NEG, x.dtype), x[..., :-k]], -1) if k else x


def _alphas(lpl, skip, valid, tl):
    import jax.numpy as jnp
    from jax import lax

    n, t_max, big_l = lpl.shape
    s = jnp.arange(big_l)
    a0 = jnp.where((s[None, :] == 0) | ((s[None, :] == 1) & (tl[:, None] > 0)), lpl[:, 0, :], _NEG)
    a0 = jnp.where(valid, a0, _NEG)

    def step(a, lp_t):
        two = jnp.where(skip, _shift(jnp, a, 2), _NEG)
        nxt = jnp.where(valid, _lse3(a, _shift(jnp, a, 1), two) + lp_t, _NEG)
        return nxt, nxt

    _, rest = lax.scan(step, a0, jnp.moveaxis(lpl[:, 1:, :], 1, 0))
    return jnp.concatenate([a0[:, None, :], jnp.moveaxis(rest, 0, 1)], 1)  # (N, T, L)


def _nll(alpha, il, tl):
    import jax.numpy as jnp

    n = alpha.shape[0]
    t_last = jnp.clip(il - 1, 0, alpha.shape[1] - 1)
    last = alpha[jnp.arange(n), t_last]  # (N, L)
    end = jnp.take_along_axis(last, (2 * tl)[:, None], 1)[:, 0]
    end1 = jnp.where(tl > 0, jnp.take_along_axis(last, jnp.clip(2 * tl - 1, 0)[:, None], 1)[:, 0], _NEG)
    nll = -jnp.logaddexp(end, end1)
    return jnp.where(il == 0, jnp.where(tl == 0, 0.0, jnp.inf), nll)


def _forward_fn(blank, width, batched):
    def f(lp, tg, il, tl):
        import jax.numpy as jnp

        if not batched:
            lp, tg, il, tl = lp[:, None, :], tg[None], il.reshape(1), tl.reshape(1)
        il, tl = il.astype(jnp.int64), tl.astype(jnp.int64)
        lp32 = lp.astype(jnp.float32)
        _, _, skip, valid, lpl = _setup(lp32, tg, il, tl, blank, width)
        alpha = _alphas(lpl, skip, valid, tl)
        nll = _nll(alpha, il, tl)
        return (nll if batched else nll[0]).astype(lp.dtype), alpha.astype(lp.dtype)

    return f


def _backward_fn(blank, width, batched, zero_infinity):
    def f(grad, lp, tg, il, tl, nll, alpha):
        import jax.numpy as jnp
        from jax import lax

        dtype = lp.dtype
        if not batched:
            lp, tg, il, tl, grad, nll = (
                lp[:, None, :],
                tg[None],
                il.reshape(1),
                tl.reshape(1),
                grad.reshape(1),
                nll.reshape(1),
            )
        il, tl = il.astype(jnp.int64), tl.astype(jnp.int64)
        lpn, lab, skip, valid, lpl = _setup(lp.astype(jnp.float32), tg, il, tl, blank, width)
        n, t_max, big_l = lpl.shape
        c = lpn.shape[2]
        s = jnp.arange(big_l)
        t_idx = jnp.arange(t_max)
        # beta, backwards in time; each batch element starts at its own last frame il - 1
        last = t_idx[None, :] == (il - 1)[:, None]  # (N, T)
        b_init = jnp.where(
            (s[None, :] == 2 * tl[:, None]) | ((s[None, :] == 2 * tl[:, None] - 1) & (tl[:, None] > 0)), 0.0, _NEG
        )
        skip_next = jnp.concatenate([skip[:, 2:], jnp.zeros((n, 2), bool)], 1)  # s -> s + 2 allowed

        def unshift(x, k):
            return jnp.concatenate([x[..., k:], jnp.full(x.shape[:-1] + (k,), _NEG, x.dtype)], -1)

        def step(b, xs):
            lp_t, is_last, active = xs
            two = jnp.where(skip_next, unshift(b, 2), _NEG)
            nxt = _lse3(b, unshift(b, 1), two)
            nxt = jnp.where(is_last[:, None], b_init, nxt)
            nxt = jnp.where(valid & active[:, None], nxt + lp_t, _NEG)
            return nxt, nxt

        active = t_idx[None, :] < il[:, None]
        xs = (jnp.moveaxis(lpl, 1, 0)[::-1], jnp.moveaxis(last, 1, 0)[::-1], jnp.moveaxis(active, 1, 0)[::-1])
        _, betas = lax.scan(step, jnp.full((n, big_l), _NEG, jnp.float32), xs)
        beta = jnp.moveaxis(betas[::-1], 0, 1)  # (N, T, L)
        ab = alpha.astype(jnp.float32)[:, :, :big_l] + beta
        m = jnp.max(ab, axis=2, keepdims=True)
        m = jnp.where(jnp.isneginf(m), 0.0, m)
        onehot = (lab[:, :, None] == jnp.arange(c)[None, None, :]).astype(jnp.float32)  # (N, L, C)
        summed = jnp.einsum("ntl,nlc->ntc", jnp.exp(ab - m), onehot, precision=lax.Precision.HIGHEST)
        lcab = jnp.log(summed) + m  # log sum over the states of each class (-inf where none)
        nll32 = nll.astype(jnp.float32)[:, None, None]
        g = (jnp.exp(lpn) - jnp.exp(lcab + nll32 - lpn)) * grad.astype(jnp.float32)[:, None, None]
        g = jnp.where(active[:, :, None], g, 0.0)
        if zero_infinity:
            g = jnp.where(jnp.isinf(nll32), 0.0, g)
        g = jnp.moveaxis(g, 0, 1)  # (T, N, C)
        return (g if batched else g[:, 0]).astype(dtype)

    return f


def _lengths(tr, x, n):
    if isinstance(x, E.Value):
        return E.convert(x, torch.int64)
    return E.constant_array(tr.fn, [int(v) for v in x], torch.int64, (n,))  # int lists are part of the op's key


def _check(log_probs, targets, blank):
    if log_probs.dtype not in (torch.float32, torch.float64):
        raise RuntimeError(f"ctc_loss: log_probs must be float32 or float64, got {log_probs.dtype}")
    c = log_probs.shape[-1]
    if not 0 <= blank < c:
        raise RuntimeError(f"ctc_loss: blank must be in label range [0, {c}), got {blank}")


@lowering("_ctc_loss", "_ctc_loss.Tensor")
def ctc_loss(tr, log_probs, targets, input_lengths, target_lengths, blank=0, zero_infinity=False):
    _check(log_probs, targets, blank)
    batched = log_probs.rank == 3
    n = log_probs.shape[1] if batched else 1
    width = (out_meta(tr, 1).shape[2] - 1) // 2
    il, tl = _lengths(tr, input_lengths, n), _lengths(tr, target_lengths, n)
    if not batched:
        il, tl = E.reshape(il, ()), E.reshape(tl, ())
    return tuple(
        jaxfn.call(
            tr, "ctc_loss", _forward_fn(blank, width, batched), [log_probs, targets, il, tl], (blank, width, batched)
        )
    )


@lowering("_ctc_loss_backward", "_ctc_loss_backward.Tensor")
def ctc_loss_backward(
    tr, grad, log_probs, targets, input_lengths, target_lengths, nll, log_alpha, blank, zero_infinity=False
):
    batched = log_probs.rank == 3
    n = log_probs.shape[1] if batched else 1
    width = (log_alpha.shape[2] - 1) // 2
    il, tl = _lengths(tr, input_lengths, n), _lengths(tr, target_lengths, n)
    if not batched:
        il, tl = E.reshape(il, ()), E.reshape(tl, ())
    f = _backward_fn(blank, width, batched, bool(zero_infinity))
    return jaxfn.call(
        tr,
        "ctc_loss_backward",
        f,
        [grad, log_probs, targets, il, tl, nll, log_alpha],
        (blank, width, batched, bool(zero_infinity)),
    )[0]
