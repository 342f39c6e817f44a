"""mm/bmm/addmm/baddbmm/mv/dot (matmul and linear decompose into these), addr, and _grouped_mm."""

from __future__ import annotations

import torch

from .. import dtypes as D
from .. import emit as E
from .. import jaxfn, runtime
from ..tables import META, lowering
from ..tables import out_meta as _meta


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


# -- grouped matrix products (mixture-of-experts layers: transformers' grouped_mm experts) -------------------------
def grouped_mm_meta(a, b, offs=None, bias=None, out_dtype=None):
    """torch's meta kernel for _grouped_mm checks CUDA's constraints (bfloat16 only, 16-byte strides); these are
    CPU's: any float dtype, int32 offsets when a 2-d operand is grouped. torch.compile's fake tensors use it too
    (compile.py registers it for tpu tensors)."""
    if a.dim() not in (2, 3) or b.dim() not in (2, 3):
        raise RuntimeError(f"Multiplicands must be 2D or 3D but got mat_a.dim()={a.dim()} and mat_b.dim()={b.dim()}")
    if a.dtype != b.dtype:
        raise RuntimeError(f"Expected mat_a and mat_b to have the same dtype, but got {a.dtype} and {b.dtype}")
    if bias is not None:
        raise RuntimeError("_grouped_mm: bias is not supported")
    if (offs is None) != (a.dim() == 3 and b.dim() == 3):
        raise RuntimeError("Have to provide offsets if there is a 2d matrix, or no offset if both matrices are 3d")
    if offs is not None and (offs.dim() != 1 or offs.dtype != torch.int32):
        raise RuntimeError("Offsets have to be int32" if offs.dtype != torch.int32 else "Offsets have to be 1-d")
    if a.size(-1) != b.size(-2):
        raise RuntimeError(f"contraction dimension of mat_a and mat_b must match, got {a.size(-1)} and {b.size(-2)}")
    if a.dim() == 2 and b.dim() == 2:
        shape = (offs.size(0), a.size(0), b.size(1))
    elif a.dim() == 2:
        if offs.size(0) != b.size(0):
            raise RuntimeError("matrix batch sizes have to match")
        shape = (a.size(0), b.size(2))
    elif b.dim() == 2:
        if offs.size(0) != a.size(0):
            raise RuntimeError("matrix batch sizes have to match")
        shape = (a.size(1), b.size(1))
    else:
        if a.size(0) != b.size(0):
            raise RuntimeError("batched dimension has to match")
        shape = (a.size(0), a.size(1), b.size(2))
    return torch.empty(shape, dtype=out_dtype or a.dtype, device="meta")


META["_grouped_mm"] = grouped_mm_meta


def _ragged(mode, op_dt, acc, out_dt):
    """The grouped product as JAX's ragged dot (a native grouped matmul on TPU; masked dense products on CPU), the
    group sizes taken from the offsets on the device: no host read, one program for every routing."""

    def f(a, b, offs):
        import jax.numpy as jnp
        from jax import lax

        a, b = a.astype(op_dt), b.astype(op_dt)
        offs = offs.astype(jnp.int32)
        sizes = jnp.diff(offs, prepend=jnp.zeros((1,), jnp.int32))
        if mode == "2d3d":  # rows of a grouped, one matrix of b per group
            r = lax.ragged_dot(a, b, sizes, preferred_element_type=acc)
        elif mode == "3d2d":  # columns of b grouped, one matrix of a per group: the transposed 2d3d product
            r = lax.ragged_dot(b.T, jnp.swapaxes(a, 1, 2), sizes, preferred_element_type=acc).T
        else:  # 2d2d: the contraction grouped, one product per group (the weight gradient of 2d3d)
            dn = lax.RaggedDotDimensionNumbers(
                dot_dimension_numbers=(([1], [0]), ([], [])), lhs_ragged_dimensions=[1], rhs_group_dimensions=[]
            )
            r = lax.ragged_dot_general(a, b, sizes, dn, preferred_element_type=acc)
        return r.astype(out_dt)

    return f


@lowering("_grouped_mm")
def grouped_mm(tr, a, b, offs=None, bias=None, out_dtype=None):
    """torch._grouped_mm: rows (2d x 3d), columns (3d x 2d) or the contraction (2d x 2d) split into groups ending at
    offs; 3d x 3d is a batched product. Rows (columns) after the last offset are zeros (CPU leaves them unset). Offsets
    that decrease, are negative or pass the grouped dimension are a device-side error (CPU reads out of bounds)."""
    m = _meta(tr)
    if offs is None:
        return _dot(a, b, [0], [0], [2], [1], m.dtype)
    mode = {(2, 3): "2d3d", (3, 2): "3d2d", (2, 2): "2d2d"}[(a.rank, b.rank)]
    extent = {"2d3d": a.shape[0], "3d2d": b.shape[1], "2d2d": a.shape[1]}[mode]
    n = offs.shape[0]
    o = E.convert(offs, torch.int64)
    prev = (
        E.concatenate([E.const(tr.fn, 0, torch.int64, (1,)), E.slice_(o, [0], [n - 1], [1])], 0)
        if n > 1
        else E.const(tr.fn, 0, torch.int64, (1,))
    )
    bad = E.binary("or", E.compare(o, prev, "LT"), E.compare(o, E.const(tr.fn, extent, torch.int64, (n,)), "GT"))
    tr.check(
        bad,
        o,
        RuntimeError,
        f"offsets must be nondecreasing, from 0 to {extent} (the grouped dimension); got an offset of {{value}}",
    )
    acc = E.acc_dtype(m.dtype)
    op_dt = acc if acc != a.dtype and runtime.get().platform == "cpu" else a.dtype  # see _dot
    fn = _ragged(mode, D.to_numpy(op_dt), D.to_numpy(acc), D.to_numpy(m.dtype))
    return jaxfn.call(tr, f"grouped_mm_{mode}", fn, [a, b, offs], static=(mode, str(op_dt), str(m.dtype)))[0]
