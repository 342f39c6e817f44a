"""Padded rules of indexing: embedding, gather, scatter, index/index_put/index_select, select and slice (with their
scatters), constant padding, cat and split: positions past a padded dim's valid end are remapped or masked.
"""

from __future__ import annotations

import torch

from .interp import broadcast_dims, handles, harmonize, meta_val, padded_args
from .padded import (
    PT,
    Sz,
    Unsupported,
    agree,
    count_sz,
    fill_padding,
    fresh_dims,
    plain,
    prefix,
    prefixed,
    same_factors,
    sym_expr,
    valid_expr,
    valid_mask,
)
from .rules_views import unsqueeze

aten = torch.ops.aten


def _wrapped(ctx, x: PT, indices):
    """Advanced indices with negative values counted from the true end of a padded dim (as PyTorch wraps them by the
    exact size, not the padded one); x's indexed dims keep their valid values first."""
    out = list(indices)
    for d, i in enumerate(indices):
        if i is not None and x.tainted(d) and i.t.dtype != torch.bool:
            n = count_sz(ctx, x.dims[d]).rt
            out[d] = PT(torch.where(i.t < 0, i.t + n, i.t), i.dims)
    return out


def _values_like_index(ctx, node, x: PT, values: PT, indices, pos):
    """index_put's values laid out like its indices along their broadcast dims (the i-th index goes with the i-th
    value: a merged dim compact in one and padded inside in the other would pair the wrong rows)."""
    idx = [i for i in indices if i is not None]
    if not isinstance(values, PT) or not values.any_tainted or not any(i.any_tainted for i in idx):
        return values, indices
    if pos != list(range(pos[0], pos[-1] + 1)):
        raise Unsupported(f"{node.target}: padded values with non-adjacent indices")
    indices = list(indices)
    rb = max(i.t.dim() for i in idx)
    off = pos[0] + rb + (x.t.dim() - pos[-1] - 1) - values.t.dim()
    for dv in range(values.t.dim()):
        k = dv + off - pos[0]
        if not 0 <= k < rb:
            continue
        for j, i in enumerate(indices):
            di = None if i is None else k - (rb - i.t.dim())
            if di is None or di < 0 or i.t.shape[di] == 1 or values.t.shape[dv] == 1:
                continue
            values, indices[j] = agree(ctx, node, values, dv, i, di)
    return values, indices


def _aligned(node, x, idx, dim):
    """gather/scatter: idx's positions along the other dims are x's positions (x's `dim` is prefixed already)."""
    for d in range(idx.t.dim()):
        if (
            d != dim
            and (x.tainted(d) or idx.tainted(d))
            and not same_factors(idx.dims[d], x.dims[d])
            and not (prefix(x, d) and prefix(idx, d))
        ):
            raise Unsupported(f"{node.target}: index and self padded differently along dim {d}")


@handles(aten.embedding.default)
def _embedding(node, args, kwargs, ctx):
    w, idx = args[0], args[1]
    if w.any_tainted:
        raise Unsupported("embedding of a padded weight")
    it = fill_padding(ctx, idx, 0)  # the padding's indices are garbage: index 0 instead
    out = node.target(w.t, it, *args[2:])
    return PT(out, list(idx.dims) + [w.dims[1]])


@handles(aten.gather.default)
def _gather(node, args, kwargs, ctx):
    x, dim, idx = args[0], args[1] % max(args[0].t.dim(), 1), args[2]
    if idx.t.dim() != x.t.dim():
        raise Unsupported(f"{node.target} with an index of another rank")
    x = prefixed(ctx, x, [dim])  # an index padded along dim too: its padding gathers position 0 into the padding
    _aligned(node, x, idx, dim)
    it = fill_padding(ctx, idx, 0)
    out = torch.gather(x.t, dim, it, **kwargs)
    dims = [
        idx.dims[d] if idx.tainted(d) or d == dim else x.dims[d] if x.t.shape[d] == out.shape[d] else idx.dims[d]
        for d in range(out.dim())
    ]
    return PT(out, dims)


