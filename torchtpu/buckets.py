"""Bucketed sizes for symbolic graphs: one program per bucket instead of one per size.

A graph from ``torch.compile(dynamic=True)`` or ``mark_dynamic`` has symbolic sizes (``s0``). Each symbol's value is
rounded up to its bucket (``set_shape_buckets``: by default the next power of two), and the graph runs on tensors of
the bucket's sizes, *padded*: the valid values of a dimension of exact size ``n`` and padded size ``P`` are its first
``n`` positions, the rest (the padding) hold anything. :func:`run` interprets the graph node by node on such
tensors; where an op would read the padding into a valid position (a sum, a mean, a matmul's contraction, a softmax,
a layer norm's weight gradient, an ``index_put`` with accumulation, a pad after the end) it first replaces the padding
by the op's identity (``where``, NaN-safe) or moves values so that the valid ones stay in front. The true sizes are
a runtime input (a device tensor), so the masks, counts and positions depend on them and not on the program: it
is the same for every size of the bucket. An op it cannot prove right on padded inputs raises :class:`Unsupported`
(the graph is then captured per exact size, as without buckets, and the reason reported).

Dimensions that merge several padded ones (``view(B * T, H)`` of ``[B, T, H]``) keep their factors, so a mask
knows which of the merged positions are valid. Inputs arrive compact (a contiguous tensor of the exact size at the
start of a storage with the bucket's capacity): :func:`run` reads each through its flat storage and gathers it into
the padded layout (padding zeroed), and returns each output compact again (its exact values first in a flat buffer
of the bucket's capacity), so that the tensors the user sees have exact sizes and contiguous strides.

The interpreter runs only while a program is captured (csrc/graph/capture.h records the ops it issues); every
later call of the bucket runs the captured program, with no Python per op. It runs on CPU tensors too, which is
how tests check it against the graph run at the exact sizes.
"""
from __future__ import annotations

import math
import operator
import os

import torch

_POLICY = os.environ.get("TORCHTPU_SHAPE_BUCKETS", "pow2")
# Uploads (x.to("tpu")) of at most this many bytes keep their host copy while sizes are bucketed: a bucketed graph
# that takes one (a batch of a new length) pads it to its bucket's capacity on the host, with no read back.
UPLOAD_HOST_COPY_BYTES = 256 * 1024


def _sync_upload_copies() -> None:
    from . import _C, eager_buckets

    _C._set_upload_host_copies(UPLOAD_HOST_COPY_BYTES if enabled() else 0)
    eager_buckets.sync()


def set_shape_buckets(policy) -> None:
    """How symbolic sizes are bucketed: "pow2" (default: the next power of two), a list of increasing sizes (a size
    above the last is its own bucket), or None / "off" (every size is its own program, as before)."""
    global _POLICY
    if policy is None:
        policy = "off"
    if not isinstance(policy, str):
        policy = ",".join(str(int(s)) for s in policy)
    _POLICY = policy
    _sync_upload_copies()


def get_shape_buckets():
    return _POLICY


def enabled() -> bool:
    return _POLICY not in ("off", "", "0", "none")


def bucket(n: int) -> int:
    """The padded size of symbolic size n under the current policy."""
    if n <= 1 or not enabled():
        return n
    if _POLICY == "pow2":
        return 1 << (n - 1).bit_length()
    for b in (int(s) for s in _POLICY.split(",")):
        if n <= b:
            return b
    return n


def alone(b: int) -> bool:
    """Whether bucket b holds a single size (0, 1, 2 under "pow2"; a size past the policy's last bucket)."""
    return b <= 2 or bucket(b - 1) != b


class Unsupported(Exception):
    """The graph cannot run bucketed (the message says which op and why)."""


# -- sizes ----------------------------------------------------------------------------------------------------------
class Sz:
    """A symbolic size inside the interpreter: its sympy expression, its padded value, and its true value as a 0-dim
    int64 tensor (None when the expression has no bucketed symbol: then it is the static int `padded`)."""

    __slots__ = ("expr", "padded", "rt")

    def __init__(self, expr, padded, rt):
        self.expr, self.padded, self.rt = expr, padded, rt

    def __repr__(self):
        return f"Sz({self.expr}, padded={self.padded})"


class _Ctx:
    def __init__(self, symbols, values, sizes_tensor):
        self.symbols = symbols  # sympy Symbol -> index into sizes_tensor
        self.values = values  # sympy Symbol -> true int (capture time only: checks)
        self.sizes = sizes_tensor
        self.device = sizes_tensor.device
        self._rt = {}
        self._iota = {}
        first = {}
        self.rep = {s: first.setdefault(values[s], s) for s in sorted(values, key=str)}

    def static(self, s) -> bool:
        """A symbol whose bucket holds only its own value is a constant of the program."""
        return alone(bucket(self.values[s]))

    def sym_rt(self, s):
        if s not in self._rt:
            self._rt[s] = self.sizes[self.symbols[s]]
        return self._rt[s]

    def size(self, expr) -> Sz | int:
        """An expression of the graph's symbols as a Sz (an int when it has no symbol)."""
        import sympy

        expr = sympy.sympify(expr)
        # constants of the program; then symbols of equal values as one (the program's key holds which are equal)
        fixed = {s: (self.values[s] if self.static(s) else self.rep[s]) for s in expr.free_symbols
                 if self.static(s) or self.rep[s] != s}
        if fixed:
            expr = expr.subs(fixed)
        if not expr.free_symbols:
            return int(expr)
        _check_bounded(expr)
        padded = int(expr.subs({s: bucket(self.values[s]) for s in expr.free_symbols}))
        return Sz(expr, padded, self._eval(expr))

    def _eval(self, e):
        import sympy
        from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

        if isinstance(e, sympy.Symbol):
            return self.sym_rt(e)
        if isinstance(e, sympy.Integer):
            return int(e)
        if isinstance(e, sympy.Add):
            out = 0
            for a in e.args:
                out = out + self._eval(a)
            return out
        if isinstance(e, sympy.Mul):
            out = 1
            for a in e.args:
                out = out * self._eval(a)
            return out
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return self._eval(e.base) ** int(e.exp)
        if isinstance(e, FloorDiv):
            return torch.div(self._eval(e.args[0]), self._eval(e.args[1]), rounding_mode="floor")
        if isinstance(e, (Mod, PythonMod)):
            return torch.remainder(self._eval(e.args[0]), self._eval(e.args[1]))
        if isinstance(e, _min_max()):
            lo = isinstance(e, _min_max()[::2])
            out = self._eval(e.args[0])
            for a in e.args[1:]:
                v = self._eval(a)
                if isinstance(out, torch.Tensor) and isinstance(v, torch.Tensor):
                    out = torch.minimum(out, v) if lo else torch.maximum(out, v)
                elif isinstance(out, torch.Tensor) or isinstance(v, torch.Tensor):
                    t, n = (out, v) if isinstance(out, torch.Tensor) else (v, out)
                    out = t.clamp(max=n) if lo else t.clamp(min=n)
                else:
                    out = min(out, v) if lo else max(out, v)
            return out
        raise Unsupported(f"the size expression {e} ({type(e).__name__})")

    def iota(self, n):
        if n not in self._iota:
            self._iota[n] = torch.arange(n, device=self.device)
        return self._iota[n]


def _valid_expr(f):
    return None if f[1] is None else f[1].expr


def _same_factors(a, b) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and _valid_expr(x) == _valid_expr(y) for x, y in zip(a, b))


# -- padded tensors ---------------------------------------------------------------------------------------------------
class PT:
    """A padded tensor: its values at padded sizes and, per dim, its factors: (padded size, valid Sz or None) from
    the major to the minor; a dim whose factors all have valid None holds no padding."""

    __slots__ = ("t", "dims")

    def __init__(self, t, dims):
        assert len(dims) == t.dim(), (t.shape, dims)
        self.t, self.dims = t, tuple(tuple(d) for d in dims)

    def tainted(self, d) -> bool:
        return any(f[1] is not None for f in self.dims[d])

    @property
    def any_tainted(self):
        return any(self.tainted(d) for d in range(len(self.dims)))


def _plain(t):
    return PT(t, [((s, None),) for s in t.shape])


def _dim_mask(ctx, factors):
    """A bool vector over a dim's padded positions: True where every factor is within its valid size."""
    m = None
    for i, (p, v) in enumerate(factors):
        if v is None:
            continue
        f = ctx.iota(p) < v.rt
        shape = [1] * len(factors)
        shape[i] = p
        f = f.view(shape)
        m = f if m is None else m & f
    if m is None:
        return None
    return m.expand([p for p, _ in factors]).reshape(-1)


def _mask(ctx, x: PT, dims=None):
    """A bool tensor broadcastable to x: True at valid positions of the given dims (default: all)."""
    dims = range(x.t.dim()) if dims is None else dims
    m = None
    for d in dims:
        dm = _dim_mask(ctx, x.dims[d])
        if dm is None:
            continue
        shape = [1] * x.t.dim()
        shape[d] = dm.numel()
        dm = dm.view(shape)
        m = dm if m is None else m & dm
    return m


def _fill(ctx, x: PT, value, dims=None) -> torch.Tensor:
    """x's values with the padding of the given dims replaced by value."""
    m = _mask(ctx, x, dims)
    if m is None:
        return x.t
    return torch.where(m, x.t, torch.full((), value, dtype=x.t.dtype, device=x.t.device))


def _fresh_dims(ctx, node_val, t):
    """Factors of an op's result whose dims are new (not views of an input's): from its symbolic sizes; a tainted dim
    holds its valid values first."""
    dims = []
    for s, p in zip(node_val.shape, t.shape):
        sz = ctx.size(s.node.expr) if isinstance(s, torch.SymInt) else int(s)
        dims.append(((p, sz if isinstance(sz, Sz) else None),))
    return dims


# -- compact <-> padded ------------------------------------------------------------------------------------------------
def pad_input(ctx, flat: torch.Tensor, sizes) -> PT:
    """A compact tensor of exact sizes `sizes` (Sz or int), read from the flat buffer of its storage, as a padded
    tensor (the padding zeroed)."""
    return _pad_dims(ctx, flat, [((s.padded, s),) if isinstance(s, Sz) else ((s, None),) for s in sizes])


