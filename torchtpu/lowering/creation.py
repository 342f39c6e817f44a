"""Fills, ranges and triangular masks (zeros/ones/full/*_like reach these through empty + fill_)."""
from __future__ import annotations

import torch

from .. import emit as E
from ..registry import lowering, out_meta as _meta


@lowering("fill.Scalar", "fill.Tensor")
def fill(tr, x, value):
    m = _meta(tr)
    v = E.convert(value, m.dtype) if isinstance(value, E.Value) else tr.scalar(value, m.dtype)
    return E.broadcast_to(E.reshape(v, ()), m.shape)


@lowering("zero")
def zero(tr, x):
    return E.const(x.fn, 0, x.dtype, x.shape)


@lowering("arange.start_step")
def arange(tr, start, end=None, step=1, dtype=None, layout=None, device=None, pin_memory=None):
    m = _meta(tr)
    n = m.shape[0]
    ct = torch.float64 if m.dtype.is_floating_point else torch.int64
    i = E.iota(tr.fn, (n,), 0, ct)
    v = E.add(E.mul(i, E.broadcast_to(tr.scalar(step, ct), (n,))), E.broadcast_to(tr.scalar(start, ct), (n,)))
    return E.convert(v, m.dtype)


def _tri(tr, x, diagonal, lower):
    r, c = x.shape[-2], x.shape[-1]
    rows = E.iota(x.fn, (r, c), 0)
    cols = E.iota(x.fn, (r, c), 1)
    diff = E.sub(cols, rows)
    keep = E.compare(diff, E.const(x.fn, diagonal, torch.int64, (r, c)), "LE" if lower else "GE")
    return E.select(E.broadcast_to(keep, x.shape), x, E.const(x.fn, 0, x.dtype, x.shape))


@lowering("tril")
def tril(tr, x, diagonal=0):
    return _tri(tr, x, diagonal, True)


@lowering("triu")
def triu(tr, x, diagonal=0):
    return _tri(tr, x, diagonal, False)


@lowering("arange.start_out")
def arange_out(tr, start, end, step=1):
    return arange(tr, start, end, step)


@lowering("_efficientzerotensor")
def efficient_zero_tensor(tr, size, dtype=None, layout=None, device=None, pin_memory=None):
    """The zeros autograd uses for gradients known to vanish (a plain zero tensor on tpu)."""
    m = _meta(tr)
    return E.const(tr.fn, 0, m.dtype, m.shape)
