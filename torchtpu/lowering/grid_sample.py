"""grid_sampler_2d/3d (bilinear / nearest / bicubic; zeros / border / reflection padding) and their gradients.

The forward is a JAX function following PyTorch's CPU kernel (GridSampler.h): unnormalize the grid, pad the
coordinates, gather the taps with a validity mask. The gradient is JAX's vjp of that same function, so input
and grid gradients come from one definition.
"""

from __future__ import annotations

from .. import emit as E
from .. import jaxfn
from ..tables import lowering, out_meta

BILINEAR, NEAREST, BICUBIC = 0, 1, 2
ZEROS, BORDER, REFLECTION = 0, 1, 2
_A = -0.75


def _sampler(interp, padding, align):
    def unnormalize(c, size):
        return (c + 1) / 2 * (size - 1) if align else ((c + 1) * size - 1) / 2

    # Gradients as CPU defines them: zero on and beyond the border; reflection flips the sign per fold.
    def clip(jnp, c, size):
        import jax

        inside = (c > 0) & (c < size - 1)
        return jnp.where(inside, c, jax.lax.stop_gradient(jnp.clip(c, 0, size - 1)))

    def reflect(jnp, c, twice_low, twice_high):
        import jax

        if twice_low == twice_high:
            return jnp.zeros_like(c)
        lo = twice_low / 2
        span = (twice_high - twice_low) / 2
        c = c - lo
        c = jnp.where(c < 0, -c, c)
        extra = jnp.fmod(c, span)
        flips = jax.lax.stop_gradient(jnp.floor(c / span))
        return jnp.where(jnp.fmod(flips, 2) == 0, extra + lo, span - extra + lo)

    def pad(jnp, c, size):
        if padding == BORDER:
            return clip(jnp, c, size)
        if padding == REFLECTION:
            c = reflect(jnp, c, 0, 2 * (size - 1)) if align else reflect(jnp, c, -1, 2 * size - 1)
            return clip(jnp, c, size)
        return c

    def f(inp, grid):
        import itertools

        import jax.numpy as jnp

        sizes = inp.shape[2:]  # (H, W) or (D, H, W); grid's last axis holds (x, y[, z]) = reversed dims
        nd = len(sizes)
        batch = jnp.arange(inp.shape[0]).reshape((-1,) + (1,) * nd)

        def tap(idx):  # integer coordinates per dim -> (N, C, *out), zero outside the input
            ok = jnp.ones(idx[0].shape, bool)
            for i, n in zip(idx, sizes):
                ok = ok & (i >= 0) & (i < n)
            v = inp[(batch, slice(None), *[jnp.clip(i, 0, n - 1) for i, n in zip(idx, sizes)])]
            return jnp.moveaxis(jnp.where(ok[..., None], v, 0), -1, 1)

        coords = [unnormalize(grid[..., nd - 1 - k], sizes[k]) for k in range(nd)]
        if interp == BICUBIC:

            def coeffs(t):
                c1 = lambda v: ((_A + 2) * v - (_A + 3)) * v * v + 1  # noqa: E731
                c2 = lambda v: ((_A * v - 5 * _A) * v + 8 * _A) * v - 4 * _A  # noqa: E731
                return [c2(t + 1), c1(t), c1(1 - t), c2(2 - t)]

            base = [jnp.floor(c) for c in coords]
            ws = [coeffs(c - b) for c, b in zip(coords, base)]
            out = 0
            for taps in itertools.product(range(4), repeat=nd):
                idx = [pad(jnp, b - 1 + t, n).astype(jnp.int64) for b, t, n in zip(base, taps, sizes)]
                wgt = 1
                for w_, t in zip(ws, taps):
                    wgt = wgt * w_[t]
                out = out + tap(idx) * wgt[:, None]
            return out
        coords = [pad(jnp, c, n) for c, n in zip(coords, sizes)]
        if interp == NEAREST:
            return tap([jnp.round(c).astype(jnp.int64) for c in coords])
        base = [jnp.floor(c) for c in coords]
        frac = [c - b for c, b in zip(coords, base)]
        out = 0
        for corner in itertools.product((0, 1), repeat=nd):
            wgt = 1
            for fr, k in zip(frac, corner):
                wgt = wgt * (fr if k else 1 - fr)
            out = out + tap([b.astype(jnp.int64) + k for b, k in zip(base, corner)]) * wgt[:, None]
        return out

    return f


def _forward_rule(nd):
    def rule(tr, inp, grid, interpolation_mode, padding_mode, align_corners):
        out = out_meta(tr)
        if out.numel() == 0:
            return E.const(tr.fn, 0, out.dtype, out.shape)
        acc = E.acc_dtype(out.dtype)
        static = (interpolation_mode, padding_mode, bool(align_corners))
        res = jaxfn.call(
            tr, f"grid_sampler_{nd}d", _sampler(*static), [E.convert(inp, acc), E.convert(grid, acc)], static
        )[0]
        return E.convert(res, out.dtype)

    return rule


def _backward_rule(nd):
    def rule(tr, grad, inp, grid, interpolation_mode, padding_mode, align_corners, output_mask):
        gi, gg = out_meta(tr, 0), out_meta(tr, 1)
        if grad.numel == 0 or inp.numel == 0:
            return E.const(tr.fn, 0, inp.dtype, inp.shape), E.const(tr.fn, 0, grid.dtype, grid.shape)
        acc = E.acc_dtype(inp.dtype)
        static = (interpolation_mode, padding_mode, bool(align_corners))
        f = _sampler(*static)

        def bwd(g, i, gr):
            import jax

            _, vjp = jax.vjp(f, i, gr)
            return vjp(g)

        di, dg = jaxfn.call(
            tr,
            f"grid_sampler_{nd}d_bwd",
            bwd,
            [E.convert(grad, acc), E.convert(inp, acc), E.convert(grid, acc)],
            static,
        )
        di = E.convert(di, gi.dtype) if output_mask[0] else E.const(tr.fn, 0, gi.dtype, gi.shape)
        return di, E.convert(dg, gg.dtype)

    return rule


for _nd in (2, 3):
    lowering(f"grid_sampler_{_nd}d")(_forward_rule(_nd))
    lowering(f"grid_sampler_{_nd}d_backward")(_backward_rule(_nd))
