"""Activations, softmax, layer norm, losses and embedding rules (backward ops decompose
through PyTorch's decompositions unless a rule is here)."""

from __future__ import annotations

import math

import torch

from .. import emit as E
from ..tables import META, lowering
from ..tables import out_meta as _meta
from .elementwise import erf_value
from .elementwise import half_in_f32 as _in_acc  # activation rules: halves computed in float32, rounded once
from .reduction import reduce


def _c(x, v):
    return E.const(x.fn, v, x.dtype, x.shape)


@lowering("relu")
def relu(tr, x):
    return E.maximum(x, _c(x, 0)) if x.dtype != torch.bool else x


@lowering("threshold_backward")
def threshold_backward(tr, grad, x, threshold):
    return E.select(E.compare(x, tr.scalar(threshold, x.dtype), "LE"), _c(grad, 0), grad)


@lowering("hardtanh")
@_in_acc
def hardtanh(tr, x, min_val=-1, max_val=1):
    return E.clamp(x, tr.scalar(min_val, x.dtype), tr.scalar(max_val, x.dtype))


@lowering("hardtanh_backward")
@_in_acc
def hardtanh_backward(tr, grad, x, min_val, max_val):
    outside = E.binary(
        "or", E.compare(x, tr.scalar(min_val, x.dtype), "LE"), E.compare(x, tr.scalar(max_val, x.dtype), "GE")
    )
    return E.select(outside, _c(grad, 0), grad)


@lowering("leaky_relu")
@_in_acc
def leaky_relu(tr, x, negative_slope=0.01):
    return E.select(E.compare(x, _c(x, 0), "GT"), x, E.mul(x, tr.scalar(negative_slope, x.dtype)))


@lowering("leaky_relu_backward")
@_in_acc
def leaky_relu_backward(tr, grad, x, negative_slope, self_is_result):
    return E.select(E.compare(x, _c(x, 0), "GT"), grad, E.mul(grad, tr.scalar(negative_slope, x.dtype)))


@lowering("elu")
@_in_acc
def elu(tr, x, alpha=1, scale=1, input_scale=1):
    neg = E.mul(
        E.unary("exponential_minus_one", E.mul(x, tr.scalar(input_scale, x.dtype))), tr.scalar(alpha * scale, x.dtype)
    )
    return E.select(E.compare(x, _c(x, 0), "GT"), E.mul(x, tr.scalar(scale, x.dtype)), neg)


@lowering("elu_backward")
@_in_acc
def elu_backward(tr, grad, alpha, scale, input_scale, is_result, x):
    s = lambda v: tr.scalar(v, x.dtype)  # noqa: E731
    if is_result:  # x is elu's output
        neg = E.mul(E.mul(grad, s(input_scale)), E.add(x, s(alpha * scale)))
    else:
        neg = E.mul(E.mul(grad, s(input_scale * alpha * scale)), E.unary("exponential", E.mul(x, s(input_scale))))
    return E.select(E.compare(x, _c(x, 0), "LE"), neg, E.mul(grad, s(scale)))


def _gelu(x, approximate):
    if approximate == "tanh":
        inner = E.mul(_c(x, math.sqrt(2 / math.pi)), E.add(x, E.mul(_c(x, 0.044715), E.mul(x, E.mul(x, x)))))
        return E.mul(E.mul(_c(x, 0.5), x), E.add(_c(x, 1.0), E.unary("tanh", inner)))
    return E.mul(E.mul(_c(x, 0.5), x), E.add(_c(x, 1.0), erf_value(E.mul(x, _c(x, 1 / math.sqrt(2))))))


@lowering("gelu")
def gelu(tr, x, approximate="none"):
    dt = x.dtype
    return E.convert(_gelu(E.convert(x, E.acc_dtype(dt)), approximate), dt)


