"""Scans and searches lowered through JAX: cumsum, cumprod, logcumsumexp, searchsorted/bucketize."""

from __future__ import annotations

import torch

from .. import emit as E
from .. import jaxfn
from ..tables import lowering
from ..tables import out_meta as _meta


def _scan(kind):
    def rule(tr, x, dim, dtype=None):
        import jax.numpy as jnp
        from jax import lax

        out = _meta(tr)
        if x.rank == 0:
            return E.convert(x, out.dtype)
        d = dim % x.rank
        xv = E.convert(x, out.dtype)
        low = out.dtype in (torch.float16, torch.bfloat16)

        def f(a):
            b = a.astype("float32") if low else a
            if kind == "cumsum":
                r = jnp.cumsum(b, axis=d)
            elif kind == "cumprod":
                r = jnp.cumprod(b, axis=d)
            elif jnp.iscomplexobj(b):
                r = lax.associative_scan(_complex_log_add_exp, b, axis=d)
            else:
                r = lax.cumlogsumexp(b, axis=d)
            return r.astype(a.dtype)

        return jaxfn.call(tr, kind, f, [xv], (d,))[0]

    return rule


def _complex_log_add_exp(x, y):
    """log(exp(x) + exp(y)) for complex x, y as CPU computes it: the larger real part factored out; two infinite
    real parts of the same sign give -inf (x) or the direct formula."""
    import jax.numpy as jnp

    x_small = x.real <= y.real
    lo, hi = jnp.where(x_small, x, y), jnp.where(x_small, y, x)
    general = hi + jnp.log1p(jnp.exp(lo - hi))
    both_inf = ~jnp.isfinite(lo.real) & (lo.real == hi.real)
    inf_case = jnp.where(lo.real < 0, x, jnp.log(jnp.exp(x) + jnp.exp(y)))
    nan = jnp.isnan(lo.real) | jnp.isnan(hi.real)
    return jnp.where(nan, jnp.full_like(x, jnp.nan), jnp.where(both_inf, inf_case, general))


lowering("cumsum")(_scan("cumsum"))
lowering("cumprod")(_scan("cumprod"))
lowering("logcumsumexp")(_scan("logcumsumexp"))


def _searchsorted(tr, sorted_seq, values, out_int32, right, side, sorter):
    import jax.numpy as jnp

    out = _meta(tr)
    if out.numel() == 0 or sorted_seq.numel == 0:  # nothing to search, or everything lands at 0
        return E.const(tr.fn, 0, out.dtype, out.shape)
    side = side or ("right" if right else "left")
    if not isinstance(values, E.Value):
        values = tr.scalar(values, sorted_seq.dtype)
    args = [sorted_seq, E.convert(values, sorted_seq.dtype)]
    if sorter is not None:
        args.append(sorter)

    def f(seq, v, *s):
        if s:
            seq = jnp.take_along_axis(seq, s[0], axis=-1)
        if seq.ndim == 1:
            r = jnp.searchsorted(seq, v, side=side)
        else:  # one sorted row per leading index
            flat_s = seq.reshape(-1, seq.shape[-1])
            flat_v = v.reshape(flat_s.shape[0], -1)
            import jax

            r = jax.vmap(lambda a, b: jnp.searchsorted(a, b, side=side))(flat_s, flat_v).reshape(v.shape)
        return r.astype("int32" if out.dtype == torch.int32 else "int64")

    return jaxfn.call(tr, "searchsorted", f, args, (side, out.dtype, sorter is not None))[0]


@lowering("searchsorted.Tensor", "searchsorted.Scalar")
def searchsorted(tr, sorted_seq, values, out_int32=False, right=False, side=None, sorter=None):
    return _searchsorted(tr, sorted_seq, values, out_int32, right, side, sorter)


@lowering("bucketize.Tensor", "bucketize.Scalar")
def bucketize(tr, values, boundaries, out_int32=False, right=False):
    if boundaries.rank != 1:
        raise RuntimeError(f"boundaries tensor must be 1 dimension, but got dim({boundaries.rank})")
    return _searchsorted(tr, boundaries, values, out_int32, right, None, None)
