"""Bucketed rows in the eager modes: a data-dependent row count without a program per count.

A storage can be *bucketed*: its first ``n`` rows are valid and the rest, up to its capacity (a bucket of
``set_shape_buckets``, by default the next power of two), is padding. ``nonzero`` makes one (and so ``where(cond)``,
boolean-mask indexing, ``masked_select``); so does every op below whose result follows the rows. A tensor whose dim
``d`` walks those rows (size ``n``, stride one row; its other dims and offset inside one row: ``token, slot =
where(...)``, ``x[token]``, ``y.t()``) is keyed by the op table (csrc/executor/kernel.cpp) with the capacity in
place of ``n``, and ``n`` travels as a runtime value: every count of a bucket shares one table entry, one fragment,
and in fused mode one chunk program.

On a table miss :func:`lower` lowers the op with the op's own rule at the capacity (the argument replaced by its
capacity-row view of the same storage) when this module can prove it right there:

- ops that treat rows alone (pointwise, reductions and softmax over other dims, matmul rows, ``index`` /
  ``index_select`` / ``embedding`` with a bucketed index, sort/topk along other dims): padding rows compute
  padding, valid rows are exact; a bucketed index reads its padding as 0 (no false out-of-range check);
- ops that sum across rows (a sum over the rows, a matmul contracting them, ``index_add`` / ``index_put`` with
  accumulation / ``embedding``'s backward with a bucketed index and values, layer norm's weight gradient): every
  bucketed input reads its padding as 0 first (``select``, so NaN-safe), which adds nothing.

A result whose shape follows the rows (its dim is the capacity at the capacity, capacity + 1 at capacity + 1) is
bucketed again when the rows are its outermost dim (its exact view is then contiguous, as on cuda). Anything else
(other ops, random draws, a second row count in one op, exact tensors as large as the capacity) answers ``exact``:
the table keys that call at its exact sizes, as without buckets (right, a program per count), counted in
``op_table.bucket_exact``.
"""

from __future__ import annotations

import functools
import math
import sys
import warnings

import torch

from .. import _C, config, executor, kernels, metrics
from .. import emit as E
from ..errors import describe, user_line
from ..lowering import reduction as R
from ..lowering.indexing import SCATTER_COMBINE
from ..tables import out_meta
from ..trace import FROM_RNG
from . import policy

EXACT = ("exact",)
ROWS_CLASS = 0  # one row class per op (a second one answers exact)


class Decline(Exception):
    """This call is not provably right at the capacity: it runs at its exact sizes."""


def sync(_value=None) -> None:
    """Turns the C++ path's bucketing on or off with the policy (torchtpu.set_shape_buckets); off while debug
    mode's NaN check is on (it reads whole buffers, padding included). The listener of both knobs."""
    _STICKY.clear()  # capacities of the previous policy's buckets
    on = policy.enabled()
    name = policy.get_shape_buckets()
    sizes = [] if name == "pow2" or not on else [int(b) for b in name.split(",")]
    _C._set_upload_host_copies(policy.UPLOAD_HOST_COPY_BYTES if on else 0)
    _C._set_eager_buckets(on and not config.get("check_nans"), sizes)


config.on_change("shape_buckets", sync)
config.on_change("check_nans", sync)


# -- sizes that change between calls of one op, outside the rows (a varying sequence length): said, not bucketed ---
VARYING_AFTER = 8  # host-read periods (training steps) that lowered a new size of one dim, the rest equal
_SIZES: dict = {}  # (op, argument, dim, the other sizes, dtype) -> [the sizes lowered, periods with a new one, last]
_SIZES_MAX = 4096
_warned_varying: list = []


