"""Complex numbers: construction (complex, polar), conjugation, and the FFT family.

Storage and views: a complex tensor's buffer is complex<f32> (complex64) or complex<f64> (complex128);
view_as_real / view_as_complex are metadata views whose reads and writes reinterpret the storage as
(real, imaginary) pairs (executor._reinterpret). Elementwise arithmetic, reductions and matmul take complex
values through the general rules.
"""

from __future__ import annotations

from .. import emit as E
from .. import jaxfn
from ..tables import lowering, out_meta


@lowering("complex")
def complex_(tr, real, imag):
    if real.dtype != imag.dtype:
        raise RuntimeError(
            f"Expected object of scalar type {real.dtype} but got scalar type {imag.dtype} for second argument"
        )
    dt = out_meta(tr).dtype
    part = E.real(E.const(tr.fn, 0, dt)).dtype
    return E.complex_(E.convert(real, part), E.convert(imag, part))


@lowering("polar")
def polar(tr, abs_, angle):
    """abs * (cos(angle) + i sin(angle)), as CPU computes it."""
    if abs_.dtype != angle.dtype:
        raise RuntimeError(
            f"Expected object of scalar type {abs_.dtype} but got scalar type {angle.dtype} for second argument"
        )
    dt = out_meta(tr).dtype
    part = E.real(E.const(tr.fn, 0, dt)).dtype
    r, t = E.convert(abs_, part), E.convert(angle, part)
    return E.complex_(E.mul(r, E.unary("cosine", t)), E.mul(r, E.unary("sine", t)))


@lowering("_conj_physical")
def conj_physical(tr, x):
    return E.conj(x)


# conj_physical itself is composite (autograd needs its formula); its out= and in-place forms are kernels
@lowering("conj_physical.out")
def conj_physical_out(tr, x):
    return E.conj(x)


# -- FFT: Core ATen's three ops, through jax.numpy.fft (XLA's FFT op on every platform) ---------------------
# torch's normalization: 0 none, 1 by 1/sqrt(n), 2 by 1/n, applied as given in either direction; jnp's norm
# names which direction is scaled.
_FORWARD_NORM = {0: "backward", 1: "ortho", 2: "forward"}
_INVERSE_NORM = {0: "forward", 1: "ortho", 2: "backward"}


def _fft(tr, name, x, dims, f, static):
    """static: every value f closes over besides the dims (jaxfn caches the lowering by it)."""
    dims = tuple(int(d) % x.rank for d in dims)
    if not dims:
        return x
    out = out_meta(tr)
    if out.numel() == 0:
        return E.const(tr.fn, 0, out.dtype, out.shape)
    return jaxfn.call(tr, name, f, [x], (dims, tuple(out.shape), out.dtype) + static)[0]


@lowering("_fft_c2c")
def fft_c2c(tr, x, dim, normalization, forward):
    def f(v):
        import jax.numpy as jnp

        dims = tuple(int(d) % v.ndim for d in dim)
        if forward:
            return jnp.fft.fftn(v, axes=dims, norm=_FORWARD_NORM[normalization])
        return jnp.fft.ifftn(v, axes=dims, norm=_INVERSE_NORM[normalization])

    return _fft(tr, "fft_c2c", x, dim, f, (normalization, bool(forward)))


@lowering("_fft_r2c")
def fft_r2c(tr, x, dim, normalization, onesided):
    def f(v):
        import jax.numpy as jnp

        dims = tuple(int(d) % v.ndim for d in dim)
        norm = _FORWARD_NORM[normalization]
        if onesided:
            return jnp.fft.rfftn(v, axes=dims, norm=norm)
        return jnp.fft.fftn(v.astype(jnp.result_type(v.dtype, jnp.complex64)), axes=dims, norm=norm)

    return _fft(tr, "fft_r2c", x, dim, f, (normalization, bool(onesided)))


@lowering("_fft_c2r")
def fft_c2r(tr, x, dim, normalization, last_dim_size):
    def f(v):
        import jax.numpy as jnp

        dims = tuple(int(d) % v.ndim for d in dim)
        sizes = [v.shape[d] for d in dims[:-1]] + [last_dim_size]
        return jnp.fft.irfftn(v, s=sizes, axes=dims, norm=_INVERSE_NORM[normalization])

    return _fft(tr, "fft_c2r", x, dim, f, (normalization, last_dim_size))
