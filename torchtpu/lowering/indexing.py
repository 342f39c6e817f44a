"""cat, index_select, gather/scatter, advanced indexing (index.Tensor, index_put), embedding."""

from __future__ import annotations

import torch

from .. import emit as E
from .. import executor as _X
from .. import jaxfn
from .. import metrics as _metrics
from ..tables import direct, inplace_lowering, lowering
from ..tables import out_meta as _meta
from .elementwise import floor_div_int
from .reduction import init_value


def _wrap(idx, size):
    """Negative indices count from the end, as on CPU."""
    idx = E.convert(idx, torch.int64)
    neg = E.compare(idx, E.const(idx.fn, 0, torch.int64, idx.shape), "LT")
    return E.select(neg, E.add(idx, E.const(idx.fn, size, torch.int64, idx.shape)), idx)


def checked(tr, idx, size, *, negative, exc=IndexError, message=None, dim=0):
    """idx as int64, checked on the device as CPU checks it: an index outside [-size, size) (negative=True: the
    op counts negative indices from the end, and they are wrapped here) or [0, size) fails the op (see
    Trace.check). XLA would clamp it instead and return a wrong row without a word."""
    idx = E.convert(idx, torch.int64)
    fn = idx.fn
    lo = E.const(fn, -size if negative else 0, torch.int64, idx.shape)
    hi = E.const(fn, size, torch.int64, idx.shape)
    bad = E.binary("or", E.compare(idx, lo, "LT"), E.compare(idx, hi, "GE"))
    tr.check(bad, idx, exc, message or f"index {{value}} is out of bounds for dimension {dim} with size {size}")
    return _wrap(idx, size) if negative else idx


@lowering("cat")
def cat(tr, tensors, dim=0):
    m = _meta(tr)
    parts = [E.convert(t, m.dtype) for t in tensors if not (t.rank == 1 and t.shape[0] == 0)]
    if not parts:
        return E.const(tr.fn, 0, m.dtype, m.shape)
    return E.concatenate(parts, dim % len(m.shape))


@lowering("index_select")
def index_select(tr, x, dim, index):
    dim = dim % max(x.rank, 1)
    if x.rank == 0:
        return x
    idx = checked(tr, E.reshape(index, (index.numel,)), x.shape[dim], negative=False, dim=dim)
    n = idx.shape[0]
    slice_sizes = [1 if d == dim else s for d, s in enumerate(x.shape)]
    offset_dims = [d for d in range(x.rank) if d != dim]
    out_shape = list(x.shape)
    out_shape[dim] = n
    # offset dims are the output dims other than `dim`; the batch (index) dim sits at `dim`.
    return E.gather(
        x,
        E.reshape(idx, (n, 1)),
        offset_dims=offset_dims,
        collapsed=[dim],
        start_index_map=[dim],
        index_vector_dim=1,
        slice_sizes=slice_sizes,
        out_shape=out_shape,
    )


def _full_indices(index, dim, rank):
    """For gather/scatter along dim: (numel, rank) int64 coordinates of every index element."""
    fn = index.fn
    cols = []
    for d in range(rank):
        c = index if d == dim else E.iota(fn, index.shape, d)
        cols.append(E.reshape(E.convert(c, torch.int64), (index.numel, 1)))
    return E.concatenate(cols, 1)


@lowering("gather")
def gather(tr, x, dim, index, sparse_grad=False):
    dim = dim % max(x.rank, 1)
    if index.numel == 0:
        return E.const(tr.fn, 0, x.dtype, index.shape)
    if x.rank == 0:
        return E.reshape(x, index.shape)
    coords = _full_indices(checked(tr, index, x.shape[dim], negative=False, exc=RuntimeError, dim=dim), dim, x.rank)
    g = E.gather(
        x,
        coords,
        offset_dims=[],
        collapsed=list(range(x.rank)),
        start_index_map=list(range(x.rank)),
        index_vector_dim=1,
        slice_sizes=[1] * x.rank,
        out_shape=(index.numel,),
    )
    return E.reshape(g, index.shape)


