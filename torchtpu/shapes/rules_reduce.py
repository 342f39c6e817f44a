"""Padded rules of reductions and contractions: sums, means, norms, variances and scans (the padding read as the
reduction's identity), sort/topk, histc, grouped and plain matmuls, softmax and layer norm with their backwards.
"""

from __future__ import annotations

import math

import torch

from .interp import Rt, arg_or, broadcast_dims, handles, meta_val, padded_args
from .padded import PT, Sz, Unsupported, agree, fill_padding, fresh_dims, plain, prefixed, same_factors

aten = torch.ops.aten


# -- reductions -------------------------------------------------------------------------------------------------------
def _reduce_dims(x, dims):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(x.t.dim()))
    dims = dims if isinstance(dims, (list, tuple)) else [dims]
    return [d % max(x.t.dim(), 1) for d in dims]


def _kept(x, rdims, keepdim):
    return [((1, None),) if d in rdims else f for d, f in enumerate(x.dims) if keepdim or d not in rdims]


def _identity(op, dtype):
    if op in ("amax", "max"):
        return -math.inf if dtype.is_floating_point else (False if dtype == torch.bool else torch.iinfo(dtype).min)
    if op in ("amin", "min"):
        return math.inf if dtype.is_floating_point else (True if dtype == torch.bool else torch.iinfo(dtype).max)
    if op == "prod":
        return 1
    if op == "all":
        return True
    return 0


def count_of(ctx, x, rdims):
    n = 1
    for d in rdims:
        for p, v in x.dims[d]:
            n = n * (v.rt if v is not None else p)
    return n


@handles(
    aten.sum.dim_IntList,
    aten.sum.default,
    aten.amax.default,
    aten.amin.default,
    aten.any.dim,
    aten.any.dims,
    aten.any.default,
    aten.all.dim,
    aten.all.default,
    aten.prod.dim_int,
    aten.mean.dim,
    aten.mean.default,
    aten.argmax.default,
    aten.argmin.default,
    aten.max.dim,
    aten.min.dim,
    aten.prod.default,
    aten.max.default,
    aten.min.default,
)
def _reduction(node, args, kwargs, ctx):
    x = args[0]
    name = node.target.overloadpacket.__name__
    single = name in ("argmax", "argmin", "max", "min", "prod")  # one dim (or all for argmax)
    dims_arg = args[1] if len(args) > 1 else kwargs.get("dim")
    if node.target in (aten.sum.default, aten.any.default, aten.all.default, aten.mean.default):
        dims_arg = None
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)  # also with every dim (dim=None)
    if single and dims_arg is None and name in ("argmax", "argmin") and x.any_tainted:
        raise Unsupported(f"{node.target} over every dim of a padded tensor (flat positions)")
    rdims = _reduce_dims(x, dims_arg)
    ident = _identity(name.replace("arg", ""), x.t.dtype)
    xs = fill_padding(ctx, x, ident, rdims) if any(x.tainted(d) for d in rdims) else x.t
    if name == "mean":
        if not any(x.tainted(d) for d in rdims):
            out = node.target(xs, *padded_args(args[1:]), **padded_args(kwargs))
        else:
            dtype = kwargs.get("dtype") or (args[3] if len(args) > 3 else None) or x.t.dtype
            s = torch.sum(xs.to(dtype), dim=rdims, keepdim=keepdim)
            out = (s / count_of(ctx, x, rdims)).to(dtype)
        return PT(out, _kept(x, rdims, keepdim))
    out = node.target(xs, *padded_args(args[1:]), **padded_args(kwargs))
    if isinstance(out, tuple):
        return tuple(PT(o, _kept(x, rdims, keepdim)) for o in out)
    return PT(out, _kept(x, rdims, keepdim))