def note_lowering(name, values) -> None:
    """Op-table misses only. Counts a lowering at a new size of some dim of an op lowered before with other sizes
    of it, all else equal (`lowerings.size_changes`). When such new sizes came in VARYING_AFTER periods between host
    reads (steps: a model's layers of several widths all lower in its first steps), warns once per process: outside
    the data-dependent rows, the eager modes compile every new size anew (docs/modes.md)."""
    changed = None
    period = metrics.get("host_syncs")
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor) or v.dim() == 0:
            continue
        shape = tuple(v.shape)
        for d, n in enumerate(shape):
            key = (name, i, d, shape[:d] + shape[d + 1 :], v.dtype)
            seen = _SIZES.get(key)
            if seen is None:
                if len(_SIZES) >= _SIZES_MAX:
                    _SIZES.pop(next(iter(_SIZES)))
                _SIZES[key] = [{n}, 1, period]
            elif n not in seen[0] and len(seen[0]) < 64:
                seen[0].add(n)
                if seen[2] != period:
                    seen[1] += 1
                    seen[2] = period
                if changed is None or seen[1] > changed[3][1]:
                    changed = (i, d, v, seen)
    if changed is None:
        return
    metrics.inc("lowerings.size_changes")
    i, d, v, (sizes, periods, _) = changed
    if periods >= VARYING_AFTER and not _warned_varying:
        _warned_varying.append(name)
        op = name if "::" in name else f"aten::{name}"  # torchtpu's own ops name their namespace
        warnings.warn(
            f"torchtpu: {op} was lowered for {len(sizes)} sizes of dim {d} of its argument {i}, new ones in "
            f"{periods} steps ({describe(v)}; sizes {sorted(sizes)[:8]}...), the rest equal, at {user_line()}; each "
            "new size compiles the programs that hold it. The eager modes bucket data-dependent counts (nonzero, "
            "masks) and uploads whose batch size or length varies, but this op ran at its exact sizes "
            "(TORCHTPU_BUCKETS_DEBUG=1 says why an op declines): torch.compile(model, backend='tpu', dynamic=True) "
            "compiles once per bucket of such sizes (torchtpu.set_shape_buckets), or pad batches to a few lengths. "
            "Counted in torchtpu.metrics as lowerings.size_changes; warned once.",
            stacklevel=2,
        )


_STICKY: dict = {}  # (op, input shape, dtype) -> the largest capacity its counts were given (bounded)
_STICKY_MAX = 256


def rows_tensor(host: torch.Tensor, device, source=None, bound=None) -> torch.Tensor:
    """The rows of `host` (a CPU tensor whose dim 0 is a data-dependent count) on the device, in a storage of the
    count's bucket with the padding zeroed (a count that fills its bucket is bucketed too, with no padding: it shares
    the bucket's entries); a count of 0 or 1, or with buckets off: exact.

    `source` (a hashable: the op and its input's shape) makes the capacity sticky: the counts of one source share
    the largest bucket it has given, up to the bucket of `bound` (the most rows it can have). The experts of an MoE
    layer route counts that straddle a bucket boundary; with one capacity for all of them, a fused chunk over every
    expert is one program instead of one per combination of buckets (at most twice the rows of the exact bucket)."""
    n = host.shape[0] if host.dim() else 0
    if n < 2 or not policy.enabled():
        return host.to(device)
    cap = policy.bucket(n)
    if source is not None:
        cap = max(cap, min(_STICKY.get(source, 0), policy.bucket(bound) if bound is not None else cap))
        if source not in _STICKY and len(_STICKY) >= _STICKY_MAX:
            _STICKY.pop(next(iter(_STICKY)))
        _STICKY[source] = cap
    if host.numel() == 0:
        return host.to(device)
    padded = torch.zeros((cap, *host.shape[1:]), dtype=host.dtype)
    padded[:n] = host

    with executor.exact_uploads():  # its own capacity, not a batch's
        dev = padded.to(device)
    out = dev[:n]
    _C._set_rows(out, n, out.stride(0) * out.element_size())
    return out


def mask(tr, v, dim, kind):
    """v (a capacity-row value) with its rows past the valid count along dim replaced by the identity of reduction
    `kind` ("add": 0, "maximum": the dtype's lowest value, ...) in v's dtype, or by `value` for kind ("fill", value)."""

    fn = tr.fn
    n = tr.rows(ROWS_CLASS)
    pos = E.iota(fn, v.shape, dim)
    valid = E.compare(pos, E.broadcast_to(n, v.shape), "LT")
    fill = (
        E.const(fn, kind[1], v.dtype)
        if isinstance(kind, tuple)
        else E.convert(R.init_value(fn, kind, v.dtype), v.dtype)
    )
    return E.select(valid, v, E.broadcast_to(fill, v.shape))


