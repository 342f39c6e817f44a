"""upsample_* / interpolate (nearest, nearest-exact, linear, bilinear, trilinear, bicubic, antialiased bilinear
and bicubic) and their gradients.

Every mode is separable: along each spatial dim the output is a fixed (out, in) weight matrix times the input,
so the forward is one matmul per dim and the gradient is the transposed matmul (MXU work on a TPU, no
scatter). The weights are built on the host with PyTorch's index arithmetic (float32 scales, the same
clamping), so the taps match the CPU kernels.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .. import emit as E
from .. import jaxfn
from ..tables import lowering, out_meta

_F = np.float32
_CUBIC_A = -0.75


def apply_separable(x, mats, transpose=False):
    """x (..., n_1..n_k) times mats[i] (m_i, n_i) along each of the last k dims (or the transposes)."""
    import jax.numpy as jnp

    k = len(mats)
    for i, m in enumerate(mats):
        axis = x.ndim - k + i
        a = jnp.asarray(m, x.dtype)
        x = jnp.moveaxis(jnp.tensordot(x, a if transpose else a.T, axes=([axis], [0]), precision="highest"), -1, axis)
    return x


def _scale(n_in, n_out, align_corners, scale):
    if align_corners:
        return _F((n_in - 1) / (n_out - 1)) if n_out > 1 else _F(0)
    return _F(1.0 / scale) if scale is not None and scale > 0 else _F(n_in / n_out)


def _source(scale, dst, align_corners, cubic):
    if align_corners:
        return _F(scale * _F(dst))
    src = _F(scale * _F(dst + 0.5) - _F(0.5))
    return _F(0) if not cubic and src < 0 else src


def _nearest(n_in, n_out, scale, exact):
    m = np.zeros((n_out, n_in))
    s = _F(1.0 / scale) if scale is not None and scale > 0 else _F(n_in / n_out)
    for o in range(n_out):
        if n_out == n_in:
            i = o
        elif n_out == 2 * n_in and not exact:
            i = o >> 1
        else:
            i = min(int(math.floor(_F(_F(o + 0.5) * s) if exact else _F(_F(o) * s))), n_in - 1)
        m[o, i] = 1.0
    return m


def _linear(n_in, n_out, align_corners, scale):
    m = np.zeros((n_out, n_in))
    s = _scale(n_in, n_out, align_corners, scale)
    for o in range(n_out):
        real = _source(s, o, align_corners, False)
        i0 = min(int(math.floor(real)), n_in - 1)
        l1 = min(max(_F(real - i0), _F(0)), _F(1))
        i1 = i0 + (1 if i0 < n_in - 1 else 0)
        m[o, i0] += _F(1) - l1
        m[o, i1] += l1
    return m


def _cubic(n_in, n_out, align_corners, scale):
    def c1(x):
        return ((_CUBIC_A + 2) * x - (_CUBIC_A + 3)) * x * x + 1

    def c2(x):
        return ((_CUBIC_A * x - 5 * _CUBIC_A) * x + 8 * _CUBIC_A) * x - 4 * _CUBIC_A

    m = np.zeros((n_out, n_in))
    s = _scale(n_in, n_out, align_corners, scale)
    for o in range(n_out):
        real = _source(s, o, align_corners, True)
        base = int(math.floor(real))
        t = float(_F(real - base))
        for k, w in enumerate((c2(t + 1), c1(t), c1(1 - t), c2(2 - t))):
            m[o, min(max(base - 1 + k, 0), n_in - 1)] += w
    return m


def _aa_filter(kind):
    if kind == "linear_aa":
        return lambda x: max(_F(0), _F(1) - abs(x))

    a = _F(-0.5)  # antialiased bicubic uses a = -0.5 (PIL's), plain bicubic -0.75

    def cubic(x):
        x = abs(x)
        if x < 1:
            return ((a + 2) * x - (a + 3)) * x * x + 1
        return (((x - 5) * x + 8) * x - 4) * a if x < 2 else _F(0)

    return cubic


def _antialias(kind, n_in, n_out, align_corners, scale):
    """Antialiased resampling (PIL's): a downscale widens the filter by the scale, each output row sums the
    taps of [center - support, center + support) normalised to 1 -- CPU's float32 arithmetic."""
    m = np.zeros((n_out, n_in))
    s = _scale(n_in, n_out, align_corners, scale)
    interp = 2 if kind == "linear_aa" else 4
    support = _F(interp * 0.5) * s if s >= 1 else _F(interp * 0.5)
    inv = _F(1) / s if s >= 1 else _F(1)
    filt = _aa_filter(kind)
    for o in range(n_out):
        center = _F(s * _F(o + 0.5))
        lo = max(int(_F(center - support + _F(0.5))), 0)
        hi = min(int(_F(center + support + _F(0.5))), n_in)
        w = np.array([filt(_F(_F(j - center + _F(0.5)) * inv)) for j in range(lo, hi)], dtype=_F)
        total = w.sum(dtype=_F)
        m[o, lo:hi] = w / total if total != 0 else w
    return m


@functools.lru_cache(maxsize=256)
def _matrices(kind, in_sizes, out_sizes, align_corners, scales):
    """Per-dim weight matrices; cached, since a training loop asks for the same ones every step."""
    scales = list(scales) + [None] * (len(in_sizes) - len(scales))
    if kind in ("nearest", "nearest_exact"):
        return [_nearest(n, m, s, kind == "nearest_exact") for n, m, s in zip(in_sizes, out_sizes, scales)]
    if kind.endswith("_aa"):
        return [_antialias(kind, n, m, align_corners, s) for n, m, s in zip(in_sizes, out_sizes, scales)]
    make = _cubic if kind == "cubic" else _linear
    return [make(n, m, align_corners, s) for n, m, s in zip(in_sizes, out_sizes, scales)]


def _run(tr, name, x, key, transpose, dt, shape):
    if math.prod(shape) == 0:
        return E.const(tr.fn, 0, dt, shape)
    f = lambda v: apply_separable(v, _matrices(*key), transpose)  # noqa: E731
    return E.convert(jaxfn.call(tr, name, f, [E.convert(x, E.acc_dtype(dt))], (transpose, key))[0], dt)


def _forward_rule(kind, nd, has_align):
    def rule(tr, x, output_size, *rest):
        align, scales = (rest[0], rest[1:]) if has_align else (False, rest)
        out = out_meta(tr)
        key = (kind, tuple(x.shape[-nd:]), tuple(out.shape[-nd:]), bool(align), tuple(scales))
        return _run(tr, f"upsample_{kind}{nd}d", x, key, False, out.dtype, tuple(out.shape))

    return rule


def _backward_rule(kind, nd, has_align):
    def rule(tr, grad, output_size, input_size, *rest):
        align, scales = (rest[0], rest[1:]) if has_align else (False, rest)
        key = (kind, tuple(input_size[-nd:]), tuple(output_size), bool(align), tuple(scales))
        return _run(tr, f"upsample_{kind}{nd}d_bwd", grad, key, True, grad.dtype, tuple(input_size))

    return rule


for _nd in (1, 2, 3):
    for _op, _kind in ((f"upsample_nearest{_nd}d", "nearest"), (f"_upsample_nearest_exact{_nd}d", "nearest_exact")):
        lowering(_op)(_forward_rule(_kind, _nd, False))
        lowering(f"{_op}_backward")(_backward_rule(_kind, _nd, False))
for _op, _kind, _nd in (
    ("upsample_linear1d", "linear", 1),
    ("upsample_bilinear2d", "linear", 2),
    ("upsample_trilinear3d", "linear", 3),
    ("upsample_bicubic2d", "cubic", 2),
    ("_upsample_bilinear2d_aa", "linear_aa", 2),
    ("_upsample_bicubic2d_aa", "cubic_aa", 2),
):
    lowering(_op)(_forward_rule(_kind, _nd, True))
    lowering(f"{_op}_backward")(_backward_rule(_kind, _nd, True))
