"""mm/bmm/addmm/baddbmm/mv/dot (matmul and linear decompose into these)."""
from __future__ import annotations

import torch

from .. import emit as E
from ..registry import lowering, out_meta as _meta


def _dot(a, b, lb, rb, lc, rc, out_dtype):
    if a.dtype != b.dtype:  # the meta kernels do not check this; CPU and CUDA do
        raise RuntimeError(f"expected both operands to have the same dtype, but got {a.dtype} and {b.dtype}")
    # NOTE: low-precision inputs accumulate in f32 (as CPU and TPU MXUs do), then round once.
    acc = E.acc_dtype(out_dtype)
    return E.convert(E.dot_general(E.convert(a, out_dtype), E.convert(b, out_dtype), lb, rb, lc, rc, acc), out_dtype)


@lowering("mm")
def mm(tr, a, b):
    return _dot(a, b, [], [], [1], [0], _meta(tr).dtype)


@lowering("bmm")
def bmm(tr, a, b):
    return _dot(a, b, [0], [0], [2], [1], _meta(tr).dtype)


@lowering("mv")
def mv(tr, a, v):
    return _dot(a, v, [], [], [1], [0], _meta(tr).dtype)


@lowering("dot")
def dot(tr, a, b):
    return _dot(a, b, [], [], [0], [0], _meta(tr).dtype)


def _scaled_add(tr, inp, prod, beta, alpha):
    dt = prod.dtype
    if alpha != 1:
        prod = E.mul(prod, tr.scalar(alpha, dt))
    if beta == 0:
        return prod
    inp = E.convert(inp, dt)
    if beta != 1:
        inp = E.mul(inp, tr.scalar(beta, dt))
    return E.add(E.broadcast_to(inp, prod.shape), prod)


@lowering("addmm")
def addmm(tr, inp, a, b, beta=1, alpha=1):
    return _scaled_add(tr, inp, mm(tr, a, b), beta, alpha)


@lowering("baddbmm")
def baddbmm(tr, inp, a, b, beta=1, alpha=1):
    return _scaled_add(tr, inp, bmm(tr, a, b), beta, alpha)


@lowering("addmv")
def addmv(tr, inp, a, v, beta=1, alpha=1):
    return _scaled_add(tr, inp, mv(tr, a, v), beta, alpha)