# -- rules that need the count itself (means and variances over the rows) ---------------------------------------------
def _count(tr, x, dims, d, acc):
    """The number of valid elements a reduction of x over dims (d: the rows) takes, as a runtime value of dtype acc."""
    other = math.prod(x.shape[k] for k in dims if k != d)
    n = E.convert(tr.rows(ROWS_CLASS), acc)
    return n if other == 1 else E.mul(n, E.const(tr.fn, other, acc))


def _rows_mean(d):

    def rule(tr, x, dim=None, keepdim=False, dtype=None):  # mean.dim; x's padding reads 0
        dt = out_meta(tr).dtype
        dims = R.reduced_dims(x, dim)
        acc = E.acc_dtype(dt)
        s = R.reduce(x, dims, "add", keepdim, acc)
        return E.convert(E.div(s, E.broadcast_to(_count(tr, x, dims, d, acc), s.shape)), dt)

    return rule


def _rows_var(d, outputs):
    """var / std / var_mean / std_mean over the rows: the mean by the valid count, the deviations of the padding 0."""

    def rule(tr, x, dim=None, correction=None, keepdim=False):  # x's padding reads 0
        dt = out_meta(tr).dtype
        dims = R.reduced_dims(x, dim)
        acc = E.acc_dtype(dt)
        xv = E.convert(x, acc)
        n = _count(tr, x, dims, d, acc)
        s = R.reduce(xv, dims, "add", True, acc)
        mean = E.div(s, E.broadcast_to(n, s.shape))
        dev = mask(tr, E.sub(xv, E.broadcast_to(mean, xv.shape)), d, ZERO)
        ss = R.reduce(E.mul(dev, dev), dims, "add", keepdim, acc)
        c = E.const(tr.fn, 1 if correction is None else correction, acc)
        denom = E.maximum(E.sub(n, c), E.const(tr.fn, 0, acc))
        var = E.div(ss, E.broadcast_to(denom, ss.shape))
        first = E.convert(E.unary("sqrt", var) if outputs[0] == "std" else var, dt)
        if len(outputs) == 1:
            return first
        m = mean if keepdim else E.reshape(mean, ss.shape)
        return first, E.convert(m, out_meta(tr, 1).dtype)

    return rule


# -- which ops, and how ------------------------------------------------------------------------------------------------
_ROWWISE_EXTRA = {
    "where.self",
    "clone",
    "_to_copy",
    "copy_",
    "copy",
    "fill_.Scalar",
    "fill_.Tensor",
    "fill.Scalar",
    "fill.Tensor",
    "zero_",
    "zero",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "masked_fill.Scalar",
    "masked_fill.Tensor",
    "masked_fill_.Scalar",
    "masked_fill_.Tensor",
    "new_zeros",
    "new_ones",
    "new_empty",
    "new_full",
    "new_empty_strided",
    "gelu_backward",
    "threshold_backward",
    "tanh_backward",
    "sigmoid_backward",
    "silu_backward",
    "logit_backward",
    "hardtanh_backward",
    "leaky_relu_backward",
    "elu_backward",
    "softplus_backward",
}

# ops over a batch's samples one by one (their dim 0): the padding samples compute padding
# (name -> the argument positions of its weights, which are not samples)
_PER_SAMPLE = {
    "convolution_overrideable": (1, 2),
    **{
        n: ()
        for n in (
            "max_pool2d_with_indices",
            "avg_pool2d",
            "_adaptive_avg_pool2d",
            "max_pool2d_with_indices_backward",
            "avg_pool2d_backward",
            "_adaptive_avg_pool2d_backward",
            "upsample_nearest2d",
            "upsample_bilinear2d",
        )
    },
}
# (grad_output, input, weight...): the weight's and bias's gradients sum over the samples
_PER_SAMPLE_BACKWARD = {"convolution_backward_overrideable"}