def _pad_dims(ctx, flat: torch.Tensor, dims) -> PT:
    """The compact values in flat laid out padded with the given factors per dim (the padding zeroed)."""
    padded = [math.prod(p for p, _ in fs) for fs in dims]
    if not dims:
        return PT(flat[0], [])
    factors = [f for fs in dims for f in fs]
    idx, stride = None, 1
    fshape = [p for p, _ in factors]
    for k in range(len(factors) - 1, -1, -1):
        p, v = factors[k]
        shape = [1] * len(factors)
        shape[k] = p
        term = ctx.iota(p).view(shape) * stride
        idx = term if idx is None else idx + term
        stride = stride * (v.rt if v is not None else p)
    pt = PT(torch.zeros((), dtype=flat.dtype, device=flat.device).expand(padded), dims)
    m = _mask(ctx, pt)
    idx = idx.expand(fshape).reshape(padded)
    if m is not None:
        idx = torch.where(m, idx, 0)
    vals = flat[idx.reshape(-1).clamp(0, flat.numel() - 1)].view(padded)
    if m is not None:
        vals = torch.where(m, vals, torch.zeros((), dtype=vals.dtype, device=vals.device))
    return PT(vals, dims)


def _conform(ctx, x: PT, d, factors) -> PT:
    """x with dim d laid out by the given factors (same valid count), its other dims as they are."""
    dims = list(x.dims)
    dims[d] = tuple(factors)
    return _pad_dims(ctx, compact_output(ctx, x), dims)


def compact_output(ctx, x: PT) -> torch.Tensor:
    """x's valid values in row-major order of its exact sizes, first in a flat tensor of x's padded numel (a dim
    merged from several padded ones is unravelled by its factors)."""
    n = x.t.numel()
    if n == 0 or x.t.dim() == 0:
        return x.t.reshape(-1)
    factors = [f for fs in x.dims for f in fs]
    rest, src, pstride = ctx.iota(n), 0, 1
    for k in range(len(factors) - 1, -1, -1):
        p, v = factors[k]
        e = v.rt if v is not None else p
        if k == 0:
            i_k = rest
        else:
            i_k = torch.remainder(rest, e)
            rest = torch.div(rest, e, rounding_mode="floor")
        src = src + i_k * pstride
        pstride *= p
    return x.t.reshape(-1)[src.clamp(0, n - 1)]


def _repack(ctx, x: PT, sizes) -> PT:
    """x's values laid out anew for exact sizes `sizes` (Sz or int per dim): compacted, then padded again."""
    return pad_input(ctx, compact_output(ctx, x), sizes)


def _agree(ctx, node, a: PT, da, b: PT, db):
    """a and b with their dims da and db laid out alike: a single-prefix layout is brought to the other's factors
    (a merged B*T dim that arrived compact, next to one merged from padded [B, T])."""
    fa, fb = a.dims[da], b.dims[db]
    if not (a.tainted(da) and b.tainted(db)) or _same_factors(fa, fb):
        return a, b
    if _count_expr(fa) != _count_expr(fb):
        raise Unsupported(f"{node.target}: dims of different valid sizes")
    if len(fa) == 1:
        return _conform(ctx, a, da, fb), b
    if len(fb) == 1:
        return a, _conform(ctx, b, db, fa)
    raise Unsupported(f"{node.target}: inputs padded differently")


def _count_expr(factors):
    import sympy

    n = sympy.Integer(1)
    for p, v in factors:
        n = n * (v.expr if v is not None else p)
    return sympy.expand(n)


# -- the interpreter -------------------------------------------------------------------------------------------------
_HANDLERS = {}


def _handles(*ops):
    def deco(fn):
        for op in ops:
            _HANDLERS[op] = fn
        return fn

    return deco


aten = torch.ops.aten


def _val(node):
    return node.meta.get("val")


def _padded_leaf(a):
    if isinstance(a, PT):
        return a.t
    if isinstance(a, Sz):
        return a.padded
    if isinstance(a, Rt):
        raise Unsupported("a value computed from symbolic sizes where a size is expected")
    return a


def _padded(a):
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
    val = _val(node)
    if isinstance(out, PT) and isinstance(val, torch.Tensor):
        want = tuple(ctx.size(s.node.expr).padded if isinstance(s, torch.SymInt) and
                     isinstance(ctx.size(s.node.expr), Sz) else int(ctx.size(s.node.expr))
                     if isinstance(s, torch.SymInt) else int(s) for s in val.shape)
        if tuple(out.t.shape) != want:
            raise Unsupported(f"{node.target}: padded result {tuple(out.t.shape)} != {want}")
        if out.t.dtype != val.dtype:
            raise Unsupported(f"{node.target}: result dtype {out.t.dtype} != {val.dtype}")


def run(gm, inputs, ctx: _Ctx):
    """Runs gm's nodes on inputs (PT, Sz, ints...); returns its outputs (PT or plain values)."""
    env = {}
    it = iter(inputs)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(it)
        elif node.op == "get_attr":
            env[node] = _plain(getattr(gm, node.target))
        elif node.op == "call_function":
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            try:
                env[node] = _call(node, args, kwargs, ctx)
            except Unsupported as e:
                if os.environ.get("TORCHTPU_BUCKETS_DEBUG"):
                    desc = [(tuple(a.t.shape), a.dims) if isinstance(a, PT) else a for a in _flat(args, kwargs)]
                    raise Unsupported(f"{e} [{node.format_node()} with {desc}]") from None
                raise
            if isinstance(env[node], PT):
                _check(node, env[node], ctx)
        elif node.op == "output":
            return torch.fx.node.map_arg(node.args[0], lambda n: env[n])
    raise Unsupported("the graph has no output")


def _call(node, args, kwargs, ctx):
    target = node.target
    h = _HANDLERS.get(target)
    if h is None and isinstance(target, torch._ops.OpOverload):
        h = _HANDLERS.get(target.overloadpacket)
        if h is None and torch.Tag.pointwise in target.tags:
            h = _pointwise
    if h is None:
        if not any(isinstance(a, (PT, Sz, Rt)) and (not isinstance(a, PT) or a.any_tainted)
                   for a in _flat(args, kwargs)):
            # no padding reaches it and no symbolic size: it runs as is
            out = target(*_padded(args), **_padded(kwargs))
            return _wrap_plain(out)
        raise Unsupported(f"{target} has no bucketed rule")
    return h(node, args, kwargs, ctx)


def _flat(args, kwargs):
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
        return _plain(out)
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap_plain(o) for o in out)
    return out


# -- symbolic ints -----------------------------------------------------------------------------------------------------
class Rt:
    """A float or bool computed from symbolic sizes (``2 / (s0 - 1)``): a runtime value, a 0-dim device tensor."""

    __slots__ = ("t",)

    def __init__(self, t):
        self.t = t


def _rt_of(a):
    return a.rt if isinstance(a, Sz) else a.t if isinstance(a, Rt) else a


def _sym_binary(fn):
    def h(node, args, kwargs, ctx):
        val = _val(node)
        if isinstance(val, torch.SymInt):
            return ctx.size(val.node.expr)
        if any(isinstance(a, (Sz, Rt)) for a in args):
            out = fn(*(_rt_of(a) for a in args))
            return Rt(out) if isinstance(out, torch.Tensor) else out
        return fn(*args)

    return h


for _op in (operator.mul, operator.add, operator.sub, operator.floordiv, operator.mod, operator.neg,
            operator.truediv, operator.pow, torch.sym_max, torch.sym_min):
    _HANDLERS[_op] = _sym_binary(_op)


@_handles(torch.sym_float, torch.sym_int, torch.sym_sqrt)
def _sym_cast(node, args, kwargs, ctx):
    a = args[0]
    if node.target is torch.sym_sqrt:
        return Rt(torch.sqrt(_rt_of(a).double())) if isinstance(a, (Sz, Rt)) else math.sqrt(a)
    return a  # a size used as a value stays its runtime tensor (true division promotes it)


@_handles(aten.sym_size.int, aten.sym_numel.default, aten.sym_stride.int, aten.sym_storage_offset.default)
def _sym_size(node, args, kwargs, ctx):
    val = _val(node)
    if isinstance(val, torch.SymInt):
        return ctx.size(val.node.expr)
    return int(val)


@_handles(operator.getitem)
def _getitem(node, args, kwargs, ctx):
    return args[0][args[1]]


# -- pointwise ---------------------------------------------------------------------------------------------------------
def _broadcast_dims(node, tensors, out, ctx, fresh=True):
    """Result factors of a broadcasting op: a dim takes the factors of the inputs that are full-size there (else,
    with fresh, those of the node's symbolic sizes)."""
    nd = out.dim()
    dims = []
    fresh = _fresh_dims(ctx, _val(node), out) if fresh and isinstance(_val(node), torch.Tensor) else None
    for d in range(nd):
        chosen = None
        for x in tensors:
            k = d - (nd - x.t.dim())
            if k < 0 or x.t.shape[k] != out.shape[d]:
                continue
            f = x.dims[k]
            if any(v is not None for _, v in f):
                if chosen is not None and not _same_factors(chosen, f):
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
        wrapped = [a[0], *(torch.full((), x, device=dev) if isinstance(x, (int, float)) and not isinstance(x, bool)
                           else x for x in a[1:])]
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


def _harmonize(ctx, node, args, kwargs):
    """args and kwargs with their padded tensors laid out alike in each broadcast dim."""
    tensors = [x for x in _flat(args, kwargs) if isinstance(x, PT)]
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
            if not _same_factors(ref[0].dims[ref[1]], x.dims[k]):
                a, b = _agree(ctx, node, ref[0], ref[1], x, k)
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
    args, kwargs = _harmonize(ctx, node, args, kwargs)
    out = _call_pointwise(node, args, kwargs, ctx)
    tensors = [x for x in _flat(args, kwargs) if isinstance(x, PT)]
    if isinstance(out, (tuple, list)):  # frexp: every result has the broadcast shape
        return tuple(PT(o, _broadcast_dims(node, tensors, o, ctx)) for o in out)
    return PT(out, _broadcast_dims(node, tensors, out, ctx))


for _op in (aten.where.self, aten.clone.default, aten.alias.default, aten._to_copy.default,
            aten.lift_fresh_copy.default, aten.full_like.default, aten.zeros_like.default, aten.ones_like.default,
            aten.empty_like.default, aten.masked_fill.Scalar, aten.masked_fill.Tensor, aten.clamp.default,
            aten.clamp.Tensor, torch.ops.prims.convert_element_type.default, aten.copy.default,
            aten.gelu_backward.default, aten.threshold_backward.default, aten.tanh_backward.default,
            aten.sigmoid_backward.default, aten.silu_backward.default, aten.native_dropout_backward.default,
            aten.zero.default, aten.fill.Scalar, aten.fill.Tensor):
    _HANDLERS[_op] = _pointwise


