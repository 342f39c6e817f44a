"""The interpreter: runs an FX graph's nodes on padded tensors (``run``), each through the rule registered for its op
(``handles``; the rule families are rules_*.py), plus the generic rules: symbolic ints, pointwise ops, dropout and
factories. An op with no rule runs as is when no padding reaches it, else raises ``Unsupported``.
"""

from __future__ import annotations

import math
import operator

import torch

from .. import config
from .padded import PT, Ctx, Sz, Unsupported, agree, fresh_dims, plain, same_factors

# -- the interpreter -------------------------------------------------------------------------------------------------
HANDLERS = {}


def handles(*ops):
    def deco(fn):
        for op in ops:
            HANDLERS[op] = fn
        return fn

    return deco


aten = torch.ops.aten


def meta_val(node):
    return node.meta.get("val")


def _padded_leaf(a):
    if isinstance(a, PT):
        return a.t
    if isinstance(a, Sz):
        return a.padded
    if isinstance(a, Rt):
        raise Unsupported("a value computed from symbolic sizes where a size is expected")
    return a


def padded_args(a):
    """Arguments for a real call: padded tensors' values, Sz as their padded ints (size positions)."""
    return _map(a, _padded_leaf)


def _has_sz(a):
    if isinstance(a, (Sz, Rt)):
        return True
    if isinstance(a, (list, tuple)):
        return any(_has_sz(x) for x in a)
    return False


def _check(node, out, ctx):
    """The result's shape must be the node's symbolic shape at the buckets (a handler's own consistency check)."""
    val = meta_val(node)
    if isinstance(out, PT) and isinstance(val, torch.Tensor):
        want = tuple(
            ctx.size(s.node.expr).padded
            if isinstance(s, torch.SymInt) and isinstance(ctx.size(s.node.expr), Sz)
            else int(ctx.size(s.node.expr))
            if isinstance(s, torch.SymInt)
            else int(s)
            for s in val.shape
        )
        if tuple(out.t.shape) != want:
            raise Unsupported(f"{node.target}: padded result {tuple(out.t.shape)} != {want}")
        if out.t.dtype != val.dtype:
            raise Unsupported(f"{node.target}: result dtype {out.t.dtype} != {val.dtype}")


def run(gm, inputs, ctx: Ctx):
    """Runs gm's nodes on inputs (PT, Sz, ints...); returns its outputs (PT or plain values)."""
    env = {}
    it = iter(inputs)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(it)
        elif node.op == "get_attr":
            env[node] = plain(getattr(gm, node.target))
        elif node.op == "call_function":
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            try:
                env[node] = call_node(node, args, kwargs, ctx)
            except Unsupported as e:
                if config.get("buckets_debug"):
                    desc = [(tuple(a.t.shape), a.dims) if isinstance(a, PT) else a for a in flat_args(args, kwargs)]
                    raise Unsupported(f"{e} [{node.format_node()} with {desc}]") from None
                raise
            if isinstance(env[node], PT):
                _check(node, env[node], ctx)
        elif node.op == "output":
            return torch.fx.node.map_arg(node.args[0], lambda n: env[n])
    raise Unsupported("the graph has no output")


def call_node(node, args, kwargs, ctx):
    target = node.target
    h = HANDLERS.get(target)
    if h is None and isinstance(target, torch._ops.OpOverload):
        h = HANDLERS.get(target.overloadpacket)
        if h is None and torch.Tag.pointwise in target.tags:
            h = _pointwise
    if h is None:
        if not any(
            isinstance(a, (PT, Sz, Rt)) and (not isinstance(a, PT) or a.any_tainted) for a in flat_args(args, kwargs)
        ):
            # no padding reaches it and no symbolic size: it runs as is
            out = target(*padded_args(args), **padded_args(kwargs))
            return _wrap_plain(out)
        raise Unsupported(f"{target} has no bucketed rule")
    return h(node, args, kwargs, ctx)


def flat_args(args, kwargs):
    out = []
    _flatten(args, out)
    _flatten(kwargs, out)
    return out


def _flatten(a, out):
    if isinstance(a, (list, tuple)):
        for x in a:
            _flatten(x, out)
    elif isinstance(a, dict):
        for x in a.values():
            _flatten(x, out)
    else:
        out.append(a)


def _map(a, fn):
    """a with fn applied to each leaf of its lists, tuples and dicts (module-level: a recursive closure would be a
    reference cycle keeping device tensors alive past the capture)."""
    if isinstance(a, (list, tuple)):
        return type(a)(_map(x, fn) for x in a)
    if isinstance(a, dict):
        return {k: _map(v, fn) for k, v in a.items()}
    return fn(a)