# reductions and per-row normalizations: (argument index of the dims, default when absent: None = every dim)
_REDUCE = {
    "sum.dim_IntList": (1, None),
    "sum": (None, None),
    "mean.dim": (1, None),
    "amax": (1, None),
    "amin": (1, None),
    "max.dim": (1, None),
    "min.dim": (1, None),
    "argmax": (1, None),
    "argmin": (1, None),
    "any.dim": (1, None),
    "all.dim": (1, None),
    "any.dims": (1, None),
    "all.dims": (1, None),
    "prod.dim_int": (1, None),
    "logsumexp": (1, None),
    "var.correction": (1, None),
    "std.correction": (1, None),
    "var_mean.correction": (1, None),
    "std_mean.correction": (1, None),
    "linalg_vector_norm": (2, None),
    "_softmax": (1, None),
    "_log_softmax": (1, None),
    "_softmax_backward_data": (2, None),
    "_log_softmax_backward_data": (2, None),
    "cumsum": (1, None),
    "cumprod": (1, None),
    "logcumsumexp": (1, None),
    "topk": (2, -1),
    "sort": (1, -1),
    "sort.stable": (2, -1),
    "max": (None, None),
    "min": (None, None),
    "prod": (None, None),
    "any": (None, None),
    "all": (None, None),
    "mean": (None, None),
}
# along the rows, these are right as they are: the valid rows of a prefix scan read only valid rows
_PREFIX = {"cumsum", "cumprod", "logcumsumexp"}
# along the rows, these are right once the padding reads as the identity of their reduction (lowering/reduction.py)
ZERO = "add"  # the padding of sums, contractions and indices reads as 0
# along the rows, these take the valid count (the rule is replaced; the padding reads 0)
_BY_COUNT = {
    "mean.dim": _rows_mean,
    "var.correction": lambda d: _rows_var(d, ("var",)),
    "std.correction": lambda d: _rows_var(d, ("std",)),
    "var_mean.correction": lambda d: _rows_var(d, ("var", "mean")),
    "std_mean.correction": lambda d: _rows_var(d, ("std", "mean")),
}
# along the rows, softmax-like ops are right once their inputs' padding reads so (per argument position)
_SOFTMAX = {
    "_softmax": ("maximum",),
    "_log_softmax": ("maximum",),
    "logsumexp": ("maximum",),
    "_softmax_backward_data": (ZERO, ZERO),
    "_log_softmax_backward_data": (ZERO, ZERO),
}
_IDENTITY = {
    "sum.dim_IntList": ZERO,
    "sum": ZERO,
    "amax": "maximum",
    "amin": "minimum",
    "max.dim": "maximum",
    "min.dim": "minimum",
    "max": "maximum",
    "min": "minimum",
    "argmax": "maximum",
    "argmin": "minimum",
    "prod.dim_int": "multiply",
    "prod": "multiply",
    "any.dim": "or",
    "any.dims": "or",
    "any": "or",
    "all.dim": "and",
    "all.dims": "and",
    "all": "and",
}

_SCATTER = {
    "scatter_add",
    "scatter_reduce.two",
    "scatter.src",
    "scatter.value",
    "scatter.reduce",
    "scatter.value_reduce",
}
# matmuls: the role of each dim of (a, b): r = result rows, c = result columns, k = contracted, b = batch
_MATMUL = {
    "mm": (0, 1, ("r", "k"), ("k", "c")),
    "addmm": (1, 2, ("r", "k"), ("k", "c")),
    "bmm": (0, 1, ("b", "r", "k"), ("b", "k", "c")),
    "baddbmm": (1, 2, ("b", "r", "k"), ("b", "k", "c")),
}


def _dims(value, nd, default):
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        return set(range(nd)) if default is None else {default % max(nd, 1)}
    if isinstance(value, int):
        return {value % max(nd, 1)}
    return {int(d) % max(nd, 1) for d in value}


