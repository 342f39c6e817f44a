"""Transcendental and special functions, lowered through JAX's implementations (jax.lax / jax.scipy.special).

StableHLO has no acos, lgamma, erfinv, Bessel functions...; XLA's CHLO dialect and JAX's scipy.special carry
careful expansions of them, so each rule here is one `jaxfn.call`. Half-precision inputs are computed in
float32 and rounded once, as PyTorch's CPU kernels do.
"""

from __future__ import annotations

import torch

from .. import emit as E
from .. import jaxfn
from ..tables import lowering, out_meta
from .elementwise import operand


def _elementwise(name, f, n_outputs=1):
    """A rule applying the JAX function `f` to the op's tensor/scalar operands (promoted to the output dtype)."""

    def rule(tr, *operands):
        out = out_meta(tr)
        dt = out.dtype
        cdt = E.acc_dtype(dt)
        vals = [operand(tr, x, cdt) for x in operands]
        res = jaxfn.call(tr, name, f, vals)
        return E.convert(res[0], dt) if n_outputs == 1 else tuple(res)

    return rule


def _jnp(attr):
    def f(*xs):
        import jax.numpy as jnp

        return getattr(jnp, attr)(*xs)

    return f


def _sps(attr):
    def f(*xs):
        import jax.scipy.special as sps

        return getattr(sps, attr)(*xs)

    return f


for _op, _f in {
    "acos": "arccos",
    "asin": "arcsin",
    "atan": "arctan",
    "acosh": "arccosh",
    "asinh": "arcsinh",
    "atanh": "arctanh",
    "cosh": "cosh",
    "sinh": "sinh",
    "log2": "log2",
    "log10": "log10",
    "hypot": "hypot",
    "nextafter": "nextafter",
}.items():
    lowering(_op)(_elementwise(_op, _jnp(_f)))

for _op, _f in {
    "erfinv": "erfinv",
    "lgamma": "gammaln",
    "i0": "i0",
    "special_i0e": "i0e",
    "special_i1": "i1",
    "special_i1e": "i1e",
    "special_ndtri": "ndtri",
    "special_erfcx": "erfcx",
    "special_log_ndtr": "log_ndtr",
    "igamma": "gammainc",
    "igammac": "gammaincc",
}.items():
    lowering(_op)(_elementwise(_op, _sps(_f)))


def _digamma(x):
    import jax.numpy as jnp
    import jax.scipy.special as sps

    # PyTorch: digamma(±0) = ∓inf (the limit from that side); JAX gives nan there.
    return jnp.where(x == 0, jnp.copysign(jnp.inf, -x), sps.digamma(x))


lowering("digamma")(_elementwise("digamma", _digamma))


# Hurwitz zeta as PyTorch's CPU kernel computes it (Cephes: a direct sum, then Euler-Maclaurin with 12
# Bernoulli terms). JAX's zeta returns nan for q < 0, where polygamma of negative arguments needs it.
_ZETA_A = (
    12.0,
    -720.0,
    30240.0,
    -1209600.0,
    47900160.0,
    -1.8924375803183791606e9,
    7.47242496e10,
    -2.950130727918164224e12,
    1.1646782814350067249e14,
    -4.5979787224074726105e15,
    1.8152105401943546773e17,
    -7.1661652561756670113e18,
)


