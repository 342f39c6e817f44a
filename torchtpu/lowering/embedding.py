"""embedding_bag (sum / mean / max, per-sample weights, padding_idx) with its gradients, and embedding_renorm_.

The bag of every index position comes from the offsets by a sorted search, so nothing waits on the host.
The auxiliary outputs (offset2bag, bag_size, max_indices) are what CPU returns, since the backward ops read
them: bag_size counts non-padding indices (zeros in sum mode, as CPU's sum path leaves it), max_indices holds
the weight row of the first maximum of each bag and column (0 for an empty bag).
"""

from __future__ import annotations

from .. import emit as E
from .. import jaxfn
from ..tables import inplace_lowering, lowering, out_meta
from .indexing import checked

SUM, MEAN, MAX = 0, 1, 2


def _offset2bag(jnp, offsets, n, num_bags):
    pos = jnp.arange(n, dtype=offsets.dtype)
    return (jnp.searchsorted(offsets[:num_bags], pos, side="right") - 1).astype(jnp.int64)


@lowering("_embedding_bag", "_embedding_bag_forward_only")
def embedding_bag(
    tr,
    weight,
    indices,
    offsets,
    scale_grad_by_freq=False,
    mode=SUM,
    sparse=False,
    per_sample_weights=None,
    include_last_offset=False,
    padding_idx=-1,
):
    out, _, _, maxi = (out_meta(tr, i) for i in range(4))
    num_bags, n = out.shape[0], indices.numel
    has_psw = per_sample_weights is not None
    acc = E.acc_dtype(weight.dtype)

    def f(w, idx, offs, *psw):
        import jax.numpy as jnp

        idx = idx.astype(jnp.int64)
        o2b = _offset2bag(jnp, offs.astype(jnp.int64), n, num_bags)
        keep = idx != padding_idx if padding_idx >= 0 else jnp.ones((n,), bool)
        rows = w[idx]
        if psw:
            rows = rows * psw[0][:, None]
        cnt = jnp.zeros((num_bags,), jnp.int64).at[o2b].add(keep.astype(jnp.int64))
        d = w.shape[1]
        if mode == MAX:
            masked = jnp.where(keep[:, None], rows, -jnp.inf)
            best = jnp.full((num_bags, d), -jnp.inf, w.dtype).at[o2b].max(masked)
            first = (masked == best[o2b]) & keep[:, None]
            where_pos = jnp.where(first, jnp.arange(n)[:, None], n)
            pos = jnp.full((num_bags, d), n, jnp.int64).at[o2b].min(where_pos)
            idx_ext = jnp.concatenate([idx, jnp.zeros((1,), jnp.int64)])
            res = jnp.where(cnt[:, None] > 0, best, 0)
            return res, o2b, cnt, idx_ext[pos]
        total = jnp.zeros((num_bags, d), w.dtype).at[o2b].add(jnp.where(keep[:, None], rows, 0))
        if mode == MEAN:
            total = jnp.where(cnt[:, None] > 0, total / jnp.maximum(cnt, 1)[:, None].astype(w.dtype), 0)
            return total, o2b, cnt, cnt
        return total, o2b, jnp.zeros_like(cnt), jnp.zeros_like(cnt)

    if n:
        rows = weight.shape[0]
        indices = checked(
            tr,
            E.reshape(indices, (n,)),
            rows,
            negative=False,
            exc=RuntimeError,
            message=f"an index takes value {{value}}, which is not in the valid range [0, {rows})",
        )
    args = [E.convert(weight, acc), indices, offsets] + ([E.convert(per_sample_weights, acc)] if has_psw else [])
    res, o2b, cnt, mi = jaxfn.call(tr, "embedding_bag", f, args, (mode, padding_idx, num_bags, has_psw))
    mi = mi if tuple(maxi.shape) == tuple(mi.shape) else E.const(tr.fn, 0, maxi.dtype, maxi.shape)
    size = out_meta(tr, 2).shape[0]
    if size > num_bags:  # the meta kernel sizes bag_size by the offsets (include_last_offset): zero tail
        cnt = E.concatenate([cnt, E.const(tr.fn, 0, cnt.dtype, (size - num_bags,))], 0)
    return E.convert(res, out.dtype), o2b, cnt, mi


