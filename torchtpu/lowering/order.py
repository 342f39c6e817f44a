"""Order statistics and counting: cummax/cummin, median/nanmedian/kthvalue, histc, nonzero_static, put,
addbmm, index_reduce -- JAX functions (scans, sorts, scatters), no host round trip.

NaN follows CPU: it is the largest value in sorts and selections, a running max/min stays NaN once it meets
one, and median of a slice holding a NaN is NaN (nanmedian skips them).
"""

from __future__ import annotations

import torch

from .. import emit as E
from .. import jaxfn
from ..tables import lowering, out_meta
from .indexing import FEW_WRITES, checked, write_each


def _cum_rule(kind):
    def rule(tr, x, dim):
        if x.rank == 0:
            return x, E.const(tr.fn, 0, torch.int64, ())
        d = dim % x.rank

        def f(v):
            import jax.numpy as jnp
            from jax import lax

            idx = lax.broadcasted_iota(jnp.int64, v.shape, d)
            isnan = (v != v) if jnp.issubdtype(v.dtype, jnp.floating) else jnp.zeros(v.shape, bool)

            def combine(a, b):
                (va, ia, na), (vb, ib, nb) = a, b
                better = (vb >= va) if kind == "max" else (vb <= va)
                take_b = nb | (~na & better)  # later wins ties; NaN beats everything and sticks
                return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia), na | nb

            vals, inds, _ = lax.associative_scan(combine, (v, idx, isnan), axis=d)
            return vals, inds

        return tuple(jaxfn.call(tr, f"cum{kind}", f, [x], (d,)))

    return rule


lowering("cummax")(_cum_rule("max"))
lowering("cummin")(_cum_rule("min"))


def _select(tr, name, x, dim, keepdim, whole, pick, k=None):
    """Sorts along dim (NaN last, stable) and picks one position per slice: `pick(jnp, n_valid, n, k)`."""
    metas = tr.out if isinstance(tr.out, (tuple, list)) else (tr.out,)
    if x.rank == 0:
        return x if whole else (x, E.const(tr.fn, 0, torch.int64, ()))
    src = E.reshape(x, (x.numel,)) if whole else x
    d = 0 if whole else dim % x.rank

    def f(v):
        import jax.numpy as jnp

        n = v.shape[d]
        nan = (v != v) if jnp.issubdtype(v.dtype, jnp.floating) else jnp.zeros(v.shape, bool)
        order = jnp.argsort(v, axis=d, stable=True)  # NaN sorts last
        vals = jnp.take_along_axis(v, order, axis=d)
        n_nan = jnp.sum(nan, axis=d, keepdims=True)
        pos = jnp.clip(pick(jnp, n - n_nan, n, k), 0, n - 1)
        val = jnp.take_along_axis(vals, pos, axis=d)
        ind = jnp.take_along_axis(order, pos, axis=d)
        if name == "median":  # a NaN in the slice: NaN, at the first NaN
            val = jnp.where(n_nan > 0, jnp.nan, val).astype(v.dtype)
            ind = jnp.where(n_nan > 0, jnp.argmax(nan, axis=d, keepdims=True), ind)
        if not keepdim or whole:
            val, ind = jnp.squeeze(val, d), jnp.squeeze(ind, d)
        return val, ind.astype(jnp.int64)

    val, ind = jaxfn.call(tr, name, f, [src], (d, bool(keepdim), whole, k))
    val = E.convert(val, metas[0].dtype)
    return val if whole else (val, ind)


def _median_pos(jnp, valid, n, k):
    return (n - 1) // 2 + jnp.zeros_like(valid)


def _nanmedian_pos(jnp, valid, n, k):
    return jnp.maximum(valid - 1, 0) // 2


def _kth_pos(jnp, valid, n, k):
    return k - 1 + jnp.zeros_like(valid)