def _zeta(x, q):
    import jax.numpy as jnp
    from jax import lax

    x, q = jnp.broadcast_arrays(x, q)
    eps = jnp.finfo(x.dtype).eps / 2
    s = jnp.power(q, -x)
    a, i, b = q, jnp.zeros(x.shape, jnp.int32), jnp.zeros_like(x)
    done = jnp.zeros(x.shape, bool)

    def cond(c):
        a, i, s, b, done = c
        return jnp.any(~done & ((i < 9) | (a <= 9)))

    def body(c):
        a, i, s, b, done = c
        go = ~done & ((i < 9) | (a <= 9))
        a2 = jnp.where(go, a + 1, a)
        b2 = jnp.where(go, jnp.power(a2, -x), b)
        s2 = jnp.where(go, s + b2, s)
        early = go & (jnp.abs(b2 / s2) < eps)
        return a2, jnp.where(go, i + 1, i), s2, b2, done | early

    a, i, s, b, done = lax.while_loop(cond, body, (a, i, s, b, done))
    w = a
    tail = s + b * w / (x - 1) - 0.5 * b
    acc, k, bb, stop = jnp.ones_like(x), 0.0, b, jnp.zeros(x.shape, bool)
    for coef in _ZETA_A:
        acc = acc * (x + k)
        bb = bb / w
        t = acc * bb / coef
        tail = jnp.where(stop, tail, tail + t)
        stop = stop | (jnp.abs(t / tail) < eps)
        k += 1
        acc = acc * (x + k)
        bb = bb / w
        k += 1
    r = jnp.where(done, s, tail)
    r = jnp.where((q <= 0) & (x != jnp.floor(x)), jnp.nan, r)
    r = jnp.where((q <= 0) & (q == jnp.floor(q)), jnp.inf, r)
    r = jnp.where(x < 1, jnp.nan, r)
    return jnp.where(x == 1, jnp.inf, r)


def _trigamma(x):
    import jax.numpy as jnp

    neg = x < 0.5
    result = jnp.where(neg, -(jnp.pi**2) / jnp.sin(jnp.pi * x) ** 2, jnp.zeros_like(x))
    x = jnp.where(neg, 1 - x, x)
    for _ in range(6):
        result = result + 1 / (x * x)
        x = x + 1
    ixx = 1 / (x * x)
    result = result + (1 + 1 / (2 * x) + ixx * (1.0 / 6 - ixx * (1.0 / 30 - ixx * (1.0 / 42)))) / x
    return jnp.where(neg, -result, result)


lowering("special_zeta")(_elementwise("zeta", _zeta))


@lowering("polygamma")
def polygamma(tr, n, x):
    if n == 0:
        return _elementwise("digamma", _digamma)(tr, x)
    if n == 1:
        return _elementwise("trigamma", _trigamma)(tr, x)

    def f(v):
        import math

        return (1.0 if n % 2 else -1.0) * math.exp(math.lgamma(n + 1.0)) * _zeta(float(n + 1), v)

    return _elementwise(f"polygamma{n}", f)(tr, x)


def _nan_aware(pick):
    def f(a, b):
        import jax.numpy as jnp

        return jnp.where(jnp.isnan(a), b, jnp.where(jnp.isnan(b), a, pick(a, b)))

    return f


@lowering("fmax")
def fmax(tr, a, b):
    import jax.numpy as jnp

    if not out_meta(tr).dtype.is_floating_point:
        return E.binary("maximum", *(E.convert(v, out_meta(tr).dtype) for v in (a, b)))
    return _elementwise("fmax", _nan_aware(jnp.maximum))(tr, a, b)


@lowering("fmin")
def fmin(tr, a, b):
    import jax.numpy as jnp

    if not out_meta(tr).dtype.is_floating_point:
        return E.binary("minimum", *(E.convert(v, out_meta(tr).dtype) for v in (a, b)))
    return _elementwise("fmin", _nan_aware(jnp.minimum))(tr, a, b)


@lowering("frexp.Tensor")
def frexp(tr, x):
    import jax.numpy as jnp

    mant, expo = out_meta(tr, 0), out_meta(tr, 1)

    def f(v):
        m, e = jnp.frexp(v)
        return m, e.astype(jnp.int32)

    m, e = jaxfn.call(tr, "frexp", f, [E.convert(x, E.acc_dtype(mant.dtype))])
    return E.convert(m, mant.dtype), E.convert(e, expo.dtype)


@lowering("special_spherical_bessel_j0")
def spherical_bessel_j0(tr, x):
    def f(v):
        import jax.numpy as jnp

        return jnp.where(v == 0, jnp.ones_like(v), jnp.sin(v) / jnp.where(v == 0, jnp.ones_like(v), v))

    return _elementwise("spherical_bessel_j0", f)(tr, x)


