"""Reductions: sum/mean/prod, max/min (values, indices), argmax/argmin, var/std, any/all."""

from __future__ import annotations

import math

import torch

from .. import emit as E
from ..hlo import region, tensor_type
from ..tables import lowering
from ..tables import out_meta as _meta


def reduced_dims(x, dim):
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return list(range(x.rank))
    if isinstance(dim, int):
        dim = [dim]
    return sorted({d % max(x.rank, 1) for d in dim}) if x.rank else []


def _keep(v, x, dims, keepdim):
    if not keepdim:
        return v
    return E.reshape(v, [1 if i in dims else s for i, s in enumerate(x.shape)])


def init_value(fn, kind, dtype):
    if kind == "add":
        return E.const(fn, 0, dtype)
    if kind == "multiply":
        return E.const(fn, 1, dtype)
    if kind in ("or", "and"):
        return E.const(fn, kind == "and", torch.bool)
    if dtype == torch.bool:
        return E.const(fn, kind == "minimum", dtype)
    if dtype.is_floating_point:
        return E.const(fn, -math.inf if kind == "maximum" else math.inf, dtype)
    info = torch.iinfo(dtype)
    return E.const(fn, info.min if kind == "maximum" else info.max, dtype)


def reduce(x, dims, kind, keepdim, dtype=None):
    dt = dtype or x.dtype
    acc = dt
    if dt in (torch.float16, torch.bfloat16) and kind in ("add", "multiply"):
        acc = torch.float32  # accumulate low-precision floats in f32, as CPU does
    xv = E.convert(x, acc)
    if kind in ("maximum", "minimum") and xv.dtype == torch.bool:
        kind = "or" if kind == "maximum" else "and"
        init = E.const(x.fn, kind == "and", torch.bool)
    else:
        init = init_value(x.fn, kind, acc)
    v = E.reduce(xv, init, dims, f"stablehlo.{kind}") if dims else xv
    return _keep(E.convert(v, dt), x, dims, keepdim)


@lowering("sum.dim_IntList")
def sum_(tr, x, dim=None, keepdim=False, dtype=None):
    return reduce(x, reduced_dims(x, dim), "add", keepdim, _meta(tr).dtype)


@lowering("sum.default")
def sum_all(tr, x, dtype=None):
    return reduce(x, reduced_dims(x, None), "add", False, _meta(tr).dtype)


@lowering("prod.dim_int")
def prod(tr, x, dim, keepdim=False, dtype=None):
    return reduce(x, reduced_dims(x, dim), "multiply", keepdim, _meta(tr).dtype)


@lowering("prod.default")
def prod_all(tr, x, dtype=None):
    return reduce(x, reduced_dims(x, None), "multiply", False, _meta(tr).dtype)


def _count(x, dims):
    return math.prod(x.shape[d] for d in dims) if dims else 1


@lowering("mean.dim")
def mean(tr, x, dim=None, keepdim=False, dtype=None):
    dt = _meta(tr).dtype
    dims = reduced_dims(x, dim)
    acc = E.acc_dtype(dt)
    s = reduce(x, dims, "add", keepdim, acc)
    return E.convert(E.div(s, E.const(x.fn, _count(x, dims), acc, s.shape)), dt)


@lowering("mean.default")
def mean_all(tr, x, dtype=None):
    return mean(tr, x, None, False, dtype)


@lowering("amax")
def amax(tr, x, dim=(), keepdim=False):
    return reduce(x, reduced_dims(x, dim), "maximum", keepdim)


@lowering("amin")
def amin(tr, x, dim=(), keepdim=False):
    return reduce(x, reduced_dims(x, dim), "minimum", keepdim)


@lowering("aminmax")
def aminmax(tr, x, dim=None, keepdim=False):
    dims = reduced_dims(x, dim)
    return reduce(x, dims, "minimum", keepdim), reduce(x, dims, "maximum", keepdim)


