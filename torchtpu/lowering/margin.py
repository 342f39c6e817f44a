"""Gradients of multi_margin_loss and multilabel_margin_loss: `jax.vjp` of the losses written as CPU computes
them. A hinge term counts where its margin is strictly positive (the vjp of `where(z > 0, z, 0)`, not of
`maximum`, whose gradient at 0 would be 1/2)."""

from __future__ import annotations

from .. import jaxfn
from ..tables import META, lowering

_MEAN, _SUM = 1, 2


def _reduce(jnp, per_sample, reduction):
    if reduction == _MEAN:
        return jnp.mean(per_sample)
    return jnp.sum(per_sample) if reduction == _SUM else per_sample


@lowering("multi_margin_loss_backward")
def multi_margin_loss_backward(tr, grad, x, target, p, margin, weight=None, reduction=_MEAN):
    p, margin, batched = int(p), float(margin), x.rank == 2

    def f(g, v, t, *w):
        import jax.numpy as jnp

        def loss(xv):
            x2 = xv.reshape((-1, xv.shape[-1] if xv.ndim else 1))
            t2 = t.reshape(-1).astype(jnp.int32)
            c = x2.shape[1]
            xy = jnp.take_along_axis(x2, t2[:, None], 1)
            z = margin - xy + x2
            h = jnp.where(z > 0, z if p == 1 else z * z, 0.0)
            if w:
                h = h * w[0].astype(h.dtype)[t2][:, None]
            h = jnp.where(jnp.arange(c)[None, :] == t2[:, None], 0.0, h)  # the target's own term is skipped
            per = jnp.sum(h, 1) / c
            return _reduce(jnp, per if batched else per[0], reduction)

        return jaxfn.vjp_in_acc(loss, g, v)

    args = [grad, x, target] + ([weight] if weight is not None else [])
    return jaxfn.call(tr, "multi_margin_loss_backward", f, args, (p, margin, reduction, batched))[0]


@lowering("multilabel_margin_loss_backward")
def multilabel_margin_loss_backward(tr, grad, x, target, reduction, is_target):
    batched = x.rank == 2

    def f(g, v, t, is_t):
        import jax.numpy as jnp

        def loss(xv):
            c1 = xv.shape[-1] if xv.ndim else 1
            x2 = xv.reshape((-1, c1))
            t2 = t.reshape((-1, c1)).astype(jnp.int32)
            nt = is_t.reshape((-1, c1)) == 0
            c = x2.shape[1]
            labels = jnp.cumprod(t2 >= 0, axis=1).astype(bool)  # the labels before the first -1
            xy = jnp.take_along_axis(x2, jnp.clip(t2, 0, c - 1), 1)
            z = 1.0 - xy[:, :, None] + x2[:, None, :]
            h = jnp.where(labels[:, :, None] & nt[:, None, :] & (z > 0), z, 0.0)
            per = jnp.sum(h, (1, 2)) / c
            return _reduce(jnp, per if batched else per[0], reduction)

        return jaxfn.vjp_in_acc(loss, g, v)

    return jaxfn.call(tr, "multilabel_margin_loss_backward", f, [grad, x, target, is_target], (reduction, batched))[0]


def _like_input(grad, x, *rest, **kwargs):
    return x.new_empty(x.shape)


META["multi_margin_loss_backward"] = META["multilabel_margin_loss_backward"] = _like_input