def _wrap_plain(out):
    if isinstance(out, torch.Tensor):
        return plain(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap_plain(o) for o in out)
    return out


# -- symbolic ints -----------------------------------------------------------------------------------------------------
class Rt:
    """A float or bool computed from symbolic sizes (``2 / (s0 - 1)``): a runtime value, a 0-dim device tensor."""

    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


def rt_of(a):
    return a.rt if isinstance(a, Sz) else a.t if isinstance(a, Rt) else a


def _sym_binary(fn):
    def h(node, args, kwargs, ctx):
        val = meta_val(node)
        if isinstance(val, torch.SymInt):
            return ctx.size(val.node.expr)
        if any(isinstance(a, (Sz, Rt)) for a in args):
            out = fn(*(rt_of(a) for a in args))
            return Rt(out) if isinstance(out, torch.Tensor) else out
        return fn(*args)

    return h


for _op in (
    operator.mul,
    operator.add,
    operator.sub,
    operator.floordiv,
    operator.mod,
    operator.neg,
    operator.truediv,
    operator.pow,
    torch.sym_max,
    torch.sym_min,
):
    HANDLERS[_op] = _sym_binary(_op)


@handles(torch.sym_float, torch.sym_int, torch.sym_sqrt)
def _sym_cast(node, args, kwargs, ctx):
    a = args[0]
    if node.target is torch.sym_sqrt:
        return Rt(torch.sqrt(rt_of(a).double())) if isinstance(a, (Sz, Rt)) else math.sqrt(a)
    return a  # a size used as a value stays its runtime tensor (true division promotes it)


@handles(aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int, aten.sym_storage_offset.default)
def _sym_size(node, args, kwargs, ctx):
    val = meta_val(node)
    if isinstance(val, torch.SymInt):
        return ctx.size(val.node.expr)
    return int(val)


@handles(operator.getitem)
def _getitem(node, args, kwargs, ctx):
    return args[0][args[1]]


# -- pointwise ---------------------------------------------------------------------------------------------------------
def broadcast_dims(node, tensors, out, ctx, fresh=True):
    """Result factors of a broadcasting op: a dim takes the factors of the inputs that are full-size there (else,
    with fresh, those of the node's symbolic sizes)."""
    nd = out.dim()
    dims = []
    fresh = fresh_dims(ctx, meta_val(node), out) if fresh and isinstance(meta_val(node), torch.Tensor) else None
    for d in range(nd):
        chosen = None
        for x in tensors:
            k = d - (nd - x.t.dim())
            if k < 0 or x.t.shape[k] != out.shape[d]:
                continue
            f = x.dims[k]
            if any(v is not None for _, v in f):
                if chosen is not None and not same_factors(chosen, f):
                    raise Unsupported(f"{node.target}: inputs padded differently in dim {d}")
                chosen = f
        if chosen is None:
            chosen = fresh[d] if fresh is not None else ((out.shape[d], None),)
        dims.append(chosen)
    return dims


def _rt_leaf(a):
    if isinstance(a, Sz):
        return a.rt
    if isinstance(a, (PT, Rt)):
        return a.t
    return a


def _runtime_scalars(node, args, kwargs, ctx):
    """A symbolic size used as a value (x / s0, x * n): its true value as a device tensor."""
    return _map(args, _rt_leaf), _map(kwargs, _rt_leaf)


def _call_pointwise(node, args, kwargs, ctx):
    target = node.target
    a, k = _runtime_scalars(node, args, kwargs, ctx)
    if _has_sz(args) or _has_sz(kwargs):
        # a Scalar overload given a runtime value: call its Tensor overload
        name = target.overloadpacket
        dev = next((x.device for x in a if isinstance(x, torch.Tensor)), None)
        # clamp(x, 0, s - 1): its Tensor overload takes both bounds as tensors
        wrapped = [
            a[0],
            *(
                torch.full((), x, device=dev) if isinstance(x, (int, float)) and not isinstance(x, bool) else x
                for x in a[1:]
            ),
        ]
        for ov in ("Tensor", "Tensor_Tensor", "Scalar_Tensor", "Tensor_Scalar"):
            alt = getattr(name, ov, None) if hasattr(name, ov) else None
            if alt is not None:
                for cand in (a, wrapped):
                    try:
                        return alt(*cand, **k)
                    except (RuntimeError, TypeError):
                        continue
        raise Unsupported(f"{target} with a runtime size as a value")
    return target(*a, **k)