@handles(aten.linalg_vector_norm.default)
def _vector_norm(node, args, kwargs, ctx):
    """A p-norm reads the padding as a zero (|0|^p adds nothing, max |x| is not raised); a negative order or -inf
    (|x|^p of 0 is inf, min |x| would be 0) reads it as inf instead."""
    x = args[0]
    order = arg_or(args, kwargs, 1, "ord", 2)
    if isinstance(order, (Sz, Rt)):
        raise Unsupported(f"{node.target} with a runtime order")
    rdims = _reduce_dims(x, arg_or(args, kwargs, 2, "dim", None))
    keepdim = arg_or(args, kwargs, 3, "keepdim", False)
    xs = fill_padding(ctx, x, math.inf if order < 0 else 0, rdims) if any(x.tainted(d) for d in rdims) else x.t
    return PT(node.target(xs, *padded_args(args[1:]), **padded_args(kwargs)), _kept(x, rdims, keepdim))


@handles(aten.var.correction, aten.var_mean.correction)
def _var(node, args, kwargs, ctx):
    x = args[0]
    dims_arg = args[1] if len(args) > 1 else kwargs.get("dim")
    correction = kwargs.get("correction", 1 if len(args) < 3 else args[2])
    correction = 1 if correction is None else correction
    keepdim = kwargs.get("keepdim", False)
    rdims = _reduce_dims(x, dims_arg)
    if not any(x.tainted(d) for d in rdims):
        out = node.target(*padded_args(args), **padded_args(kwargs))
        kept = _kept(x, rdims, keepdim)
        return tuple(PT(o, kept) for o in out) if isinstance(out, tuple) else PT(out, kept)
    n = count_of(ctx, x, rdims)
    xs = fill_padding(ctx, x, 0, rdims)
    mean = torch.sum(xs, dim=rdims, keepdim=True) / n
    dev = fill_padding(ctx, PT(x.t - mean, x.dims), 0, rdims)
    var = torch.sum(dev * dev, dim=rdims, keepdim=keepdim) / (n - correction)
    kept = _kept(x, rdims, keepdim)
    if node.target is aten.var_mean.correction:
        return PT(var, kept), PT(mean if keepdim else mean.squeeze(rdims), kept)
    return PT(var, kept)


@handles(aten.cumsum.default, aten.cumprod.default, aten.cummax.default, aten.cummin.default, aten.logcumsumexp.default)
def _scan(node, args, kwargs, ctx):
    """A scan along a dim reads only earlier positions: the padding, after the valid values, is never read into
    them, unless the dim merges several padded ones."""
    x, dim = args[0], args[1] % max(args[0].t.dim(), 1)
    if x.tainted(dim) and len(x.dims[dim]) != 1:
        raise Unsupported(f"{node.target} along a merged padded dim")
    out = node.target(*padded_args(args), **padded_args(kwargs))
    return tuple(PT(o, x.dims) for o in out) if isinstance(out, tuple) else PT(out, x.dims)


@handles(aten.topk.default, aten.sort.default, aten.sort.stable)
def _select_along(node, args, kwargs, ctx):
    """topk / sort: along a dim without padding (a router's top-k experts of each padded token) each row on its own,
    so the padding's rows give garbage rows; along a padded dim, a stable sort with the padding sorting last."""
    x = args[0]
    if node.target is aten.topk.default:
        if isinstance(args[1], Sz):
            raise Unsupported("topk with a symbolic k")
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
    elif node.target is aten.sort.stable:
        dim = kwargs.get("dim", -1)
    else:
        dim = args[1] if len(args) > 1 else kwargs.get("dim", -1)
    dim = dim % max(x.t.dim(), 1)
    if x.tainted(dim) and node.target is not aten.topk.default:
        desc = (
            kwargs.get("descending", False)
            if node.target is aten.sort.stable
            else arg_or(args, kwargs, 2, "descending", False)
        )
        return _sort_padded(ctx, x, dim, desc)
    if x.tainted(dim):
        # the k first of a sort (Dynamo guards k <= the true size, as PyTorch raises past it)
        values, indices = _sort_padded(ctx, x, dim, arg_or(args, kwargs, 3, "largest", True))
        k = args[1]
        dims = [((k, None),) if d == dim else f for d, f in enumerate(values.dims)]
        return PT(values.t.narrow(dim, 0, k), dims), PT(indices.t.narrow(dim, 0, k), dims)
    out = node.target(*padded_args(args), **padded_args(kwargs))
    dims = [((o, None),) if d == dim else f for d, (f, o) in enumerate(zip(x.dims, out[0].shape))]
    return tuple(PT(o, dims) for o in out)


