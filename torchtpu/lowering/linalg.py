"""Dense linear algebra (real and complex) through JAX (jax.lax.linalg): LU, solve, inverse, determinants, Cholesky,
triangular solves, eigh, SVD, QR, matrix_exp.

JAX picks each platform's own factorization (LAPACK custom calls on CPU, XLA's TPU expanders, cuSOLVER).
PyTorch's packed outputs are reproduced: LU pivots are 1-based LAPACK row swaps (int32), `info` is LAPACK's
(the first zero pivot of U; for Cholesky the order of the first leading minor that is not positive
definite). Gradients are PyTorch's own formulas, which reduce to these ops and matmuls.
"""

from __future__ import annotations

from .. import emit as E
from .. import jaxfn
from ..tables import lowering, out_meta


def _call(tr, name, f, args, static=()):
    metas = tr.out if isinstance(tr.out, (tuple, list)) else (tr.out,)
    if any(a.numel == 0 for a in args if isinstance(a, E.Value)):  # empty matrices or batches: zeros
        out = [E.const(tr.fn, 0, m.dtype, m.shape) for m in metas]
        return tuple(out) if isinstance(tr.out, (tuple, list)) else out[0]
    res = jaxfn.call(tr, name, f, args, static)
    out = [E.convert(r, m.dtype) if m is not None and r.dtype != m.dtype else r for r, m in zip(res, metas)]
    return tuple(out) if isinstance(tr.out, (tuple, list)) else out[0]


def _mT(x):
    import jax.numpy as jnp

    return jnp.swapaxes(x, -1, -2)


def _mH(x):
    """The adjoint (conjugate transpose); the transpose for real matrices."""
    import jax.numpy as jnp

    return jnp.conj(_mT(x)) if jnp.iscomplexobj(x) else _mT(x)


def _lu(a):
    """(packed LU, 1-based int32 pivots, permutation, LAPACK info) of a batch of square matrices."""
    import jax.numpy as jnp
    from jax import lax

    lu, piv, perm = lax.linalg.lu(a)
    if min(a.shape[-2:]) == 0:
        return lu, (piv + 1).astype(jnp.int32), perm, jnp.zeros(a.shape[:-2], jnp.int32)
    zero = jnp.diagonal(lu, axis1=-2, axis2=-1) == 0
    first = jnp.argmax(zero, axis=-1)
    info = jnp.where(jnp.any(zero, axis=-1), first + 1, 0).astype(jnp.int32)
    return lu, (piv + 1).astype(jnp.int32), perm, info


def _perm_from_pivots(piv, n):
    import jax.numpy as jnp
    from jax import lax

    return lax.linalg.lu_pivots_to_permutation((piv - 1).astype(jnp.int32), n)


def _lu_solve(lu, perm, b, adjoint=False):
    """Solves A x = b (or A^H x = b) for column blocks b (..., n, k), with P A = L U."""
    import jax.numpy as jnp
    from jax import lax

    if not adjoint:
        pb = jnp.take_along_axis(b, perm[..., :, None], axis=-2)
        y = lax.linalg.triangular_solve(lu, pb, left_side=True, lower=True, unit_diagonal=True)
        return lax.linalg.triangular_solve(lu, y, left_side=True, lower=False)
    y = lax.linalg.triangular_solve(lu, b, left_side=True, lower=False, transpose_a=True, conjugate_a=True)
    z = lax.linalg.triangular_solve(
        lu, y, left_side=True, lower=True, unit_diagonal=True, transpose_a=True, conjugate_a=True
    )
    inv = jnp.argsort(perm, axis=-1)
    return jnp.take_along_axis(z, inv[..., :, None], axis=-2)


def _batch_to(x, batch):
    import jax.numpy as jnp

    return jnp.broadcast_to(x, tuple(batch) + x.shape[-2:])


# -- LU family ---------------------------------------------------------------------------------------------
@lowering("linalg_lu_factor_ex")
def lu_factor_ex(tr, a, pivot=True, check_errors=False):
    if not pivot:
        raise NotImplementedError("linalg.lu_factor: LU without pivoting is not implemented on tpu (nor on CPU)")

    def f(x):
        lu_, piv, _, info = _lu(x)
        return lu_, piv, info

    return _call(tr, "lu_factor", f, [a])