@_handles(aten.native_dropout.default)
def _dropout(node, args, kwargs, ctx):
    out, mask = node.target(*_padded(args), **_padded(kwargs))
    dims = args[0].dims
    return (PT(out, dims), PT(mask, dims))


# -- factories ---------------------------------------------------------------------------------------------------------
def _factory(node, args, kwargs, ctx):
    val = _val(node)
    if node.target in (aten.arange.start_step, aten.arange.start, aten.arange.default):
        start = args[0] if len(args) > 1 else 0
        if isinstance(start, Sz) or (len(args) > 2 and isinstance(args[2], Sz)):
            raise Unsupported(f"{node.target} with a symbolic start or step")
    elif node.target is aten.scalar_tensor.default and isinstance(args[0], (Sz, Rt)):
        # a size as a value (a count to divide by): its runtime value
        out = _rt_of(args[0]).to(kwargs.get("dtype") or torch.get_default_dtype())
        return PT(out, [])
    else:
        sizes = {a.name for a in node.target._schema.arguments if "int" in str(a.type)}  # SymInt, SymInt[]
        named = list(zip((a.name for a in node.target._schema.arguments), args)) + list(kwargs.items())
        if any(_has_sz(v) and n not in sizes for n, v in named):
            raise Unsupported(f"{node.target} with a symbolic size as a value")
    out = node.target(*_padded(args), **_padded(kwargs))
    return PT(out, _fresh_dims(ctx, val, out))


for _op in (aten.arange.start_step, aten.arange.start, aten.arange.default, aten.full.default, aten.zeros.default,
            aten.ones.default, aten.empty.memory_format, aten.scalar_tensor.default, aten.new_zeros.default,
            aten.new_ones.default, aten.new_full.default, aten.new_empty.default, aten.empty_strided.default,
            aten.empty_permuted.default, aten.new_empty_strided.default, torch.ops.prims.iota.default):
    _HANDLERS[_op] = _factory


# -- views ---------------------------------------------------------------------------------------------------------------
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
        out = x.t.reshape(_padded(args[1]))
        return PT(out, _regroup(node, x.dims, out.shape))
    except (Unsupported, RuntimeError):
        # the padding does not split along the result's dims (a merged B*T dim read as [B, T]): lay it out anew
        return _repack(ctx, x, [ctx.size(_expr(s)) for s in _val(node).shape])


for _op in (aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default):
    _HANDLERS[_op] = _view


@_handles(aten.permute.default, aten.permute_copy.default)
def _permute(node, args, kwargs, ctx):
    x, perm = args[0], [p % max(args[0].t.dim(), 1) for p in args[1]]
    return PT(node.target(x.t, perm), [x.dims[p] for p in perm])


@_handles(aten.transpose.int)
def _transpose(node, args, kwargs, ctx):
    x, a, b = args
    dims = list(x.dims)
    a, b = a % x.t.dim(), b % x.t.dim()
    dims[a], dims[b] = dims[b], dims[a]
    return PT(node.target(x.t, a, b), dims)


@_handles(aten.t.default)
def _t(node, args, kwargs, ctx):
    x = args[0]
    return PT(x.t.t(), list(reversed(x.dims)))


@_handles(aten.unsqueeze.default)
def _unsqueeze(node, args, kwargs, ctx):
    x, d = args
    d = d % (x.t.dim() + 1)
    dims = list(x.dims)
    dims.insert(d, ((1, None),))
    return PT(x.t.unsqueeze(d), dims)


@_handles(aten.squeeze.dims, aten.squeeze.dim, aten.squeeze.default)
def _squeeze(node, args, kwargs, ctx):
    x = args[0]
    out = node.target(*_padded(args))
    if node.target is aten.squeeze.default:
        drop = [d for d in range(x.t.dim()) if x.t.shape[d] == 1]
    else:
        ds = args[1] if isinstance(args[1], (list, tuple)) else [args[1]]
        drop = [d % max(x.t.dim(), 1) for d in ds if x.t.shape[d % max(x.t.dim(), 1)] == 1]
    return PT(out, [f for d, f in enumerate(x.dims) if d not in drop])


def _diag_dims(node, x, args, kwargs):
    offset = _arg(args, kwargs, 1, "offset", 0)
    d1 = _arg(args, kwargs, 2, "dim1", 0) % max(x.t.dim(), 1)
    d2 = _arg(args, kwargs, 3, "dim2", 1) % max(x.t.dim(), 1)
    if isinstance(offset, Sz):
        raise Unsupported(f"{node.target} at a symbolic offset")
    return offset, d1, d2