def _classify(fname, args, kwargs, bdim):
    """The masks (id(tensor) -> the reduction whose identity its padding reads as) that make the rule right at the
    capacity; raises Decline."""

    name = kernels.cpp_name(fname)
    packet = name.split(".")[0]
    op = getattr(getattr(torch.ops.aten, packet), name.split(".")[1] if "." in name else "default", None)
    flat = []
    for a in (*args, *kwargs.values()):
        flat.extend(a if isinstance(a, (list, tuple)) else [a])
    tensors = [t for t in flat if isinstance(t, torch.Tensor)]
    bucketed = [t for t in tensors if id(t) in bdim]

    if name in _REDUCE:
        pos, default = _REDUCE[name]
        x = args[0]
        if name in ("_softmax_backward_data", "_log_softmax_backward_data"):
            x = args[1]
        if any(t.dim() != x.dim() or bdim[id(t)] != bdim.get(id(x)) for t in bucketed):
            raise Decline(f"{name}: bucketed inputs laid out differently")
        if any(id(t) not in bdim for t in tensors):  # a softmax backward's other operand at its exact size
            raise Decline(f"{name}: an exact tensor beside the rows")
        given = (args[pos] if pos is not None and len(args) > pos else kwargs.get("dim")) if pos is not None else None
        reduced = _dims(given, x.dim(), default)
        d = bdim[id(bucketed[0])]
        if d not in reduced:
            return {}
        if packet in _PREFIX:
            return {}
        if name in _BY_COUNT or name == "mean":
            if x.dtype.is_complex:
                raise Decline(f"{name} of complex rows")
            masks = {id(x): ZERO}
            if name == "mean":
                by_dims = _rows_mean(d)
                return masks, lambda tr, x, dtype=None: by_dims(tr, x, None, False, dtype)
            return masks, _BY_COUNT[name](d)
        if name in _SOFTMAX:
            xs = args[: len(_SOFTMAX[name])]
            return {id(t): kind for t, kind in zip(xs, _SOFTMAX[name])}
        if name == "linalg_vector_norm":
            order = args[1] if len(args) > 1 else kwargs.get("ord", 2)
            if not (order == 0 or order > 0):  # 0 padding adds nothing to a count, a p-sum or a maximum of |x|
                raise Decline(f"{name} of order {order} across the rows")
            return {id(x): ZERO}
        if name in _IDENTITY:
            if packet in ("argmax", "argmin") and len(reduced) > 1 and d != 0:
                raise Decline(f"{name}: a flat index over rows that are not the outermost dim")
            return {id(t): _IDENTITY[name] for t in bucketed}
        raise Decline(f"{name} across the rows")

    if packet in _MATMUL:
        ia, ib, ra, rb = _MATMUL[packet]
        a, b = args[ia], args[ib]
        if any(id(t) in bdim for t in (*args[:ia], *args[ib + 1 :]) if isinstance(t, torch.Tensor)):
            raise Decline(f"{name}: a bucketed bias")
        roles = {ra[bdim[id(a)]]} if id(a) in bdim else set()
        roles |= {rb[bdim[id(b)]]} if id(b) in bdim else set()
        if "k" in roles:
            if not (id(a) in bdim and id(b) in bdim and ra[bdim[id(a)]] == "k" and rb[bdim[id(b)]] == "k"):
                raise Decline(f"{name}: contracting rows with an exact operand")
            return {id(a): ZERO, id(b): ZERO}
        if len(roles) > 1:
            raise Decline(f"{name}: rows in two roles")
        if "b" in roles and not (id(a) in bdim and id(b) in bdim):
            raise Decline(f"{name}: a batch of rows against an exact batch")
        out_pos = {"b": 0, "r": len(ra) - 2, "c": len(ra) - 1}
        for bias in (t for t in (*args[:ia], *args[ib + 1 :]) if isinstance(t, torch.Tensor)):
            for role in roles:  # an exact bias along the rows: broadcast against the capacity, it would pass unseen
                k = out_pos[role] - (len(ra) - bias.dim())
                if 0 <= k and bias.shape[k] != 1:
                    raise Decline(f"{name}: an exact bias along the rows")
        return {}

    if name == "index.Tensor":
        self, indices = args[0], args[1]
        if id(self) in bdim:
            raise Decline("index: a bucketed self")
        idx = [i for i in indices if i is not None]
        if any(i.dim() != 1 for i in idx if id(i) in bdim) or not any(id(i) in bdim for i in idx):
            raise Decline("index: bucketed indices of several dims")
        if any(id(i) not in bdim and i.numel() != 1 for i in idx):  # it would broadcast against the capacity
            raise Decline("index: an exact index beside the bucketed ones")
        return {id(i): ZERO for i in idx if id(i) in bdim}

    if name == "index_select":
        self, dim, index = args[0], args[1], args[2]
        if id(self) in bdim and bdim[id(self)] == dim % self.dim():
            raise Decline("index_select along the rows")
        return {id(index): ZERO} if id(index) in bdim else {}

    if name == "embedding":
        if id(args[0]) in bdim:
            raise Decline("embedding: a bucketed weight")
        return {id(args[1]): ZERO}

    if name == "embedding_dense_backward":
        if len(args) > 4 and args[4]:
            raise Decline("embedding backward scaled by frequency")
        if id(args[0]) not in bdim or id(args[1]) not in bdim:
            raise Decline("embedding backward: gradient and indices not both on the rows")
        return {id(t): ZERO for t in bucketed}

    if name == "index_add":
        self, dim, index, source = args[0], args[1], args[2], args[3]
        if id(self) in bdim or id(index) not in bdim or bdim.get(id(source)) != dim % max(source.dim(), 1):
            raise Decline("index_add: rows other than a bucketed index and its source rows")
        return {id(index): ZERO, id(source): ZERO}

    if name in ("index_put", "_index_put_impl_"):
        self, indices, values = args[0], args[1], args[2]
        accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
        idx = [i for i in indices if i is not None]
        if (
            not accumulate
            or id(self) in bdim
            or id(values) not in bdim
            or any(id(i) not in bdim or i.dim() != 1 for i in idx)
        ):
            raise Decline(
                f"index_put: not an accumulation of bucketed values at bucketed indices (accumulate "
                f"{bool(accumulate)}, self {id(self) in bdim}, values {tuple(values.shape)} "
                f"{values.stride()} {id(values) in bdim}, indices "
                f"{[(tuple(i.shape), i.dtype, id(i) in bdim) for i in idx]})"
            )
        where = [k for k, i in enumerate(indices) if i is not None]
        start = where[0] if where == list(range(where[0], where[0] + len(where))) else 0
        result_nd = self.dim() - len(indices) + 1
        if result_nd - values.dim() + bdim[id(values)] != start:
            raise Decline("index_put: values' rows are not the indices' rows")
        return {id(t): ZERO for t in bucketed}

    if name == "cat":
        xs, dim = args[0], (args[1] if len(args) > 1 else kwargs.get("dim", 0))
        nd = max(t.dim() for t in xs)
        ds = {bdim.get(id(t)) for t in xs if t.dim() == nd}
        if len(ds) != 1 or None in ds or dim % nd in ds:
            raise Decline("cat: along the rows, or of tensors with and without them")
        return {}

    if name in ("nll_loss_forward", "nll_loss_backward"):
        back = name == "nll_loss_backward"
        x, target, weight, reduction, ignore = args[back : back + 5]
        if x.dim() != 2 or bdim.get(id(x)) != 0 or bdim.get(id(target)) != 0 or id(weight) in bdim:
            raise Decline(f"{name}: not a loss over bucketed rows of (rows, classes) with their targets")
        masks = {id(x): ZERO, id(target): ("fill", ignore)}  # the padding rows are ignored targets
        if back:
            grad = args[0]
            if reduction == 0:
                if bdim.get(id(grad)) != 0:
                    raise Decline(f"{name}: a per-row gradient at its exact size")
                masks[id(grad)] = ZERO
            elif id(grad) in bdim or id(args[6]) in bdim:
                raise Decline(f"{name}: a bucketed total")
        return masks

    if name in _SCATTER:
        self, dim, index, src = args[:4]
        nd = max(index.dim(), 1)
        d = bdim.get(id(index))
        if d is None or (isinstance(src, torch.Tensor) and (bdim.get(id(src)) != d or src.dim() != index.dim())):
            raise Decline(f"{name}: rows other than a bucketed index and its source rows")
        if id(self) in bdim:  # row by row: the padding rows update the padding rows of self
            if bdim[id(self)] != d or d == dim % nd:  # along the rows the bounds check would see the capacity
                raise Decline(f"{name}: a bucketed self along the scattered dim or other rows")
            return {id(index): ZERO}
        reduce_ = args[4] if name == "scatter_reduce.two" else "sum" if name == "scatter_add" else None
        include_self = args[5] if len(args) > 5 else kwargs.get("include_self", True)
        combine = None if reduce_ == "mean" else SCATTER_COMBINE.get(reduce_)  # a mean would count the padding
        if combine is None or not include_self:  # on an exact self the padding's updates land on its rows
            raise Decline(f"{name}: reduce {reduce_!r}, include_self={include_self} into an exact self")
        return {id(index): ZERO, id(src): combine}

    if name == "gather":
        self, dim, index = args[:3]
        d = bdim.get(id(index))  # a bucketed self walks the same rows, not along dim (bounds seen at the capacity)
        if d is None or (id(self) in bdim and (bdim[id(self)] != d or d == dim % self.dim())):
            raise Decline("gather: rows other than a bucketed index (and the self rows it walks)")
        return {id(index): ZERO}

    if name == "native_layer_norm":
        x, shape = args[0], args[1]
        if any(t is not x for t in bucketed) or bdim[id(x)] >= x.dim() - len(shape):
            raise Decline("layer_norm over the rows")
        return {}

    if name == "native_layer_norm_backward":
        x, shape = args[1], args[2]
        if bdim.get(id(x)) is None or bdim[id(x)] >= x.dim() - len(shape):
            raise Decline("layer_norm backward over the rows")
        if any(isinstance(t, torch.Tensor) and id(t) not in bdim for t in (args[0], args[3], args[4])):
            raise Decline("layer_norm backward: gradient, mean or rstd at its exact size")
        return {id(t): ZERO for t in bucketed}  # the weight and bias gradients sum over the rows

    if name in _PER_SAMPLE:  # each sample (dim 0: a batch of varying size) on its own
        weights = [a for k, a in enumerate(args) if k in _PER_SAMPLE[name] and isinstance(a, torch.Tensor)]
        samples = [t for t in tensors if not any(t is w for w in weights)]
        if any(id(w) in bdim for w in weights) or any(bdim.get(id(t)) != 0 for t in samples):
            raise Decline(f"{name}: rows other than the batch of its samples")
        return {}

    if name in _PER_SAMPLE_BACKWARD:  # the input gradient per sample; the weight (and bias) gradients sum over it
        go, x = args[0], args[1]
        if bdim.get(id(go)) != 0 or bdim.get(id(x)) != 0 or any(t is not go and t is not x for t in bucketed):
            raise Decline(f"{name}: rows other than the batch of the gradient and the input")
        return {id(go): ZERO, id(x): ZERO}

    if (op is not None and torch.Tag.pointwise in op.tags) or name in _ROWWISE_EXTRA:
        nd = max(t.dim() for t in tensors)
        at = {nd - t.dim() + bdim[id(t)] for t in bucketed}
        if len(at) != 1:
            raise Decline(f"{name}: bucketed rows broadcast onto different dims")
        d = at.pop()
        for t in tensors:  # an exact tensor along the rows: broadcast against the capacity, it would pass unseen
            k = d - (nd - t.dim())
            if id(t) not in bdim and 0 <= k and t.shape[k] != 1:
                raise Decline(f"{name}: an exact tensor along the rows ({tuple(t.shape)}, stride {t.stride()})")
        return {}

    raise Decline(f"{name} has no bucketed-rows rule")


