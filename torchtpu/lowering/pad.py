"""reflection_pad{1,2,3}d and replication_pad{1,2,3}d and their gradients.

The forward is `jnp.pad` (numpy's 'reflect' is PyTorch's reflection, 'edge' its replication); a negative
padding crops, as PyTorch allows for replication. The gradient is `jax.vjp` of that forward: every output
position adds its gradient back onto the input element it copied (a scatter-add XLA plans).
"""

from __future__ import annotations

from .. import emit as E
from .. import jaxfn
from ..tables import lowering, out_meta


def _pad_fn(mode, padding, nd):
    def fwd(x):
        import jax.numpy as jnp

        lead = x.ndim - nd
        # PyTorch lists the last dim first: (left, right, top, bottom, front, back)
        pads = [(0, 0)] * lead + [(padding[2 * (nd - 1 - i)], padding[2 * (nd - 1 - i) + 1]) for i in range(nd)]
        y = jnp.pad(x, [(max(a, 0), max(b, 0)) for a, b in pads], mode="reflect" if mode == "reflection" else "edge")
        return y[tuple(slice(max(-a, 0), y.shape[i] - max(-b, 0)) for i, (a, b) in enumerate(pads))]

    return fwd


def _forward_rule(mode, nd):
    def rule(tr, x, padding):
        f = _pad_fn(mode, tuple(padding), nd)
        return E.convert(jaxfn.call(tr, f"{mode}_pad{nd}d", f, [x], (tuple(padding),))[0], out_meta(tr).dtype)

    return rule


def _backward_rule(mode, nd):
    def rule(tr, grad, x, padding):
        fwd = _pad_fn(mode, tuple(padding), nd)

        def f(g, v):  # halves accumulate in float32
            return jaxfn.vjp_in_acc(fwd, g, v)

        return jaxfn.call(tr, f"{mode}_pad{nd}d_backward", f, [grad, x], (tuple(padding),))[0]

    return rule


for _mode in ("reflection", "replication"):
    for _nd in (1, 2, 3):
        lowering(f"{_mode}_pad{_nd}d")(_forward_rule(_mode, _nd))
        lowering(f"{_mode}_pad{_nd}d_backward")(_backward_rule(_mode, _nd))


@lowering("constant_pad_nd")
def constant_pad_nd(tr, x, pad, value=0):
    """The last dims padded with `value` (F.pad's order: the last dim's (before, after) first); a negative amount
    crops. One op instead of torch's empty + fill + copy into a slice: its result follows a varying length L (the
    loss's labels padded to L + 1) where an empty of L + 1 could not say so."""
    m = out_meta(tr)
    low, high = [0] * x.rank, [0] * x.rank
    for j in range(len(pad) // 2):
        low[x.rank - 1 - j], high[x.rank - 1 - j] = pad[2 * j], pad[2 * j + 1]
    v = E.convert(value, m.dtype) if isinstance(value, E.Value) else tr.scalar(value, m.dtype)
    return E.pad(x, E.reshape(v, ()), low, high)