@handles(aten.scatter.value, aten.scatter.src, aten.scatter_add.default, aten.scatter_reduce.two)
def _scatter(node, args, kwargs, ctx):
    """Along other dims the index's padding lies over x's; an index padded along the scattered dim (a varying
    number of rows scattered into a fixed table) sends its padding to one extra position past x's end, dropped."""
    x, dim, idx = args[0], args[1] % max(args[0].t.dim(), 1), args[2]
    if idx.t.dim() != x.t.dim():
        raise Unsupported(f"{node.target} with an index of another rank")
    trash = idx.tainted(dim)
    for d in range(idx.t.dim()):
        if d != dim and idx.tainted(d) and not same_factors(idx.dims[d], x.dims[d]):
            # an index smaller than x along d, padded there on its own: its padding would land on valid positions
            if idx.t.shape[d] > x.t.shape[d] or not (prefix(x, d) and prefix(idx, d)):
                raise Unsupported(f"{node.target}: index and self padded differently")
            trash = True
    x = prefixed(ctx, x, [dim])
    _aligned(node, x, idx, dim)
    src = args[3] if len(args) > 3 else None
    if isinstance(src, PT):  # the i-th index goes with the i-th source value
        for d in range(idx.t.dim()):
            if idx.t.shape[d] == src.t.shape[d] and (idx.tainted(d) or src.tainted(d)):
                idx, src = agree(ctx, node, idx, d, src, d)
                if not same_factors(idx.dims[d], src.dims[d]):
                    raise Unsupported(f"{node.target}: index and source padded differently along dim {d}")
            elif idx.tainted(d) or src.tainted(d):
                raise Unsupported(f"{node.target}: index and source of different sizes along a padded dim {d}")
        args = list(args[:3]) + [src] + list(args[4:])
    rest = [a.t if isinstance(a, PT) else a for a in args[3:]]
    if not trash:
        return PT(node.target(x.t, dim, fill_padding(ctx, idx, 0), *rest, **kwargs), x.dims)
    n0 = x.t.shape[dim]
    xt = torch.cat([x.t, torch.zeros_like(x.t.narrow(dim, 0, 1))], dim)
    it = torch.where(valid_mask(ctx, idx), idx.t, n0)
    return PT(node.target(xt, dim, it, *rest, **kwargs).narrow(dim, 0, n0), x.dims)


@handles(
    aten.index_put.default,
    aten.index_put_.default,
    aten._unsafe_index_put.default,
    aten._index_put_impl.default,
    aten._index_put_impl_.default,
)
def _index_put(node, args, kwargs, ctx):
    x, indices, values = args[0], args[1], args[2]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    pos = [d for d, i in enumerate(indices) if i is not None]
    x = prefixed(ctx, x, pos)
    indices = _wrapped(ctx, x, indices)
    values, indices = _values_like_index(ctx, node, x, values, indices, pos)
    tainted = [i for i in indices if i is not None and i.any_tainted]
    if not tainted:
        out = node.target(x.t, [None if i is None else i.t for i in indices], values.t, accumulate)
        return PT(out, x.dims)
    m = None  # the valid rows of the indices
    for i in tainted:
        mi = valid_mask(ctx, i)
        m = mi if m is None else m & mi
    if not accumulate:
        # the padding's rows write into one extra position past the first indexed dim's end, dropped after
        d0 = pos[0]
        n0 = x.t.shape[d0]
        trash = torch.zeros_like(x.t.narrow(d0, 0, 1))
        xt = torch.cat([x.t, trash], d0)
        idx = [None if i is None else i.t for i in indices]
        idx[d0] = torch.where(m, idx[d0], n0)
        for d in pos[1:]:
            idx[d] = torch.where(m, idx[d], 0)
        out = node.target(xt, idx, values.t, False).narrow(d0, 0, n0)
        return PT(out, x.dims)
    # the padding's rows add 0 (at index 0); a valid index points at a valid position of x (its indexed dims keep their
    # valid values first: prefixed), so x's own padding may stay as it is
    idx = [None if i is None else torch.where(valid_mask(ctx, i), i.t, 0) if i.any_tainted else i.t for i in indices]
    # the mask at the indices' place in the result (after x's leading dims when the indices are adjacent, else
    # first); values broadcast to the result's rank against it
    nb = m.dim()
    start = pos[0] if pos == list(range(pos[0], pos[-1] + 1)) else 0
    rank = x.t.dim() - len(pos) + nb
    vm = m.view([1] * start + list(m.shape) + [1] * (rank - start - nb))
    vals = torch.where(vm, values.t, torch.zeros((), dtype=values.t.dtype, device=values.t.device))
    out = node.target(x.t, idx, vals, True)
    return PT(out, x.dims)


