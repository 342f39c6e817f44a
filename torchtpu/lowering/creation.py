"""Fills, ranges and triangular masks (zeros/ones/full/*_like reach these through empty + fill_)."""

from __future__ import annotations

import math

import torch

from .. import emit as E
from ..tables import lowering
from ..tables import out_meta as _meta


@lowering("fill.Scalar", "fill.Tensor")
def fill(tr, x, value):
    m = _meta(tr)
    if type(value) in (int, float, bool) and value == 0 and math.copysign(1.0, value) > 0:  # not a runtime scalar
        return tr.zeros(m.dtype, m.shape)
    v = E.convert(value, m.dtype) if isinstance(value, E.Value) else tr.scalar(value, m.dtype)
    return E.broadcast_to(E.reshape(v, ()), m.shape)


@lowering("zero")
def zero(tr, x):
    return tr.zeros(x.dtype, x.shape)


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
    return tr.zeros(m.dtype, m.shape)


def _spaced(tr, start, end, steps, base=None):
    """linspace/logspace as CPU's kernels: start and end are cast to the dtype first (integers truncate, halves
    round), the step is (end - start) / (steps - 1) (in double for integers), the first half counts up from
    start and the second down from end. linspace in half precision rounds after every operation, as c10's
    scalar types do; logspace computes its exponents in float32 and raises base to them. A single-step
    logspace is base ** start, start as given."""
    dt = _meta(tr).dtype
    if steps == 0:
        return E.const(tr.fn, 0, dt, (0,))
    cdt = torch.float64 if not dt.is_floating_point else E.acc_dtype(dt)
    per_op = cdt != dt and dt.is_floating_point and base is None

    def rnd(v):  # round to the dtype after an operation (half-precision linspace only)
        return E.convert(E.convert(v, dt), cdt) if per_op else v

    def operand(x, cast):
        v = (E.convert(x, dt) if cast else x) if isinstance(x, E.Value) else tr.scalar(x, dt if cast else cdt)
        return E.convert(v, cdt)

    if steps == 1:
        v = operand(start, base is None)
    else:
        s, e = operand(start, True), operand(end, True)
        c = lambda val: E.const(tr.fn, val, cdt, (steps,))  # noqa: E731
        # the divisor is a runtime scalar: XLA would turn a division by a constant into an inexact reciprocal
        step = E.broadcast_to(rnd(E.div(rnd(E.sub(e, s)), tr.scalar(float(steps - 1), cdt))), (steps,))
        idx = E.iota(tr.fn, (steps,), 0, cdt)
        up = rnd(E.add(E.broadcast_to(s, (steps,)), rnd(E.mul(step, idx))))
        down = rnd(E.sub(E.broadcast_to(e, (steps,)), rnd(E.mul(step, E.sub(c(steps - 1), idx)))))
        v = E.select(E.compare(idx, c(steps // 2), "LT"), up, down)
    if base is not None:
        v = E.binary("power", E.broadcast_to(tr.scalar(float(base), cdt), v.shape), v)
    return E.convert(E.broadcast_to(v, (steps,)), dt)


@lowering("linspace", "linspace.Tensor_Tensor", "linspace.Tensor_Scalar", "linspace.Scalar_Tensor")
def linspace(tr, start, end, steps, dtype=None, layout=None, device=None, pin_memory=None):
    return _spaced(tr, start, end, steps)


@lowering("linspace.out", "linspace.Tensor_Tensor_out", "linspace.Tensor_Scalar_out", "linspace.Scalar_Tensor_out")
def linspace_out(tr, start, end, steps):
    return _spaced(tr, start, end, steps)


@lowering("logspace", "logspace.Tensor_Tensor", "logspace.Tensor_Scalar", "logspace.Scalar_Tensor")
def logspace(tr, start, end, steps, base=10.0, dtype=None, layout=None, device=None, pin_memory=None):
    return _spaced(tr, start, end, steps, base)


@lowering("logspace.out", "logspace.Tensor_Tensor_out", "logspace.Tensor_Scalar_out", "logspace.Scalar_Tensor_out")
def logspace_out(tr, start, end, steps, base=10.0):
    return _spaced(tr, start, end, steps, base)