def _scatter(tr, x, dim, index, src, combiner):
    dim = dim % max(x.rank, 1)
    if index.numel == 0:
        return x
    if x.rank == 0:  # 0-d: the same update on a one-element vector
        s = E.reshape(src, (1,)) if isinstance(src, E.Value) else src
        return E.reshape(_scatter(tr, E.reshape(x, (1,)), 0, E.reshape(index, (1,)), s, combiner), ())
    if not isinstance(src, E.Value):
        src = E.const(x.fn, src, x.dtype, index.shape)
    elif src.shape != index.shape:
        src = E.slice_(src, [0] * src.rank, list(index.shape))
    coords = _full_indices(checked(tr, index, x.shape[dim], negative=False, exc=RuntimeError, dim=dim), dim, x.rank)
    return E.scatter(
        x,
        coords,
        E.reshape(E.convert(src, x.dtype), (index.numel,)),
        [],
        list(range(x.rank)),
        list(range(x.rank)),
        1,
        combiner,
    )


@lowering("scatter.src", "scatter.value")
def scatter(tr, x, dim, index, src):
    if not isinstance(src, E.Value):
        src = tr.scalar(src, x.dtype)
        src = E.broadcast_to(src, index.shape)
    return _scatter(tr, x, dim, index, src, None)


@lowering("scatter_add")
def scatter_add(tr, x, dim, index, src):
    return _scatter(tr, x, dim, index, src, "stablehlo.add")


def _advanced(tr, x, indices):
    """Normalizes x[indices] (indices: a list, None for a full slice, possibly shorter than x's dims) into the one
    layout gather and scatter share: x transposed so the k indexed dims come first. Returns (xt, perm, k, stacked
    indices (bshape + [k]), bshape, the remaining dims' sizes, p0): p0 is where torch puts the broadcast dims in
    x[indices], the first indexed dim when the indexed dims are adjacent and not leading; else None (they lead)."""
    indices = list(indices) + [None] * (x.rank - len(indices))
    pos = [d for d, i in enumerate(indices) if i is not None]
    rest = [d for d in range(x.rank) if d not in pos]
    perm = pos + rest
    xt = E.transpose(x, perm)
    idx = [checked(tr, indices[d], x.shape[d], negative=True, dim=d) for d in pos]
    bshape = E.broadcast_shapes(*[i.shape for i in idx])
    idx = [E.reshape(E.broadcast_to(i, bshape), list(bshape) + [1]) for i in idx]
    stacked = E.concatenate(idx, len(bshape))
    k = len(pos)
    adjacent = pos == list(range(pos[0], pos[0] + k))
    p0 = pos[0] if adjacent and pos[0] > 0 else None
    return xt, perm, k, stacked, list(bshape), list(xt.shape[k:]), p0


@lowering("index.Tensor")
def index(tr, x, indices):
    xt, perm, k, stacked, bshape, rest_sizes, p0 = _advanced(tr, x, indices)
    nb = len(bshape)
    g = E.gather(
        xt,
        stacked,
        offset_dims=list(range(nb, nb + len(rest_sizes))),
        collapsed=list(range(k)),
        start_index_map=list(range(k)),
        index_vector_dim=nb,
        slice_sizes=[1] * k + rest_sizes,
        out_shape=bshape + rest_sizes,
    )
    if p0 is not None:  # the broadcast dims go where the first indexed dim was
        order = list(range(nb, nb + p0)) + list(range(nb)) + list(range(nb + p0, nb + len(rest_sizes)))
        g = E.transpose(g, order)
    return g


FEW_WRITES = 8  # index writes of at most this many positions: dynamic_update_slice in place, not a scatter