def harmonize(ctx, node, args, kwargs):
    """args and kwargs with their padded tensors laid out alike in each broadcast dim."""
    tensors = [x for x in flat_args(args, kwargs) if isinstance(x, PT)]
    if len(tensors) < 2:
        return args, kwargs
    nd = max(x.t.dim() for x in tensors)
    repl = {}
    for d in range(nd):
        ref = None
        for x in tensors:
            x = repl.get(id(x), x)
            k = d - (nd - x.t.dim())
            if k < 0 or not x.tainted(k):
                continue
            if ref is None:
                ref = (x, k)
                continue
            if not same_factors(ref[0].dims[ref[1]], x.dims[k]):
                a, b = agree(ctx, node, ref[0], ref[1], x, k)
                if a is not ref[0]:
                    repl[id(ref[0])] = a
                    for y in tensors:  # ref's original may be reached through other entries
                        if repl.get(id(y)) is ref[0]:
                            repl[id(y)] = a
                    ref = (a, ref[1])
                if b is not x:
                    repl[id(x)] = b
    if not repl:
        return args, kwargs

    def sub(a):
        return repl.get(id(a), a) if isinstance(a, PT) else a

    return _map(args, sub), _map(kwargs, sub)


def _pointwise(node, args, kwargs, ctx):
    args, kwargs = harmonize(ctx, node, args, kwargs)
    out = _call_pointwise(node, args, kwargs, ctx)
    tensors = [x for x in flat_args(args, kwargs) if isinstance(x, PT)]
    if isinstance(out, (tuple, list)):  # frexp: every result has the broadcast shape
        return tuple(PT(o, broadcast_dims(node, tensors, o, ctx)) for o in out)
    return PT(out, broadcast_dims(node, tensors, out, ctx))


for _op in (
    aten.where.self,
    aten.clone.default,
    aten.alias.default,
    aten._to_copy.default,
    aten.lift_fresh_copy.default,
    aten.full_like.default,
    aten.zeros_like.default,
    aten.ones_like.default,
    aten.empty_like.default,
    aten.masked_fill.Scalar,
    aten.masked_fill.Tensor,
    aten.clamp.default,
    aten.clamp.Tensor,
    torch.ops.prims.convert_element_type.default,
    aten.copy.default,
    aten.gelu_backward.default,
    aten.threshold_backward.default,
    aten.tanh_backward.default,
    aten.sigmoid_backward.default,
    aten.silu_backward.default,
    aten.native_dropout_backward.default,
    aten.zero.default,
    aten.fill.Scalar,
    aten.fill.Tensor,
):
    HANDLERS[_op] = _pointwise


@handles(aten.native_dropout.default)
def _dropout(node, args, kwargs, ctx):
    out, mask = node.target(*padded_args(args), **padded_args(kwargs))
    dims = args[0].dims
    return (PT(out, dims), PT(mask, dims))


# -- factories ---------------------------------------------------------------------------------------------------------
def _factory(node, args, kwargs, ctx):
    val = meta_val(node)
    if node.target in (aten.arange.start_step, aten.arange.start, aten.arange.default):
        start = args[0] if len(args) > 1 else 0
        if isinstance(start, Sz) or (len(args) > 2 and isinstance(args[2], Sz)):
            raise Unsupported(f"{node.target} with a symbolic start or step")
    elif node.target is aten.scalar_tensor.default and isinstance(args[0], (Sz, Rt)):
        # a size as a value (a count to divide by): its runtime value
        out = rt_of(args[0]).to(kwargs.get("dtype") or torch.get_default_dtype())
        return PT(out, [])
    else:
        sizes = {a.name for a in node.target._schema.arguments if "int" in str(a.type)}  # SymInt, SymInt[]
        named = list(zip((a.name for a in node.target._schema.arguments), args)) + list(kwargs.items())
        if any(_has_sz(v) and n not in sizes for n, v in named):
            raise Unsupported(f"{node.target} with a symbolic size as a value")
    out = node.target(*padded_args(args), **padded_args(kwargs))
    return PT(out, fresh_dims(ctx, val, out))


for _op in (
    aten.arange.start_step,
    aten.arange.start,
    aten.arange.default,
    aten.full.default,
    aten.zeros.default,
    aten.ones.default,
    aten.empty.memory_format,
    aten.scalar_tensor.default,
    aten.new_zeros.default,
    aten.new_ones.default,
    aten.new_full.default,
    aten.new_empty.default,
    aten.empty_strided.default,
    aten.empty_permuted.default,
    aten.new_empty_strided.default,
    torch.ops.prims.iota.default,
):
    HANDLERS[_op] = _factory


def arg_or(args, kwargs, i, name, default):
    return args[i] if len(args) > i else kwargs.get(name, default)