def _sort_padded(ctx, x, dim, desc):
    """A sort along a padded dim (a router grouping its tokens by expert; topk's first k): the padding becomes values
    that sort after every valid one, in a stable sort (valid ones first among equals), so the valid values come first,
    sorted, and their indices are exact coordinates (the dim laid out compact first)."""
    x = prefixed(ctx, x, [dim])
    dt = x.t.dtype
    if dt == torch.bool:
        fill = not desc
    elif dt.is_floating_point:
        fill = -math.inf if desc else math.nan  # NaN sorts after +inf ascending (a valid NaN stays ahead: stable)
    else:
        fill = torch.iinfo(dt).min if desc else torch.iinfo(dt).max
    values, indices = torch.sort(fill_padding(ctx, x, fill, [dim]), dim=dim, descending=desc, stable=True)
    return PT(values, x.dims), PT(indices, x.dims)


@handles(aten.histc.default)
def _histc(node, args, kwargs, ctx):
    """histc over padded values: the padding becomes a value past `max`, which no bin counts."""
    x = args[0]
    bins = args[1] if len(args) > 1 else kwargs.get("bins", 100)
    lo = args[2] if len(args) > 2 else kwargs.get("min", 0)
    hi = args[3] if len(args) > 3 else kwargs.get("max", 0)
    dt = x.t.dtype
    if not dt.is_floating_point:  # integers are counted in float32 (the lowering's arithmetic, order.histc)
        x = PT(x.t.to(torch.float32), x.dims)
    if x.any_tainted:
        if lo == hi:
            raise Unsupported("histc of padded values over their own range (min == max)")
        xt = fill_padding(ctx, x, math.inf)
    else:
        xt = x.t
    out = torch.histc(xt, bins, lo, hi)
    return plain(out.to(dt) if out.dtype != dt else out)


@handles(aten._grouped_mm.default)
def _grouped_mm(node, args, kwargs, ctx):
    """Grouped matmul (MoE experts): the groups' rows (or, for a weight gradient, the contracted dim) follow `offs`,
    whose last offset is the valid count; the padding is zeroed (what a contraction over it adds is 0), the rows
    past the valid ones are padding of the result. Padded dims are laid out with their valid values first."""
    tensors = []
    for a in args:
        if isinstance(a, PT):
            a = prefixed(ctx, a, [d for d in range(a.t.dim()) if a.tainted(d)])
            a = PT(fill_padding(ctx, a, 0), a.dims)
        tensors.append(a)
    out = node.target(*padded_args(tensors), **padded_args(kwargs))
    return PT(out, fresh_dims(ctx, meta_val(node), out))


@handles(aten.flip.default)
def _flip(node, args, kwargs, ctx):
    """flip along a padded dim: the valid values reversed in place (position i reads L-1-i), the padding after."""
    x, dims = args[0], [d % max(args[0].t.dim(), 1) for d in args[1]]
    out = x.t
    for d in dims:
        if not x.tainted(d):
            out = out.flip(d)
            continue
        if len(x.dims[d]) != 1:
            raise Unsupported("flip along a merged padded dim")
        pos = ctx.iota(out.shape[d])
        n = x.dims[d][0][1].rt
        out = out.index_select(d, torch.where(pos < n, n - 1 - pos, pos))
    return PT(out, x.dims)


@handles(aten.tril.default, aten.triu.default)
def _triangle(node, args, kwargs, ctx):
    """tril/triu keep positions by (row, column): right on the padded layout when both dims keep their valid values
    first (a causal mask's ones(L, L).tril())."""
    x = args[0]
    if x.t.dim() < 2 or any(len(x.dims[d]) != 1 for d in (-2, -1)):
        raise Unsupported(f"{node.target} over merged padded dims")
    return PT(node.target(*padded_args(args), **padded_args(kwargs)), x.dims)


