"""Convolutions (1d/2d/3d, strided, padded, dilated, grouped, transposed) and their gradients.

PyTorch routes every convolution on a PrivateUse1 device to `convolution_overrideable` and its backward to
`convolution_backward_overrideable`. Both lower through JAX's `lax.conv_general_dilated` (and `jax.vjp` for
gradients and transposed convolutions), inlined as private functions of the op's program.
"""

from __future__ import annotations

import torch

from .. import emit as E
from .. import jaxfn
from ..tables import META, lowering
from .reduction import reduce


def _dn(nd):
    sp = "DHW"[-nd:] if nd <= 3 else None
    return ("NC" + sp, "OI" + sp, "NC" + sp)


def _forward(stride, padding, dilation, groups, nd):
    from jax import lax

    def f(x, w):
        return lax.conv_general_dilated(
            x,
            w,
            window_strides=tuple(stride),
            padding=[(p, p) for p in padding],
            rhs_dilation=tuple(dilation),
            feature_group_count=groups,
            dimension_numbers=_dn(nd),
        )

    return _in_f32(f)


def _in_f32(f):
    """Low-precision inputs compute in f32 and round once at the end, as CPU does."""

    def g(*xs):
        dt = xs[0].dtype
        if dt.itemsize >= 4:
            return f(*xs)
        import jax

        out = f(*[x.astype("float32") for x in xs])
        return jax.tree_util.tree_map(lambda o: o.astype(dt), out)

    return g


def _transposed(stride, padding, dilation, groups, nd, out_shape):
    """PyTorch's transposed convolution is the input-gradient of the forward one; out_shape fixes the
    output padding."""
    import jax
    import jax.numpy as jnp

    fwd = _forward(stride, padding, dilation, groups, nd)

    def f(x, w):
        z = jnp.zeros(out_shape, x.dtype)
        y, vjp = jax.vjp(lambda z_: fwd(z_, w), z)
        # NOTE: with output_padding >= stride (allowed while < dilation) the forward convolution of the
        # output has more positions than x; PyTorch treats those as absent, i.e. zero.
        x = jnp.pad(x, [(0, 0), (0, 0)] + [(0, m - s) for m, s in zip(y.shape[2:], x.shape[2:])])
        return vjp(x)[0]

    def g(x, w):  # jax.vjp has no integer tangents: integer inputs go through float64 (exact below 2**53)
        if jnp.issubdtype(x.dtype, jnp.integer):
            return f(x.astype(jnp.float64), w.astype(jnp.float64)).astype(x.dtype)
        return f(x, w)

    return _in_f32(g)


def _conv_fn(stride, padding, dilation, transposed, groups, nd, out_shape):
    if transposed:
        return _transposed(stride, padding, dilation, groups, nd, out_shape)
    return _forward(stride, padding, dilation, groups, nd)


def _static(stride, padding, dilation, transposed, output_padding, groups, out_shape):
    return (
        tuple(stride),
        tuple(padding),
        tuple(dilation),
        bool(transposed),
        tuple(output_padding),
        groups,
        tuple(out_shape),
    )


def _conv_meta(x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    return torch.ops.aten.convolution.default(x, w, b, stride, padding, dilation, transposed, output_padding, groups)


META["convolution_overrideable"] = _conv_meta


def _expand(v, nd):
    v = list(v)
    return v * nd if len(v) == 1 else v


@lowering("convolution_overrideable")
def convolution(tr, x, w, b, stride, padding, dilation, transposed, output_padding, groups):
    nd = x.rank - 2
    stride, padding, dilation = _expand(stride, nd), _expand(padding, nd), _expand(dilation, nd)
    out = tr.out
    f = _conv_fn(stride, padding, dilation, transposed, groups, nd, out.shape)
    dt = out.dtype
    (y,) = jaxfn.call(
        tr,
        "conv",
        f,
        [E.convert(x, dt), E.convert(w, dt)],
        _static(stride, padding, dilation, transposed, output_padding, groups, out.shape),
    )
    if b is not None:
        y = E.add(y, E.broadcast_in_dim(E.convert(b, dt), y.shape, [1]))
    return y


def _conv_backward_meta(g, x, w, stride, padding, dilation, transposed, output_padding, groups, output_mask):
    bias = torch.empty((w.shape[1] * groups if transposed else w.shape[0],), dtype=g.dtype, device="meta")
    # an output left out of output_mask is undefined, as CPU's (aten's 1-d convolution_backward views a defined
    # grad_input back to 1-d only when it was asked for: a 4-d one would reach autograd)
    outs = (torch.empty_like(x), torch.empty_like(w), bias)
    return tuple(o if m else None for o, m in zip(outs, output_mask))


META["convolution_backward_overrideable"] = _conv_backward_meta


@lowering("convolution_backward_overrideable")
def convolution_backward(tr, g, x, w, stride, padding, dilation, transposed, output_padding, groups, output_mask):
    import jax

    nd = x.rank - 2
    stride, padding, dilation = _expand(stride, nd), _expand(padding, nd), _expand(dilation, nd)
    # for a transposed convolution the forward output (g's shape) fixes the output padding
    f = _conv_fn(stride, padding, dilation, transposed, groups, nd, g.shape)

    def bwd(x_, w_, g_):
        _, vjp = jax.vjp(f, x_, w_)
        return vjp(g_)

    bwd = _in_f32(bwd)

    dt = g.dtype
    gx, gw = jaxfn.call(
        tr,
        "conv_bwd",
        bwd,
        [E.convert(x, dt), E.convert(w, dt), g],
        _static(stride, padding, dilation, transposed, output_padding, groups, g.shape),
    )
    gb = reduce(g, [d for d in range(g.rank) if d != 1], "add", False) if output_mask[2] else None
    return tuple(v if m else None for v, m in zip((gx, gw, gb), output_mask))
