"""Unary, binary (broadcasting + type promotion), comparison and select rules."""

from __future__ import annotations

import math

import torch

from .. import emit as E
from ..tables import lowering, out_meta
from ..trace import plain


def _out_dtype(tr):
    return out_meta(tr).dtype


def operand(tr, x, dtype):
    """Value or Python scalar -> Value of dtype."""
    if isinstance(x, E.Value):
        return E.convert(x, dtype)
    return tr.scalar(x, dtype)


def _promote_for_compare(tr, a, b):
    a, b = plain(a), plain(b)  # result types depend on types only (the op table keys scalars by type)
    ta = a.dtype if isinstance(a, E.Value) else None
    tb = b.dtype if isinstance(b, E.Value) else None
    ma = (
        torch.empty((), dtype=ta)
        if ta is not None and isinstance(a, E.Value) and a.rank == 0
        else (torch.empty((1,), dtype=ta) if ta else a)
    )
    mb = (
        torch.empty((), dtype=tb)
        if tb is not None and isinstance(b, E.Value) and b.rank == 0
        else (torch.empty((1,), dtype=tb) if tb else b)
    )
    return torch.result_type(ma, mb)


# -- unary float ops -----------------------------------------------------------------------------
def _float_unary(hlo_name):
    def rule(tr, x):
        return E.unary(hlo_name, E.convert(x, _out_dtype(tr)))

    return rule


for _name, _hlo in {
    "exp": "exponential",
    "log": "log",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "tanh": "tanh",
    "sin": "sine",
    "cos": "cosine",
    "tan": "tan",
    "log1p": "log_plus_one",
    "expm1": "exponential_minus_one",
    "sigmoid": "logistic",
}.items():
    lowering(_name)(_float_unary(_hlo))


def _rounding(hlo_name):
    def rule(tr, x):
        return E.unary(hlo_name, x) if x.dtype.is_floating_point else x  # integers are already whole

    return rule


for _name, _hlo in {"ceil": "ceil", "floor": "floor", "round": "round_nearest_even"}.items():
    lowering(_name)(_rounding(_hlo))


@lowering("abs")
def abs_(tr, x):
    return E.unary("abs", x) if x.dtype != torch.bool else x


@lowering("neg")
def neg(tr, x):
    return E.unary("negate", x)


@lowering("sign")
def sign(tr, x):
    return E.unary("sign", x) if x.dtype != torch.bool else x


@lowering("logical_not")
def logical_not(tr, x):
    return E.compare(x, E.const(x.fn, 0, x.dtype), "EQ")


@lowering("bitwise_not")
def bitwise_not(tr, x):
    return E.unary("not", x)


@lowering("reciprocal")
def reciprocal(tr, x):
    x = E.convert(x, _out_dtype(tr))
    return E.div(E.const(x.fn, 1, x.dtype, x.shape), x)


@lowering("erf")
def erf(tr, x):
    # NOTE: stablehlo has no erf op (it is a chlo op), so it is written out here.
    x = E.convert(x, _out_dtype(tr))
    return erf_value(x)


def erf_value(x):
    """erf with max error ~1.2e-7 (Numerical Recipes erfc Chebyshev fit), computed in f32/f64."""
    fn = x.fn
    dt = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
    xv = E.convert(x, dt)
    c = lambda v: E.const(fn, v, dt, xv.shape)  # noqa: E731
    z = E.unary("abs", xv)
    t = E.div(c(1.0), E.add(c(1.0), E.mul(c(0.5), z)))
    coeffs = [
        -1.26551223,
        1.00002368,
        0.37409196,
        0.09678418,
        -0.18628806,
        0.27886807,
        -1.13520398,
        1.48851587,
        -0.82215223,
        0.17087277,
    ]
    poly = c(coeffs[-1])
    for k in reversed(coeffs[:-1]):
        poly = E.add(c(k), E.mul(t, poly))
    erfc = E.mul(t, E.unary("exponential", E.add(E.mul(E.unary("negate", z), z), poly)))
    r = E.sub(c(1.0), erfc)
    r = E.select(E.compare(xv, c(0.0), "GE"), r, E.unary("negate", r))
    return E.convert(r, x.dtype)