@handles(aten.index.Tensor)
def _index(node, args, kwargs, ctx):
    """Advanced indexing: the result's indexed dims are the indices' broadcast dims (the padding's indices read
    position 0), the others x's; a valid index points at a valid position."""
    x, indices = args
    pos = [i for i, ix in enumerate(indices) if ix is not None]
    idx = [indices[i] for i in pos]
    if not idx or any(i.t.dtype == torch.bool for i in idx):
        raise Unsupported("boolean-mask index")
    x = prefixed(ctx, x, pos)
    indices = _wrapped(ctx, x, indices)
    idx = [indices[i] for i in pos]
    args2, _ = harmonize(ctx, node, (idx,), {})
    idx = list(args2[0])
    filled = [fill_padding(ctx, i, 0) for i in idx]
    full = list(indices)
    for p, f in zip(pos, filled):
        full[p] = f
    out = aten.index.Tensor(x.t, full)
    bshape = torch.broadcast_shapes(*(i.t.shape for i in idx))
    probe = torch.empty(bshape, device="meta")
    bdims = broadcast_dims(node, idx, probe, ctx, fresh=False) if len(bshape) else []
    rest_before = list(x.dims[: pos[0]])
    rest_after = list(x.dims[pos[-1] + 1 :])
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    dims = rest_before + bdims + rest_after if adjacent else bdims + [f for d, f in enumerate(x.dims) if d not in pos]
    return PT(out, dims)


@handles(aten.index_select.default)
def _index_select(node, args, kwargs, ctx):
    """x.index_select(dim, i) is x[:, ..., i]: advanced indexing's rule."""
    x, dim, index = args[0], args[1] % max(args[0].t.dim(), 1), args[2]
    if not isinstance(index, PT):
        index = plain(index)
    if index.t.dim() == 0:  # the dim stays, of size 1
        index = unsqueeze(node, (index, 0), {}, ctx)
    return _index(node, (x, [None] * dim + [index]), {}, ctx)


@handles(aten.select.int)
def _select(node, args, kwargs, ctx):
    """x[..., i, ...]: along a padded dim, laid out with its valid values first (a merged dim padded inside is made
    compact), a valid index i >= 0 is its padded position; i < 0 counts from the true end (the last token's hidden
    state), a runtime position."""
    x, dim, i = args[0], args[1] % max(args[0].t.dim(), 1), args[2]
    if not x.tainted(dim):
        return PT(x.t.select(dim, padded_args(i)), [f for d, f in enumerate(x.dims) if d != dim])
    if isinstance(i, Sz):
        raise Unsupported(f"select of a padded dim (factors {x.dims[dim]}) at a symbolic index")
    x = prefixed(ctx, x, [dim])
    dims = [f for d, f in enumerate(x.dims) if d != dim]
    if i >= 0:
        return PT(x.t.select(dim, i), dims)
    pos = (count_sz(ctx, x.dims[dim]).rt + i).clamp(min=0).reshape(1)
    return PT(x.t.index_select(dim, pos).squeeze(dim), dims)


