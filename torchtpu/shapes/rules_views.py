"""Padded rules of views and layout ops: view/reshape (dims regrouped with their factors), permute, transpose,
squeeze/unsqueeze, diagonal, unfold, the FFTs, complex views, repeat and expand.
"""

from __future__ import annotations

import torch

from .interp import HANDLERS, arg_or, handles, meta_val, padded_args
from .padded import PT, Sz, Unsupported, fresh_dims, prefixed, repack, same_factors, sym_expr

aten = torch.ops.aten


# -- views -------------------------------------------------------------------------------------------------------------
def _regroup(node, factors, out_shape):
    """Factors of a reshape's result dims: the input's factors, flattened, grouped to the result's sizes (a factor
    without padding may be split; a padded one may not)."""
    flat = [f for fs in factors for f in fs if f[0] != 1]
    out, i = [], 0
    for n in out_shape:
        if n == 1:
            out.append(((1, None),))
            continue
        group, prod = [], 1
        while prod < n and i < len(flat):
            p, v = flat[i]
            if prod * p > n:
                if v is not None or n % prod or p % (n // prod):
                    raise Unsupported(f"{node.target}: a padded dim split across {tuple(out_shape)}")
                take = n // prod
                group.append((take, None))
                flat[i] = (p // take, None)
                prod = n
                break
            group.append(flat[i])
            prod *= p
            i += 1
        if prod != n:
            raise Unsupported(f"{node.target}: reshape to {tuple(out_shape)}")
        out.append(tuple(group))
    if i != len(flat):
        raise Unsupported(f"{node.target}: reshape to {tuple(out_shape)} leaves factors")
    return out


def _view(node, args, kwargs, ctx):
    x = args[0]
    # a reshape, not a view: a handler's result may be laid out unlike the traced one (the graph is functional)
    try:
        # raises when the padded sizes do not give the result's: a padded input to a static shape (`reshape(25, 5)`
        # of [s0, s1, 5], Dynamo guarding s0 * s1 == 25)
        out = x.t.reshape(padded_args(args[1]))
        return PT(out, _regroup(node, x.dims, out.shape))
    except (Unsupported, RuntimeError):
        # the padding does not split along the result's dims (a merged B*T dim read as [B, T]): lay it out anew
        return repack(ctx, x, [ctx.size(sym_expr(s)) for s in meta_val(node).shape])


for _op in (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default):
    HANDLERS[_op] = _view


@handles(aten.permute.default, aten.permute_copy.default)
def _permute(node, args, kwargs, ctx):
    x, perm = args[0], [p % max(args[0].t.dim(), 1) for p in args[1]]
    return PT(node.target(x.t, perm), [x.dims[p] for p in perm])


@handles(aten.transpose.int)
def _transpose(node, args, kwargs, ctx):
    x, a, b = args
    dims = list(x.dims)
    a, b = a % x.t.dim(), b % x.t.dim()
    dims[a], dims[b] = dims[b], dims[a]
    return PT(node.target(x.t, a, b), dims)


@handles(aten.t.default)
def _t(node, args, kwargs, ctx):
    x = args[0]
    return PT(x.t.t(), list(reversed(x.dims)))


@handles(aten.unsqueeze.default)
def unsqueeze(node, args, kwargs, ctx):
    x, d = args
    d = d % (x.t.dim() + 1)
    dims = list(x.dims)
    dims.insert(d, ((1, None),))
    return PT(x.t.unsqueeze(d), dims)


@handles(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def _squeeze(node, args, kwargs, ctx):
    x = args[0]
    out = node.target(*padded_args(args))
    if node.target is aten.squeeze.default:
        drop = [d for d in range(x.t.dim()) if x.t.shape[d] == 1]
    else:
        ds = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        drop = [d % max(x.t.dim(), 1) for d in ds if x.t.shape[d % max(x.t.dim(), 1)] == 1]
    return PT(out, [f for d, f in enumerate(x.dims) if d not in drop])


def _diag_dims(node, x, args, kwargs):
    offset = arg_or(args, kwargs, 1, "offset", 0)
    d1 = arg_or(args, kwargs, 2, "dim1", 0) % max(x.t.dim(), 1)
    d2 = arg_or(args, kwargs, 3, "dim2", 1) % max(x.t.dim(), 1)
    if isinstance(offset, Sz):
        raise Unsupported(f"{node.target} at a symbolic offset")
    return offset, d1, d2


@handles(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(node, args, kwargs, ctx):
    """With both dims laid out valid-first, the padded diagonal's first min(s1, s2 - offset) entries are the exact
    diagonal (its later ones lie in a padded row or column)."""
    offset, d1, d2 = _diag_dims(node, args[0], args, kwargs)
    x = prefixed(ctx, args[0], [d1, d2])
    out = node.target(x.t, offset, d1, d2)
    dims = [f for d, f in enumerate(x.dims) if d not in (d1, d2)] + [fresh_dims(ctx, meta_val(node), out)[-1]]
    return PT(out, dims)


@handles(aten.diagonal_scatter.default)
def _diagonal_scatter(node, args, kwargs, ctx):
    """The source's padding lands on diagonal positions in a padded row or column of the base."""
    base, src = args[0], args[1]
    offset, d1, d2 = _diag_dims(node, base, [base] + list(args[2:]), kwargs)
    base = prefixed(ctx, base, [d1, d2])
    rest = [f for d, f in enumerate(base.dims) if d not in (d1, d2)]
    if not all(same_factors(a, b) for a, b in zip(rest, src.dims[:-1])) or len(src.dims[-1]) != 1:
        raise Unsupported(f"{node.target} of a source padded unlike the base")
    # the source may be padded to its own bucket: its valid prefix (the exact diagonal) fits the padded diagonal
    n = base.t.diagonal(offset, d1, d2).shape[-1]
    st = src.t.narrow(-1, 0, n) if src.t.shape[-1] >= n else torch.nn.functional.pad(src.t, (0, n - src.t.shape[-1]))
    return PT(node.target(base.t, st, offset, d1, d2), base.dims)


@handles(aten.unfold.default)
def _unfold(node, args, kwargs, ctx):
    """Windows along a dim laid out valid-first: the valid windows read valid positions only."""
    x, dim, size, step = args[0], args[1] % max(args[0].t.dim(), 1), args[2], args[3]
    if isinstance(size, Sz) or isinstance(step, Sz):
        raise Unsupported(f"{node.target} with a symbolic window")
    x = prefixed(ctx, x, [dim])
    out = x.t.unfold(dim, size, step)
    dims = list(x.dims)
    dims[dim] = fresh_dims(ctx, meta_val(node), out)[dim] if x.tainted(dim) else ((out.shape[dim], None),)
    return PT(out, dims + [((size, None),)])


def _spectral(node, args, kwargs, ctx):
    """An FFT over unpadded dims transforms each of the other dims' positions on its own (the spectrogram of a
    varying number of frames); over a padded dim the length itself would change."""
    x, fdims = args[0], [d % max(args[0].t.dim(), 1) for d in args[1]]
    if any(x.tainted(d) for d in fdims):
        raise Unsupported(f"{node.target} along a padded dim")
    out = node.target(*padded_args(args), **padded_args(kwargs))
    return PT(out, [((out.shape[d], None),) if d in fdims else x.dims[d] for d in range(out.dim())])


for _op in (aten._fft_r2c.default, aten._fft_c2c.default, aten._fft_c2r.default):
    HANDLERS[_op] = _spectral


@handles(aten._conj.default, aten.conj_physical.default, aten._neg_view.default)
def _conj(node, args, kwargs, ctx):
    return PT(node.target(args[0].t), args[0].dims)


@handles(aten.view_as_real.default)
def _view_as_real(node, args, kwargs, ctx):
    return PT(aten.view_as_real.default(args[0].t), list(args[0].dims) + [((2, None),)])


@handles(aten.view_as_complex.default)
def _view_as_complex(node, args, kwargs, ctx):
    x = args[0]
    if x.tainted(x.t.dim() - 1):
        raise Unsupported(f"{node.target} of a padded last dim")
    t = x.t if x.t.stride(-1) == 1 and all(st % 2 == 0 for st in x.t.stride()[:-1]) else x.t.contiguous()
    return PT(aten.view_as_complex.default(t), list(x.dims[:-1]))


@handles(aten.repeat.default)
def _repeat(node, args, kwargs, ctx):
    """Tiling: a padded dim repeated r times is r padded blocks (a dim padded inside)."""
    x, reps = args[0], list(args[1])
    out = x.t.repeat(padded_args(reps))
    new = len(reps) - x.t.dim()
    dims = [((r.padded, r),) if isinstance(r, Sz) else ((r, None),) for r in reps[:new]]
    for f, r, s in zip(x.dims, reps[new:], x.t.shape):
        if isinstance(r, Sz):  # a symbolic count of blocks: the valid blocks first (instance norm's weight per sample)
            if any(v is not None for _, v in f):
                raise Unsupported(f"{node.target} of a padded dim by a symbolic count")
            dims.append(((r.padded, r), (s, None)))
        else:
            dims.append(f if r == 1 else ((r * s, None),) if all(v is None for _, v in f) else ((r, None),) + tuple(f))
    return PT(out, dims)


@handles(aten.expand.default, aten.expand_copy.default)
def _expand(node, args, kwargs, ctx):
    x = args[0]
    out = node.target(*padded_args(args))
    fresh = fresh_dims(ctx, meta_val(node), out)
    nd, dims = out.dim(), []
    for d in range(nd):
        k = d - (nd - x.t.dim())
        if k >= 0 and x.t.shape[k] == out.shape[d]:
            dims.append(x.dims[k])
        else:
            dims.append(fresh[d])
    return PT(out, dims)
