"""Padded rules of per-sample and spatial ops: group norm, grid sampling, convolutions and pools (windows must not
read padding into valid outputs), batch norm (statistics over the valid samples) and scaled dot-product attention
(padded keys masked).
"""

from __future__ import annotations

import math

import torch

from .interp import HANDLERS, Rt, arg_or, flat_args, handles, meta_val, padded_args, rt_of
from .padded import PT, Sz, Unsupported, dim_mask, fill_padding, fresh_dims, plain, same_factors
from .rules_reduce import count_of

aten = torch.ops.aten


# -- per-sample ops (a padded batch dim only) ----------------------------------------------------------------------
def _batch_only(node, tensors):
    for x in tensors:
        if any(x.tainted(d) for d in range(1, x.t.dim())):
            raise Unsupported(f"{node.target} with a padded dim other than the batch dim")


def _per_sample(node, args, kwargs, ctx):
    """An op that computes each sample (dim 0) on its own (pooling, upsampling, their input gradients): the padded
    samples stay in the padding."""
    x = args[0]
    _batch_only(node, [a for a in flat_args(args, kwargs) if isinstance(a, PT)])
    out = node.target(*padded_args(args), **padded_args(kwargs))
    outs = out if isinstance(out, (tuple, list)) else [out]
    res = [
        PT(o, [x.dims[0]] + [((s, None),) for s in o.shape[1:]]) if o.dim() and o.shape[0] == x.t.shape[0] else plain(o)
        for o in outs
    ]
    return tuple(res) if isinstance(out, (tuple, list)) else res[0]


def _per_plane(node, args, kwargs, ctx, lead=None):
    """An op that computes each plane (the dims before its spatial ones: batch and channels) on its own, over spatial
    dims without padding (pooling, upsampling, padding, their input gradients): padded samples and channels stay
    padding, so each tensor argument's planes must be laid out as the input's."""
    x, name = args[0], str(node.target)
    lead = x.t.dim() - (1 if "1d" in name else 3 if "3d" in name else 2) if lead is None else lead
    for a in flat_args(args, kwargs):
        if not isinstance(a, PT):
            continue
        if any(a.tainted(d) for d in range(lead, a.t.dim())):
            raise Unsupported(f"{node.target} over a padded spatial dim")
        if a.t.dim() != x.t.dim() or not all(same_factors(a.dims[d], x.dims[d]) for d in range(lead)):
            raise Unsupported(f"{node.target} with arguments whose planes are padded differently")
    out = node.target(*padded_args(args), **padded_args(kwargs))
    outs = out if isinstance(out, (tuple, list)) else [out]
    res = []
    for o in outs:
        if not isinstance(o, torch.Tensor):
            res.append(o)
        elif o.dim() == x.t.dim() and tuple(o.shape[:lead]) == tuple(x.t.shape[:lead]):
            res.append(PT(o, list(x.dims[:lead]) + [((s, None),) for s in o.shape[lead:]]))
        elif any(x.tainted(d) for d in range(lead)):  # an output laid out otherwise: its padding is unknown
            raise Unsupported(f"{node.target}: an output that is not per plane")
        else:
            res.append(plain(o))
    return tuple(res) if isinstance(out, (tuple, list)) else res[0]


@handles(aten.native_group_norm.default)
def _group_norm(node, args, kwargs, ctx):
    """Each sample's group statistics on their own: over a padded batch (a partial last batch) only."""
    x = args[0]
    _batch_only(node, [a for a in flat_args(args, kwargs) if isinstance(a, PT)])
    out, mean, rstd = node.target(*padded_args(args), **padded_args(kwargs))
    return (
        PT(out, x.dims),
        PT(mean, [x.dims[0], ((mean.shape[1], None),)]),
        PT(rstd, [x.dims[0], ((rstd.shape[1], None),)]),
    )


def _grid_args(node, x, grid):
    if any(x.tainted(d) for d in range(2, x.t.dim())):
        raise Unsupported(f"{node.target} of an input of a padded size (the grid's coordinates are relative to it)")
    if grid.tainted(grid.t.dim() - 1) or not same_factors(x.dims[0], grid.dims[0]):
        raise Unsupported(f"{node.target}: input and grid padded differently")