@lowering("max.default")
def max_all(tr, x):
    return reduce(x, reduced_dims(x, None), "maximum", False)


@lowering("min.default")
def min_all(tr, x):
    return reduce(x, reduced_dims(x, None), "minimum", False)


@lowering("any.default", "any.dim", "any.dims")
def any_(tr, x, dim=None, keepdim=False):
    return reduce(E.convert(x, torch.bool), reduced_dims(x, dim), "or", keepdim, torch.bool)


@lowering("all.default", "all.dim", "all.dims")
def all_(tr, x, dim=None, keepdim=False):
    return reduce(E.convert(x, torch.bool), reduced_dims(x, dim), "and", keepdim, torch.bool)


def arg_reduce(x, dim, keepdim, is_max):
    """(values, int64 indices) along dim; NaN wins, ties take the smallest index (as on CPU)."""
    fn = x.fn
    if dim is None:
        x = E.reshape(x, (x.numel,))
        dim = 0
    dim = dim % max(x.rank, 1)
    if x.rank == 0:
        return x, E.const(fn, 0, torch.int64)
    idx = E.iota(fn, x.shape, dim)
    t = tensor_type((), x.dtype)
    it = tensor_type((), torch.int64)
    it1 = tensor_type((), torch.bool)
    direction = "GT" if is_max else "LT"
    kind = "FLOAT" if x.dtype.is_floating_point else ("UNSIGNED" if x.dtype in (torch.bool, torch.uint8) else "SIGNED")

    def cmp(a, b, d, kind=kind, t=t):
        return (
            f'"stablehlo.compare"({a}, {b}) {{comparison_direction = #stablehlo<comparison_direction {d}>, '
            f"compare_type = #stablehlo<comparison_type {kind}>}} : ({t}, {t}) -> {it1}"
        )

    icmp = cmp("%bi", "%ai", "LT", "SIGNED", it)
    body = [
        f"%better = {cmp('%bv', '%av', direction)}",
        f"%eq = {cmp('%bv', '%av', 'EQ')}",
        f"%bnan = {cmp('%bv', '%bv', 'NE')}",
        f"%anan = {cmp('%av', '%av', 'NE')}",
        f'%notanan = "stablehlo.not"(%anan) : ({it1}) -> {it1}',
        f'%bnan2 = "stablehlo.and"(%bnan, %notanan) : ({it1}, {it1}) -> {it1}',
        f"%ilt = {icmp}",
        f'%tie = "stablehlo.and"(%eq, %ilt) : ({it1}, {it1}) -> {it1}',
        f'%bothnan = "stablehlo.and"(%bnan, %anan) : ({it1}, {it1}) -> {it1}',
        f'%tie2 = "stablehlo.and"(%bothnan, %ilt) : ({it1}, {it1}) -> {it1}',
        f'%c1 = "stablehlo.or"(%better, %tie) : ({it1}, {it1}) -> {it1}',
        f'%c2 = "stablehlo.or"(%c1, %bnan2) : ({it1}, {it1}) -> {it1}',
        f'%c3 = "stablehlo.or"(%c2, %tie2) : ({it1}, {it1}) -> {it1}',
        f'%rv = "stablehlo.select"(%c3, %bv, %av) : ({it1}, {t}, {t}) -> {t}',
        f'%ri = "stablehlo.select"(%c3, %bi, %ai) : ({it1}, {it}, {it}) -> {it}',
        f'"stablehlo.return"(%rv, %ri) : ({t}, {it}) -> ()',
    ]
    init_v = (
        init_value(fn, "maximum" if is_max else "minimum", x.dtype)
        if x.dtype != torch.bool
        else E.const(fn, not is_max, torch.bool)
    )
    init_i = E.const(fn, 0, torch.int64)
    v, i = E.reduce_multi([x, idx], [init_v, init_i], [dim], body, ["%av", "%ai", "%bv", "%bi"])
    if keepdim:
        shape = [1 if d == dim else s for d, s in enumerate(x.shape)]
        v, i = E.reshape(v, shape), E.reshape(i, shape)
    return v, i