def half_in_f32(rule):
    """Computes a float16/bfloat16 rule in float32 and rounds once, as CPU's opmath kernels do."""

    def wrapped(tr, *args, **kwargs):
        dt = _out_dtype(tr)
        if dt not in (torch.float16, torch.bfloat16):
            return rule(tr, *args, **kwargs)
        up = [E.convert(a, torch.float32) if isinstance(a, E.Value) else a for a in args]
        return E.convert(rule(tr.with_out(torch.empty((), dtype=torch.float32, device="meta")), *up, **kwargs), dt)

    return wrapped


# -- binary ops -------------------------------------------------------------------------------------
def _binary(hlo_name, with_alpha=False):
    def rule(tr, a, b, alpha=1):
        dt = _out_dtype(tr)
        av, bv = operand(tr, a, dt), operand(tr, b, dt)
        if with_alpha and alpha != 1:
            bv = E.mul(bv, operand(tr, alpha, dt))
        if dt == torch.bool and hlo_name in ("add", "multiply"):
            return E.binary("or" if hlo_name == "add" else "and", av, bv)
        return E.binary(hlo_name, av, bv)

    return rule


def _half_operands_rounded(rule):
    """add/sub in float16/bfloat16 as CPU: the operands (a Python scalar, a wider 0-d tensor) and alpha are
    rounded to the dtype first, then `a + alpha * b` is computed in float32 and rounded once."""
    inner = half_in_f32(rule)

    def wrapped(tr, a, b, alpha=1):
        dt = _out_dtype(tr)
        if dt in (torch.float16, torch.bfloat16):  # rounded on the device: they may be runtime scalars
            a, b = (E.convert(v, dt) if isinstance(v, E.Value) else tr.scalar(v, dt) for v in (a, b))
            alpha = tr.scalar(alpha, dt) if alpha != 1 else 1
        return inner(tr, a, b, alpha)

    return wrapped


# Arithmetic in float16/bfloat16 runs in float32 and rounds once, as CPU's opmath kernels do. mul and div keep a
# Python scalar (or a wider 0-d tensor) at float32; add and sub round it (and alpha) to the dtype first.
lowering("add.Tensor", "add.Scalar")(_half_operands_rounded(_binary("add", True)))
lowering("sub.Tensor", "sub.Scalar")(_half_operands_rounded(_binary("subtract", True)))
lowering("mul.Tensor", "mul.Scalar")(half_in_f32(_binary("multiply")))
lowering("maximum")(_binary("maximum"))
lowering("minimum")(_binary("minimum"))
lowering("bitwise_and.Tensor", "bitwise_and.Scalar", "logical_and")(_binary("and"))
lowering("bitwise_or.Tensor", "bitwise_or.Scalar", "logical_or")(_binary("or"))
lowering("bitwise_xor.Tensor", "bitwise_xor.Scalar", "logical_xor")(_binary("xor"))


@lowering("rsub.Tensor", "rsub.Scalar")
@_half_operands_rounded
def rsub(tr, a, b, alpha=1):
    dt = _out_dtype(tr)
    av, bv = operand(tr, a, dt), operand(tr, b, dt)
    if alpha != 1:
        av = E.mul(av, operand(tr, alpha, dt))
    return E.sub(bv, av)


def floor_div_int(a, b):
    """Integer floor division (Python/torch semantics) from truncating division."""
    q = E.div(a, b)
    zero = E.const(a.fn, 0, a.dtype)
    rem = E.sub(a, E.mul(q, b))
    adjust = E.binary(
        "and", E.compare(rem, zero, "NE"), E.compare(E.compare(rem, zero, "LT"), E.compare(b, zero, "LT"), "NE")
    )
    return E.select(adjust, E.sub(q, E.const(a.fn, 1, a.dtype)), q)


@lowering("div.Tensor", "div.Scalar", "div.Tensor_mode", "div.Scalar_mode")
def div(tr, a, b, rounding_mode=None):
    dt = _out_dtype(tr)
    if dt in (torch.float16, torch.bfloat16):
        # As CPU: the float32 quotient (a scalar kept at float32) is rounded once; trunc truncates the rounded
        # quotient, floor works on the float32 values.
        if rounding_mode == "trunc":
            return _trunc(half_in_f32(div)(tr, a, b))
        return half_in_f32(div)(tr, a, b, rounding_mode)
    av, bv = operand(tr, a, dt), operand(tr, b, dt)
    if rounding_mode is None:
        return E.div(av, bv)
    if rounding_mode == "trunc":
        q = E.div(av, bv)
        return _trunc(q) if dt.is_floating_point else q
    if dt.is_floating_point:
        return _floor_div_float(av, bv)
    return floor_div_int(av, bv)