def write_each(v, pos, ix, parts, accumulate=False):
    """(jax) v with parts[k] (v's rank, size 1 along the dims in pos) written (added, with accumulate) where dim
    pos[j] is ix[j][k], one dynamic_update_slice per k in order, so the last of duplicates wins, as on CPU. A
    scatter along an inner dim is no write in place on XLA:CPU: it moves the indexed dims first, a copy of the whole
    tensor there and one back, where a static KV cache's write in a decode step (one position along dim 2) needs
    neither. An index out of bounds writes nothing (the caller's device-side check raises)."""
    import jax.numpy as jnp
    from jax import lax

    zero = jnp.zeros((), jnp.int64)
    for k, part in enumerate(parts):
        at = [zero] * v.ndim
        inside = True
        for d, i in zip(pos, ix):
            at[d] = i[k]
            inside = inside & (i[k] >= 0) & (i[k] < v.shape[d])
        cur = lax.dynamic_slice(v, at, part.shape)
        v = lax.dynamic_update_slice(v, jnp.where(inside, cur + part if accumulate else part, cur), at)
    return v


def _few_writes(tr, x, indices, values, accumulate):
    """x[indices] = values (+= with accumulate) by write_each when at most FEW_WRITES positions are indexed, in x's
    own layout; None when a scatter serves better."""
    indices = list(indices) + [None] * (x.rank - len(indices))
    pos = [d for d, i in enumerate(indices) if i is not None]
    if not pos or x.rank == 0:
        return None
    bshape = list(E.broadcast_shapes(*[indices[d].shape for d in pos]))
    n = 1
    for b in bshape:
        n *= b
    if n == 0 or n > FEW_WRITES:
        return None
    idx = [checked(tr, indices[d], x.shape[d], negative=True, dim=d) for d in pos]
    rest_sizes = [x.shape[d] for d in range(x.rank) if d not in pos]
    p0 = pos[0] if pos == list(range(pos[0], pos[0] + len(pos))) and pos[0] > 0 else None
    res_shape = rest_sizes[:p0] + bshape + rest_sizes[p0:] if p0 is not None else bshape + rest_sizes
    part_shape = [1 if d in pos else x.shape[d] for d in range(x.rank)]

    def f(v, vals, *ix):
        import jax.numpy as jnp

        vals = jnp.broadcast_to(vals, res_shape)
        if p0 is not None:  # torch puts the indexed positions where the first indexed dim was: bring them first
            nb = len(bshape)
            vals = jnp.transpose(vals, list(range(p0, p0 + nb)) + list(range(p0)) + list(range(p0 + nb, vals.ndim)))
        vals = vals.reshape([n] + rest_sizes)
        ix = [jnp.broadcast_to(i, bshape).reshape(n) for i in ix]
        return write_each(v, pos, ix, [vals[k].reshape(part_shape) for k in range(n)], accumulate)

    return jaxfn.call(tr, "index_put_few", f, [x, E.convert(values, x.dtype)] + idx, (tuple(pos), bool(accumulate)))[0]


@lowering("index_put")
def index_put(tr, x, indices, values, accumulate=False):
    few = _few_writes(tr, x, indices, values, accumulate)
    if few is not None:
        return few
    xt, perm, k, stacked, bshape, rest_sizes, p0 = _advanced(tr, x, indices)
    nb = len(bshape)
    vals = E.convert(values, x.dtype)
    # values are given in the result layout of x[indices]; bring them to (bshape + rest).
    if p0 is not None:
        full = rest_sizes[:p0] + bshape + rest_sizes[p0:]
        vals = E.broadcast_to(vals, full)
        order = list(range(p0, p0 + nb)) + list(range(p0)) + list(range(p0 + nb, len(full)))
        vals = E.transpose(vals, order)
    else:
        vals = E.broadcast_to(vals, bshape + rest_sizes)
    out = E.scatter(
        xt,
        stacked,
        vals,
        update_window_dims=list(range(nb, nb + len(rest_sizes))),
        inserted_window_dims=list(range(k)),
        scatter_dims_to_operand_dims=list(range(k)),
        index_vector_dim=nb,
        combiner="stablehlo.add" if accumulate else None,
    )
    inv = [perm.index(d) for d in range(x.rank)]
    return E.transpose(out, inv)