@lowering("linalg_lu_solve")
def lu_solve(tr, lu, pivots, b, left=True, adjoint=False):
    out = out_meta(tr)
    n = lu.shape[-1]

    def f(lu_, piv, b_):
        batch = out.shape[:-2]
        lu_ = _batch_to(lu_, batch)
        piv = _broadcast(piv, tuple(batch) + (n,))
        perm = _perm_from_pivots(piv, n)
        if left:
            return _lu_solve(lu_, perm, _batch_to(b_, batch), adjoint)
        # X A = B  <=>  A^H X^H = B^H (and X A^H = B  <=>  A X^H = B^H)
        return _mH(_lu_solve(lu_, perm, _mH(_batch_to(b_, batch)), not adjoint))

    return _call(tr, "lu_solve", f, [lu, pivots, b], (left, adjoint, tuple(out.shape)))


def _broadcast(x, shape):
    import jax.numpy as jnp

    return jnp.broadcast_to(x, shape)


@lowering("lu_unpack")
def lu_unpack(tr, lu, pivots, unpack_data=True, unpack_pivots=True):
    p_m, l_m, u_m = (out_meta(tr, i) for i in range(3))
    m, n = lu.shape[-2], lu.shape[-1]
    k = min(m, n)

    def f(lu_, piv):
        import jax.numpy as jnp

        outs = []
        if unpack_pivots:
            perm = _perm_from_pivots(piv, m)
            # P with A = P L U: column j of P is e_{perm[j]}
            outs.append(jnp.swapaxes(jnp.eye(m, dtype=lu_.dtype)[perm], -1, -2))
        else:
            outs.append(jnp.zeros(p_m.shape, lu_.dtype))
        if unpack_data:
            low = jnp.tril(lu_[..., :, :k], -1) + jnp.eye(m, k, dtype=lu_.dtype)
            outs += [low, jnp.triu(lu_[..., :k, :])]
        else:
            outs += [jnp.zeros(l_m.shape, lu_.dtype), jnp.zeros(u_m.shape, lu_.dtype)]
        return tuple(outs)

    return _call(tr, "lu_unpack", f, [lu, pivots], (unpack_data, unpack_pivots))


@lowering("linalg_lu")
def linalg_lu(tr, a, pivot=True):
    if not pivot:
        raise NotImplementedError("linalg.lu: LU without pivoting is not implemented on tpu (nor on CPU)")
    m, n = a.shape[-2], a.shape[-1]
    k = min(m, n)

    def f(x):
        import jax.numpy as jnp
        from jax import lax

        lu_, _, perm = lax.linalg.lu(x)
        p = jnp.swapaxes(jnp.eye(m, dtype=x.dtype)[perm], -1, -2)
        return p, jnp.tril(lu_[..., :, :k], -1) + jnp.eye(m, k, dtype=x.dtype), jnp.triu(lu_[..., :k, :])

    return _call(tr, "linalg_lu", f, [a])


def _vector_rhs(a_rank, b_shape, a_shape):
    return len(b_shape) == 1 or (len(b_shape) == a_rank - 1 and tuple(b_shape) == tuple(a_shape[:-1]))


@lowering("_linalg_solve_ex")
def solve_ex(tr, a, b, left=True, check_errors=False):
    res_m = out_meta(tr, 0)
    vec = _vector_rhs(a.rank, b.shape, a.shape)

    def f(a_, b_):
        import jax.numpy as jnp

        batch = res_m.shape[:-1] if vec else res_m.shape[:-2]
        lu_, piv, perm, info = _lu(_batch_to(a_, batch))
        bb = b_[..., None] if vec else b_
        bb = jnp.broadcast_to(bb, tuple(batch) + bb.shape[-2:])
        x = _lu_solve(lu_, perm, bb) if left else _mH(_lu_solve(lu_, perm, _mH(bb), True))
        return (x[..., 0] if vec else x), lu_, piv, info

    return _call(tr, "solve_ex", f, [a, b], (left, vec, tuple(res_m.shape)))


@lowering("linalg_inv_ex")
def inv_ex(tr, a, check_errors=False):
    n = a.shape[-1]

    def f(x):
        import jax.numpy as jnp

        lu_, _, perm, info = _lu(x)
        eye = jnp.broadcast_to(jnp.eye(n, dtype=x.dtype), x.shape)
        return _lu_solve(lu_, perm, eye), info

    return _call(tr, "inv_ex", f, [a])