@handles(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def _grid_sampler(node, args, kwargs, ctx):
    """Each output position samples on its own: samples, channels and output positions may be padded (the output
    is [N, C] of the input, then the grid's positions)."""
    x, grid = args[0], args[1]
    _grid_args(node, x, grid)
    out = node.target(x.t, grid.t, *args[2:], **kwargs)
    return PT(out, [x.dims[0], x.dims[1]] + list(grid.dims[1:-1]))


@handles(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def _grid_sampler_backward(node, args, kwargs, ctx):
    """The padding of the output gradient, the input and the grid read as zeros: the grid's gradient sums over
    channels and the input's over output positions."""
    go, x, grid = args[0], args[1], args[2]
    _grid_args(node, x, grid)
    gi, gg = node.target(
        fill_padding(ctx, go, 0), fill_padding(ctx, x, 0), fill_padding(ctx, grid, 0), *args[3:], **kwargs
    )
    return (PT(gi, x.dims) if gi is not None else None, PT(gg, grid.dims) if gg is not None else None)


def _replication_pad_backward(node, args, kwargs, ctx):
    """Over a padded spatial dim: each output gradient position adds into the input position it copied (its
    position less the left pad, clamped to the true size), one spatial dim at a time; the output gradient's
    padding adds into one extra position, dropped."""
    go, x, pad = args[0], args[1], list(args[2])
    k = len(pad) // 2
    lead = x.t.dim() - k
    if not any(x.tainted(d) or go.tainted(d) for d in range(lead, x.t.dim())):
        return _per_plane(node, args, kwargs, ctx, lead)
    if any(isinstance(p, Sz) or p < 0 for p in pad):
        raise Unsupported(f"{node.target} by a symbolic or negative amount")
    if go.t.dim() != x.t.dim() or not all(same_factors(go.dims[d], x.dims[d]) for d in range(lead)):
        raise Unsupported(f"{node.target} with arguments whose planes are padded differently")
    g = go.t
    for j in range(k):
        d = x.t.dim() - 1 - j
        left, right = pad[2 * j], pad[2 * j + 1]
        if len(x.dims[d]) != 1 or len(go.dims[d]) != 1:
            raise Unsupported(f"{node.target} over a merged padded dim")
        n_in = x.t.shape[d]
        valid = x.dims[d][0][1].rt if x.dims[d][0][1] is not None else n_in
        pos = ctx.iota(g.shape[d])
        idx = torch.minimum((pos - left).clamp(min=0), torch.as_tensor(valid, device=pos.device) - 1)
        idx = torch.where(pos < valid + left + right, idx, n_in)
        shape = list(g.shape)
        shape[d] = n_in + 1
        g = g.new_zeros(shape).index_add(d, idx, g).narrow(d, 0, n_in)
    return PT(g, x.dims)


_PER_PLANE = (
    [
        "_adaptive_avg_pool2d",
        "_adaptive_avg_pool2d_backward",
        "_adaptive_avg_pool3d",
        "_adaptive_avg_pool3d_backward",
        "upsample_nearest2d",
        "upsample_bilinear2d",
        "_low_memory_max_pool2d_with_offsets",
        "max_unpool2d",
    ]
    + [f"reflection_pad{n}d{b}" for n in (1, 2, 3) for b in ("", "_backward")]
    + [f"replication_pad{n}d" for n in (1, 2, 3)]
)
_PER_SAMPLE = ["_low_memory_max_pool2d_offsets_to_indices", "im2col", "col2im", "pixel_shuffle", "pixel_unshuffle"]
for _names, _fn in (
    (_PER_PLANE, _per_plane),
    (_PER_SAMPLE, _per_sample),
    ([f"replication_pad{n}d_backward" for n in (1, 2, 3)], _replication_pad_backward),
):
    for _name in _names:
        _pk = getattr(aten, _name, None)
        if _pk is not None:
            HANDLERS[_pk] = _fn


def _spatial(node, x: PT, lead=2, channels=True):
    """The padded dims of x past its batch and channel dims (dims lead..; each a single factor: a merged dim padded
    inside puts padding inside a window); a convolution's channel dim (lead - 1, contracted) must hold no padding."""
    if channels and x.tainted(lead - 1):
        raise Unsupported(f"{node.target} with a padded channel dim")
    dims = [d for d in range(lead, x.t.dim()) if x.tainted(d)]
    if any(len(x.dims[d]) != 1 for d in dims):
        raise Unsupported(f"{node.target} over a merged spatial dim padded inside")
    return dims


def _out_dims(ctx, x: PT, out, val, lead=2):
    """A windowed op's result: the dims before the spatial ones as the input's, the rest from the op's symbolic
    sizes (valid first)."""
    dims = fresh_dims(ctx, val, out)
    for s_, f in zip(val.shape, dims):
        if isinstance(s_, torch.SymInt) and f[0][1] is not None and f[0][1].padded != f[0][0]:
            raise Unsupported(f"{val.shape} at the buckets is {tuple(out.shape)} on padded inputs")
    return PT(out, list(x.dims[: lead - 1]) + dims[lead - 1 :])


@handles(aten.convolution.default)
def _convolution(node, args, kwargs, ctx):
    """A convolution (also transposed) over padded spatial dims: the input's padding is zeroed, so a valid output
    reads zeros past the true end as the op's own zero padding, and valid outputs come first."""
    x, w = args[0], args[1]
    if w.any_tainted or (isinstance(args[2], PT) and args[2].any_tainted):
        raise Unsupported("convolution with a padded weight")
    sp = _spatial(node, x)
    out = node.target(fill_padding(ctx, x, 0, sp) if sp else x.t, *padded_args(args[1:]))
    return _out_dims(ctx, x, out, meta_val(node))


@handles(aten.convolution_backward.default)
def _convolution_backward(node, args, kwargs, ctx):
    """The gradients with the output gradient's and the input's padding zeroed: a padded output (one that does not
    exist at the exact size, though its window may cover valid inputs) adds 0 to every input and weight gradient,
    and the weight and bias gradients sum over valid positions and samples only."""
    go, x, w = args[0], args[1], args[2]
    if w.any_tainted:
        raise Unsupported("convolution_backward with a padded weight")
    if _spatial(node, x) or _spatial(node, go):  # (also checks: no padded channels, no merged spatial dims)
        # (bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask)
        _windows_agree(node, x, go, 2, w.t.shape[2:], args[4], args[5], args[6], transposed=args[7], out_pad=args[8])
    rest = padded_args(args[3:])
    gi, gw, gb = node.target(fill_padding(ctx, go, 0), fill_padding(ctx, x, 0), w.t, *rest)
    return (
        PT(gi, x.dims) if gi is not None else None,
        plain(gw) if gw is not None else None,
        plain(gb) if gb is not None else None,
    )


def _pool_lead(node, x: PT):
    """The first spatial dim of a pooling's input ([N, C, *spatial] or unbatched [C, *spatial])."""
    return x.t.dim() - (3 if "3d" in str(node.target) else 2)


def _pooled_dims(node, x: PT, ceil=False, pad=None, count_pad=True):
    """The padded spatial dims of a pooling's input. An average's valid outputs must read only valid inputs and the
    op's own padding: not with ceil_mode (the last window is clipped at the true end, and its divisor with it), nor
    over a padded dim with padding that the divisor does not count (a maximum ignores what lies past the end)."""
    lead = _pool_lead(node, x)
    sp = _spatial(node, x, lead, channels=False)  # each plane pooled on its own: padded planes stay padding
    if sp and ceil:
        raise Unsupported(f"{node.target} with ceil_mode over a padded dim")
    if sp and not count_pad and any(pad[(d - lead) % len(pad)] for d in sp):
        raise Unsupported(f"{node.target} over a padded dim with padding the divisor does not count")
    return lead, sp


def _windows_agree(node, x: PT, go: PT, lead, k, st, pad, dil, ceil=False, transposed=False, out_pad=(0,)):
    """A windowed op's backward: its output gradient's padded sizes must be the forward's output sizes on the padded
    input (what the op assumes), not only the output's symbolic sizes at the buckets."""
    for j, d in enumerate(range(lead, x.t.dim())):
        kk, ss, pp, dd = (v[j % len(v)] for v in (k, st, pad, dil))
        if transposed:
            n = (x.t.shape[d] - 1) * ss - 2 * pp + dd * (kk - 1) + out_pad[j % len(out_pad)] + 1
        else:
            num = x.t.shape[d] + 2 * pp - dd * (kk - 1) - 1
            n = (-(-num // ss) if ceil else num // ss) + 1
            if ceil and (n - 1) * ss >= x.t.shape[d] + pp:
                n -= 1
        if n != go.t.shape[d]:
            raise Unsupported(f"{node.target}: output size {n} on the padded input, {go.t.shape[d]} at the buckets")


def _reindex(ctx, idx: PT, x: PT, lead, to_exact):
    """max pooling's indices count flat positions over the input's spatial dims: re-counted between the padded
    sizes (the op's, on padded planes) and the exact ones (the user's), digit by digit; the padding's become 0."""
    padded = list(x.t.shape[lead:])
    exact = []
    for d in range(lead, x.t.dim()):
        f = x.dims[d][0][1]
        exact.append(f.rt if f is not None else x.t.shape[d])
    src, dst = (padded, exact) if to_exact else (exact, padded)
    rest, out, scale = idx.t, 0, 1
    for n_src, n_dst in zip(reversed(src), reversed(dst)):
        out = out + torch.remainder(rest, n_src) * scale
        rest = torch.div(rest, n_src, rounding_mode="floor")
        scale = scale * n_dst
    return PT(fill_padding(ctx, PT(out.to(idx.t.dtype), idx.dims), 0), idx.dims)


@handles(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool(node, args, kwargs, ctx):
    """Max pooling over padded spatial dims: the padding reads as -inf (as the op's own padding), valid outputs come
    first, the indices count exact positions."""
    x = args[0]
    lead, sp = _pooled_dims(node, x)
    if not sp:
        return _per_plane(node, args, kwargs, ctx, lead)
    fill = -math.inf if x.t.dtype.is_floating_point else torch.iinfo(x.t.dtype).min
    out, idx = node.target(fill_padding(ctx, x, fill, sp), *padded_args(args[1:]), **padded_args(kwargs))
    val = meta_val(node)
    return _out_dims(ctx, x, out, val[0], lead), _reindex(ctx, _out_dims(ctx, x, idx, val[1], lead), x, lead, True)


@handles(aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default)
def _max_pool_backward(node, args, kwargs, ctx):
    """The padded outputs' gradients are zeroed (an output past the true end may have picked a valid input)."""
    go, x = args[0], args[1]
    lead, sp = _pooled_dims(node, x)
    if not sp:
        return _per_plane(node, args, kwargs, ctx, lead)
    k, st, pad, dil = (
        list(arg_or(args, kwargs, i, n, dflt))
        for i, n, dflt in ((2, "kernel_size", None), (3, "stride", []), (4, "padding", [0]), (5, "dilation", [1]))
    )
    st = st or k
    ceil = arg_or(args, kwargs, 6, "ceil_mode", False)
    _windows_agree(node, x, go, lead, k, st, pad, dil, ceil)
    args = list(args)
    args[7] = _reindex(ctx, args[7], x, lead, False)
    gi = node.target(fill_padding(ctx, go, 0), x.t, *padded_args(args[2:]), **padded_args(kwargs))
    return PT(gi, x.dims)


@handles(aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(node, args, kwargs, ctx):
    """Average pooling over a padded spatial dim: the padding reads as 0 (as the op's own padding), and without
    ceil_mode a valid output's window ends inside the true end plus the op's padding, so its divisor is exact."""
    x = args[0]
    lead, sp = _pooled_dims(
        node,
        x,
        arg_or(args, kwargs, 4, "ceil_mode", False),
        list(arg_or(args, kwargs, 3, "padding", [0])),
        arg_or(args, kwargs, 5, "count_include_pad", True),
    )
    if not sp:
        return _per_plane(node, args, kwargs, ctx, lead)
    out = node.target(fill_padding(ctx, x, 0, sp), *padded_args(args[1:]), **padded_args(kwargs))
    return _out_dims(ctx, x, out, meta_val(node), lead)


@handles(aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default)
def _avg_pool_backward(node, args, kwargs, ctx):
    go, x = args[0], args[1]
    pad = list(arg_or(args, kwargs, 4, "padding", [0]))
    lead, sp = _pooled_dims(
        node, x, arg_or(args, kwargs, 5, "ceil_mode", False), pad, arg_or(args, kwargs, 6, "count_include_pad", True)
    )
    if not sp:
        return _per_plane(node, args, kwargs, ctx, lead)
    k = list(args[2])
    _windows_agree(node, x, go, lead, k, list(args[3]) or k, pad, [1])
    return PT(node.target(fill_padding(ctx, go, 0), x.t, *padded_args(args[2:]), **padded_args(kwargs)), x.dims)


@handles(aten._native_batch_norm_legit_functional.default, aten._native_batch_norm_legit_no_training.default)
def _batch_norm(node, args, kwargs, ctx):
    """Batch statistics over the valid samples only (the true count), as the op computes them."""
    x = args[0]
    _batch_only(node, [x])
    if node.target is aten._native_batch_norm_legit_no_training.default or not args[5] or not x.tainted(0):
        out = node.target(*padded_args(args))
        return (PT(out[0], x.dims),) + tuple(plain(o) for o in out[1:])
    w, b, rm, rv, _, momentum, eps = (padded_args(a) for a in args[1:8])
    dims = [0] + list(range(2, x.t.dim()))
    shape = [1, -1] + [1] * (x.t.dim() - 2)
    acc = torch.float32 if x.t.dtype in (torch.float16, torch.bfloat16) else x.t.dtype
    n = count_of(ctx, x, dims)
    xs = fill_padding(ctx, x, 0, [0]).to(acc)
    mean = xs.sum(dims) / n
    dev = fill_padding(ctx, PT(xs - mean.view(shape), x.dims), 0, [0])
    var = (dev * dev).sum(dims) / n
    rstd = torch.rsqrt(var + eps)
    out = (xs - mean.view(shape)) * rstd.view(shape)
    if w is not None:
        out = out * w.view(shape)
    if b is not None:
        out = out + b.view(shape)
    new_rm = rm * (1 - momentum) + mean.to(rm.dtype) * momentum
    new_rv = rv * (1 - momentum) + (var * n / (n - 1)).to(rv.dtype) * momentum
    return PT(out.to(x.t.dtype), x.dims), plain(mean), plain(rstd), plain(new_rm), plain(new_rv)


@handles(aten._native_batch_norm_legit.no_stats)
def _batch_norm_no_stats(node, args, kwargs, ctx):
    """Batch statistics without running ones (instance norm views [B, C, L] as [1, B*C, L]): each channel's on its
    own, so padded channels stay padding; a padded dim read into the statistics is not taken."""
    x = args[0]
    if any(x.tainted(d) for d in range(x.t.dim()) if d != 1):
        raise Unsupported(f"{node.target} with a padded dim other than the channels")
    for a in args[1:3]:
        if isinstance(a, PT) and not same_factors(a.dims[0], x.dims[1]):
            raise Unsupported(f"{node.target} with a weight padded unlike the channels")
    out = node.target(*padded_args(args), **padded_args(kwargs))
    return (PT(out[0], x.dims),) + tuple(PT(o, [x.dims[1]]) for o in out[1:])


# -- attention ---------------------------------------------------------------------------------------------------------
def _attention_args(ctx, node, q, k, causal, kwargs):
    """The keyword arguments of an attention op on padded inputs, and the factor q is scaled by first: a scale that
    depends on a symbolic size (the default 1/sqrt(E) of a padded head dim, or a runtime value) is applied to q,
    and the op told 1."""
    kw = {a: (b.t if isinstance(b, PT) else b) for a, b in kwargs.items()}
    key_mask = _key_mask(ctx, node, q, k, causal, kwargs.get("attn_mask"))
    if key_mask is not None:
        kw["attn_mask"] = key_mask
    scale = kwargs.get("scale")
    factor = None
    if isinstance(scale, (Rt, Sz)):
        factor = rt_of(scale)
    elif scale is None and q.tainted(q.t.dim() - 1):
        e = q.dims[-1][0][1]
        factor = 1.0 / torch.sqrt(e.rt.to(q.t.dtype))
    if factor is not None:
        kw["scale"] = 1.0
    return kw, factor


@handles(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_cpu(node, args, kwargs, ctx):
    names = ("q", "k", "v", "dropout_p", "is_causal", "attn_mask", "scale")
    a, f, mask, scale, _ = _attention_inputs(node, args, kwargs, ctx, names)
    out, lse = node.target(f["q"], f["k"], f["v"], a["dropout_p"], a["is_causal"], attn_mask=mask, scale=scale)
    return PT(out, list(a["q"].dims[:-1]) + [a["v"].dims[-1]]), PT(lse, list(a["q"].dims[:-1]))


def _key_mask(ctx, node, q, k, causal, mask):
    """The mask that keeps valid queries off the padding's keys: none when causal attention already does (the
    padding follows every valid key), else the given mask with the padded keys masked out."""
    kd = k.t.dim() - 2
    if not k.tainted(kd):
        return mask.t if isinstance(mask, PT) else mask
    if causal:
        if not same_factors(q.dims[kd], k.dims[kd]):
            raise Unsupported("causal attention with queries and keys padded differently")
        return mask.t if isinstance(mask, PT) else mask
    km = dim_mask(ctx, k.dims[kd]).view([1] * (q.t.dim() - 1) + [-1])
    # an additive mask of q's dtype (these kernels take no boolean mask: True would add 1)
    add = torch.zeros((), dtype=q.t.dtype, device=q.t.device).masked_fill(~km, -math.inf)
    if mask is None:
        return add
    if mask.t.dtype == torch.bool:
        return torch.zeros((), dtype=q.t.dtype, device=q.t.device).masked_fill(~(mask.t & km), -math.inf)
    return mask.t + add


@handles(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _sdpa_cpu_backward(node, args, kwargs, ctx):
    names = ("grad", "q", "k", "v", "out", "logsumexp", "dropout_p", "is_causal", "attn_mask", "scale")
    a, f, mask, scale, factor = _attention_inputs(node, args, kwargs, ctx, names)
    # the padding's queries get zero gradients (their attention weights then add nothing to the keys' and values')
    gq, gk, gv = node.target(
        f["grad"],
        f["q"],
        f["k"],
        f["v"],
        f["out"],
        f["logsumexp"],
        a["dropout_p"],
        a["is_causal"],
        attn_mask=mask,
        scale=scale,
    )
    if factor is not None:
        gq = gq * factor
    return PT(gq, a["q"].dims), PT(gk, a["k"].dims), PT(gv, a["v"].dims)


_ATTENTION_DEFAULTS = {"attn_mask": None, "scale": None, "dropout_p": 0.0, "is_causal": False}


def _attention_inputs(node, args, kwargs, ctx, names):
    """An attention op's arguments (torch's CPU flash-attention ops, torchtpu_attn's) by name, in the op's order:
    names lists them, positional first; those neither given nor passed take their defaults. Returns them with every
    tensor's padding filled with 0 (q scaled first where the scale follows a padded size), the mask and scale to
    call the op with, and that factor (None: none)."""
    given = dict(zip(names, args)) | {n: v for n, v in kwargs.items() if n in names}
    a = {n: given.get(n, _ATTENTION_DEFAULTS.get(n)) for n in names}
    q, k, causal = a["q"], a["k"], a["is_causal"]
    kw, factor = _attention_args(ctx, node, q, k, causal, {"attn_mask": a["attn_mask"], "scale": a["scale"]})
    filled = {n: fill_padding(ctx, t, 0) for n, t in a.items() if isinstance(t, PT) and n != "attn_mask"}
    if factor is not None:
        filled["q"] = filled["q"] * factor
    return a, filled, kw.get("attn_mask"), kw.get("scale"), factor


@handles(torch.ops.torchtpu_attn.sdpa.default)
def _sdpa_tpu(node, args, kwargs, ctx):
    names = ("q", "k", "v", "attn_mask", "is_causal", "scale", "dropout_p")
    a, f, mask, scale, _ = _attention_inputs(node, args, kwargs, ctx, names)
    if a["dropout_p"]:
        raise Unsupported("attention dropout (its random draws would follow the padded size)")
    out, lse, rng = node.target(f["q"], f["k"], f["v"], mask, a["is_causal"], scale, 0.0)
    return PT(out, list(a["q"].dims[:-1]) + [a["v"].dims[-1]]), PT(lse, list(a["q"].dims[:-1])), plain(rng)


@handles(torch.ops.torchtpu_attn.sdpa_backward.default)
def _sdpa_tpu_backward(node, args, kwargs, ctx):
    names = ("grad", "q", "k", "v", "attn_mask", "out", "logsumexp", "is_causal", "scale", "dropout_p", "rng_state")
    a, f, mask, scale, factor = _attention_inputs(node, args, kwargs, ctx, names)
    if a["dropout_p"]:
        raise Unsupported("attention dropout (its random draws would follow the padded size)")
    # the padding's queries get zero gradients: their probabilities then add nothing to the keys' and values'
    gq, gk, gv = node.target(
        f["grad"], f["q"], f["k"], f["v"], mask, f["out"], f["logsumexp"], a["is_causal"], scale, 0.0, f["rng_state"]
    )
    if factor is not None:
        gq = gq * factor
    return PT(gq, a["q"].dims), PT(gk, a["k"].dims), PT(gv, a["v"].dims)
