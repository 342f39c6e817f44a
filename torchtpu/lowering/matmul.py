"""mm/bmm/addmm/baddbmm/mv/dot (matmul and linear decompose into these)."""
from __future__ import annotations

import torch

from .. import emit as E
from .. import runtime
from ..tables import lowering, out_meta as _meta


def _dot(a, b, lb, rb, lc, rc, out_dtype):
    if a.dtype != b.dtype:  # the meta kernels do not check this; CPU and CUDA do
        raise RuntimeError(f"expected both operands to have the same dtype, but got {a.dtype} and {b.dtype}")
    # NOTE: low-precision inputs accumulate in f32 (as CPU and TPU MXUs do), then round once.
    acc = E.acc_dtype(out_dtype)
    # XLA:CPU's dot thunk has no bf16 x bf16 -> f32 kernel for some shapes (batched ones, UNIMPLEMENTED at run
    # time): on CPU the operands widen first (exact); accelerators keep the low-precision MXU/tensor-core path.
    op_dt = acc if acc != out_dtype and runtime.get().platform == "cpu" else out_dtype
    return E.convert(E.dot_general(E.convert(a, op_dt), E.convert(b, op_dt), lb, rb, lc, rc, acc), out_dtype)


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


@lowering("addr")
def addr(tr, x, v1, v2, beta=1, alpha=1):
    """beta * x + alpha * outer(v1, v2), elementwise as CPU's kernel: `beta * x + (alpha * v1) * v2`, each
    operation rounded to the dtype in half precision (beta and alpha too); x is ignored when beta is 0."""
    m = _meta(tr)
    dt, shape = m.dtype, tuple(m.shape)
    a = E.broadcast_to(E.reshape(E.convert(v1, dt), (v1.shape[0], 1)), shape)
    b = E.broadcast_to(E.reshape(E.convert(v2, dt), (1, v2.shape[0])), shape)
    xv = E.broadcast_to(E.convert(x, dt), shape)
    if dt == torch.bool:
        prod = E.binary("and", a, b) if alpha else E.const(tr.fn, False, dt, shape)
        return E.binary("or", xv, prod) if beta else prod
    cdt = E.acc_dtype(dt)

    def op(f, u, w):  # one operation, rounded to dt
        return E.convert(f(E.convert(u, cdt), E.convert(w, cdt)), dt)

    def scal(v):
        return E.broadcast_to(tr.scalar(v, dt), shape)

    prod = op(E.mul, op(E.mul, scal(alpha), a) if alpha != 1 else a, b)
    if beta == 0:
        return prod
    return op(E.add, op(E.mul, scal(beta), xv) if beta != 1 else xv, prod)
