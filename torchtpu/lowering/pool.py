"""Average pooling (1d/2d/3d through avg_pool2d/3d) and its gradient, via JAX's reduce_window."""

from __future__ import annotations

import math

import torch

from .. import emit as E
from .. import jaxfn
from ..tables import lowering
from ..tables import out_meta as _meta
from .upsample import apply_separable


def _out_size(n, k, s, p, ceil_mode):
    out = (n + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1
    if ceil_mode and (out - 1) * s >= n + p:  # the last window must start inside the input or left padding
        out -= 1
    return out


def _avg_pool_fn(nd, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override, in_shape):
    import jax.numpy as jnp
    from jax import lax

    spatial = in_shape[-nd:]
    outs = [_out_size(n, k, s, p, ceil_mode) for n, k, s, p in zip(spatial, kernel, stride, padding)]
    # extra high padding so that ceil_mode windows fit; those positions never count as elements
    extra = [max(0, (o - 1) * s + k - (n + 2 * p)) for o, n, k, s, p in zip(outs, spatial, kernel, stride, padding)]
    lead = len(in_shape) - nd
    win = (1,) * lead + tuple(kernel)
    strides = (1,) * lead + tuple(stride)

    def f(x):
        dt = x.dtype
        xf = x.astype("float32") if dt.itemsize < 4 else x
        pads = [(0, 0)] * lead + [(p, p + e) for p, e in zip(padding, extra)]
        total = lax.reduce_window(jnp.pad(xf, pads), 0.0, lax.add, win, strides, "VALID")
        if divisor_override:
            div = float(divisor_override)
        else:
            ones = jnp.ones(spatial, xf.dtype)
            if count_include_pad:  # padding counts, the ceil_mode overhang does not
                cnt = jnp.pad(jnp.pad(ones, [(p, p) for p in padding], constant_values=1.0), [(0, e) for e in extra])
            else:
                cnt = jnp.pad(ones, [(p, p + e) for p, e in zip(padding, extra)])
            div = lax.reduce_window(cnt, 0.0, lax.add, tuple(kernel), tuple(stride), "VALID")
        return (total / div).astype(dt)

    return f


def _norm(v, nd, default=None):
    v = list(v) if v else list(default)
    return v * nd if len(v) == 1 else v


def _avg_args(x, nd, kernel_size, stride, padding):
    k = _norm(kernel_size, nd)
    return k, _norm(stride, nd, k), _norm(padding, nd)


def _avg_pool_rule(nd):
    def rule(tr, x, kernel_size, stride=(), padding=0, ceil_mode=False, count_include_pad=True, divisor_override=None):
        k, s, p = _avg_args(x, nd, kernel_size, stride, [padding] if isinstance(padding, int) else padding)
        f = _avg_pool_fn(nd, k, s, p, ceil_mode, count_include_pad, divisor_override, x.shape)
        static = (tuple(k), tuple(s), tuple(p), ceil_mode, count_include_pad, divisor_override)
        return jaxfn.call(tr, f"avg_pool{nd}d", f, [x], static)[0]

    return rule


def _avg_pool_backward_rule(nd):
    def rule(tr, g, x, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override):
        import jax

        k, s, p = _avg_args(x, nd, kernel_size, stride, padding)
        f = _avg_pool_fn(nd, k, s, p, ceil_mode, count_include_pad, divisor_override, x.shape)

        def bwd(x_, g_):
            return jax.vjp(f, x_)[1](g_)[0]

        static = (tuple(k), tuple(s), tuple(p), ceil_mode, count_include_pad, divisor_override)
        return jaxfn.call(tr, f"avg_pool{nd}d_bwd", bwd, [x, E.convert(g, x.dtype)], static)[0]

    return rule


for _nd in (2, 3):
    lowering(f"avg_pool{_nd}d")(_avg_pool_rule(_nd))
    lowering(f"avg_pool{_nd}d_backward")(_avg_pool_backward_rule(_nd))


def _max_pool_fn(nd, kernel, stride, padding, dilation, ceil_mode, in_shape):
    """(values, int64 indices into each input plane), as max_pool{2,3}d_with_indices; the first maximum wins."""
    import jax.numpy as jnp
    from jax import lax

    spatial = in_shape[-nd:]
    eff = [d * (k - 1) + 1 for k, d in zip(kernel, dilation)]
    outs = [_out_size(n, e, s, p, ceil_mode) for n, e, s, p in zip(spatial, eff, stride, padding)]
    extra = [max(0, (o - 1) * s + e - (n + 2 * p)) for o, n, e, s, p in zip(outs, spatial, eff, stride, padding)]
    lead = len(in_shape) - nd

    def f(x):
        idx = jnp.broadcast_to(jnp.arange(math.prod(spatial), dtype=jnp.int64).reshape(spatial), x.shape)
        pads = [(0, 0)] * lead + [(p, p + e) for p, e in zip(padding, extra)]
        low = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
        xp = jnp.pad(x, pads, constant_values=low)
        ip = jnp.pad(idx, pads, constant_values=-1)

        def pick(a, b):
            (va, ia), (vb, ib) = a, b
            b_nan = vb != vb
            a_nan = va != va
            take_b = (vb > va) | (b_nan & ~a_nan) | (((vb == va) | (b_nan & a_nan)) & (ib < ia) & (ib >= 0)) | (ia < 0)
            return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

        init = (jnp.array(low, x.dtype), jnp.array(-1, jnp.int64))
        return lax.reduce_window(
            (xp, ip),
            init,
            pick,
            (1,) * lead + tuple(kernel),
            (1,) * lead + tuple(stride),
            "VALID",
            window_dilation=(1,) * lead + tuple(dilation),
        )

    return f


def _max_pool_rule(nd):
    def rule(tr, x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        k = _norm(kernel_size, nd)
        s, p = _norm(stride, nd, k), _norm([padding] if isinstance(padding, int) else padding, nd)
        d = _norm([dilation] if isinstance(dilation, int) else dilation, nd)
        f = _max_pool_fn(nd, k, s, p, d, ceil_mode, x.shape)
        v, i = jaxfn.call(tr, f"max_pool{nd}d", f, [x], (tuple(k), tuple(s), tuple(p), tuple(d), ceil_mode))
        return v, i

    return rule


def _max_pool_backward_rule(nd):
    def rule(tr, g, x, kernel_size, stride, padding, dilation, ceil_mode, indices):
        # Every output gradient lands on the input element its index names (scatter-add per plane).
        lead = x.shape[:-nd]
        planes = math.prod(lead)
        plane = math.prod(x.shape[-nd:])
        n_out = math.prod(g.shape[-nd:])
        acc = E.const(x.fn, 0, g.dtype, (planes, plane))
        rows = E.reshape(E.iota(x.fn, (planes, n_out), 0), (planes * n_out, 1))
        cols = E.reshape(E.convert(indices, torch.int64), (planes * n_out, 1))
        coords = E.concatenate([rows, cols], 1)
        out = E.scatter(acc, coords, E.reshape(g, (planes * n_out,)), [], [0, 1], [0, 1], 1, "stablehlo.add")
        return E.reshape(out, x.shape)

    return rule


for _nd in (2, 3):
    lowering(f"max_pool{_nd}d_with_indices")(_max_pool_rule(_nd))
    lowering(f"max_pool{_nd}d_with_indices_backward")(_max_pool_backward_rule(_nd))


# -- adaptive pooling: output cell i of a dim of size n -> m covers [floor(i*n/m), ceil((i+1)*n/m)) --------------
def _adaptive_bounds(n, m):
    return [((i * n) // m, -((-(i + 1) * n) // m)) for i in range(m)]


def _avg_matrix(n, m):
    """(m, n) matrix averaging each output cell's window: adaptive average pooling is separable."""
    import numpy as np

    a = np.zeros((m, n), np.float64)
    for i, (lo, hi) in enumerate(_adaptive_bounds(n, m)):
        a[i, lo:hi] = 1.0 / (hi - lo)
    return a


def _adaptive_avg(nd, x, sizes, transpose=False):

    return apply_separable(x, [_avg_matrix(n, m) for n, m in sizes], transpose)


def _adaptive_avg_rule(nd):
    def rule(tr, x, output_size):
        out = _meta(tr)
        dt = out.dtype
        acc = E.acc_dtype(dt)
        sizes = tuple((n, m) for n, m in zip(x.shape[-nd:], out.shape[-nd:]))
        if out.numel() == 0:
            return E.const(tr.fn, 0, dt, out.shape)
        f = lambda v: _adaptive_avg(nd, v, sizes)  # noqa: E731
        return E.convert(jaxfn.call(tr, f"adaptive_avg{nd}d", f, [E.convert(x, acc)], sizes)[0], dt)

    return rule


def _adaptive_avg_backward_rule(nd):
    def rule(tr, g, x):
        dt = _meta(tr).dtype
        acc = E.acc_dtype(dt)
        sizes = tuple((n, m) for n, m in zip(x.shape[-nd:], g.shape[-nd:]))
        if x.numel == 0:
            return E.const(tr.fn, 0, dt, x.shape)
        f = lambda v: _adaptive_avg(nd, v, sizes, transpose=True)  # noqa: E731
        return E.convert(jaxfn.call(tr, f"adaptive_avg{nd}d_bwd", f, [E.convert(g, acc)], sizes)[0], dt)

    return rule


def _adaptive_max_fn(nd, spatial, out_sizes):
    """Gathers every cell's (padded) window, masks the padding, and takes the first maximum (NaN wins)."""
    import numpy as np

    def f(x):
        import jax.numpy as jnp

        lead = x.ndim - nd
        vals, flat = x, None
        pos = []
        for k in range(nd):
            b = _adaptive_bounds(spatial[k], out_sizes[k])
            kmax = max(hi - lo for lo, hi in b)
            idx = np.array([[min(lo + j, hi - 1) for j in range(kmax)] for lo, hi in b])  # repeats stay in-window
            pos.append(idx)
        grids = np.meshgrid(*[p.reshape(-1) for p in pos], indexing="ij")  # over (o0*k0, o1*k1, ...)
        vals = x[(Ellipsis, *grids)]
        shape = [s for k in range(nd) for s in pos[k].shape]  # (o0, k0, o1, k1, ...)
        vals = vals.reshape(x.shape[:lead] + tuple(shape))
        strides = np.cumprod((spatial[1:] + (1,))[::-1])[::-1]
        flat = sum(np.asarray(g, np.int64) * int(s) for g, s in zip(grids, strides)).reshape(shape)
        order = list(range(lead)) + [lead + 2 * k for k in range(nd)] + [lead + 2 * k + 1 for k in range(nd)]
        vals = jnp.transpose(vals, order).reshape(x.shape[:lead] + tuple(out_sizes) + (-1,))
        flat = np.transpose(flat, [2 * k for k in range(nd)] + [2 * k + 1 for k in range(nd)])
        flat = flat.reshape(tuple(out_sizes) + (-1,))
        j = jnp.argmax(vals, axis=-1)  # first maximum; NaN counts as the maximum, as on CPU
        best = jnp.take_along_axis(vals, j[..., None], -1)[..., 0]
        return best, jnp.asarray(flat)[tuple(np.indices(out_sizes)) + (j,)].astype(jnp.int64)

    return f


def _adaptive_max_rule(nd):
    def rule(tr, x, output_size):
        out = _meta(tr, 0)
        if out.numel() == 0:
            return E.const(tr.fn, 0, out.dtype, out.shape), E.const(tr.fn, 0, torch.int64, out.shape)
        spatial, sizes = tuple(x.shape[-nd:]), tuple(out.shape[-nd:])
        v, i = jaxfn.call(tr, f"adaptive_max{nd}d", _adaptive_max_fn(nd, spatial, sizes), [x], (spatial, sizes))
        return v, i

    return rule


def _adaptive_max_backward_rule(nd):
    scatter_back = _max_pool_backward_rule(nd)

    def rule(tr, g, x, indices):
        return scatter_back(tr, g, x, None, None, None, None, None, indices)

    return rule


for _nd in (2, 3):
    lowering(f"_adaptive_avg_pool{_nd}d")(_adaptive_avg_rule(_nd))
    lowering(f"_adaptive_avg_pool{_nd}d_backward")(_adaptive_avg_backward_rule(_nd))
    lowering(f"adaptive_max_pool{_nd}d")(_adaptive_max_rule(_nd))
    lowering(f"adaptive_max_pool{_nd}d_backward")(_adaptive_max_backward_rule(_nd))
