"""segment_reduce (sum, mean, max, min, prod over consecutive segments given by lengths or offsets) and its
gradient, as CPU computes them: the accumulator starts at `initial` when given (mean is (initial + sum) /
length; an empty segment is `initial`), else at the identity (an empty mean is NaN); max/min gradients are
shared equally among ties; prod's gradient handles zeros (one zero: the product of the others). Segment ids
come from a searchsorted over the running lengths, per leading index, all on the device."""

from __future__ import annotations

import math

from .. import jaxfn
from ..tables import lowering

_IDENT = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}


def _layout(jnp, data, lengths, offsets, axis):
    """data (..., n, ...) -> (R, n, T); lengths (R, S); ids (R, n) (S for positions past the last segment)."""
    lead, n = data.shape[:axis], data.shape[axis]
    lens = (offsets[..., 1:] - offsets[..., :-1]) if lengths is None else lengths
    lens = lens.reshape((-1, lens.shape[-1])).astype(jnp.int64)
    import jax

    x = data.reshape((math.prod(lead), n, -1))
    pos = jnp.arange(n)
    ids = jax.vmap(lambda e: jnp.searchsorted(e, pos, side="right"))(jnp.cumsum(lens, axis=1))
    return x, lens, ids


def _seg(jax, kind, x, ids, s):
    fn = {
        "sum": jax.ops.segment_sum,
        "mean": jax.ops.segment_sum,
        "prod": jax.ops.segment_prod,
        "max": jax.ops.segment_max,
        "min": jax.ops.segment_min,
    }[kind]
    return jax.vmap(lambda v, i: fn(v, i, num_segments=s))(x, ids)


def _forward_fn(reduce, axis, initial, has_lengths):
    def f(data, seg):
        import jax
        import jax.numpy as jnp

        dt = data.dtype
        wide = jaxfn.acc_dtype(dt)
        x, lens, ids = _layout(jnp, data.astype(wide), seg if has_lengths else None, None if has_lengths else seg, axis)
        s = lens.shape[1]
        out = _seg(jax, reduce, x, ids, s)  # (R, S, T)
        if reduce in ("max", "min"):  # NaN in a segment wins, as on CPU
            has_nan = _seg(jax, "max", jnp.isnan(x).astype(wide), ids, s) > 0
            out = jnp.where(has_nan, jnp.nan, out)
        count = lens[:, :, None].astype(wide)
        if initial is not None:
            init = jnp.asarray(initial, wide)
            out = {
                "sum": out + init,
                "mean": out + init,
                "prod": out * init,
                "max": jnp.maximum(out, init),
                "min": jnp.minimum(out, init),
            }[reduce]
            if reduce == "mean":
                out = jnp.where(count == 0, init, out / jnp.where(count == 0, 1, count))
        elif reduce == "mean":
            out = out / count
        shape = data.shape[:axis] + (s,) + data.shape[axis + 1 :]
        return out.reshape(shape).astype(dt)

    return f


def _backward_fn(reduce, axis, initial, has_lengths):
    def f(grad, output, data, seg):
        import jax
        import jax.numpy as jnp

        dt = data.dtype
        wide = jaxfn.acc_dtype(dt)
        x, lens, ids = _layout(jnp, data.astype(wide), seg if has_lengths else None, None if has_lengths else seg, axis)
        r, n, t = x.shape
        s = lens.shape[1]
        g = grad.astype(wide).reshape((r, s, t))
        o = output.astype(wide).reshape((r, s, t))
        inside = (ids < s)[:, :, None]
        idc = jnp.clip(ids, 0, max(s - 1, 0))

        def at(v):  # per-segment values at each element
            return jnp.take_along_axis(v, jnp.broadcast_to(idc[:, :, None], (r, n, t)), 1)

        ge = at(g)
        if reduce == "sum":
            gi = ge
        elif reduce == "mean":
            gi = ge / at(jnp.maximum(lens, 1)[:, :, None].astype(wide))
        elif reduce in ("max", "min"):
            hit = (x == at(o)).astype(wide)
            ties = _seg(jax, "sum", hit, ids, s)
            gi = hit * ge / at(jnp.maximum(ties, 1))
        else:  # prod
            zero = (x == 0).astype(wide)
            zeros = at(_seg(jax, "sum", zero, ids, s))
            others = at(_seg(jax, "prod", jnp.where(x == 0, 1, x), ids, s))
            if initial is not None:
                others = others * initial
            gi = jnp.where(
                zeros == 0, ge * at(o) / jnp.where(x == 0, 1, x), jnp.where((zeros == 1) & (x == 0), ge * others, 0)
            )
        gi = jnp.where(inside, gi, 0)
        return gi.reshape(data.shape).astype(dt)

    return f


def _check(reduce, lengths, indices, offsets):
    if reduce not in _IDENT:
        raise RuntimeError(f"segment_reduce: reduce must be one of {sorted(_IDENT)}, got {reduce!r}")
    if indices is not None:
        raise RuntimeError("segment_reduce: indices are not supported (as on CPU); pass lengths or offsets")
    if (lengths is None) == (offsets is None):
        raise RuntimeError("segment_reduce: exactly one of lengths and offsets must be given")


@lowering("segment_reduce")
def segment_reduce(tr, data, reduce, lengths=None, indices=None, offsets=None, axis=0, unsafe=False, initial=None):
    _check(reduce, lengths, indices, offsets)
    axis = axis % data.rank
    seg = lengths if lengths is not None else offsets
    init = None if initial is None else float(initial)
    f = _forward_fn(reduce, axis, init, lengths is not None)
    return jaxfn.call(tr, "segment_reduce", f, [data, seg], (reduce, axis, init, lengths is not None))[0]


@lowering("_segment_reduce_backward")
def segment_reduce_backward(tr, grad, output, data, reduce, lengths=None, offsets=None, axis=0, initial=None):
    _check(reduce, lengths, None, offsets)
    axis = axis % data.rank
    seg = lengths if lengths is not None else offsets
    init = None if initial is None else float(initial)
    f = _backward_fn(reduce, axis, init, lengths is not None)
    return jaxfn.call(
        tr, "segment_reduce_backward", f, [grad, output, data, seg], (reduce, axis, init, lengths is not None)
    )[0]