def _standins(values, bucketed, extra=0, meta=False):
    """values with each bucketed tensor argument as its capacity-row view (+ extra rows; meta: meta tensors)."""
    vals = list(values)
    bdim = {}
    for arg, elem, dim, _cls, cap in bucketed:
        t = vals[arg] if elem < 0 else vals[arg][elem]
        size = list(t.shape)
        size[dim] = cap + extra
        s = (
            torch.empty_strided(size, t.stride(), dtype=t.dtype, device="meta")
            if meta
            else t.as_strided(size, t.stride(), t.storage_offset())
        )
        if elem < 0:
            vals[arg] = s
        else:
            lst = list(vals[arg])
            lst[elem] = s
            vals[arg] = lst
        bdim[id(s)] = dim
    return vals, bdim


def lower(name, values, runtime_slots, storages, device, rows, bucketed):
    """The table entry of a bucketed signature (kernels.lower's): (entry, registration); EXACT when declined."""

    try:
        if len(rows) != 1:
            raise Decline("two row counts in one op")
        with torch.no_grad():
            vals, bdim = _standins(values, bucketed)
        call = kernels.Call(name, vals, True, runtime_slots, storages, device)
        kind, fname, _rule, _ = call.info
        if kind == "out":
            raise Decline("an out= form")
        try:
            plan = _classify(fname, call.args, call.kwargs, bdim)
        except (IndexError, KeyError, TypeError, AttributeError) as e:  # an argument shape this module did not foresee
            raise Decline(f"{name}: {type(e).__name__}") from None
        if isinstance(plan, tuple):  # the masks and a rule that replaces the op's own at the capacity
            plan, rule = plan
            call.info = (kind, fname, rule, call.info[3])
        call.masks = {i: functools.partial(mask, dim=bdim[i], kind=kind) for i, kind in plan.items()}
        try:
            entry = list(call.entry())
        except kernels.NeedsPython:
            return ("python",), None
        except Exception as e:  # noqa: BLE001 — a call wrong at its exact sizes raises there, with its own message
            raise Decline(f"the rule failed at the capacity ({type(e).__name__})") from None
        _, fid, _, scalar_params, _, outputs, _, _, has_checks, _ = entry  # kernels.Call.entry's tuple
        if any(s[0] == FROM_RNG for s in scalar_params):  # the draws would follow the capacity
            raise Decline("random numbers")
        if (
            fid >= 0
            and has_checks
            and not call.masks
            and name.split(".")[0] not in ("index", "index_select", "embedding")
        ):
            raise Decline("device-side checks over padding rows")
        entry[5] = _follow(call, values, bucketed, outputs)
        return tuple(entry), call.registration
    except Decline as e:
        metrics.inc(f"eager_buckets.declined.{kernels.cpp_name(name)}")  # once per signature (the table keeps it)
        if config.get("buckets_debug"):
            print(f"torchtpu: eager buckets: {name} runs at exact sizes: {e}", file=sys.stderr)
        return EXACT, None