@lowering("_embedding_bag_dense_backward")
def embedding_bag_dense_backward(
    tr,
    grad,
    indices,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    per_sample_weights=None,
    padding_idx=-1,
):
    has_psw = per_sample_weights is not None
    acc = E.acc_dtype(grad.dtype)

    def f(g, idx, o2b, bsize, maxi, *psw):
        import jax.numpy as jnp

        idx = idx.astype(jnp.int64)
        d = g.shape[1]
        if mode == MAX:
            cols = jnp.broadcast_to(jnp.arange(d), maxi.shape)
            upd = jnp.where(bsize[: g.shape[0], None] > 0, g, 0)  # bag_size may carry a zero tail
            return jnp.zeros((num_weights, d), g.dtype).at[maxi, cols].add(upd)
        rows = g[o2b]
        if mode == MEAN:
            rows = rows / jnp.maximum(bsize[o2b], 1)[:, None].astype(g.dtype)
        if psw:
            rows = rows * psw[0][:, None]
        if scale_grad_by_freq:
            freq = jnp.zeros((num_weights,), g.dtype).at[idx].add(1)
            rows = rows / freq[idx][:, None]
        if padding_idx >= 0:
            rows = jnp.where((idx != padding_idx)[:, None], rows, 0)
        return jnp.zeros((num_weights, d), g.dtype).at[idx].add(rows)

    args = [E.convert(grad, acc), indices, offset2bag, bag_size, maximum_indices]
    args += [E.convert(per_sample_weights, acc)] if has_psw else []
    static = (mode, padding_idx, num_weights, bool(scale_grad_by_freq), has_psw)
    return E.convert(jaxfn.call(tr, "embedding_bag_bwd", f, args, static)[0], out_meta(tr).dtype)


@lowering("_embedding_bag_backward")
def embedding_bag_backward(
    tr,
    grad,
    indices,
    offsets,
    offset2bag,
    bag_size,
    maximum_indices,
    num_weights,
    scale_grad_by_freq,
    mode,
    sparse,
    per_sample_weights=None,
    padding_idx=-1,
):
    if sparse:
        raise NotImplementedError("embedding_bag(sparse=True): sparse gradients are not supported on tpu")
    return embedding_bag_dense_backward(
        tr,
        grad,
        indices,
        offset2bag,
        bag_size,
        maximum_indices,
        num_weights,
        scale_grad_by_freq,
        mode,
        per_sample_weights,
        padding_idx,
    )


@lowering("_embedding_bag_per_sample_weights_backward")
def embedding_bag_psw_backward(tr, grad, weight, indices, offsets, offset2bag, mode, padding_idx=-1):
    acc = E.acc_dtype(grad.dtype)

    def f(g, w, idx, o2b):
        import jax.numpy as jnp

        idx = idx.astype(jnp.int64)
        r = jnp.sum(g[o2b] * w[idx], -1)
        return jnp.where(idx != padding_idx, r, 0) if padding_idx >= 0 else r

    args = [E.convert(grad, acc), E.convert(weight, acc), indices, offset2bag]
    return E.convert(jaxfn.call(tr, "embedding_bag_psw_bwd", f, args, (padding_idx,))[0], out_meta(tr).dtype)


@inplace_lowering("embedding_renorm_")
def embedding_renorm_(tr, weight, indices, max_norm, norm_type):
    """Rows named by indices whose norm exceeds max_norm are scaled to max_norm (each row once)."""
    acc = E.acc_dtype(weight.dtype)

    def f(w, idx):
        import jax.numpy as jnp

        used = jnp.zeros((w.shape[0],), bool).at[idx.reshape(-1).astype(jnp.int64)].set(True)
        norm = jnp.linalg.norm(w, ord=norm_type, axis=1)
        scale = jnp.where(used & (norm > max_norm), max_norm / (norm + 1e-7), 1)
        return w * scale[:, None].astype(w.dtype)

    res = jaxfn.call(tr, "embedding_renorm", f, [E.convert(weight, acc), indices], (max_norm, norm_type))[0]
    return E.convert(res, weight.dtype)