def _median_rules(name, pick):
    def whole(tr, x):
        return _select(tr, name, x, 0, False, True, pick)

    def along(tr, x, dim, keepdim=False):
        return _select(tr, name, x, dim, keepdim, False, pick)

    lowering(name)(whole)
    lowering(f"{name}.dim")(along)


_median_rules("median", _median_pos)
_median_rules("nanmedian", _nanmedian_pos)


@lowering("kthvalue")
def kthvalue(tr, x, k, dim=-1, keepdim=False):
    return _select(tr, "kthvalue", x, dim, keepdim, False, _kth_pos, k)


@lowering("mode")
def mode(tr, x, dim=-1, keepdim=False):
    """The most frequent value of each slice (the smallest among equally frequent ones, NaNs counted as one
    value) and the last index holding it, as CPU: a stable sort, run lengths from run starts/ends, argmax."""
    if x.rank == 0:
        return x, E.const(tr.fn, 0, torch.int64, ())
    d = dim % x.rank

    def f(v):
        import jax.numpy as jnp
        from jax import lax

        v = jnp.moveaxis(v, d, -1)
        n = v.shape[-1]
        order = jnp.argsort(v, axis=-1, stable=True)  # NaN last; equal values keep index order
        s = jnp.take_along_axis(v, order, axis=-1)
        nan = (s != s) if jnp.issubdtype(s.dtype, jnp.floating) else jnp.zeros(s.shape, bool)
        same = (s[..., 1:] == s[..., :-1]) | (nan[..., 1:] & nan[..., :-1])
        edge = jnp.ones(s.shape[:-1] + (1,), bool)
        start = jnp.concatenate([edge, ~same], -1)
        end = jnp.concatenate([~same, edge], -1)
        pos = lax.broadcasted_iota(jnp.int32, s.shape, s.ndim - 1)
        first = lax.cummax(jnp.where(start, pos, 0), axis=s.ndim - 1)
        last = lax.cummin(jnp.where(end, pos, n - 1), axis=s.ndim - 1, reverse=True)
        best = jnp.argmax(last - first, axis=-1, keepdims=True)  # first maximum: the smallest value
        val = jnp.take_along_axis(s, best, axis=-1)
        ind = jnp.take_along_axis(order, jnp.take_along_axis(last, best, axis=-1), axis=-1)
        if not keepdim:
            val, ind = val[..., 0], ind[..., 0]
        else:
            val, ind = jnp.moveaxis(val, -1, d), jnp.moveaxis(ind, -1, d)
        return val, ind.astype(jnp.int64)

    val, ind = jaxfn.call(tr, "mode", f, [x], (d, bool(keepdim)))
    return E.convert(val, out_meta(tr, 0).dtype), ind


@lowering("histc")
def histc(tr, x, bins=100, min=0, max=0):
    """Counts in `bins` equal bins over [min, max] (the data's range when both are 0); the top edge falls
    in the last bin, values outside are ignored. The data range is found on the device."""
    out = out_meta(tr)

    def f(v):
        import jax.numpy as jnp

        v = v.reshape(-1).astype(jnp.promote_types(v.dtype, jnp.float32))  # cuda's accscalar arithmetic
        lo, hi = jnp.asarray(min, v.dtype), jnp.asarray(max, v.dtype)
        if min == 0 and max == 0 and v.size:
            lo, hi = jnp.min(v), jnp.max(v)
        lo, hi = jnp.where(lo == hi, lo - 1, lo), jnp.where(lo == hi, hi + 1, hi)
        b = ((v - lo) * bins / (hi - lo)).astype(jnp.int64)
        b = jnp.where(b == bins, bins - 1, b)
        ok = (v >= lo) & (v <= hi)
        return jnp.zeros((bins,), v.dtype).at[jnp.where(ok, b, bins)].add(1, mode="drop")

    return E.convert(jaxfn.call(tr, "histc", f, [x], (bins, float(min), float(max)))[0], out.dtype)