@handles(aten.slice.Tensor)
def _slice(node, args, kwargs, ctx):
    x = args[0]
    dim = (args[1] if len(args) > 1 else 0) % max(x.t.dim(), 1)
    start = args[2] if len(args) > 2 else None
    step = args[4] if len(args) > 4 else 1
    dims = list(x.dims)
    if x.tainted(dim) and isinstance(start, Sz) and step == 1 and len(x.dims[dim]) == 1:
        # a runtime start (cat's backward splitting its gradient): position i reads start + i
        n = ctx.size(sym_expr(meta_val(node).shape[dim]))
        n = n.padded if isinstance(n, Sz) else n
        src = (start.rt + ctx.iota(n)).clamp(max=x.t.shape[dim] - 1)
        out = x.t.index_select(dim, src)
        dims[dim] = fresh_dims(ctx, meta_val(node), out)[dim]
        return PT(out, dims)
    out = node.target(*padded_args(args))
    if x.tainted(dim):
        if len(x.dims[dim]) != 1 or step != 1 or (start is not None and (isinstance(start, Sz) or start < 0)):
            raise Unsupported("slice of a padded dim other than [k:end] with k >= 0")
        dims[dim] = fresh_dims(ctx, meta_val(node), out)[dim]
    else:
        dims[dim] = ((out.shape[dim], None),)
    return PT(out, dims)


@handles(aten.slice_scatter.default)
def _slice_scatter(node, args, kwargs, ctx):
    import sympy

    base, src = args[0], args[1]
    dim = (args[2] if len(args) > 2 else 0) % max(base.t.dim(), 1)
    start = args[3] if len(args) > 3 else None
    step = args[5] if len(args) > 5 else 1
    if base.tainted(dim) or src.tainted(dim):
        if (
            step != 1
            or (not isinstance(start, Sz) and (start or 0) < 0)
            or len(base.dims[dim]) != 1
            or len(src.dims[dim]) != 1
        ):
            raise Unsupported("slice_scatter into a padded dim other than [k:end] or [k:k+n]")
        # the source's padding lands in the base's padding only if the source reaches the base's end
        lb, ls = valid_expr(base.dims[dim][0]), valid_expr(src.dims[dim][0])
        lb = base.dims[dim][0][0] if lb is None else lb
        ls = src.dims[dim][0][0] if ls is None else ls
        if isinstance(start, Sz) or sympy.simplify(sympy.sympify(lb) - sympy.sympify(ls) - (start or 0)) != 0:
            # short of the end (diff's, trapz's backward), or at a runtime start: base positions [start, start + n)
            # take the source's valid values, all others keep the base's
            if any(d != dim and not same_factors(base.dims[d], src.dims[d]) for d in range(base.t.dim())):
                raise Unsupported("slice_scatter of a source padded unlike the base")
            n = base.t.shape[dim]
            rel = ctx.iota(n) - (start.rt if isinstance(start, Sz) else (start or 0))
            f = src.dims[dim][0]
            inside = (rel >= 0) & (rel < (f[1].rt if f[1] is not None else f[0]))
            taken = src.t.index_select(dim, rel.clamp(0, src.t.shape[dim] - 1))
            shape = [1] * base.t.dim()
            shape[dim] = n
            return PT(torch.where(inside.view(shape), taken, base.t), base.dims)
    out = node.target(*padded_args(args))
    return PT(out, broadcast_dims(node, [base], out, ctx))