# -- matmuls -----------------------------------------------------------------------------------------------------------
def _contract(ctx, node, a, b, ka, kb):
    """a and b with the padding of their contracted dims (a's ka, b's kb) zeroed."""
    a, b = agree(ctx, node, a, ka, b, kb)
    fa, fb = a.dims[ka], b.dims[kb]
    ta, tb = a.tainted(ka), b.tainted(kb)
    if ta and tb and not same_factors(fa, fb):
        raise Unsupported(f"{node.target}: contracted dims padded differently")
    if not (ta or tb):
        return a.t, b.t
    f = fa if ta else fb
    return (
        fill_padding(ctx, PT(a.t, [f if d == ka else ((s, None),) for d, s in enumerate(a.t.shape)]), 0, [ka]),
        fill_padding(ctx, PT(b.t, [f if d == kb else ((s, None),) for d, s in enumerate(b.t.shape)]), 0, [kb]),
    )


@handles(aten.mm.default)
def _mm(node, args, kwargs, ctx):
    a, b = args
    at_, bt = _contract(ctx, node, a, b, 1, 0)
    return PT(torch.mm(at_, bt), [a.dims[0], b.dims[1]])


@handles(aten.bmm.default)
def _bmm(node, args, kwargs, ctx):
    a, b = args
    at_, bt = _contract(ctx, node, a, b, 2, 1)
    batch = a.dims[0] if a.tainted(0) else b.dims[0]
    return PT(torch.bmm(at_, bt), [batch, a.dims[1], b.dims[2]])


@handles(aten.addmm.default)
def _addmm(node, args, kwargs, ctx):
    bias, a, b = args[:3]
    at_, bt = _contract(ctx, node, a, b, 1, 0)
    out = aten.addmm.default(bias.t, at_, bt, *args[3:], **kwargs)
    prod = PT(out, [a.dims[0], b.dims[1]])
    return PT(out, broadcast_dims(node, [prod, bias], out, ctx))


# -- softmax -----------------------------------------------------------------------------------------------------------
@handles(aten._softmax.default, aten._log_softmax.default)
def _softmax(node, args, kwargs, ctx):
    x, dim = args[0], args[1] % max(args[0].t.dim(), 1)
    xs = fill_padding(ctx, x, -math.inf, [dim]) if x.tainted(dim) else x.t
    return PT(node.target(xs, dim, *args[2:]), x.dims)


@handles(aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
def _softmax_backward(node, args, kwargs, ctx):
    g, out, dim = args[0], args[1], args[2] % max(args[0].t.dim(), 1)
    if g.tainted(dim) or out.tainted(dim):
        gt = fill_padding(ctx, g, 0, [dim])
        ot = fill_padding(ctx, out, 0 if node.target is aten._softmax_backward_data.default else -math.inf, [dim])
    else:
        gt, ot = g.t, out.t
    res = node.target(gt, ot, dim, *args[3:])
    return PT(res, broadcast_dims(node, [g, out], res, ctx))


# -- norms -------------------------------------------------------------------------------------------------------------
@handles(aten.native_layer_norm.default)
def _layer_norm(node, args, kwargs, ctx):
    x, shape = args[0], args[1]
    k = x.t.dim() - len(shape)
    if any(x.tainted(d) for d in range(k, x.t.dim())):
        raise Unsupported("native_layer_norm over a padded dim")
    out, mean, rstd = node.target(*padded_args(args))
    lead = list(x.dims[:k]) + [((1, None),)] * len(shape)
    return PT(out, x.dims), PT(mean, lead), PT(rstd, lead)


@handles(aten.native_layer_norm_backward.default)
def _layer_norm_backward(node, args, kwargs, ctx):
    go, x, shape, mean, rstd, w, b, mask = args
    k = x.t.dim() - len(shape)
    if any(x.tainted(d) for d in range(k, x.t.dim())):
        raise Unsupported("native_layer_norm_backward over a padded dim")
    lead = list(range(k))
    # the weight and bias gradients sum over the leading dims: the padding contributes exactly 0
    gi, gw, gb = node.target(
        fill_padding(ctx, go, 0, lead),
        fill_padding(ctx, x, 0, lead),
        list(shape),
        fill_padding(ctx, mean, 0, lead),
        fill_padding(ctx, rstd, 1, lead),
        padded_args(w),
        padded_args(b),
        mask,
    )
    return (
        PT(gi, x.dims) if gi is not None else None,
        plain(gw) if gw is not None else None,
        plain(gb) if gb is not None else None,
    )