@lowering("gelu_backward")
def gelu_backward(tr, grad, x, approximate="none"):
    dt = x.dtype
    xv, g = E.convert(x, E.acc_dtype(dt)), E.convert(grad, E.acc_dtype(dt))
    if approximate == "tanh":
        k, c3 = math.sqrt(2 / math.pi), 0.044715
        x2 = E.mul(xv, xv)
        inner = E.mul(_c(xv, k), E.add(xv, E.mul(_c(xv, c3), E.mul(x2, xv))))
        t = E.unary("tanh", inner)
        dinner = E.mul(_c(xv, k), E.add(_c(xv, 1.0), E.mul(_c(xv, 3 * c3), x2)))
        d = E.add(
            E.mul(_c(xv, 0.5), E.add(_c(xv, 1.0), t)),
            E.mul(E.mul(_c(xv, 0.5), xv), E.mul(E.sub(_c(xv, 1.0), E.mul(t, t)), dinner)),
        )
    else:
        cdf = E.mul(_c(xv, 0.5), E.add(_c(xv, 1.0), erf_value(E.mul(xv, _c(xv, 1 / math.sqrt(2))))))
        pdf = E.mul(_c(xv, 1 / math.sqrt(2 * math.pi)), E.unary("exponential", E.mul(_c(xv, -0.5), E.mul(xv, xv))))
        d = E.add(cdf, E.mul(xv, pdf))
    return E.convert(E.mul(g, d), dt)


@lowering("silu")
def silu(tr, x):
    return E.mul(x, E.unary("logistic", x))


@lowering("silu_backward")
def silu_backward(tr, grad, x):
    s = E.unary("logistic", x)
    return E.mul(grad, E.mul(s, E.add(_c(x, 1.0), E.mul(x, E.sub(_c(x, 1.0), s)))))


@lowering("sigmoid_backward")
def sigmoid_backward(tr, grad, y):
    return E.mul(grad, E.conj(E.mul(y, E.sub(_c(y, 1.0), y))))  # complex: the conjugate derivative, as autograd


@lowering("tanh_backward")
def tanh_backward(tr, grad, y):
    return E.mul(grad, E.conj(E.sub(_c(y, 1.0), E.mul(y, y))))


def _softmax_parts(x, dim, dt):
    xv = E.convert(x, E.acc_dtype(dt))
    m = reduce(xv, [dim], "maximum", True)
    sh = E.sub(xv, m)
    e = E.unary("exponential", sh)
    s = reduce(e, [dim], "add", True)
    return sh, e, s


@lowering("_softmax")
def softmax(tr, x, dim, half_to_float):
    dt = _meta(tr).dtype
    dim = dim % max(x.rank, 1)
    if x.rank == 0:
        return E.const(x.fn, 1, dt)
    _, e, s = _softmax_parts(x, dim, dt)
    return E.convert(E.div(e, s), dt)


@lowering("_log_softmax")
def log_softmax(tr, x, dim, half_to_float):
    dt = _meta(tr).dtype
    dim = dim % max(x.rank, 1)
    if x.rank == 0:
        return E.const(x.fn, 0, dt)
    sh, _, s = _softmax_parts(x, dim, dt)
    return E.convert(E.sub(sh, E.unary("log", s)), dt)


@lowering("_softmax_backward_data")
def softmax_backward(tr, grad, y, dim, input_dtype):
    dt = _meta(tr).dtype
    g, yv = E.convert(grad, E.acc_dtype(dt)), E.convert(y, E.acc_dtype(dt))
    gy = E.mul(g, yv)
    total = reduce(gy, [dim % y.rank], "add", True) if y.rank else gy  # 0-d: the sum over one element
    return E.convert(E.sub(gy, E.mul(yv, total)), dt)


@lowering("_log_softmax_backward_data")
def log_softmax_backward(tr, grad, y, dim, input_dtype):
    dt = _meta(tr).dtype
    g, yv = E.convert(grad, E.acc_dtype(dt)), E.convert(y, E.acc_dtype(dt))
    s = reduce(g, [dim % y.rank], "add", True) if y.rank else g
    return E.convert(E.sub(g, E.mul(E.unary("exponential", yv), s)), dt)