@handles(aten.constant_pad_nd.default)
def _constant_pad(node, args, kwargs, ctx):
    x, pad = args[0], list(args[1])
    value = args[2] if len(args) > 2 else 0
    if any(isinstance(p, Sz) for p in pad):
        raise Unsupported("constant_pad_nd by a symbolic amount")
    out = node.target(x.t, pad, value)
    dims = list(x.dims)
    fresh = fresh_dims(ctx, meta_val(node), out)
    for j in range(len(pad) // 2):
        d = x.t.dim() - 1 - j
        before, after = pad[2 * j], pad[2 * j + 1]
        if before == 0 and after == 0:
            continue
        if not x.tainted(d):
            dims[d] = ((out.shape[d], None),)
            continue
        if len(x.dims[d]) != 1:
            raise Unsupported("constant_pad_nd of a merged padded dim")
        dims[d] = fresh[d]
        if after <= 0:  # cropping the end only shortens the padding (the valid values cropped fall into it)
            continue
        # the op put the trailing pad after the padding; write it right after the valid values
        v = x.dims[d][0][1]
        pos = ctx.iota(out.shape[d])
        tail = (pos >= v.rt + before) & (pos < v.rt + before + after)
        shape = [1] * out.dim()
        shape[d] = out.shape[d]
        out = torch.where(tail.view(shape), torch.full((), value, dtype=out.dtype, device=out.device), out)
        dims[d] = fresh[d]
    return PT(out, dims)


@handles(aten.cat.default)
def _cat(node, args, kwargs, ctx):
    xs = [x for x in args[0]]
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    nd = max(x.t.dim() for x in xs)
    dim = dim % nd
    xs = [x for x in xs if not (x.t.dim() == 1 and x.t.numel() == 0)]
    if len(xs) == 1:
        return xs[0]
    if any(x.tainted(dim) for x in xs):
        return _cat_padded(ctx, node, xs, dim)
    out = torch.cat([x.t for x in xs], dim)
    dims = broadcast_dims(
        node,
        [PT(x.t, [f if d != dim else ((out.shape[dim], None),) for d, f in enumerate(x.dims)]) for x in xs],
        out,
        ctx,
    )
    return PT(out, dims)


def _cat_padded(ctx, node, xs, dim):
    """cat along a padded dim: the operands' valid values one after the other, the padding after them all."""
    if any(len(x.dims[dim]) != 1 for x in xs):
        raise Unsupported("cat along a merged padded dim")
    other = [d for d in range(xs[0].t.dim()) if d != dim]
    for x in xs[1:]:
        for d in other:
            if x.tainted(d) != xs[0].tainted(d) or (x.tainted(d) and not same_factors(x.dims[d], xs[0].dims[d])):
                raise Unsupported("cat of operands padded differently")
    joined = torch.cat([x.t for x in xs], dim)
    pos = ctx.iota(joined.shape[dim])
    src = torch.zeros_like(pos)
    start, offset = 0, 0  # an operand's first valid position in the result; its first position in `joined`
    for x in xs:
        p, v = x.dims[dim][0]
        n = v.rt if v is not None else p
        inside = (pos >= start) & (pos < start + n)
        src = torch.where(inside, pos - start + offset, src)
        start, offset = start + n, offset + p
    out = joined.index_select(dim, src)
    dims = list(xs[0].dims)
    dims[dim] = fresh_dims(ctx, meta_val(node), out)[dim]
    return PT(out, dims)


@handles(aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int, aten.chunk.default)
def _split(node, args, kwargs, ctx):
    x = args[0]
    if node.target is aten.unbind.int:
        dim = (args[1] if len(args) > 1 else 0) % max(x.t.dim(), 1)
    else:
        dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % max(x.t.dim(), 1)
    if x.tainted(dim):
        if node.target is aten.unbind.int:
            raise Unsupported("unbind along a padded dim")
        return _split_padded(ctx, prefixed(ctx, x, [dim]), dim, meta_val(node))
    outs = node.target(*padded_args(args))
    res = []
    for o in outs:
        dims = list(x.dims)
        if node.target is aten.unbind.int:
            del dims[dim]
        else:
            dims[dim] = ((o.shape[dim], None),)
        res.append(PT(o, dims))
    return res


def _split_padded(ctx, x: PT, dim, vals):
    """Pieces along a padded dim (laid out with its valid values first): piece j starts where the valid values of the
    pieces before it end (a runtime position once one of them is symbolic) and holds its own valid values first."""
    import sympy

    res, start = [], sympy.Integer(0)
    for v in vals:
        n = v.shape[dim]
        n = n.node.expr if isinstance(n, torch.SymInt) else sympy.Integer(n)
        sz, at = ctx.size(n), ctx.size(start)
        p = sz.padded if isinstance(sz, Sz) else sz
        if isinstance(at, int) and at + p <= x.t.shape[dim]:
            out = x.t.narrow(dim, at, p)
        else:
            first = at.rt if isinstance(at, Sz) else at
            out = x.t.index_select(dim, (first + ctx.iota(p)).clamp(max=x.t.shape[dim] - 1))
        dims = list(x.dims)
        dims[dim] = ((p, sz if isinstance(sz, Sz) else None),)
        res.append(PT(out, dims))
        start = start + n
    return res