def _trunc(q):
    return E.select(E.compare(q, E.const(q.fn, 0, q.dtype), "LT"), E.unary("ceil", q), E.unary("floor", q))


def _floor_div_float(a, b):
    """CPU's floor division: from fmod, so a quotient just below an integer is not rounded up first."""
    c = lambda v: E.const(a.fn, v, a.dtype, a.shape)  # noqa: E731
    mod = E.binary("remainder", a, b)
    q = E.div(E.sub(a, mod), b)
    fix = E.binary(
        "and", E.compare(mod, c(0), "NE"), E.compare(E.compare(b, c(0), "LT"), E.compare(mod, c(0), "LT"), "NE")
    )
    q = E.select(fix, E.sub(q, c(1)), q)
    fl = E.unary("floor", q)
    q = E.select(
        E.compare(q, c(0), "NE"),
        E.add(fl, E.convert(E.compare(E.sub(q, fl), c(0.5), "GT"), a.dtype)),
        E.mul(E.div(a, b), c(0)),
    )  # zero takes the sign of a / b
    return E.select(E.compare(b, c(0), "EQ"), E.div(a, b), q)


@lowering("remainder.Tensor", "remainder.Scalar")
def remainder(tr, a, b):
    dt = _out_dtype(tr)
    av, bv = operand(tr, a, dt), operand(tr, b, dt)
    r = E.binary("remainder", av, bv)
    zero = E.const(r.fn, 0, dt)
    fix = E.binary(
        "and", E.compare(r, zero, "NE"), E.compare(E.compare(r, zero, "LT"), E.compare(bv, zero, "LT"), "NE")
    )
    return E.select(fix, E.add(r, bv), r)


@lowering("fmod.Tensor", "fmod.Scalar")
def fmod(tr, a, b):
    dt = _out_dtype(tr)
    return E.binary("remainder", operand(tr, a, dt), operand(tr, b, dt))


@lowering("pow.Tensor_Tensor", "pow.Tensor_Scalar", "pow.Scalar")
def pow_(tr, a, b):
    # NOTE: a Python exponent is rounded to the tensor's dtype first, as CPU does (x ** 0.3 in bfloat16 uses
    # 0.30078125); unlike add/mul, pow does not keep a float32 scalar.
    dt = _out_dtype(tr)
    if not isinstance(b, E.Value) and b == 2:
        av = operand(tr, a, dt)
        return E.mul(av, av)
    if not isinstance(b, E.Value) and b == 0.5 and dt.is_floating_point:
        return E.unary("sqrt", operand(tr, a, dt))
    return E.binary("power", operand(tr, a, dt), operand(tr, b, dt))


@lowering("atan2")
def atan2(tr, a, b):
    dt = _out_dtype(tr)
    return E.binary("atan2", operand(tr, a, dt), operand(tr, b, dt))


# -- comparisons ----------------------------------------------------------------------------------
def _cmp(direction):
    def rule(tr, a, b):
        dt = _promote_for_compare(tr, a, b)
        return E.compare(operand(tr, a, dt), operand(tr, b, dt), direction)

    return rule


for _n, _d in {"eq": "EQ", "ne": "NE", "lt": "LT", "le": "LE", "gt": "GT", "ge": "GE"}.items():
    lowering(f"{_n}.Tensor", f"{_n}.Scalar")(_cmp(_d))


@lowering("isnan")
def isnan(tr, x):
    if x.dtype.is_complex:  # either part
        return E.binary("or", E.isnan(E.real(x)), E.isnan(E.imag(x)))
    return E.isnan(x) if x.dtype.is_floating_point else E.const(x.fn, False, torch.bool, x.shape)