@lowering("native_layer_norm")
def native_layer_norm(tr, x, normalized_shape, weight, bias, eps):
    dt = x.dtype
    acc = E.acc_dtype(dt)
    k = len(normalized_shape)
    dims = list(range(x.rank - k, x.rank))
    n = math.prod(normalized_shape)
    xv = E.convert(x, acc)
    mean = E.div(reduce(xv, dims, "add", True), E.const(x.fn, n, acc))
    d = E.sub(xv, mean)
    var = E.div(reduce(E.mul(d, d), dims, "add", True), E.const(x.fn, n, acc))
    rstd = E.unary("rsqrt", E.add(var, tr.scalar(eps, acc)))
    y = E.mul(d, rstd)
    if weight is not None:
        y = E.mul(y, E.convert(weight, acc))
    if bias is not None:
        y = E.add(y, E.convert(bias, acc))
    stat_shape = _meta(tr, 1).shape
    return (
        E.convert(y, dt),
        E.convert(E.reshape(mean, stat_shape), _meta(tr, 1).dtype),
        E.convert(E.reshape(rstd, stat_shape), _meta(tr, 2).dtype),
    )


@lowering("native_layer_norm_backward")
def native_layer_norm_backward(tr, grad, x, normalized_shape, mean, rstd, weight, bias, output_mask):
    dt = x.dtype
    acc = E.acc_dtype(dt)
    k = len(normalized_shape)
    axis = x.rank - k
    inner = list(range(axis, x.rank))
    outer = list(range(axis))
    n = math.prod(normalized_shape)
    xv, g = E.convert(x, acc), E.convert(grad, acc)
    mean_b = E.broadcast_to(E.reshape(E.convert(mean, acc), [*x.shape[:axis]] + [1] * k), x.shape)
    rstd_b = E.broadcast_to(E.reshape(E.convert(rstd, acc), [*x.shape[:axis]] + [1] * k), x.shape)
    xhat = E.mul(E.sub(xv, mean_b), rstd_b)
    gw = E.mul(g, E.convert(weight, acc)) if weight is not None else g
    results = []
    if output_mask[0]:
        a = reduce(gw, inner, "add", True)
        b = reduce(E.mul(gw, xhat), inner, "add", True)
        nn_ = E.const(x.fn, n, acc)
        dx = E.mul(E.div(rstd_b, nn_), E.sub(E.sub(E.mul(nn_, gw), a), E.mul(xhat, b)))
        results.append(E.convert(dx, dt))
    else:
        results.append(E.const(x.fn, 0, dt, x.shape))
    wshape = list(normalized_shape)
    if output_mask[1] and weight is not None:
        results.append(E.convert(E.reshape(reduce(E.mul(g, xhat), outer, "add", False), wshape), weight.dtype))
    else:
        results.append(E.const(x.fn, 0, dt, wshape))
    if output_mask[2] and bias is not None:
        results.append(E.convert(E.reshape(reduce(g, outer, "add", False), wshape), bias.dtype))
    else:
        results.append(E.const(x.fn, 0, dt, wshape))
    return tuple(results)


def _check_targets(tr, target, ignore_index, classes):
    """A target outside [0, classes) that is not ignore_index fails the op, as on CPU (XLA's iota compare would
    silently count it as no class at all)."""
    fn = target.fn
    t = E.convert(target, torch.int64)
    c = lambda v: E.const(fn, v, torch.int64, t.shape)  # noqa: E731
    out = E.binary("or", E.compare(t, c(0), "LT"), E.compare(t, c(classes), "GE"))
    tr.check(
        E.binary("and", out, E.compare(t, c(ignore_index), "NE")), t, IndexError, "Target {value} is out of bounds."
    )