@lowering("max.dim")
def max_dim(tr, x, dim, keepdim=False):
    return arg_reduce(x, dim, keepdim, True)


@lowering("min.dim")
def min_dim(tr, x, dim, keepdim=False):
    return arg_reduce(x, dim, keepdim, False)


def _arg_index(x, dim, keepdim, is_max):
    _, i = arg_reduce(x, dim, keepdim if dim is not None else False, is_max)
    return E.reshape(i, [1] * x.rank) if dim is None and keepdim else i


@lowering("argmax")
def argmax(tr, x, dim=None, keepdim=False):
    return _arg_index(x, dim, keepdim, True)


@lowering("argmin")
def argmin(tr, x, dim=None, keepdim=False):
    return _arg_index(x, dim, keepdim, False)


def _var(x, dims, correction, keepdim, dt):
    """(variance, mean, dtype): the variance of complex values is the mean |x - mean|^2 (real), their mean complex."""
    acc = E.acc_dtype(dt)
    xacc = x.dtype if x.dtype.is_complex else acc
    xv = E.convert(x, xacc)
    n = _count(x, dims)
    s = reduce(xv, dims, "add", True, xacc)
    mean = E.div(s, E.const(x.fn, n, xacc, s.shape))
    d = E.sub(xv, mean)
    sq = E.mul(d, d) if not d.dtype.is_complex else E.add(E.mul(E.real(d), E.real(d)), E.mul(E.imag(d), E.imag(d)))
    ss = reduce(sq, dims, "add", keepdim, acc)
    denom = max(n - (1 if correction is None else correction), 0)
    var = E.div(ss, E.const(x.fn, denom, acc, ss.shape))
    return var, (mean if keepdim else E.reshape(mean, ss.shape)), acc


@lowering("var.correction")
def var(tr, x, dim=None, correction=None, keepdim=False):
    dt = _meta(tr).dtype
    v, _, _ = _var(x, reduced_dims(x, dim), correction, keepdim, dt)
    return E.convert(v, dt)


@lowering("std.correction")
def std(tr, x, dim=None, correction=None, keepdim=False):
    dt = _meta(tr).dtype
    v, _, _ = _var(x, reduced_dims(x, dim), correction, keepdim, dt)
    return E.convert(E.unary("sqrt", v), dt)


@lowering("var_mean.correction")
def var_mean(tr, x, dim=None, correction=None, keepdim=False):
    dt = _meta(tr).dtype
    v, m, _ = _var(x, reduced_dims(x, dim), correction, keepdim, dt)
    return E.convert(v, dt), E.convert(m, _meta(tr, 1).dtype)


@lowering("logsumexp")
def logsumexp(tr, x, dim, keepdim=False):
    dt = _meta(tr).dtype
    dims = reduced_dims(x, dim)
    xv = E.convert(x, dt)
    re = E.real(xv)  # complex values shift by the largest real part, as CPU does
    m = reduce(re, dims, "maximum", True)
    m = E.select(
        E.compare(E.unary("abs", m), E.const(x.fn, math.inf, m.dtype, m.shape), "EQ"),
        E.const(x.fn, 0, m.dtype, m.shape),
        m,
    )
    m = E.convert(m, dt)
    s = reduce(E.unary("exponential", E.sub(xv, m)), dims, "add", True)
    r = E.add(E.unary("log", s), m)
    return r if keepdim else E.reshape(r, _meta(tr).shape)