@lowering("nonzero_static")
def nonzero_static(tr, x, size, fill_value=-1):
    """The first `size` non-zero coordinates in row-major order, padded with fill_value: no host sync."""
    if x.numel == 0:
        return E.const(tr.fn, fill_value, torch.int64, out_meta(tr).shape)

    def f(v):
        import jax.numpy as jnp

        if v.ndim == 0:
            return jnp.zeros((size, 0), jnp.int64)
        coords = jnp.nonzero(v, size=size, fill_value=fill_value)
        return jnp.stack(coords, axis=1).astype(jnp.int64)

    return jaxfn.call(tr, "nonzero_static", f, [x], (size, fill_value))[0]


@lowering("put")
def put(tr, x, index, source, accumulate=False):
    """x.flatten()[index] = source (or += with accumulate); negative indices count from the end."""
    n = x.numel

    def f(v, idx, src):
        import jax.numpy as jnp

        flat = v.reshape(-1)
        i = idx.reshape(-1).astype(jnp.int64)
        i = jnp.where(i < 0, i + n, i)
        s = src.reshape(-1).astype(v.dtype)
        flat = (
            flat.at[i].add(s)
            if accumulate and v.dtype != jnp.bool_
            else flat.at[i].max(s)
            if accumulate
            else flat.at[i].set(s)
        )
        return flat.reshape(v.shape)

    if index.numel == 0:
        return x
    index = _flat_checked(tr, index, n)
    return jaxfn.call(tr, "put", f, [x, index, source], (accumulate,))[0]


def _flat_checked(tr, index, n):

    return checked(
        tr,
        index,
        n,
        negative=True,
        message=f"out of range: tried to access index {{value}} on a tensor of {n} elements.",
    )


@lowering("addbmm")
def addbmm(tr, x, b1, b2, beta=1, alpha=1):
    """beta * x + alpha * sum_b b1[b] @ b2[b] (one dot contracting batch and inner dims)."""
    out = out_meta(tr)
    dt = out.dtype

    def f(xv, a, b, be, al):
        import jax.numpy as jnp

        prod = jnp.einsum(
            "bij,bjk->ik",
            a,
            b,
            precision="highest",
            preferred_element_type=jnp.float32 if a.dtype in (jnp.bfloat16, jnp.float16) else None,
        )
        prod = (prod * al).astype(xv.dtype) if alpha != 1 else prod.astype(xv.dtype)
        if beta == 0:  # beta = 0 ignores x, NaNs included, as on CPU
            return jnp.broadcast_to(prod, out.shape)
        return (xv * be if beta != 1 else xv) + prod

    args = [E.convert(x, dt), E.convert(b1, dt), E.convert(b2, dt), tr.scalar(beta, dt), tr.scalar(alpha, dt)]
    return jaxfn.call(tr, "addbmm", f, args, (beta == 0, beta == 1, alpha == 1, tuple(out.shape)))[0]