def _nll_weights(x, target, weight, ignore_index, dim_c):
    """Per-element weight of x in the loss: the class weight where class == target (an iota compare,
    no gather) and target != ignore_index, else 0."""
    dt = x.dtype
    others = [d for d in range(x.rank) if d != dim_c]
    classes = E.iota(x.fn, x.shape, dim_c)
    hit = E.compare(classes, E.convert(E.broadcast_in_dim(target, x.shape, others), torch.int64), "EQ")
    w = E.const(x.fn, 1, dt, x.shape) if weight is None else E.broadcast_in_dim(E.convert(weight, dt), x.shape, [dim_c])
    valid = E.compare(target, E.const(x.fn, ignore_index, torch.int64, target.shape), "NE")
    keep = E.binary("and", hit, E.broadcast_in_dim(valid, x.shape, others))
    return E.select(keep, w, E.const(x.fn, 0, dt, x.shape))


@lowering("nll_loss_forward")
def nll_loss_forward(tr, x, target, weight, reduction, ignore_index):
    dim_c = 1 if x.rank >= 2 else 0
    if x.rank == 1:
        x = E.reshape(x, (1, x.shape[0]))
        target = E.reshape(target, (1,))
        dim_c = 1
    _check_targets(tr, target, ignore_index, x.shape[dim_c])
    wsel = _nll_weights(x, target, weight, ignore_index, dim_c)
    per = E.unary("negate", reduce(E.mul(x, wsel), [dim_c], "add", False))
    wsum = reduce(wsel, list(range(x.rank)), "add", False)
    if reduction == 0:
        out = per if _meta(tr).shape == tuple(per.shape) else E.reshape(per, _meta(tr).shape)
    elif reduction == 1:
        out = E.div(reduce(per, list(range(per.rank)), "add", False), wsum)
    else:
        out = reduce(per, list(range(per.rank)), "add", False)
    return out, E.reshape(wsum, ())


@lowering("nll_loss_backward")
def nll_loss_backward(tr, grad, x, target, weight, reduction, ignore_index, total_weight):
    dt = x.dtype
    orig_shape = x.shape
    if x.rank == 1:
        x = E.reshape(x, (1, x.shape[0]))
        target = E.reshape(target, (1,))
    dim_c = 1
    _check_targets(tr, target, ignore_index, x.shape[dim_c])
    wsel = _nll_weights(x, target, weight, ignore_index, dim_c)
    g = E.convert(grad, dt)
    if reduction == 0:
        gb = E.broadcast_in_dim(E.reshape(g, target.shape), x.shape, [d for d in range(x.rank) if d != dim_c])
    else:
        gb = E.broadcast_to(E.reshape(g, ()), x.shape)
        if reduction == 1:
            gb = E.div(gb, E.broadcast_to(E.reshape(E.convert(total_weight, dt), ()), x.shape))
    return E.reshape(E.unary("negate", E.mul(wsel, gb)), orig_shape)