@lowering("embedding")
def embedding(tr, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    flat = E.reshape(indices, (indices.numel,))
    rows = index_select(tr, weight, 0, flat)
    return E.reshape(rows, list(indices.shape) + [weight.shape[1]])


@lowering("embedding_dense_backward")
def embedding_dense_backward(tr, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    d = grad.shape[-1]
    n = indices.numel
    idx = checked(
        tr,
        E.reshape(indices, (n,)),
        num_weights,
        negative=False,
        message=f"index {{value}} is out of range for an embedding of {num_weights} rows",
    )
    g = E.reshape(grad, (n, d))
    if scale_grad_by_freq:  # each row's gradient divided by how often its index occurs in the batch
        counts = E.scatter(
            E.const(tr.fn, 0, torch.int64, (num_weights,)),
            E.reshape(idx, (n, 1)),
            E.const(tr.fn, 1, torch.int64, (n,)),
            [],
            [0],
            [0],
            1,
            "stablehlo.add",
        )
        freq = E.gather(
            counts,
            E.reshape(idx, (n, 1)),
            offset_dims=[],
            collapsed=[0],
            start_index_map=[0],
            index_vector_dim=1,
            slice_sizes=[1],
            out_shape=(n,),
        )
        g = E.div(g, E.broadcast_in_dim(E.convert(freq, g.dtype), (n, d), [0]))
    if padding_idx is not None and padding_idx >= 0:
        keep = E.compare(idx, E.const(tr.fn, padding_idx, torch.int64, (n,)), "NE")
        g = E.select(E.broadcast_in_dim(keep, (n, d), [0]), g, E.const(tr.fn, 0, g.dtype, (n, d)))
    acc = E.acc_dtype(g.dtype)
    zeros = E.const(tr.fn, 0, acc, (num_weights, d))
    out = E.scatter(zeros, E.reshape(idx, (n, 1)), E.convert(g, acc), [1], [0], [0], 1, "stablehlo.add")
    return E.convert(out, grad.dtype)


# -- data-dependent output shapes: the host learns the size (a counted host sync) -------------------
# (nonzero and masked_select, whose results are bucketed rows: shapes/data_dependent.py)


@direct("bincount")
def bincount(self, weights=None, minlength=0):
    """Counts (or weight sums) of each value of a 1-d non-negative integer tensor. The length, max(x) + 1,
    is learned by one counted host sync (it reads min and max together); the counting is an index_add."""
    _metrics.inc("op.bincount")
    if self.dim() != 1 or self.dtype.is_floating_point or self.dtype.is_complex or self.dtype == torch.bool:
        raise RuntimeError(
            f"bincount only supports 1-d non-negative integral inputs (got {self.dtype}"
            f"{list(self.shape)} on {self.device})."
        )
    if minlength < 0:
        raise RuntimeError(f"bincount: minlength should be >= 0, got {minlength}")
    if weights is not None and (weights.dim() != 1 or weights.shape[0] != self.shape[0]):
        raise RuntimeError(
            f"bincount: weights should be 1-d and have the same length as input (input "
            f"{list(self.shape)}, weights {list(weights.shape)})"
        )
    dtype = torch.int64 if weights is None else torch.float32 if weights.dtype == torch.float32 else torch.float64
    n = minlength
    if self.numel():
        lo, hi = _X.read_host(torch.stack([self.min(), self.max()]).to(torch.int64), "bincount").tolist()
        if lo < 0:
            raise RuntimeError(f"bincount only supports 1-d non-negative integral inputs (min value {lo}).")
        n = max(hi + 1, minlength)
    out = torch.zeros(n, dtype=dtype, device=self.device)
    if not self.numel():
        return out
    src = torch.ones(self.shape, dtype=dtype, device=self.device) if weights is None else weights.to(dtype)
    return out.index_add_(0, self.to(torch.int64), src)


@direct("repeat_interleave.Tensor")
def repeat_interleave(repeats, output_size=None):
    """Index i repeated repeats[i] times. The length, sum(repeats), costs one counted host sync unless
    output_size is given; the indices come from a searchsorted over the running sum, on the device."""
    _metrics.inc("op.repeat_interleave")
    if repeats.dim() != 1 or repeats.dtype.is_floating_point or repeats.dtype == torch.bool:
        raise RuntimeError(
            f"repeat_interleave: repeats must be a 1-d integer tensor, got {repeats.dtype}"
            f"{list(repeats.shape)} on {repeats.device}"
        )
    if output_size is None:
        lo, total = (
            _X.read_host(torch.stack([repeats.min(), repeats.sum()]).to(torch.int64), "repeat_interleave").tolist()
            if repeats.numel()
            else (0, 0)
        )
        if lo < 0:
            raise RuntimeError("repeat_interleave: repeats can not be negative")
        output_size = total
    ends = repeats.to(torch.int64).cumsum(0)
    pos = torch.arange(output_size, dtype=torch.int64, device=repeats.device)
    return torch.searchsorted(ends, pos, right=True).to(repeats.dtype)


# (boolean-mask indices become long indices in shapes/data_dependent.py: nonzero's bucketed rows)


@inplace_lowering("_index_put_impl_")
def index_put_impl_(tr, x, indices, values, accumulate=False, unsafe=False):
    return index_put(tr, x, indices, values, accumulate)


@lowering("flip")
def flip(tr, x, dims):
    if x.rank == 0 or not dims:
        return x
    d = sorted({int(k) % x.rank for k in dims})
    return x.fn.op("stablehlo.reverse", [x], x.shape, x.dtype, f"dimensions = array<i64: {', '.join(map(str, d))}>")


@lowering("roll")
def roll(tr, x, shifts, dims=()):
    if not dims:  # roll the flattened tensor
        flat = E.reshape(x, (x.numel,))
        return E.reshape(roll(tr, flat, shifts, [0]), x.shape)
    for s, d in zip(shifts, dims):
        d = d % x.rank
        n = x.shape[d]
        if n == 0:
            continue
        s = s % n
        if s:
            x = E.concatenate([E.slice_dim(x, d, n - s, n), E.slice_dim(x, d, 0, n - s)], d)
    return x


SCATTER_COMBINE = {"sum": "add", "prod": "multiply", "amax": "maximum", "amin": "minimum", "mean": "add"}


@lowering("scatter_reduce.two")
def scatter_reduce(tr, x, dim, index, src, reduce, include_self=True):

    dim = dim % max(x.rank, 1)
    if index.numel == 0:
        return x
    if x.rank == 0:
        x1 = E.reshape(x, (1,))
        return E.reshape(
            scatter_reduce(tr, x1, 0, E.reshape(index, (1,)), E.reshape(src, (1,)), reduce, include_self), ()
        )
    kind = SCATTER_COMBINE[reduce]
    coords = _full_indices(checked(tr, index, x.shape[dim], negative=False, exc=RuntimeError, dim=dim), dim, x.rank)
    n = index.numel
    src_v = E.convert(src, x.dtype)
    if src_v.shape != index.shape:
        src_v = E.slice_(src_v, [0] * src_v.rank, list(index.shape))
    src_v = E.reshape(src_v, (n,))

    def scat(base, upd, comb):
        return E.scatter(base, coords, upd, [], list(range(x.rank)), list(range(x.rank)), 1, comb)

    if x.dtype == torch.bool:  # sums and maxima of booleans are "or", products and minima "and"
        kind = {"add": "or", "multiply": "and", "maximum": "or", "minimum": "and"}[kind]
    ident = init_value(x.fn, kind, x.dtype)
    touched = scat(E.const(x.fn, False, torch.bool, x.shape), E.const(x.fn, True, torch.bool, (n,)), None)
    base = x if include_self else E.select(touched, E.broadcast_to(ident, x.shape), x)
    out = scat(base, src_v, f"stablehlo.{kind}")
    if reduce == "mean":
        ct = torch.int64
        cnt = scat(E.const(x.fn, 1 if include_self else 0, ct, x.shape), E.const(x.fn, 1, ct, (n,)), "stablehlo.add")
        cnt = E.select(touched, cnt, E.const(x.fn, 1, ct, x.shape))
        cntv = E.convert(cnt, x.dtype)
        if x.dtype.is_floating_point:
            out = E.div(out, cntv)
        else:
            out = floor_div_int(out, cntv)
    return out


@direct("_unique2")
def unique2(self, sorted=True, return_inverse=False, return_counts=False):
    """torch.unique on the device: sort, mark run starts, learn the count (one counted host sync), then
    place values / inverse / counts with scatters. Output is sorted, as on CPU."""
    _metrics.inc("op._unique2")
    flat = self.reshape(-1)
    n = flat.numel()
    if n == 0:
        empty = self.new_empty((0,))
        return (
            empty,
            torch.zeros(self.shape, dtype=torch.int64, device=self.device),
            torch.zeros(0, dtype=torch.int64, device=self.device),
        )
    s, perm = torch.sort(flat, stable=True)
    starts = torch.ones(n, dtype=torch.bool, device=self.device)
    if n > 1:
        starts[1:] = s[1:] != s[:-1]
    pos = torch.cumsum(starts.to(torch.int64), 0) - 1  # run number of each sorted element
    k = int(_X.read_host(pos[-1:], "unique").item()) + 1
    slot = torch.where(starts, pos, torch.full_like(pos, k))  # non-starts go to a spare slot, dropped below
    values = torch.zeros(k + 1, dtype=self.dtype, device=self.device).scatter(0, slot, s)[:k]
    inverse = torch.empty(0, dtype=torch.int64, device=self.device)
    counts = torch.empty(0, dtype=torch.int64, device=self.device)
    if return_inverse:
        inverse = torch.zeros(n, dtype=torch.int64, device=self.device).scatter(0, perm, pos).reshape(self.shape)
    if return_counts:
        counts = torch.zeros(k, dtype=torch.int64, device=self.device).scatter_add(0, pos, torch.ones_like(pos))
    return values, inverse, counts


@lowering("scatter.reduce", "scatter.value_reduce")
def scatter_legacy_reduce(tr, x, dim, index, src, reduce):
    """scatter(..., reduce='add'|'multiply'): the self-including scatter with that combiner."""
    if not isinstance(src, E.Value):
        src = E.broadcast_to(tr.scalar(src, x.dtype), index.shape)
    return _scatter(tr, x, dim, index, src, {"add": "stablehlo.add", "multiply": "stablehlo.multiply"}[reduce])


@lowering("masked_scatter")
def masked_scatter(tr, x, mask, source):
    """Mask positions take source's elements in order: the k-th true element takes source.flatten()[k]."""

    if mask.dtype != torch.bool:
        raise RuntimeError(f"masked_scatter_ only supports boolean masks, but got mask with dtype {mask.dtype}")
    out = _meta(tr)
    m = E.broadcast_to(mask, tuple(out.shape))
    if out.numel() == 0:
        return E.broadcast_to(x, tuple(out.shape))
    count = E.reduce(
        E.convert(E.reshape(m, (m.numel,)), torch.int64), E.const(tr.fn, 0, torch.int64), [0], "stablehlo.add"
    )
    tr.check(
        E.compare(count, E.const(tr.fn, source.numel, torch.int64), "GT"),
        count,
        RuntimeError,
        f"masked_scatter: expected source to have at least as many elements as ones in mask ({{value}}), "
        f"got {source.numel}",
    )
    if source.numel == 0:
        return E.broadcast_to(x, tuple(out.shape))

    def f(xv, mv, src):
        import jax.numpy as jnp

        flat = mv.reshape(-1)
        k = jnp.clip(jnp.cumsum(flat.astype(jnp.int64)) - 1, 0, src.size - 1)
        return jnp.where(flat, src.reshape(-1)[k], xv.reshape(-1)).reshape(xv.shape)

    return jaxfn.call(
        tr,
        "masked_scatter",
        f,
        [E.broadcast_to(E.convert(x, out.dtype), tuple(out.shape)), m, E.convert(source, out.dtype)],
    )[0]


@lowering("index_add")
def index_add(tr, x, dim, index, source, alpha=1):
    """x with source's slices added at index along dim (duplicates accumulate)."""

    if index.numel == 0:
        return x
    if x.rank == 0:
        return E.reshape(
            index_add(tr, E.reshape(x, (1,)), 0, E.reshape(index, (1,)), E.reshape(source, (1,)), alpha), ()
        )
    dim = dim % x.rank
    size = x.shape[dim]
    src_shape = source.shape if source.rank else (1,)
    if (
        len(src_shape) != x.rank
        or any(a != b for d, (a, b) in enumerate(zip(src_shape, x.shape)) if d != dim)
        or src_shape[dim] != index.numel
    ):
        raise RuntimeError(
            "source tensor shape must match self tensor shape, excluding the specified dimension. "
            f"Got self.shape = {list(x.shape)} source.shape = {list(source.shape)}, and index has "
            f"{index.numel} elements along dimension {dim}"
        )
    src = E.convert(source if source.rank else E.reshape(source, (1,)), x.dtype)
    index = checked(tr, index, size, negative=False, exc=RuntimeError, dim=dim)

    def f(xv, idx, s, a):
        import jax.numpy as jnp

        idx = jnp.where(idx < 0, idx + size, idx).reshape(-1)
        upd = s & a if xv.dtype == jnp.bool_ else s * a
        at = xv.at[(slice(None),) * dim + (idx,)]
        return at.max(upd) if xv.dtype == jnp.bool_ else at.add(upd)  # bool: logical or

    return jaxfn.call(tr, "index_add", f, [x, index, src, tr.scalar(alpha, x.dtype)], (dim,))[0]


@lowering("sgn")
def sgn(tr, x):
    return E.unary("sign", x) if x.dtype != torch.bool else x


@direct("_unique")
def unique_legacy(self, sorted=True, return_inverse=False):
    values, inverse, _ = unique2(self, sorted, return_inverse, False)
    return values, inverse


def _unique_runs(rows, perm, dev):
    """rows (n, m) in final order -> (first index of each run, run number per row, run count k)."""
    n = rows.shape[0]
    starts = torch.ones(n, dtype=torch.bool, device=dev)
    if n > 1:
        starts[1:] = (rows[1:] != rows[:-1]).any(1)
    pos = torch.cumsum(starts.to(torch.int64), 0) - 1
    k = int(_X.read_host(pos[-1:], "unique").item()) + 1
    return torch.nonzero_static(starts, size=k).reshape(-1), pos, k


def _unique_slices(self, dim, sort, return_inverse, return_counts):
    """Unique slices along dim (flattened elements when dim is None): sorted lexicographically on the device
    (a stable sort per column, last column first) or, for unique_consecutive, in place; the run count is
    learned by one counted host sync."""
    import math

    dev = self.device
    if dim is None:
        x, d = self.reshape(-1), 0
    else:
        d = dim % max(self.dim(), 1)
        x = self.movedim(d, 0) if self.dim() else self.reshape(1)
    n = x.shape[0]
    rows = x.reshape(n, math.prod(x.shape[1:]))
    if n == 0:
        empty = torch.zeros(0, dtype=torch.int64, device=dev)
        return (
            (x if dim is None else x.movedim(0, d)),
            torch.zeros(self.shape if dim is None else (0,), dtype=torch.int64, device=dev),
            empty,
        )
    perm = torch.arange(n, device=dev)
    if sort:
        for c in reversed(range(rows.shape[1])):
            _, order = torch.sort(rows.index_select(0, perm)[:, c], stable=True)
            perm = perm.index_select(0, order)
    srt = rows.index_select(0, perm) if sort else rows
    first, pos, k = _unique_runs(srt, perm, dev)
    values = srt.index_select(0, first).reshape((k,) + tuple(x.shape[1:]))
    values = values if dim is None else values.movedim(0, d)
    inverse = torch.zeros(n, dtype=torch.int64, device=dev).scatter(0, perm, pos)
    inverse = inverse.reshape(self.shape) if dim is None else inverse
    counts = torch.zeros(k, dtype=torch.int64, device=dev).scatter_add(0, pos, torch.ones_like(pos))
    return values, inverse, counts


@direct("unique_dim")
def unique_dim(self, dim, sorted=True, return_inverse=False, return_counts=False):
    _metrics.inc("op.unique_dim")
    return _unique_slices(self, dim, True, return_inverse, return_counts)


@direct("unique_consecutive")
def unique_consecutive(self, return_inverse=False, return_counts=False, dim=None):
    _metrics.inc("op.unique_consecutive")
    return _unique_slices(self, dim, False, return_inverse, return_counts)