def _follow(call, values, bucketed, outputs):
    """The outputs with the rows they follow: (..., row class, dim) for a new output whose dim is the capacity."""
    if not any(o[0] == 0 for o in outputs):
        return outputs

    cap = bucketed[0][4]
    mvals, _ = _standins(values, bucketed, extra=1, meta=True)
    margs, mkwargs = [], {}
    for a, v in zip(call.op._schema.arguments, mvals):
        if a.kwarg_only:
            mkwargs[a.name] = v
        else:
            margs.append(v)
    try:
        more = kernels.as_tuple(kernels.meta(call.op, call.name, margs, mkwargs))
    except Exception:  # noqa: BLE001
        raise Decline("no metadata at another capacity") from None
    out = []
    for j, o in enumerate(outputs):
        if o[0] != 0:
            out.append(o)
            continue
        sizes, strides = list(o[3]), list(o[4])
        m = more[j] if j < len(more) else None
        if m is None:
            raise Decline("outputs differ at another capacity")
        grew = [d for d, (a, b) in enumerate(zip(sizes, m.shape)) if a != b]
        if len(m.shape) != len(sizes) or any(sizes[d] != cap or m.shape[d] != cap + 1 for d in grew) or len(grew) > 1:
            raise Decline("an output shape that is not the rows")
        if not grew:
            out.append(o)
            continue
        d = grew[0]
        if any(s != 1 for s in sizes[:d]) or strides != list(torch.empty(sizes, device="meta").stride()):
            raise Decline("rows that are not an output's outermost dim")
        out.append((*o[:6], ROWS_CLASS, d))
    return out


kernels.register_lowerer("rows", lower)
kernels.on_lowering(note_lowering)