@_handles(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(node, args, kwargs, ctx):
    """With both dims laid out valid-first, the padded diagonal's first min(s1, s2 - offset) entries are the exact
    diagonal (its later ones lie in a padded row or column)."""
    offset, d1, d2 = _diag_dims(node, args[0], args, kwargs)
    x = _prefixed(ctx, args[0], [d1, d2])
    out = node.target(x.t, offset, d1, d2)
    dims = [f for d, f in enumerate(x.dims) if d not in (d1, d2)] + [_fresh_dims(ctx, _val(node), out)[-1]]
    return PT(out, dims)


@_handles(aten.diagonal_scatter.default)
def _diagonal_scatter(node, args, kwargs, ctx):
    """The source's padding lands on diagonal positions in a padded row or column of the base."""
    base, src = args[0], args[1]
    offset, d1, d2 = _diag_dims(node, base, [base] + list(args[2:]), kwargs)
    base = _prefixed(ctx, base, [d1, d2])
    rest = [f for d, f in enumerate(base.dims) if d not in (d1, d2)]
    if not all(_same_factors(a, b) for a, b in zip(rest, src.dims[:-1])) or len(src.dims[-1]) != 1:
        raise Unsupported(f"{node.target} of a source padded unlike the base")
    # the source may be padded to its own bucket: its valid prefix (the exact diagonal) fits the padded diagonal
    n = base.t.diagonal(offset, d1, d2).shape[-1]
    st = src.t.narrow(-1, 0, n) if src.t.shape[-1] >= n else torch.nn.functional.pad(src.t, (0, n - src.t.shape[-1]))
    return PT(node.target(base.t, st, offset, d1, d2), base.dims)


@_handles(aten.unfold.default)
def _unfold(node, args, kwargs, ctx):
    """Windows along a dim laid out valid-first: the valid windows read valid positions only."""
    x, dim, size, step = args[0], args[1] % max(args[0].t.dim(), 1), args[2], args[3]
    if isinstance(size, Sz) or isinstance(step, Sz):
        raise Unsupported(f"{node.target} with a symbolic window")
    x = _prefixed(ctx, x, [dim])
    out = x.t.unfold(dim, size, step)
    dims = list(x.dims)
    dims[dim] = _fresh_dims(ctx, _val(node), out)[dim] if x.tainted(dim) else ((out.shape[dim], None),)
    return PT(out, dims + [((size, None),)])


def _spectral(node, args, kwargs, ctx):
    """An FFT over unpadded dims transforms each of the other dims' positions on its own (the spectrogram of a
    varying number of frames); over a padded dim the length itself would change."""
    x, fdims = args[0], [d % max(args[0].t.dim(), 1) for d in args[1]]
    if any(x.tainted(d) for d in fdims):
        raise Unsupported(f"{node.target} along a padded dim")
    out = node.target(*_padded(args), **_padded(kwargs))
    return PT(out, [((out.shape[d], None),) if d in fdims else x.dims[d] for d in range(out.dim())])


for _op in (aten._fft_r2c.default, aten._fft_c2c.default, aten._fft_c2r.default):
    _HANDLERS[_op] = _spectral


@_handles(aten._conj.default, aten.conj_physical.default, aten._neg_view.default)
def _conj(node, args, kwargs, ctx):
    return PT(node.target(args[0].t), args[0].dims)


@_handles(aten.view_as_real.default)
def _view_as_real(node, args, kwargs, ctx):
    return PT(aten.view_as_real.default(args[0].t), list(args[0].dims) + [((2, None),)])


@_handles(aten.view_as_complex.default)
def _view_as_complex(node, args, kwargs, ctx):
    x = args[0]
    if x.tainted(x.t.dim() - 1):
        raise Unsupported(f"{node.target} of a padded last dim")
    t = x.t if x.t.stride(-1) == 1 and all(st % 2 == 0 for st in x.t.stride()[:-1]) else x.t.contiguous()
    return PT(aten.view_as_complex.default(t), list(x.dims[:-1]))


@_handles(aten.repeat.default)
def _repeat(node, args, kwargs, ctx):
    """Tiling: a padded dim repeated r times is r padded blocks (a dim padded inside)."""
    x, reps = args[0], list(args[1])
    out = x.t.repeat(_padded(reps))
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


@_handles(aten.expand.default, aten.expand_copy.default)
def _expand(node, args, kwargs, ctx):
    x = args[0]
    out = node.target(*_padded(args))
    fresh = _fresh_dims(ctx, _val(node), out)
    nd, dims = out.dim(), []
    for d in range(nd):
        k = d - (nd - x.t.dim())
        if k >= 0 and x.t.shape[k] == out.shape[d]:
            dims.append(x.dims[k])
        else:
            dims.append(fresh[d])
    return PT(out, dims)


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


def _count(ctx, x, rdims):
    n = 1
    for d in rdims:
        for p, v in x.dims[d]:
            n = n * (v.rt if v is not None else p)
    return n


@_handles(aten.sum.dim_IntList, aten.sum.default, aten.amax.default, aten.amin.default, aten.any.dim,
          aten.any.dims, aten.any.default, aten.all.dim, aten.all.default, aten.prod.dim_int, aten.mean.dim,
          aten.mean.default, aten.argmax.default, aten.argmin.default, aten.max.dim, aten.min.dim, aten.prod.default,
          aten.max.default, aten.min.default)
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
    xs = _fill(ctx, x, ident, rdims) if any(x.tainted(d) for d in rdims) else x.t
    if name == "mean":
        if not any(x.tainted(d) for d in rdims):
            out = node.target(xs, *_padded(args[1:]), **_padded(kwargs))
        else:
            dtype = kwargs.get("dtype") or (args[3] if len(args) > 3 else None) or x.t.dtype
            s = torch.sum(xs.to(dtype), dim=rdims, keepdim=keepdim)
            out = (s / _count(ctx, x, rdims)).to(dtype)
        return PT(out, _kept(x, rdims, keepdim))
    out = node.target(xs, *_padded(args[1:]), **_padded(kwargs))
    if isinstance(out, tuple):
        return tuple(PT(o, _kept(x, rdims, keepdim)) for o in out)
    return PT(out, _kept(x, rdims, keepdim))


@_handles(aten.linalg_vector_norm.default)
def _vector_norm(node, args, kwargs, ctx):
    """A p-norm reads the padding as a zero (|0|^p adds nothing, max |x| is not raised); a negative order or -inf
    (|x|^p of 0 is inf, min |x| would be 0) reads it as inf instead."""
    x = args[0]
    order = _arg(args, kwargs, 1, "ord", 2)
    if isinstance(order, (Sz, Rt)):
        raise Unsupported(f"{node.target} with a runtime order")
    rdims = _reduce_dims(x, _arg(args, kwargs, 2, "dim", None))
    keepdim = _arg(args, kwargs, 3, "keepdim", False)
    xs = _fill(ctx, x, math.inf if order < 0 else 0, rdims) if any(x.tainted(d) for d in rdims) else x.t
    return PT(node.target(xs, *_padded(args[1:]), **_padded(kwargs)), _kept(x, rdims, keepdim))


@_handles(aten.var.correction, aten.var_mean.correction)
def _var(node, args, kwargs, ctx):
    x = args[0]
    dims_arg = args[1] if len(args) > 1 else kwargs.get("dim")
    correction = kwargs.get("correction", 1 if len(args) < 3 else args[2])
    correction = 1 if correction is None else correction
    keepdim = kwargs.get("keepdim", False)
    rdims = _reduce_dims(x, dims_arg)
    if not any(x.tainted(d) for d in rdims):
        out = node.target(*_padded(args), **_padded(kwargs))
        kept = _kept(x, rdims, keepdim)
        return tuple(PT(o, kept) for o in out) if isinstance(out, tuple) else PT(out, kept)
    n = _count(ctx, x, rdims)
    xs = _fill(ctx, x, 0, rdims)
    mean = torch.sum(xs, dim=rdims, keepdim=True) / n
    dev = _fill(ctx, PT(x.t - mean, x.dims), 0, rdims)
    var = torch.sum(dev * dev, dim=rdims, keepdim=keepdim) / (n - correction)
    kept = _kept(x, rdims, keepdim)
    if node.target is aten.var_mean.correction:
        return PT(var, kept), PT(mean if keepdim else mean.squeeze(rdims), kept)
    return PT(var, kept)


@_handles(aten.cumsum.default, aten.cumprod.default, aten.cummax.default, aten.cummin.default,
          aten.logcumsumexp.default)
def _scan(node, args, kwargs, ctx):
    """A scan along a dim reads only earlier positions: the padding, after the valid values, is never read into
    them, unless the dim merges several padded ones."""
    x, dim = args[0], args[1] % max(args[0].t.dim(), 1)
    if x.tainted(dim) and len(x.dims[dim]) != 1:
        raise Unsupported(f"{node.target} along a merged padded dim")
    out = node.target(*_padded(args), **_padded(kwargs))
    return tuple(PT(o, x.dims) for o in out) if isinstance(out, tuple) else PT(out, x.dims)


@_handles(aten.topk.default, aten.sort.default, aten.sort.stable)
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
        desc = kwargs.get("descending", False) if node.target is aten.sort.stable else \
            _arg(args, kwargs, 2, "descending", False)
        return _sort_padded(ctx, x, dim, desc)
    if x.tainted(dim):
        # the k first of a sort (Dynamo guards k <= the true size, as PyTorch raises past it)
        values, indices = _sort_padded(ctx, x, dim, _arg(args, kwargs, 3, "largest", True))
        k = args[1]
        dims = [((k, None),) if d == dim else f for d, f in enumerate(values.dims)]
        return PT(values.t.narrow(dim, 0, k), dims), PT(indices.t.narrow(dim, 0, k), dims)
    out = node.target(*_padded(args), **_padded(kwargs))
    dims = [((o, None),) if d == dim else f for d, (f, o) in enumerate(zip(x.dims, out[0].shape))]
    return tuple(PT(o, dims) for o in out)


def _sort_padded(ctx, x, dim, desc):
    """A sort along a padded dim (a router grouping its tokens by expert; topk's first k): the padding becomes values
    that sort after every valid one, in a stable sort (valid ones first among equals), so the valid values come first,
    sorted, and their indices are exact coordinates (the dim laid out compact first)."""
    x = _prefixed(ctx, x, [dim])
    dt = x.t.dtype
    if dt == torch.bool:
        fill = not desc
    elif dt.is_floating_point:
        fill = -math.inf if desc else math.nan  # NaN sorts after +inf ascending (a valid NaN stays ahead: stable)
    else:
        fill = torch.iinfo(dt).min if desc else torch.iinfo(dt).max
    values, indices = torch.sort(_fill(ctx, x, fill, [dim]), dim=dim, descending=desc, stable=True)
    return PT(values, x.dims), PT(indices, x.dims)


@_handles(aten.histc.default)
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
        xt = _fill(ctx, x, math.inf)
    else:
        xt = x.t
    out = torch.histc(xt, bins, lo, hi)
    return _plain(out.to(dt) if out.dtype != dt else out)


@_handles(aten._grouped_mm.default)
def _grouped_mm(node, args, kwargs, ctx):
    """Grouped matmul (MoE experts): the groups' rows (or, for a weight gradient, the contracted dim) follow `offs`,
    whose last offset is the valid count; the padding is zeroed (what a contraction over it adds is 0), the rows
    past the valid ones are padding of the result. Padded dims are laid out with their valid values first."""
    tensors = []
    for a in args:
        if isinstance(a, PT):
            a = _prefixed(ctx, a, [d for d in range(a.t.dim()) if a.tainted(d)])
            a = PT(_fill(ctx, a, 0), a.dims)
        tensors.append(a)
    out = node.target(*_padded(tensors), **_padded(kwargs))
    return PT(out, _fresh_dims(ctx, _val(node), out))


@_handles(aten.flip.default)
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


@_handles(aten.tril.default, aten.triu.default)
def _triangle(node, args, kwargs, ctx):
    """tril/triu keep positions by (row, column): right on the padded layout when both dims keep their valid values
    first (a causal mask's ones(L, L).tril())."""
    x = args[0]
    if x.t.dim() < 2 or any(len(x.dims[d]) != 1 for d in (-2, -1)):
        raise Unsupported(f"{node.target} over merged padded dims")
    return PT(node.target(*_padded(args), **_padded(kwargs)), x.dims)


# -- matmuls ------------------------------------------------------------------------------------------------------------
def _contract(ctx, node, a, b, ka, kb):
    """a and b with the padding of their contracted dims (a's ka, b's kb) zeroed."""
    a, b = _agree(ctx, node, a, ka, b, kb)
    fa, fb = a.dims[ka], b.dims[kb]
    ta, tb = a.tainted(ka), b.tainted(kb)
    if ta and tb and not _same_factors(fa, fb):
        raise Unsupported(f"{node.target}: contracted dims padded differently")
    if not (ta or tb):
        return a.t, b.t
    f = fa if ta else fb
    return (_fill(ctx, PT(a.t, [f if d == ka else ((s, None),) for d, s in enumerate(a.t.shape)]), 0, [ka]),
            _fill(ctx, PT(b.t, [f if d == kb else ((s, None),) for d, s in enumerate(b.t.shape)]), 0, [kb]))


@_handles(aten.mm.default)
def _mm(node, args, kwargs, ctx):
    a, b = args
    at_, bt = _contract(ctx, node, a, b, 1, 0)
    return PT(torch.mm(at_, bt), [a.dims[0], b.dims[1]])


@_handles(aten.bmm.default)
def _bmm(node, args, kwargs, ctx):
    a, b = args
    at_, bt = _contract(ctx, node, a, b, 2, 1)
    batch = a.dims[0] if a.tainted(0) else b.dims[0]
    return PT(torch.bmm(at_, bt), [batch, a.dims[1], b.dims[2]])


@_handles(aten.addmm.default)
def _addmm(node, args, kwargs, ctx):
    bias, a, b = args[:3]
    at_, bt = _contract(ctx, node, a, b, 1, 0)
    out = aten.addmm.default(bias.t, at_, bt, *args[3:], **kwargs)
    prod = PT(out, [a.dims[0], b.dims[1]])
    return PT(out, _broadcast_dims(node, [prod, bias], out, ctx))


# -- softmax ------------------------------------------------------------------------------------------------------------
@_handles(aten._softmax.default, aten._log_softmax.default)
def _softmax(node, args, kwargs, ctx):
    x, dim = args[0], args[1] % max(args[0].t.dim(), 1)
    xs = _fill(ctx, x, -math.inf, [dim]) if x.tainted(dim) else x.t
    return PT(node.target(xs, dim, *args[2:]), x.dims)


@_handles(aten._softmax_backward_data.default, aten._log_softmax_backward_data.default)
def _softmax_backward(node, args, kwargs, ctx):
    g, out, dim = args[0], args[1], args[2] % max(args[0].t.dim(), 1)
    if g.tainted(dim) or out.tainted(dim):
        gt = _fill(ctx, g, 0, [dim])
        ot = _fill(ctx, out, 0 if node.target is aten._softmax_backward_data.default else -math.inf, [dim])
    else:
        gt, ot = g.t, out.t
    res = node.target(gt, ot, dim, *args[3:])
    return PT(res, _broadcast_dims(node, [g, out], res, ctx))


# -- norms ---------------------------------------------------------------------------------------------------------------
@_handles(aten.native_layer_norm.default)
def _layer_norm(node, args, kwargs, ctx):
    x, shape = args[0], args[1]
    k = x.t.dim() - len(shape)
    if any(x.tainted(d) for d in range(k, x.t.dim())):
        raise Unsupported("native_layer_norm over a padded dim")
    out, mean, rstd = node.target(*_padded(args))
    lead = list(x.dims[:k]) + [((1, None),)] * len(shape)
    return PT(out, x.dims), PT(mean, lead), PT(rstd, lead)


@_handles(aten.native_layer_norm_backward.default)
def _layer_norm_backward(node, args, kwargs, ctx):
    go, x, shape, mean, rstd, w, b, mask = args
    k = x.t.dim() - len(shape)
    if any(x.tainted(d) for d in range(k, x.t.dim())):
        raise Unsupported("native_layer_norm_backward over a padded dim")
    lead = list(range(k))
    # the weight and bias gradients sum over the leading dims: the padding contributes exactly 0
    gi, gw, gb = node.target(_fill(ctx, go, 0, lead), _fill(ctx, x, 0, lead), list(shape), _fill(ctx, mean, 0, lead),
                             _fill(ctx, rstd, 1, lead), _padded(w), _padded(b), mask)
    return (PT(gi, x.dims) if gi is not None else None, _plain(gw) if gw is not None else None,
            _plain(gb) if gb is not None else None)


# -- indexing ------------------------------------------------------------------------------------------------------------
def _prefix(x, d) -> bool:
    """Whether dim d of x keeps its valid values first: only its outermost factor is padded, so a valid (exact)
    coordinate is its padded position. A merged dim padded inside (`[B, T]` flattened with T padded) is not: exact
    position b * T + t sits at b * T_bucket + t."""
    return all(f[1] is None for f in x.dims[d][1:])


def _prefixed(ctx, x: PT, dims) -> PT:
    """x with each of the given dims laid out with its valid values first (a merged dim padded inside, `[B*T]` of
    `[B, T]` with T padded, becomes compact: exact coordinate c at position c), so that an index *value*, which
    counts exact coordinates as in the user's program, reads or writes the right position."""
    for d in dims:
        if not _prefix(x, d):
            x = _conform(ctx, x, d, ((x.t.shape[d], _count_sz(ctx, x.dims[d])),))
    return x


def _wrapped(ctx, x: PT, indices):
    """Advanced indices with negative values counted from the true end of a padded dim (as PyTorch wraps them by the
    exact size, not the padded one); x's indexed dims keep their valid values first."""
    out = list(indices)
    for d, i in enumerate(indices):
        if i is not None and x.tainted(d) and i.t.dtype != torch.bool:
            n = _count_sz(ctx, x.dims[d]).rt
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
            values, indices[j] = _agree(ctx, node, values, dv, i, di)
    return values, indices


def _count_sz(ctx, factors):
    sz = ctx.size(_count_expr(factors))
    if not isinstance(sz, Sz):
        raise Unsupported(f"a merged dim without a valid count (factors {factors})")
    return sz


def _aligned(node, x, idx, dim):
    """gather/scatter: idx's positions along the other dims are x's positions (x's `dim` is _prefixed already)."""
    for d in range(idx.t.dim()):
        if d != dim and (x.tainted(d) or idx.tainted(d)) and not _same_factors(idx.dims[d], x.dims[d]) and \
                not (_prefix(x, d) and _prefix(idx, d)):
            raise Unsupported(f"{node.target}: index and self padded differently along dim {d}")


@_handles(aten.embedding.default)
def _embedding(node, args, kwargs, ctx):
    w, idx = args[0], args[1]
    if w.any_tainted:
        raise Unsupported("embedding of a padded weight")
    it = _fill(ctx, idx, 0)  # the padding's indices are garbage: index 0 instead
    out = node.target(w.t, it, *args[2:])
    return PT(out, list(idx.dims) + [w.dims[1]])


@_handles(aten.gather.default)
def _gather(node, args, kwargs, ctx):
    x, dim, idx = args[0], args[1] % max(args[0].t.dim(), 1), args[2]
    if idx.t.dim() != x.t.dim():
        raise Unsupported(f"{node.target} with an index of another rank")
    x = _prefixed(ctx, x, [dim])  # an index padded along dim too: its padding gathers position 0 into the padding
    _aligned(node, x, idx, dim)
    it = _fill(ctx, idx, 0)
    out = torch.gather(x.t, dim, it, **kwargs)
    dims = [idx.dims[d] if idx.tainted(d) or d == dim else x.dims[d] if x.t.shape[d] == out.shape[d]
            else idx.dims[d] for d in range(out.dim())]
    return PT(out, dims)


@_handles(aten.scatter.value, aten.scatter.src, aten.scatter_add.default, aten.scatter_reduce.two)
def _scatter(node, args, kwargs, ctx):
    """Along other dims the index's padding lies over x's; an index padded along the scattered dim (a varying
    number of rows scattered into a fixed table) sends its padding to one extra position past x's end, dropped."""
    x, dim, idx = args[0], args[1] % max(args[0].t.dim(), 1), args[2]
    if idx.t.dim() != x.t.dim():
        raise Unsupported(f"{node.target} with an index of another rank")
    trash = idx.tainted(dim)
    for d in range(idx.t.dim()):
        if d != dim and idx.tainted(d) and not _same_factors(idx.dims[d], x.dims[d]):
            # an index smaller than x along d, padded there on its own: its padding would land on valid positions
            if idx.t.shape[d] > x.t.shape[d] or not (_prefix(x, d) and _prefix(idx, d)):
                raise Unsupported(f"{node.target}: index and self padded differently")
            trash = True
    x = _prefixed(ctx, x, [dim])
    _aligned(node, x, idx, dim)
    src = args[3] if len(args) > 3 else None
    if isinstance(src, PT):  # the i-th index goes with the i-th source value
        for d in range(idx.t.dim()):
            if idx.t.shape[d] == src.t.shape[d] and (idx.tainted(d) or src.tainted(d)):
                idx, src = _agree(ctx, node, idx, d, src, d)
                if not _same_factors(idx.dims[d], src.dims[d]):
                    raise Unsupported(f"{node.target}: index and source padded differently along dim {d}")
            elif idx.tainted(d) or src.tainted(d):
                raise Unsupported(f"{node.target}: index and source of different sizes along a padded dim {d}")
        args = list(args[:3]) + [src] + list(args[4:])
    rest = [a.t if isinstance(a, PT) else a for a in args[3:]]
    if not trash:
        return PT(node.target(x.t, dim, _fill(ctx, idx, 0), *rest, **kwargs), x.dims)
    n0 = x.t.shape[dim]
    xt = torch.cat([x.t, torch.zeros_like(x.t.narrow(dim, 0, 1))], dim)
    it = torch.where(_mask(ctx, idx), idx.t, n0)
    return PT(node.target(xt, dim, it, *rest, **kwargs).narrow(dim, 0, n0), x.dims)


@_handles(aten.index_put.default, aten.index_put_.default, aten._unsafe_index_put.default,
          aten._index_put_impl.default, aten._index_put_impl_.default)
def _index_put(node, args, kwargs, ctx):
    x, indices, values = args[0], args[1], args[2]
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    pos = [d for d, i in enumerate(indices) if i is not None]
    x = _prefixed(ctx, x, pos)
    indices = _wrapped(ctx, x, indices)
    values, indices = _values_like_index(ctx, node, x, values, indices, pos)
    tainted = [i for i in indices if i is not None and i.any_tainted]
    if not tainted:
        out = node.target(x.t, [None if i is None else i.t for i in indices], values.t, accumulate)
        return PT(out, x.dims)
    m = None  # the valid rows of the indices
    for i in tainted:
        mi = _mask(ctx, i)
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
    # valid values first: _prefixed), so x's own padding may stay as it is
    idx = [None if i is None else torch.where(_mask(ctx, i), i.t, 0) if i.any_tainted else i.t for i in indices]
    # the mask at the indices' place in the result (after x's leading dims when the indices are adjacent, else
    # first); values broadcast to the result's rank against it
    nb = m.dim()
    start = pos[0] if pos == list(range(pos[0], pos[-1] + 1)) else 0
    rank = x.t.dim() - len(pos) + nb
    vm = m.view([1] * start + list(m.shape) + [1] * (rank - start - nb))
    vals = torch.where(vm, values.t, torch.zeros((), dtype=values.t.dtype, device=values.t.device))
    out = node.target(x.t, idx, vals, True)
    return PT(out, x.dims)


@_handles(aten.index.Tensor)
def _index(node, args, kwargs, ctx):
    """Advanced indexing: the result's indexed dims are the indices' broadcast dims (the padding's indices read
    position 0), the others x's; a valid index points at a valid position."""
    x, indices = args
    pos = [i for i, ix in enumerate(indices) if ix is not None]
    idx = [indices[i] for i in pos]
    if not idx or any(i.t.dtype == torch.bool for i in idx):
        raise Unsupported("boolean-mask index")
    x = _prefixed(ctx, x, pos)
    indices = _wrapped(ctx, x, indices)
    idx = [indices[i] for i in pos]
    args2, _ = _harmonize(ctx, node, (idx,), {})
    idx = list(args2[0])
    filled = [_fill(ctx, i, 0) for i in idx]
    full = list(indices)
    for p, f in zip(pos, filled):
        full[p] = f
    out = aten.index.Tensor(x.t, full)
    bshape = torch.broadcast_shapes(*(i.t.shape for i in idx))
    probe = torch.empty(bshape, device="meta")
    bdims = _broadcast_dims(node, idx, probe, ctx, fresh=False) if len(bshape) else []
    rest_before = list(x.dims[:pos[0]])
    rest_after = list(x.dims[pos[-1] + 1:])
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    dims = rest_before + bdims + rest_after if adjacent else bdims + [f for d, f in enumerate(x.dims) if d not in pos]
    return PT(out, dims)


@_handles(aten.index_select.default)
def _index_select(node, args, kwargs, ctx):
    """x.index_select(dim, i) is x[:, ..., i]: advanced indexing's rule."""
    x, dim, index = args[0], args[1] % max(args[0].t.dim(), 1), args[2]
    if not isinstance(index, PT):
        index = _plain(index)
    if index.t.dim() == 0:  # the dim stays, of size 1
        index = _unsqueeze(node, (index, 0), {}, ctx)
    return _index(node, (x, [None] * dim + [index]), {}, ctx)


@_handles(aten.select.int)
def _select(node, args, kwargs, ctx):
    """x[..., i, ...]: along a padded dim, laid out with its valid values first (a merged dim padded inside is made
    compact), a valid index i >= 0 is its padded position; i < 0 counts from the true end (the last token's hidden
    state), a runtime position."""
    x, dim, i = args[0], args[1] % max(args[0].t.dim(), 1), args[2]
    if not x.tainted(dim):
        return PT(x.t.select(dim, _padded(i)), [f for d, f in enumerate(x.dims) if d != dim])
    if isinstance(i, Sz):
        raise Unsupported(f"select of a padded dim (factors {x.dims[dim]}) at a symbolic index")
    x = _prefixed(ctx, x, [dim])
    dims = [f for d, f in enumerate(x.dims) if d != dim]
    if i >= 0:
        return PT(x.t.select(dim, i), dims)
    pos = (_count_sz(ctx, x.dims[dim]).rt + i).clamp(min=0).reshape(1)
    return PT(x.t.index_select(dim, pos).squeeze(dim), dims)


@_handles(aten.slice.Tensor)
def _slice(node, args, kwargs, ctx):
    x = args[0]
    dim = (args[1] if len(args) > 1 else 0) % max(x.t.dim(), 1)
    start = args[2] if len(args) > 2 else None
    step = args[4] if len(args) > 4 else 1
    dims = list(x.dims)
    if x.tainted(dim) and isinstance(start, Sz) and step == 1 and len(x.dims[dim]) == 1:
        # a runtime start (cat's backward splitting its gradient): position i reads start + i
        n = ctx.size(_expr(_val(node).shape[dim]))
        n = n.padded if isinstance(n, Sz) else n
        src = (start.rt + ctx.iota(n)).clamp(max=x.t.shape[dim] - 1)
        out = x.t.index_select(dim, src)
        dims[dim] = _fresh_dims(ctx, _val(node), out)[dim]
        return PT(out, dims)
    out = node.target(*_padded(args))
    if x.tainted(dim):
        if len(x.dims[dim]) != 1 or step != 1 or (start is not None and (isinstance(start, Sz) or start < 0)):
            raise Unsupported("slice of a padded dim other than [k:end] with k >= 0")
        dims[dim] = _fresh_dims(ctx, _val(node), out)[dim]
    else:
        dims[dim] = ((out.shape[dim], None),)
    return PT(out, dims)


@_handles(aten.slice_scatter.default)
def _slice_scatter(node, args, kwargs, ctx):
    import sympy

    base, src = args[0], args[1]
    dim = (args[2] if len(args) > 2 else 0) % max(base.t.dim(), 1)
    start = args[3] if len(args) > 3 else None
    step = args[5] if len(args) > 5 else 1
    if base.tainted(dim) or src.tainted(dim):
        if step != 1 or (not isinstance(start, Sz) and (start or 0) < 0) or len(base.dims[dim]) != 1 or \
                len(src.dims[dim]) != 1:
            raise Unsupported("slice_scatter into a padded dim other than [k:end] or [k:k+n]")
        # the source's padding lands in the base's padding only if the source reaches the base's end
        lb, ls = _valid_expr(base.dims[dim][0]), _valid_expr(src.dims[dim][0])
        lb = base.dims[dim][0][0] if lb is None else lb
        ls = src.dims[dim][0][0] if ls is None else ls
        if isinstance(start, Sz) or sympy.simplify(sympy.sympify(lb) - sympy.sympify(ls) - (start or 0)) != 0:
            # short of the end (diff's, trapz's backward), or at a runtime start: base positions [start, start + n)
            # take the source's valid values, all others keep the base's
            if any(d != dim and not _same_factors(base.dims[d], src.dims[d]) for d in range(base.t.dim())):
                raise Unsupported("slice_scatter of a source padded unlike the base")
            n = base.t.shape[dim]
            rel = ctx.iota(n) - (start.rt if isinstance(start, Sz) else (start or 0))
            f = src.dims[dim][0]
            inside = (rel >= 0) & (rel < (f[1].rt if f[1] is not None else f[0]))
            taken = src.t.index_select(dim, rel.clamp(0, src.t.shape[dim] - 1))
            shape = [1] * base.t.dim()
            shape[dim] = n
            return PT(torch.where(inside.view(shape), taken, base.t), base.dims)
    out = node.target(*_padded(args))
    return PT(out, _broadcast_dims(node, [base], out, ctx))


@_handles(aten.constant_pad_nd.default)
def _constant_pad(node, args, kwargs, ctx):
    x, pad = args[0], list(args[1])
    value = args[2] if len(args) > 2 else 0
    if any(isinstance(p, Sz) for p in pad):
        raise Unsupported("constant_pad_nd by a symbolic amount")
    out = node.target(x.t, pad, value)
    dims = list(x.dims)
    fresh = _fresh_dims(ctx, _val(node), out)
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


@_handles(aten.cat.default)
def _cat(node, args, kwargs, ctx):
    xs = [x for x in args[0]]
    dim = (args[1] if len(args) > 1 else kwargs.get("dim", 0))
    nd = max(x.t.dim() for x in xs)
    dim = dim % nd
    xs = [x for x in xs if not (x.t.dim() == 1 and x.t.numel() == 0)]
    if len(xs) == 1:
        return xs[0]
    if any(x.tainted(dim) for x in xs):
        return _cat_padded(ctx, node, xs, dim)
    out = torch.cat([x.t for x in xs], dim)
    dims = _broadcast_dims(node, [PT(x.t, [f if d != dim else ((out.shape[dim], None),) for d, f in enumerate(x.dims)])
                                  for x in xs], out, ctx)
    return PT(out, dims)


def _cat_padded(ctx, node, xs, dim):
    """cat along a padded dim: the operands' valid values one after the other, the padding after them all."""
    if any(len(x.dims[dim]) != 1 for x in xs):
        raise Unsupported("cat along a merged padded dim")
    other = [d for d in range(xs[0].t.dim()) if d != dim]
    for x in xs[1:]:
        for d in other:
            if x.tainted(d) != xs[0].tainted(d) or (x.tainted(d) and not _same_factors(x.dims[d], xs[0].dims[d])):
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
    dims[dim] = _fresh_dims(ctx, _val(node), out)[dim]
    return PT(out, dims)


@_handles(aten.split_with_sizes.default, aten.split.Tensor, aten.unbind.int, aten.chunk.default)
def _split(node, args, kwargs, ctx):
    x = args[0]
    if node.target is aten.unbind.int:
        dim = (args[1] if len(args) > 1 else 0) % max(x.t.dim(), 1)
    else:
        dim = (args[2] if len(args) > 2 else kwargs.get("dim", 0)) % max(x.t.dim(), 1)
    if x.tainted(dim):
        if node.target is aten.unbind.int:
            raise Unsupported("unbind along a padded dim")
        return _split_padded(ctx, _prefixed(ctx, x, [dim]), dim, _val(node))
    outs = node.target(*_padded(args))
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


# -- per-sample ops (a padded batch dim only) ----------------------------------------------------------------------
def _batch_only(node, tensors):
    for x in tensors:
        if any(x.tainted(d) for d in range(1, x.t.dim())):
            raise Unsupported(f"{node.target} with a padded dim other than the batch dim")


def _per_sample(node, args, kwargs, ctx):
    """An op that computes each sample (dim 0) on its own (pooling, upsampling, their input gradients): the padded
    samples stay in the padding."""
    x = args[0]
    _batch_only(node, [a for a in _flat(args, kwargs) if isinstance(a, PT)])
    out = node.target(*_padded(args), **_padded(kwargs))
    outs = out if isinstance(out, (tuple, list)) else [out]
    res = [PT(o, [x.dims[0]] + [((s, None),) for s in o.shape[1:]]) if o.dim() and o.shape[0] == x.t.shape[0]
           else _plain(o) for o in outs]
    return tuple(res) if isinstance(out, (tuple, list)) else res[0]


def _per_plane(node, args, kwargs, ctx, lead=None):
    """An op that computes each plane (the dims before its spatial ones: batch and channels) on its own, over spatial
    dims without padding (pooling, upsampling, padding, their input gradients): padded samples and channels stay
    padding, so each tensor argument's planes must be laid out as the input's."""
    x, name = args[0], str(node.target)
    lead = x.t.dim() - (1 if "1d" in name else 3 if "3d" in name else 2) if lead is None else lead
    for a in _flat(args, kwargs):
        if not isinstance(a, PT):
            continue
        if any(a.tainted(d) for d in range(lead, a.t.dim())):
            raise Unsupported(f"{node.target} over a padded spatial dim")
        if a.t.dim() != x.t.dim() or not all(_same_factors(a.dims[d], x.dims[d]) for d in range(lead)):
            raise Unsupported(f"{node.target} with arguments whose planes are padded differently")
    out = node.target(*_padded(args), **_padded(kwargs))
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
            res.append(_plain(o))
    return tuple(res) if isinstance(out, (tuple, list)) else res[0]


@_handles(aten.native_group_norm.default)
def _group_norm(node, args, kwargs, ctx):
    """Each sample's group statistics on their own: over a padded batch (a partial last batch) only."""
    x = args[0]
    _batch_only(node, [a for a in _flat(args, kwargs) if isinstance(a, PT)])
    out, mean, rstd = node.target(*_padded(args), **_padded(kwargs))
    return PT(out, x.dims), PT(mean, [x.dims[0], ((mean.shape[1], None),)]), \
        PT(rstd, [x.dims[0], ((rstd.shape[1], None),)])


def _grid_args(node, x, grid):
    if any(x.tainted(d) for d in range(2, x.t.dim())):
        raise Unsupported(f"{node.target} of an input of a padded size (the grid's coordinates are relative to it)")
    if grid.tainted(grid.t.dim() - 1) or not _same_factors(x.dims[0], grid.dims[0]):
        raise Unsupported(f"{node.target}: input and grid padded differently")


@_handles(aten.grid_sampler_2d.default, aten.grid_sampler_3d.default)
def _grid_sampler(node, args, kwargs, ctx):
    """Each output position samples on its own: samples, channels and output positions may be padded (the output
    is [N, C] of the input, then the grid's positions)."""
    x, grid = args[0], args[1]
    _grid_args(node, x, grid)
    out = node.target(x.t, grid.t, *args[2:], **kwargs)
    return PT(out, [x.dims[0], x.dims[1]] + list(grid.dims[1:-1]))


@_handles(aten.grid_sampler_2d_backward.default, aten.grid_sampler_3d_backward.default)
def _grid_sampler_backward(node, args, kwargs, ctx):
    """The padding of the output gradient, the input and the grid read as zeros: the grid's gradient sums over
    channels and the input's over output positions."""
    go, x, grid = args[0], args[1], args[2]
    _grid_args(node, x, grid)
    gi, gg = node.target(_fill(ctx, go, 0), _fill(ctx, x, 0), _fill(ctx, grid, 0), *args[3:], **kwargs)
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
    if go.t.dim() != x.t.dim() or not all(_same_factors(go.dims[d], x.dims[d]) for d in range(lead)):
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


_PER_PLANE = ["_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d",
              "_adaptive_avg_pool3d_backward", "upsample_nearest2d", "upsample_bilinear2d",
              "_low_memory_max_pool2d_with_offsets", "max_unpool2d"] + \
    [f"reflection_pad{n}d{b}" for n in (1, 2, 3) for b in ("", "_backward")] + [f"replication_pad{n}d" for n in (1, 2, 3)]
_PER_SAMPLE = ["_low_memory_max_pool2d_offsets_to_indices", "im2col", "col2im", "pixel_shuffle", "pixel_unshuffle"]
for _names, _fn in ((_PER_PLANE, _per_plane), (_PER_SAMPLE, _per_sample),
                    ([f"replication_pad{n}d_backward" for n in (1, 2, 3)], _replication_pad_backward)):
    for _name in _names:
        _pk = getattr(aten, _name, None)
        if _pk is not None:
            _HANDLERS[_pk] = _fn


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
    dims = _fresh_dims(ctx, val, out)
    for s_, f in zip(val.shape, dims):
        if isinstance(s_, torch.SymInt) and f[0][1] is not None and f[0][1].padded != f[0][0]:
            raise Unsupported(f"{val.shape} at the buckets is {tuple(out.shape)} on padded inputs")
    return PT(out, list(x.dims[:lead - 1]) + dims[lead - 1:])


@_handles(aten.convolution.default)
def _convolution(node, args, kwargs, ctx):
    """A convolution (also transposed) over padded spatial dims: the input's padding is zeroed, so a valid output
    reads zeros past the true end as the op's own zero padding, and valid outputs come first."""
    x, w = args[0], args[1]
    if w.any_tainted or (isinstance(args[2], PT) and args[2].any_tainted):
        raise Unsupported("convolution with a padded weight")
    sp = _spatial(node, x)
    out = node.target(_fill(ctx, x, 0, sp) if sp else x.t, *_padded(args[1:]))
    return _out_dims(ctx, x, out, _val(node))


@_handles(aten.convolution_backward.default)
def _convolution_backward(node, args, kwargs, ctx):
    """The gradients with the output gradient's and the input's padding zeroed: a padded output (one that does not
    exist at the exact size, though its window may cover valid inputs) adds 0 to every input and weight gradient,
    and the weight and bias gradients sum over valid positions and samples only."""
    go, x, w = args[0], args[1], args[2]
    if w.any_tainted:
        raise Unsupported("convolution_backward with a padded weight")
    if _spatial(node, x) or _spatial(node, go):  # (also checks: no padded channels, no merged spatial dims)
        # (bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask)
        _windows_agree(node, x, go, 2, w.t.shape[2:], args[4], args[5], args[6], transposed=args[7],
                       out_pad=args[8])
    rest = _padded(args[3:])
    gi, gw, gb = node.target(_fill(ctx, go, 0), _fill(ctx, x, 0), w.t, *rest)
    return (PT(gi, x.dims) if gi is not None else None, _plain(gw) if gw is not None else None,
            _plain(gb) if gb is not None else None)


def _arg(args, kwargs, i, name, default):
    return args[i] if len(args) > i else kwargs.get(name, default)


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
    return PT(_fill(ctx, PT(out.to(idx.t.dtype), idx.dims), 0), idx.dims)


@_handles(aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default)
def _max_pool(node, args, kwargs, ctx):
    """Max pooling over padded spatial dims: the padding reads as -inf (as the op's own padding), valid outputs come
    first, the indices count exact positions."""
    x = args[0]
    lead, sp = _pooled_dims(node, x)
    if not sp:
        return _per_plane(node, args, kwargs, ctx, lead)
    fill = -math.inf if x.t.dtype.is_floating_point else torch.iinfo(x.t.dtype).min
    out, idx = node.target(_fill(ctx, x, fill, sp), *_padded(args[1:]), **_padded(kwargs))
    val = _val(node)
    return _out_dims(ctx, x, out, val[0], lead), _reindex(ctx, _out_dims(ctx, x, idx, val[1], lead), x, lead, True)


@_handles(aten.max_pool2d_with_indices_backward.default, aten.max_pool3d_with_indices_backward.default)
def _max_pool_backward(node, args, kwargs, ctx):
    """The padded outputs' gradients are zeroed (an output past the true end may have picked a valid input)."""
    go, x = args[0], args[1]
    lead, sp = _pooled_dims(node, x)
    if not sp:
        return _per_plane(node, args, kwargs, ctx, lead)
    k, st, pad, dil = (list(_arg(args, kwargs, i, n, dflt)) for i, n, dflt in
                       ((2, "kernel_size", None), (3, "stride", []), (4, "padding", [0]), (5, "dilation", [1])))
    st = st or k
    ceil = _arg(args, kwargs, 6, "ceil_mode", False)
    _windows_agree(node, x, go, lead, k, st, pad, dil, ceil)
    args = list(args)
    args[7] = _reindex(ctx, args[7], x, lead, False)
    gi = node.target(_fill(ctx, go, 0), x.t, *_padded(args[2:]), **_padded(kwargs))
    return PT(gi, x.dims)


@_handles(aten.avg_pool2d.default, aten.avg_pool3d.default)
def _avg_pool(node, args, kwargs, ctx):
    """Average pooling over a padded spatial dim: the padding reads as 0 (as the op's own padding), and without
    ceil_mode a valid output's window ends inside the true end plus the op's padding, so its divisor is exact."""
    x = args[0]
    lead, sp = _pooled_dims(node, x, _arg(args, kwargs, 4, "ceil_mode", False), list(_arg(args, kwargs, 3, "padding",
                            [0])), _arg(args, kwargs, 5, "count_include_pad", True))
    if not sp:
        return _per_plane(node, args, kwargs, ctx, lead)
    out = node.target(_fill(ctx, x, 0, sp), *_padded(args[1:]), **_padded(kwargs))
    return _out_dims(ctx, x, out, _val(node), lead)


@_handles(aten.avg_pool2d_backward.default, aten.avg_pool3d_backward.default)
def _avg_pool_backward(node, args, kwargs, ctx):
    go, x = args[0], args[1]
    pad = list(_arg(args, kwargs, 4, "padding", [0]))
    lead, sp = _pooled_dims(node, x, _arg(args, kwargs, 5, "ceil_mode", False), pad,
                            _arg(args, kwargs, 6, "count_include_pad", True))
    if not sp:
        return _per_plane(node, args, kwargs, ctx, lead)
    k = list(args[2])
    _windows_agree(node, x, go, lead, k, list(args[3]) or k, pad, [1])
    return PT(node.target(_fill(ctx, go, 0), x.t, *_padded(args[2:]), **_padded(kwargs)), x.dims)


@_handles(aten._native_batch_norm_legit_functional.default, aten._native_batch_norm_legit_no_training.default)
def _batch_norm(node, args, kwargs, ctx):
    """Batch statistics over the valid samples only (the true count), as the op computes them."""
    x = args[0]
    _batch_only(node, [x])
    if node.target is aten._native_batch_norm_legit_no_training.default or not args[5] or not x.tainted(0):
        out = node.target(*_padded(args))
        return (PT(out[0], x.dims),) + tuple(_plain(o) for o in out[1:])
    w, b, rm, rv, _, momentum, eps = (_padded(a) for a in args[1:8])
    dims = [0] + list(range(2, x.t.dim()))
    shape = [1, -1] + [1] * (x.t.dim() - 2)
    acc = torch.float32 if x.t.dtype in (torch.float16, torch.bfloat16) else x.t.dtype
    n = _count(ctx, x, dims)
    xs = _fill(ctx, x, 0, [0]).to(acc)
    mean = xs.sum(dims) / n
    dev = _fill(ctx, PT(xs - mean.view(shape), x.dims), 0, [0])
    var = (dev * dev).sum(dims) / n
    rstd = torch.rsqrt(var + eps)
    out = (xs - mean.view(shape)) * rstd.view(shape)
    if w is not None:
        out = out * w.view(shape)
    if b is not None:
        out = out + b.view(shape)
    new_rm = rm * (1 - momentum) + mean.to(rm.dtype) * momentum
    new_rv = rv * (1 - momentum) + (var * n / (n - 1)).to(rv.dtype) * momentum
    return PT(out.to(x.t.dtype), x.dims), _plain(mean), _plain(rstd), _plain(new_rm), _plain(new_rv)


@_handles(aten._native_batch_norm_legit.no_stats)
def _batch_norm_no_stats(node, args, kwargs, ctx):
    """Batch statistics without running ones (instance norm views [B, C, L] as [1, B*C, L]): each channel's on its
    own, so padded channels stay padding; a padded dim read into the statistics is not taken."""
    x = args[0]
    if any(x.tainted(d) for d in range(x.t.dim()) if d != 1):
        raise Unsupported(f"{node.target} with a padded dim other than the channels")
    for a in args[1:3]:
        if isinstance(a, PT) and not _same_factors(a.dims[0], x.dims[1]):
            raise Unsupported(f"{node.target} with a weight padded unlike the channels")
    out = node.target(*_padded(args), **_padded(kwargs))
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
        factor = _rt_of(scale)
    elif scale is None and q.tainted(q.t.dim() - 1):
        e = q.dims[-1][0][1]
        factor = 1.0 / torch.sqrt(e.rt.to(q.t.dtype))
    if factor is not None:
        kw["scale"] = 1.0
    return kw, factor


@_handles(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_cpu(node, args, kwargs, ctx):
    q, k, v = args[:3]
    dropout = args[3] if len(args) > 3 else kwargs.get("dropout_p", 0.0)
    causal = args[4] if len(args) > 4 else kwargs.get("is_causal", False)
    kw, factor = _attention_args(ctx, node, q, k, causal, kwargs)
    qt = _fill(ctx, q, 0)
    out, lse = node.target(qt if factor is None else qt * factor, _fill(ctx, k, 0), _fill(ctx, v, 0), dropout,
                           causal, **kw)
    return PT(out, list(q.dims[:-1]) + [v.dims[-1]]), PT(lse, list(q.dims[:-1]))


def _key_mask(ctx, node, q, k, causal, mask):
    """The mask that keeps valid queries off the padding's keys: none when causal attention already does (the
    padding follows every valid key), else the given mask with the padded keys masked out."""
    kd = k.t.dim() - 2
    if not k.tainted(kd):
        return mask.t if isinstance(mask, PT) else mask
    if causal:
        if not _same_factors(q.dims[kd], k.dims[kd]):
            raise Unsupported("causal attention with queries and keys padded differently")
        return mask.t if isinstance(mask, PT) else mask
    km = _dim_mask(ctx, k.dims[kd]).view([1] * (q.t.dim() - 1) + [-1])
    # an additive mask of q's dtype (these kernels take no boolean mask: True would add 1)
    add = torch.zeros((), dtype=q.t.dtype, device=q.t.device).masked_fill(~km, -math.inf)
    if mask is None:
        return add
    if mask.t.dtype == torch.bool:
        return torch.zeros((), dtype=q.t.dtype, device=q.t.device).masked_fill(~(mask.t & km), -math.inf)
    return mask.t + add


@_handles(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _sdpa_cpu_backward(node, args, kwargs, ctx):
    go, q, k, v, out, lse = args[:6]
    dropout, causal = args[6], args[7]
    kw, factor = _attention_args(ctx, node, q, k, causal, kwargs)
    qt = _fill(ctx, q, 0)
    # the padding's queries get zero gradients (their attention weights then add nothing to the keys' and values')
    gq, gk, gv = node.target(_fill(ctx, go, 0), qt if factor is None else qt * factor, _fill(ctx, k, 0),
                             _fill(ctx, v, 0), _fill(ctx, out, 0), _fill(ctx, lse, 0), dropout, causal, **kw)
    if factor is not None:
        gq = gq * factor
    return PT(gq, q.dims), PT(gk, k.dims), PT(gv, v.dims)


__all__ = ["set_shape_buckets", "get_shape_buckets", "bucket", "Unsupported", "run", "pad_input", "compact_output"]


# -- a graph's bucketed calls -----------------------------------------------------------------------------------------
def _expr(s):
    return s.node.expr if isinstance(s, torch.SymInt) else int(s)


class Plan:
    """What a graph's bucketed calls need, found once from its placeholders' and outputs' symbolic sizes."""

    def __init__(self, gm):
        import sympy

        self.gm = gm
        self.placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.sources = {}  # Symbol -> (placeholder index, dim or None)
        symbols = set()
        self.in_shapes = []  # per placeholder: sympy shape (tensors), expr (sym ints) or None
        for i, n in enumerate(self.placeholders):
            val = _val(n)
            if isinstance(val, torch.SymInt):
                e = val.node.expr
                self.in_shapes.append(("int", e))
                symbols |= e.free_symbols
                if isinstance(e, sympy.Symbol):
                    self.sources.setdefault(e, (i, None))
            elif isinstance(val, torch.Tensor):
                shape = tuple(_expr(s) for s in val.shape)
                self.in_shapes.append(("tensor", shape))
                for d, e in enumerate(shape):
                    if isinstance(e, sympy.Expr) and not e.is_number:
                        symbols |= e.free_symbols
                        if isinstance(e, sympy.Symbol):
                            self.sources.setdefault(e, (i, d))
            else:
                self.in_shapes.append(None)
        self.symbols = sorted(symbols, key=str)
        missing = [s for s in self.symbols if s not in self.sources]
        if missing:
            raise Unsupported(f"the graph's sizes {missing} are not given by any input")
        out = [n for n in gm.graph.nodes if n.op == "output"][0]
        self.out_shapes = []
        for a in torch.fx.node.map_aggregate(out.args[0], lambda x: x):
            v = _val(a) if isinstance(a, torch.fx.Node) else None
            self.out_shapes.append(tuple(_expr(s) for s in v.shape) if isinstance(v, torch.Tensor) else None)
        for shape in [s[1] for s in self.in_shapes if s is not None and s[0] == "tensor"] + \
                [s for s in self.out_shapes if s is not None]:
            for e in shape:
                _check_bounded(e)
        self.index = {s: i for i, s in enumerate(self.symbols)}
        self._fns = {}

    def symbolic(self) -> bool:
        return bool(self.symbols)

    def values(self, args):
        """The symbols' true values in this call."""
        out = []
        for s in self.symbols:
            i, d = self.sources[s]
            a = args[i]
            out.append(int(a) if d is None else int(a.shape[d]))
        return out

    def key(self, values):
        """A program serves the calls with the same buckets and the same equal sizes."""
        return tuple(bucket(v) for v in values), tuple(values.index(v) for v in values)

    def _fn(self, e):
        """e as a Python function of the symbols' values (compiled once; it runs on every call)."""
        if e not in self._fns:
            names = ", ".join(f"a{i}" for i in range(len(self.symbols)))
            self._fns[e] = eval(f"lambda {names}: {_py(e, self.index)}")  # noqa: S307 (our own expression text)
        return self._fns[e]

    def sizes(self, shape, values):
        return [int(self._fn(e)(*values)) if not isinstance(e, int) else e for e in shape]

    def capacity(self, shape, values):
        """Elements of a compact tensor of that symbolic shape in this call's buckets."""
        b = self.key(values)[0]
        return math.prod(int(self._fn(e)(*b)) if not isinstance(e, int) else e for e in shape)

    def tensor_inputs(self):
        return [i for i, s in enumerate(self.in_shapes) if s is not None and s[0] == "tensor"]

    def padded_input(self, i):
        return any(not isinstance(e, int) and not e.is_number for e in self.in_shapes[i][1])


def monotone(e) -> bool:
    """Whether a size expression never decreases as its symbols grow (sums, products with positive factors,
    floor divisions by positive constants, min/max of such): then its value at the buckets' sizes bounds its value
    at every size of the bucket, which a padded layout needs. `s - 4 * ceil(s / 5)` (chunk's last piece) is not:
    1 at s = 5, 0 at its bucket's 8."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    if isinstance(e, int) or isinstance(e, sympy.Symbol) or (isinstance(e, sympy.Basic) and e.is_number):
        return True
    if isinstance(e, sympy.Add):
        return all(a.is_number or monotone(a) for a in e.args)
    if isinstance(e, sympy.Mul):
        return all((a.is_number and a > 0) or (not a.is_number and monotone(a)) for a in e.args)
    if isinstance(e, sympy.Pow):
        return e.exp.is_Integer and int(e.exp) > 0 and monotone(e.base)
    if isinstance(e, FloorDiv):
        if e.args[1].is_number:
            return e.args[1] > 0 and monotone(e.args[0])
        q = sympy.cancel(e.args[0] / e.args[1])  # an exact quotient: (s**2) // s is s
        return sympy.fraction(q)[1] == 1 and q.is_polynomial() and monotone(sympy.expand(q))
    if isinstance(e, _min_max()):
        return all(monotone(a) for a in e.args)
    return False


def _min_max():
    """(min, max, min, max): sympy's and torch's own (ShapeEnv's expressions use torch.utils._sympy's)."""
    import sympy
    from torch.utils._sympy.functions import Max, Min

    return (sympy.Min, sympy.Max, Min, Max)


def _check_bounded(e):
    if not monotone(e):
        raise Unsupported(f"the size {e} may shrink as its symbols grow: no bucket bounds it")


def _py(e, index) -> str:
    """Python source of a size expression over the arguments a0, a1... (index: Symbol -> position)."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

    if isinstance(e, int) or (isinstance(e, sympy.Basic) and e.is_Integer):
        return str(int(e))
    if isinstance(e, sympy.Symbol):
        return f"a{index[e]}"
    if isinstance(e, sympy.Add):
        return "(" + " + ".join(_py(a, index) for a in e.args) + ")"
    if isinstance(e, sympy.Mul):
        return "(" + " * ".join(_py(a, index) for a in e.args) + ")"
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
        return f"({_py(e.base, index)} ** {int(e.exp)})"
    if isinstance(e, FloorDiv):
        return f"({_py(e.args[0], index)} // {_py(e.args[1], index)})"
    if isinstance(e, (Mod, PythonMod)):
        return f"({_py(e.args[0], index)} % {_py(e.args[1], index)})"
    if isinstance(e, _min_max()):
        return ("min(" if isinstance(e, _min_max()[::2]) else "max(") + ", ".join(_py(a, index) for a in e.args) + ")"
    raise Unsupported(f"the size expression {e} ({type(e).__name__})")


class SizeOut:
    """A symbolic size the graph returns (a forward's sizes saved for its backward)."""

    __slots__ = ("expr",)

    def __init__(self, expr):
        self.expr = expr


def _symbolic_shape(shape):
    return shape is not None and any(not isinstance(e, int) and not e.is_number for e in shape)


def execute(plan: Plan, args, flats, sizes_tensor):
    """Runs plan's graph bucketed. args: the call's arguments; flats: per argument, the flat storage buffer (bucket
    capacity) for a padded tensor input, else None; sizes_tensor: the symbols' true values (int64, on the device).
    Returns the outputs: a padded output as its compact flat buffer, the others as they are."""
    values = plan.values(args)
    ctx = _Ctx(plan.index, dict(zip(plan.symbols, values)), sizes_tensor)
    inputs = []
    for i, a in enumerate(args):
        spec = plan.in_shapes[i]
        if spec is not None and spec[0] == "int":
            inputs.append(ctx.size(spec[1]))
        elif isinstance(a, torch.Tensor):
            if flats[i] is not None:
                inputs.append(pad_input(ctx, flats[i], [ctx.size(e) for e in spec[1]]))
            else:
                inputs.append(_plain(a))
        else:
            inputs.append(a)
    outs = run(plan.gm, inputs, ctx)
    res = []
    for o, shape in zip(torch.fx.node.map_aggregate(outs, lambda x: x), plan.out_shapes):
        if isinstance(o, PT):
            if _symbolic_shape(shape):
                res.append(compact_output(ctx, o))
            else:
                res.append(o.t)
        elif isinstance(o, Sz):
            res.append(SizeOut(o.expr))  # the call's true value, computed on the host (exact_outputs)
        else:
            res.append(o)
    return res


def exact_outputs(plan: Plan, values, outs):
    """The user's tensors: each compact flat output as a contiguous view of its exact sizes."""
    res = []
    for o, shape in zip(outs, plan.out_shapes):
        if isinstance(o, SizeOut):
            res.append(int(plan._fn(o.expr)(*values)))
        elif isinstance(o, torch.Tensor) and _symbolic_shape(shape):
            sizes = plan.sizes(shape, values)
            strides, acc = [], 1
            for s in reversed(sizes):
                strides.append(acc)
                acc *= max(s, 1)
            res.append(o.as_strided(sizes, list(reversed(strides)), 0))
        else:
            res.append(o)
    return res