@lowering("index_reduce")
def index_reduce(tr, x, dim, index, source, reduce, include_self=True):
    """x's slices along dim at index combined with source's by prod / mean / amax / amin."""
    if index.numel == 0:
        return x
    if x.rank == 0:
        x1 = E.reshape(x, (1,))
        return E.reshape(
            index_reduce(tr, x1, 0, E.reshape(index, (1,)), E.reshape(source, (1,)), reduce, include_self), ()
        )
    d = dim % x.rank
    size = x.shape[d]

    index = checked(tr, index, size, negative=False, dim=d)

    def f(v, idx, src):
        import jax.numpy as jnp

        idx = idx.reshape(-1).astype(jnp.int64)
        sel = (slice(None),) * d + (idx,)
        touched = jnp.zeros(v.shape[d], bool).at[idx].set(True)
        tshape = [1] * v.ndim
        tshape[d] = v.shape[d]
        touched = touched.reshape(tshape)
        src = src.astype(v.dtype)
        if reduce == "mean":
            acc = v.astype(jaxfn.acc_dtype(v.dtype))
            base = acc if include_self else jnp.where(touched, 0, acc)
            total = base.at[sel].add(src.astype(acc.dtype))
            cnt = jnp.zeros(v.shape[d], jnp.int64).at[idx].add(1).reshape(tshape) + (1 if include_self else 0)
            cnt = jnp.maximum(cnt, 1)
            res = total / cnt if jnp.issubdtype(v.dtype, jnp.floating) else total // cnt
            return jnp.where(touched, res, acc).astype(v.dtype)
        if reduce == "prod":
            base = v if include_self else jnp.where(touched, 1, v)
            return base.at[sel].multiply(src)
        big = jnp.finfo(v.dtype).max if jnp.issubdtype(v.dtype, jnp.floating) else jnp.iinfo(v.dtype).max
        if reduce == "amax":
            base = (
                v
                if include_self
                else jnp.where(
                    touched, -jnp.inf if jnp.issubdtype(v.dtype, jnp.floating) else jnp.iinfo(v.dtype).min, v
                )
            )
            return base.at[sel].max(src)
        base = v if include_self else jnp.where(touched, jnp.inf if jnp.issubdtype(v.dtype, jnp.floating) else big, v)
        return base.at[sel].min(src)

    return jaxfn.call(tr, "index_reduce", f, [x, index, source], (d, reduce, bool(include_self)))[0]


def _index_write(tr, name, x, dim, index, value):
    """x with its slices along dim at index replaced by value (a tensor of those slices, or a scalar)."""
    if index.numel == 0:
        return x
    if x.rank == 0:
        v = E.reshape(value, (1,)) if isinstance(value, E.Value) else value
        return E.reshape(_index_write(tr, name, E.reshape(x, (1,)), 0, E.reshape(index, (1,)), v), ())
    d = dim % x.rank
    size = x.shape[d]
    val = E.convert(value, x.dtype) if isinstance(value, E.Value) else tr.scalar(value, x.dtype)

    # index_fill counts negative indices from the end; index_copy rejects them (as CPU does)
    index = checked(
        tr,
        index,
        size,
        negative=name == "index_fill",
        dim=d,
        message=("index_copy_(): " if name == "index_copy" else "")
        + f"index {{value}} is out of bounds for dimension {d} with size {size}",
    )

    def f(v, idx, s):
        import jax.numpy as jnp
        from jax import lax

        idx = idx.reshape(-1).astype(jnp.int64)
        idx = jnp.where(idx < 0, idx + size, idx)
        if s.ndim == 0 and name == "index_copy" and v.ndim:
            s = s.reshape((1,) * v.ndim)
        n = idx.shape[0]
        if n > FEW_WRITES:
            return v.at[(slice(None),) * d + (idx,)].set(s)
        shape = list(v.shape)
        shape[d] = 1
        parts = [lax.slice_in_dim(s, k, k + 1, axis=d) if s.ndim == v.ndim and s.shape[d] == n else s for k in range(n)]
        return write_each(v, [d], [idx], [jnp.broadcast_to(p, shape).astype(v.dtype) for p in parts])

    return jaxfn.call(tr, name, f, [x, index, val], (d,))[0]


@lowering("index_copy")
def index_copy(tr, x, dim, index, source):
    return _index_write(tr, "index_copy", x, dim, index, source)


@lowering("index_fill.int_Scalar", "index_fill.int_Tensor")
def index_fill(tr, x, dim, index, value):
    return _index_write(tr, "index_fill", x, dim, index, value)


@lowering("take")
def take(tr, x, index):
    """x.flatten()[index], shaped like index; negative indices count from the end."""
    n = x.numel
    if index.numel == 0:
        return E.const(tr.fn, 0, x.dtype, index.shape)
    index = _flat_checked(tr, index, n)
    if n == 0:
        return E.const(tr.fn, 0, x.dtype, index.shape)

    def f(v, idx):
        import jax.numpy as jnp

        i = idx.astype(jnp.int64)
        return v.reshape(-1)[jnp.where(i < 0, i + n, i)]

    return jaxfn.call(tr, "take", f, [x, index])[0]