def sort_values_indices(x, dim, descending):
    """Stable sort along dim with NaN ordered as the largest value (as on CPU); returns (values, int64 indices)."""
    fn = x.fn
    if x.rank == 0:
        return x, E.const(fn, 0, torch.int64)
    dim = dim % x.rank
    idx = E.iota(fn, x.shape, dim)
    t, it, b = tensor_type((), x.dtype), tensor_type((), torch.int64), tensor_type((), torch.bool)
    kind = "FLOAT" if x.dtype.is_floating_point else ("UNSIGNED" if x.dtype in (torch.bool, torch.uint8) else "SIGNED")

    def cmp(a, c, d):
        return (
            f'"stablehlo.compare"({a}, {c}) {{comparison_direction = #stablehlo<comparison_direction {d}>, '
            f"compare_type = #stablehlo<comparison_type {kind}>}} : ({t}, {t}) -> {b}"
        )

    first, second = ("%a", "%b") if not descending else ("%b", "%a")
    body = [
        f"%lt = {cmp(first, second, 'LT')}",
        # NaN is the largest: `first` precedes a NaN `second` unless it is NaN itself
        f"%sn = {cmp(second, second, 'NE')}",
        f"%fnum = {cmp(first, first, 'EQ')}",
        f'%nan_after = "stablehlo.and"(%sn, %fnum) : ({b}, {b}) -> {b}',
        f'%r = "stablehlo.or"(%lt, %nan_after) : ({b}, {b}) -> {b}',
        f'"stablehlo.return"(%r) : ({b}) -> ()',
    ]
    reg = region([("%a", t), ("%b", t), ("%ia", it), ("%ib", it)], body)
    v, i = fn.op_multi(
        "stablehlo.sort",
        [x, idx],
        [(x.shape, x.dtype), (x.shape, torch.int64)],
        f"dimension = {dim} : i64, is_stable = true",
        reg,
    )
    return v, i


@lowering("sort.default")
def sort(tr, x, dim=-1, descending=False):
    return sort_values_indices(x, dim, descending)


@lowering("sort.stable")
def sort_stable(tr, x, stable=None, dim=-1, descending=False):
    return sort_values_indices(x, dim, descending)


@lowering("topk")
def topk(tr, x, k, dim=-1, largest=True, sorted=True):
    if x.rank == 0:
        return x, E.const(x.fn, 0, torch.int64)
    dim = dim % x.rank
    v, i = sort_values_indices(x, dim, largest)
    return E.slice_dim(v, dim, 0, k), E.slice_dim(i, dim, 0, k)


@lowering("linalg_vector_norm")
def vector_norm(tr, x, ord=2, dim=None, keepdim=False, dtype=None):
    """‖x‖_ord over dim (all dims when None or empty): inf/-inf = max/min |x|, 0 = count of non-zeros,
    otherwise (sum |x|^ord)^(1/ord); half precision accumulates in float32."""
    out = _meta(tr)
    dt = out.dtype
    acc = E.acc_dtype(dt)
    dims = (
        list(range(x.rank))
        if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0)
        else [d % max(x.rank, 1) for d in ([dim] if isinstance(dim, int) else dim)]
    )
    dims = dims if x.rank else []
    a = E.convert(E.unary("abs", x), acc)  # |x| first: a complex x's modulus
    c = lambda v: E.const(x.fn, v, acc, a.shape)  # noqa: E731
    if ord == math.inf:
        r = reduce(a, dims, "maximum", keepdim)
    elif ord == -math.inf:
        r = reduce(a, dims, "minimum", keepdim)
    elif ord == 0:
        r = reduce(E.convert(E.compare(a, c(0), "NE"), acc), dims, "add", keepdim)
    elif ord == 1:
        r = reduce(a, dims, "add", keepdim)
    elif ord == 2:
        r = E.unary("sqrt", reduce(E.mul(a, a), dims, "add", keepdim))
    else:
        s = reduce(E.binary("power", a, c(ord)), dims, "add", keepdim)
        r = E.binary("power", s, E.const(x.fn, 1.0 / ord, acc, s.shape))
    return E.convert(r, dt)