@lowering("isinf")
def isinf(tr, x):
    if x.dtype.is_complex:
        return E.binary("or", isinf(tr, E.real(x)), isinf(tr, E.imag(x)))
    if not x.dtype.is_floating_point:
        return E.const(x.fn, False, torch.bool, x.shape)
    return E.compare(E.unary("abs", x), E.const(x.fn, math.inf, x.dtype), "EQ")


@lowering("where.self")
def where(tr, cond, a, b):
    dt = _out_dtype(tr)
    return E.select(E.convert(cond, torch.bool), operand(tr, a, dt), operand(tr, b, dt))


@lowering("clamp", "clamp.Tensor")
def clamp(tr, x, min=None, max=None):
    dt = _out_dtype(tr)
    xv = E.convert(x, dt)
    lo = None if min is None else operand(tr, min, dt)
    hi = None if max is None else operand(tr, max, dt)
    return E.clamp(xv, lo, hi)


@lowering("clamp_min", "clamp_min.Tensor")
def clamp_min(tr, x, min):
    return clamp(tr, x, min=min)


@lowering("clamp_max", "clamp_max.Tensor")
def clamp_max(tr, x, max):
    return clamp(tr, x, max=max)


@lowering("masked_fill.Scalar", "masked_fill.Tensor")
def masked_fill(tr, x, mask, value):
    dt = _out_dtype(tr)
    return E.select(E.convert(mask, torch.bool), operand(tr, value, dt), x)


@lowering("lerp.Scalar", "lerp.Tensor")
def lerp(tr, a, b, w):
    dt = _out_dtype(tr)
    av, bv = E.convert(a, dt), E.convert(b, dt)
    return E.add(av, E.mul(operand(tr, w, dt), E.sub(bv, av)))


@lowering("addcmul")
@half_in_f32
def addcmul(tr, x, t1, t2, value=1):
    dt = _out_dtype(tr)
    prod = E.mul(E.convert(t1, dt), E.convert(t2, dt))
    return E.add(E.convert(x, dt), E.mul(prod, tr.scalar(value, dt)) if value != 1 else prod)


@lowering("addcdiv")
@half_in_f32
def addcdiv(tr, x, t1, t2, value=1):
    dt = _out_dtype(tr)
    q = E.div(E.convert(t1, dt), E.convert(t2, dt))
    return E.add(E.convert(x, dt), E.mul(q, tr.scalar(value, dt)) if value != 1 else q)


@lowering("trunc")
def trunc(tr, x):
    if not x.dtype.is_floating_point:
        return x
    neg = E.compare(x, E.const(x.fn, 0, x.dtype, x.shape), "LT")
    return E.select(neg, E.unary("ceil", x), E.unary("floor", x))


@lowering("exp2")
def exp2(tr, x):
    x = E.convert(x, _out_dtype(tr))
    return E.binary("power", E.const(x.fn, 2.0, x.dtype, x.shape), x)


@lowering("signbit")
def signbit(tr, x):
    if not x.dtype.is_floating_point:
        return (
            E.compare(x, E.const(x.fn, 0, x.dtype, x.shape), "LT")
            if x.dtype != torch.bool
            else E.const(x.fn, False, torch.bool, x.shape)
        )
    bits = E.bitcast(x, {2: torch.int16, 4: torch.int32, 8: torch.int64}[x.dtype.itemsize])
    return E.compare(bits, E.const(x.fn, 0, bits.dtype, x.shape), "LT")  # -0.0 and -nan count, as on CPU


@lowering("erfc")
def erfc(tr, x):
    x = E.convert(x, _out_dtype(tr))
    return E.sub(E.const(x.fn, 1.0, x.dtype, x.shape), erf_value(x))


@lowering("round.decimals")
def round_decimals(tr, x, decimals=0):
    if not x.dtype.is_floating_point:
        return x
    dt = x.dtype
    xv = E.convert(x, E.acc_dtype(dt))
    scale = E.const(xv.fn, 10.0 ** abs(decimals), xv.dtype, xv.shape)
    if decimals >= 0:  # as PyTorch's CPU kernel: nearbyint(x * 10^d) / 10^d, or the mirror for d < 0
        r = E.div(E.unary("round_nearest_even", E.mul(xv, scale)), scale)
    else:
        r = E.mul(E.unary("round_nearest_even", E.div(xv, scale)), scale)
    return E.convert(r, dt)