def _det_parts(x, transposed):
    """LU of x^T (transposed) or of x, as CPU's det/slogdet return it: of x^T for contiguous real matrices, of x
    otherwise; their gradients solve with it (adjoint=not transposed)."""
    import jax.numpy as jnp

    lu_, piv, _, _ = _lu(_mT(x) if transposed else x)
    n = x.shape[-1]
    d = jnp.diagonal(lu_, axis1=-2, axis2=-1)
    swaps = jnp.sum(piv != jnp.arange(1, n + 1, dtype=jnp.int32), axis=-1)
    parity = jnp.where(swaps % 2 == 0, 1.0, -1.0).astype(x.dtype)
    return lu_, piv, d, parity


def _empty_det(tr, sign_log):
    """det of 0x0 matrices is 1 (log|det| 0); the LU and pivots are empty."""
    metas = tr.out
    vals = [E.const(tr.fn, 1, metas[0].dtype, metas[0].shape)]
    if sign_log:
        vals.append(E.const(tr.fn, 0, metas[1].dtype, metas[1].shape))
    return tuple(vals) + tuple(E.const(tr.fn, 0, m.dtype, m.shape) for m in metas[len(vals) :])


@lowering("_linalg_det")
def det(tr, a):
    if a.shape[-1] == 0:
        return _empty_det(tr, False)

    transposed = _lu_of_transpose(tr, a)

    def f(x):
        import jax.numpy as jnp

        lu_, piv, d, parity = _det_parts(x, transposed)
        return parity * jnp.prod(d, axis=-1), lu_, piv

    return _call(tr, "det", f, [a], (transposed,))


def _lu_of_transpose(tr, a):
    """CPU's det and slogdet factor A^T when A is contiguous and real (their backward checks the same)."""
    t = tr.arg_of(a)
    return t is not None and t.is_contiguous() and not t.is_complex()


@lowering("_linalg_slogdet")
def slogdet(tr, a):
    if a.shape[-1] == 0:
        return _empty_det(tr, True)

    transposed = _lu_of_transpose(tr, a)

    def f(x):
        import jax.numpy as jnp

        lu_, piv, d, parity = _det_parts(x, transposed)
        sign = parity * jnp.prod(jnp.sign(d), axis=-1)  # d / |d| for complex d
        return sign, jnp.sum(jnp.log(jnp.abs(d)), axis=-1), lu_, piv

    return _call(tr, "slogdet", f, [a], (transposed,))


# -- Cholesky ----------------------------------------------------------------------------------------------
def _minor_info(a):
    """LAPACK potrf's info: the order of the first leading minor that is not positive definite (0 if none),
    by elimination without pivoting on the symmetric matrix built from the lower triangle."""
    import jax.numpy as jnp
    from jax import lax

    n = a.shape[-1]
    m = jnp.tril(a) + _mH(jnp.tril(a, -1))

    def body(j, carry):
        m, info = carry
        d = m[..., j, j]
        pos = jnp.real(d) > 0
        bad = ~pos & (info == 0)
        info = jnp.where(bad, j + 1, info)
        col = m[..., :, j] / jnp.where(pos, d, 1)[..., None]
        m = m - col[..., :, None] * m[..., j, None, :]
        return m, info

    return lax.fori_loop(0, n, body, (m, jnp.zeros(a.shape[:-2], jnp.int32)))[1]


@lowering("linalg_cholesky_ex")
def cholesky_ex(tr, a, upper=False, check_errors=False):
    def f(x):
        import jax.numpy as jnp
        from jax import lax

        low = lax.linalg.cholesky(x, symmetrize_input=False)
        ok = jnp.all(jnp.isfinite(low))
        info = lax.cond(ok, lambda v: jnp.zeros(v.shape[:-2], jnp.int32), _minor_info, x)
        low = jnp.where(jnp.isfinite(low), low, 0)
        return (_mH(low) if upper else low), info

    return _call(tr, "cholesky_ex", f, [a], (upper,))


@lowering("cholesky")
def cholesky(tr, a, upper=False):
    return _call(tr, "cholesky", lambda x: _mH(_chol(x)) if upper else _chol(x), [a], (upper,))


def _chol(x):
    from jax import lax

    return lax.linalg.cholesky(x, symmetrize_input=False)


@lowering("_cholesky_solve_helper")
def cholesky_solve_helper(tr, b, factor, upper):
    def f(b_, c):
        from jax import lax

        low = _mH(c) if upper else c
        y = lax.linalg.triangular_solve(low, b_, left_side=True, lower=True)
        return lax.linalg.triangular_solve(low, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)

    return _call(tr, "cholesky_solve", f, [b, factor], (upper,))