def _gcd(a, b):
    """CPU's Euclid loop on |a|, |b| (a while loop over the whole array). |INT_MIN| wraps and stays negative,
    so gcd(INT_MIN, 0) = INT_MIN as on CPU (jnp.gcd never ends there: it keeps the pair ordered)."""
    import jax.numpy as jnp
    from jax import lax

    def body(ab):
        a, b = ab
        nz = a != 0
        return jnp.where(nz, lax.rem(b, jnp.where(nz, a, 1)), a), jnp.where(nz, a, b)

    a, b = jnp.broadcast_arrays(a, b)
    return lax.while_loop(lambda ab: jnp.any(ab[0] != 0), body, (jnp.abs(a), jnp.abs(b)))[1]


def _lcm(a, b):
    import jax.numpy as jnp
    from jax import lax

    a, b = jnp.broadcast_arrays(a, b)
    g = _gcd(a, b)
    return jnp.where(g == 0, 0, jnp.abs(lax.div(a, jnp.where(g == 0, 1, g)) * b)).astype(a.dtype)


lowering("gcd")(_elementwise("gcd", _gcd))
lowering("lcm")(_elementwise("lcm", _lcm))


def _shift(left):
    """x << s / x >> s on integers: a shift by a negative amount or by the bit width or more gives 0 (left) or
    the sign fill (right, arithmetic), as on CPU; StableHLO leaves those out-of-range shifts to the backend."""

    def rule(tr, a, b):
        dt = out_meta(tr).dtype
        x, s = operand(tr, a, dt), operand(tr, b, dt)
        shape = E.broadcast_shapes(x.shape, s.shape)
        x, s = E.broadcast_to(x, shape), E.broadcast_to(s, shape)
        c = lambda v: E.const(x.fn, v, dt, shape)  # noqa: E731
        bits = torch.iinfo(dt).bits if dt != torch.bool else 1
        in_range = E.binary("and", E.compare(s, c(0), "GE"), E.compare(s, c(bits), "LT"))
        if left:
            return E.select(in_range, E.binary("shift_left", x, s), c(0))
        fill = E.binary("shift_right_arithmetic", x, c(bits - 1)) if dt.is_signed else c(0)
        shr = "shift_right_arithmetic" if dt.is_signed else "shift_right_logical"
        return E.select(in_range, E.binary(shr, x, s), fill)

    return rule


lowering(
    "bitwise_left_shift.Tensor",
    "bitwise_left_shift.Tensor_Scalar",
    "bitwise_left_shift.Scalar_Tensor",
    "__lshift__.Tensor",
    "__lshift__.Scalar",
)(_shift(True))
lowering(
    "bitwise_right_shift.Tensor",
    "bitwise_right_shift.Tensor_Scalar",
    "bitwise_right_shift.Scalar_Tensor",
    "__rshift__.Tensor",
    "__rshift__.Scalar",
)(_shift(False))


@lowering("angle")
def angle(tr, x):
    """Argument of a real number: pi for negatives, 0 otherwise (-0.0 included), NaN stays NaN. Of a complex
    number: atan2(imag, real)."""
    dt = out_meta(tr).dtype
    if x.dtype.is_complex:
        return E.binary("atan2", E.imag(x), E.real(x))
    v = E.convert(x, dt)
    c = lambda val: E.const(v.fn, val, dt, v.shape)  # noqa: E731
    r = E.select(E.compare(v, c(0), "LT"), c(3.141592653589793), c(0))
    return E.select(E.compare(v, v, "NE"), v, r)


@lowering("logit_backward")
def logit_backward(tr, grad, x, eps=None):
    """grad / (x (1 - x)); with eps, 0 outside [eps, 1 - eps]; without, NaN outside [0, 1]. Halves in float32."""
    dt = out_meta(tr).dtype
    cdt = E.acc_dtype(dt)
    g, v = E.convert(grad, cdt), E.convert(x, cdt)
    c = lambda val: E.const(v.fn, val, cdt, v.shape)  # noqa: E731
    d = E.div(g, E.mul(v, E.sub(c(1), v)))
    lo, hi = (0.0, 1.0) if eps is None or eps < 0 else (eps, 1.0 - eps)
    outside = E.binary("or", E.compare(v, c(lo), "LT"), E.compare(v, c(hi), "GT"))
    r = E.select(outside, c(float("nan") if eps is None or eps < 0 else 0.0), d)
    return E.convert(r, dt)