@lowering("native_batch_norm", "_native_batch_norm_legit")
def native_batch_norm(tr, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Train: batch statistics, running stats updated in place in the same program. Eval: running stats;
    the saved statistics are empty, as on CPU."""
    dt = x.dtype
    acc = E.acc_dtype(dt)
    c = x.shape[1] if x.rank > 1 else 1
    dims = [d for d in range(x.rank) if d != 1]
    stat = lambda v: E.broadcast_in_dim(v, x.shape, [1])  # noqa: E731
    xv = E.convert(x, acc)
    if training:
        n = x.numel // c
        mean = E.div(reduce(xv, dims, "add", False), E.const(x.fn, n, acc, (c,)))
        d = E.sub(xv, stat(mean))
        var = E.div(reduce(E.mul(d, d), dims, "add", False), E.const(x.fn, n, acc, (c,)))
        mom = tr.scalar(momentum, acc)
        keep = E.sub(E.const(x.fn, 1, acc), mom)
        if running_mean is not None:
            rm = E.add(E.mul(E.convert(running_mean, acc), keep), E.mul(mean, mom))
            tr.update(running_mean, rm)
        if running_var is not None:
            unbiased = E.mul(var, E.const(x.fn, n / max(n - 1, 1), acc, (c,)))
            rv = E.add(E.mul(E.convert(running_var, acc), keep), E.mul(unbiased, mom))
            tr.update(running_var, rv)
    else:
        mean, var = E.convert(running_mean, acc), E.convert(running_var, acc)
        d = E.sub(xv, stat(mean))
    invstd = E.unary("rsqrt", E.add(var, tr.scalar(eps, acc)))
    y = E.mul(d, stat(invstd))
    if weight is not None:
        y = E.mul(y, stat(E.convert(weight, acc)))
    if bias is not None:
        y = E.add(y, stat(E.convert(bias, acc)))
    sdt = weight.dtype if weight is not None else dt  # (see _batch_norm_meta)
    shape = (c,) if training else (0,)
    if not training:
        return E.convert(y, dt), E.const(x.fn, 0, sdt, shape), E.const(x.fn, 0, sdt, shape)
    return E.convert(y, dt), E.convert(mean, sdt), E.convert(invstd, sdt)


@lowering("_native_batch_norm_legit.no_stats")
def native_batch_norm_no_stats(tr, x, weight, bias, training, momentum, eps):
    return native_batch_norm(tr, x, weight, bias, None, None, training, momentum, eps)


@lowering("_native_batch_norm_legit_no_training")
def native_batch_norm_no_training(tr, x, weight, bias, running_mean, running_var, momentum, eps):
    return native_batch_norm(tr, x, weight, bias, running_mean, running_var, False, momentum, eps)


@lowering("native_batch_norm_backward")
def native_batch_norm_backward(
    tr, grad, x, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask
):
    """Train: through the batch statistics; eval: a per-channel scale. Weight/bias gradients are sums."""
    dt = x.dtype
    acc = E.acc_dtype(dt)
    c = x.shape[1] if x.rank > 1 else 1
    dims = [d for d in range(x.rank) if d != 1]
    stat = lambda v: E.broadcast_in_dim(v, x.shape, [1])  # noqa: E731
    xv, g = E.convert(x, acc), E.convert(grad, acc)
    if train:
        mean, invstd = E.convert(save_mean, acc), E.convert(save_invstd, acc)
    else:
        mean = E.convert(running_mean, acc)
        invstd = E.unary("rsqrt", E.add(E.convert(running_var, acc), tr.scalar(eps, acc)))
    xhat = E.mul(E.sub(xv, stat(mean)), stat(invstd))
    w = E.convert(weight, acc) if weight is not None else E.const(x.fn, 1, acc, (c,))
    sum_g = reduce(g, dims, "add", False)
    sum_gx = reduce(E.mul(g, xhat), dims, "add", False)
    res = []
    if output_mask[0]:
        scale = stat(E.mul(w, invstd))
        if train:
            n = x.numel // c
            nn_ = E.const(x.fn, n, acc, (c,))
            inner = E.sub(E.sub(g, stat(E.div(sum_g, nn_))), E.mul(xhat, stat(E.div(sum_gx, nn_))))
            res.append(E.convert(E.mul(scale, inner), dt))
        else:
            res.append(E.convert(E.mul(scale, g), dt))
    else:
        res.append(E.const(x.fn, 0, dt, x.shape))
    pdt = weight.dtype if weight is not None else dt
    res.append(E.convert(sum_gx, pdt) if output_mask[1] else E.const(x.fn, 0, pdt, (c,)))
    res.append(E.convert(sum_g, pdt) if output_mask[2] else E.const(x.fn, 0, pdt, (c,)))
    return tuple(res)


def _with_reserve(tr, outs):
    """The new batch-norm API's 4th output: an empty uint8 reserve (used by cudnn/miopen only)."""
    return (*outs, E.const(tr.fn, 0, torch.uint8, (0,)))


def _batch_norm_meta(op_name, training_arg):
    """CPU is the oracle where the meta kernel differs: batch norm's saved statistics take the parameters'
    dtype (the input's without weight) and are empty in eval mode."""
    op = getattr(torch.ops.aten, op_name.split(".")[0])
    op = getattr(op, op_name.split(".")[1] if "." in op_name else "default")

    def meta(*args, **kwargs):
        outs = list(op(*args, **kwargs))
        x, weight = args[0], args[1]
        training = training_arg(args, kwargs)
        c = x.shape[1] if x.dim() > 1 else 1
        sdt = weight.dtype if weight is not None else x.dtype
        shape = (c,) if training else (0,)
        outs[1] = torch.empty(shape, dtype=sdt, device="meta")
        outs[2] = torch.empty(shape, dtype=sdt, device="meta")
        return tuple(outs)

    return meta


for _name, _training in (
    ("native_batch_norm", lambda a, k: a[5]),
    ("_native_batch_norm_legit", lambda a, k: a[5]),
    ("_native_batch_norm_legit.no_stats", lambda a, k: a[3]),
    ("_native_batch_norm_legit_no_training", lambda a, k: False),
    ("_batch_norm_with_update", lambda a, k: True),
):
    META[_name] = _batch_norm_meta(_name, _training)


@lowering("_batch_norm_with_update")
def batch_norm_with_update(tr, x, weight, bias, running_mean, running_var, momentum, eps):
    return _with_reserve(tr, native_batch_norm(tr, x, weight, bias, running_mean, running_var, True, momentum, eps))


@lowering("_batch_norm_no_update")
def batch_norm_no_update(tr, x, weight, bias, running_mean, running_var, momentum, eps):
    training = running_mean is None or running_var is None  # no running stats: batch statistics, no update
    return _with_reserve(tr, native_batch_norm(tr, x, weight, bias, running_mean, running_var, training, momentum, eps))


@lowering("batch_norm_backward")
def batch_norm_backward(
    tr, grad, x, weight, running_mean, running_var, save_mean, save_invstd, update, eps, output_mask, reserve
):
    return native_batch_norm_backward(
        tr, grad, x, weight, running_mean, running_var, save_mean, save_invstd, update, eps, output_mask
    )


def _within(tr, x, lambd):
    """-lambd <= x <= lambd, compared in float32 for halves (lambd kept at float32, as CPU); NaN is outside."""
    w = E.convert(x, E.acc_dtype(x.dtype))
    lam = tr.scalar(lambd, w.dtype)
    return E.binary("and", E.compare(w, E.unary("negate", lam), "GE"), E.compare(w, lam, "LE"))


@lowering("hardshrink_backward", "softshrink_backward")
def shrink_backward(tr, grad, x, lambd):
    """The gradient passes where |x| > lambd, as CPU: zero for -lambd <= x <= lambd."""
    g = E.convert(grad, _meta(tr).dtype)
    return E.select(_within(tr, E.convert(x, g.dtype), lambd), _c(g, 0), g)


@lowering("hardshrink")
def hardshrink(tr, x, lambd=0.5):
    """0 for -lambd <= x <= lambd, x elsewhere (NaN stays)."""
    xv = E.convert(x, _meta(tr).dtype)
    return E.select(_within(tr, xv, lambd), _c(xv, 0), xv)


@lowering("softshrink")
@_in_acc
def softshrink(tr, x, lambd=0.5):
    """x - lambd above lambd, x + lambd below -lambd, x * 0 between (so -0.0 and NaN stay, as on CPU)."""
    lam = tr.scalar(lambd, x.dtype)
    return E.select(
        E.compare(x, lam, "GT"),
        E.sub(x, lam),
        E.select(E.compare(x, E.unary("negate", lam), "LT"), E.add(x, lam), E.mul(x, _c(x, 0))),
    )