@lowering("cholesky_inverse")
def cholesky_inverse(tr, factor, upper=False):
    n = factor.shape[-1]

    def f(c):
        import jax.numpy as jnp
        from jax import lax

        low = _mH(c) if upper else c
        eye = jnp.broadcast_to(jnp.eye(n, dtype=c.dtype), c.shape)
        y = lax.linalg.triangular_solve(low, eye, left_side=True, lower=True)
        return lax.linalg.triangular_solve(low, y, left_side=True, lower=True, transpose_a=True, conjugate_a=True)

    return _call(tr, "cholesky_inverse", f, [factor], (upper,))


# -- triangular solves -------------------------------------------------------------------------------------
@lowering("linalg_solve_triangular")
def solve_triangular(tr, a, b, upper, left=True, unitriangular=False):
    out = out_meta(tr)

    def f(a_, b_):
        from jax import lax

        batch = out.shape[:-2]
        return lax.linalg.triangular_solve(
            _batch_to(a_, batch), _batch_to(b_, batch), left_side=left, lower=not upper, unit_diagonal=unitriangular
        )

    return _call(tr, "solve_triangular", f, [a, b], (upper, left, unitriangular, tuple(out.shape)))


@lowering("triangular_solve")
def triangular_solve(tr, b, a, upper=True, transpose=False, unitriangular=False):
    sol, coef = out_meta(tr, 0), out_meta(tr, 1)

    def f(b_, a_):
        from jax import lax

        batch = sol.shape[:-2]
        aa = _batch_to(a_, batch)
        x = lax.linalg.triangular_solve(
            aa,
            _batch_to(b_, batch),
            left_side=True,
            lower=not upper,
            transpose_a=transpose,
            unit_diagonal=unitriangular,
        )
        return x, _batch_to(a_, coef.shape[:-2])

    return _call(tr, "triangular_solve", f, [b, a], (upper, transpose, unitriangular, tuple(sol.shape)))


# -- spectral ----------------------------------------------------------------------------------------------
@lowering("_linalg_eigh")
def eigh(tr, a, UPLO="L", compute_v=True):
    vec_m = out_meta(tr, 1)

    def f(x):
        import jax.numpy as jnp

        w, v = jnp.linalg.eigh(x, UPLO=UPLO, symmetrize_input=False)
        return w, (v if compute_v else jnp.zeros(vec_m.shape, x.dtype))

    return _call(tr, "eigh", f, [a], (UPLO, compute_v))


@lowering("_linalg_svd")
def svd(tr, a, full_matrices=False, compute_uv=True, driver=None):
    u_m, vh_m = out_meta(tr, 0), out_meta(tr, 2)
    if a.numel == 0 and full_matrices and compute_uv:  # the complete bases of an empty matrix: identities

        def eye(m):
            diagonal = E.compare(E.iota(tr.fn, m.shape[-2:], 0), E.iota(tr.fn, m.shape[-2:], 1), "EQ")
            return E.broadcast_to(E.convert(diagonal, m.dtype), tuple(m.shape))

        return eye(u_m), E.const(tr.fn, 0, out_meta(tr, 1).dtype, out_meta(tr, 1).shape), eye(vh_m)

    def f(x):
        import jax.numpy as jnp

        if not compute_uv:
            return jnp.zeros(u_m.shape, x.dtype), jnp.linalg.svd(x, compute_uv=False), jnp.zeros(vh_m.shape, x.dtype)
        return tuple(jnp.linalg.svd(x, full_matrices=full_matrices))

    return _call(tr, "svd", f, [a], (full_matrices, compute_uv))


@lowering("linalg_qr")
def qr(tr, a, mode="reduced"):
    q_m = out_meta(tr, 0)

    def f(x):
        import jax.numpy as jnp

        if mode == "r":
            return jnp.zeros(q_m.shape, x.dtype), jnp.linalg.qr(x, mode="r")
        return tuple(jnp.linalg.qr(x, mode=mode))

    return _call(tr, "qr", f, [a], (mode,))


@lowering("linalg_matrix_exp")
def matrix_exp(tr, a):
    def f(x):
        import jax.numpy as jnp
        import jax.scipy.linalg as jsl

        if x.dtype in (jnp.bfloat16, jnp.float16):  # expm has no half-precision path: float32, rounded once
            return jsl.expm(x.astype(jnp.float32)).astype(x.dtype)
        return jsl.expm(x)

    return _call(tr, "matrix_exp", f, [a])
