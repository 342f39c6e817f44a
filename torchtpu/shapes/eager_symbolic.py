"""A varying inner size in the eager modes (a batch's sequence length L): one table entry per bucket of L.

An upload whose inner dim varies between steps (csrc/executor/kernel.cpp `upload_bucket`) is stored compact (its
row-major values first) in a storage of its sizes at L's bucket, marked with L; so is every result of an op below.
The op table keys each size, stride and offset of a tensor on such a storage as a form of L (``a * L**p + b``) or as
a static value (kernel.cpp `sym_classify`): whatever the guess, a later call matches the key only when its own
values are the same forms of its own L, so an entry lowered for every L of the bucket under those forms is right for
every call it serves. On a miss :func:`lower` builds that entry:

1. the op's result shapes under a symbolic L (fake tensors with sizes and strides as SymInts of one ShapeEnv
   symbol); a call whose meta function guards on L (branches on its value) is declined;
2. the interpreter's (interp.py) rule for the op, run on *traced* tensors (padded_trace.py), so the whole padded
   computation becomes one fragment: each tensor on a marked storage is read from the storage's flat value by a
   gather at runtime L (its strides and offset are forms of L) into the padded layout, the rule masks where the
   op would read the padding, and each result that follows L is written compact at the capacity;
3. the entry: L is a runtime int (``ScalarSource::kSym``), each new output's sizes are forms the C++ kernel
   evaluates at the call's L (contiguous strides, a storage of the sizes at the capacity, marked with L again).

Anything the interpreter cannot prove right (its ``Unsupported``), an op without a rule, a random draw, an in-place
or ``out=`` form, answers ``exact``: the call is keyed again at its exact sizes (right, a program per size), counted
in ``op_table.bucket_exact`` and ``eager_symbolic.declined.<op>`` (``TORCHTPU_BUCKETS_DEBUG=1`` prints why).
"""

from __future__ import annotations

import math
import sys

import torch

from .. import _C, config, kernels, metrics
from .. import emit as E
from ..errors import user_line
from ..trace import FROM_RNG, FROM_SYM, INT, OutputSlot
from . import interp, padded_trace
from .padded import PT, Ctx, Sz, Unsupported, compact_output, rows_at
from .padded import plain as padded_plain

EXACT = ("exact",)


class Decline(Exception):
    pass


# -- form codes (csrc/executor/kernel.cpp sym_code) ------------------------------------------------------------------
def decode(code: int):
    """(a, b, p) of a form code, or None for a static value."""
    if code >= 0:
        return None
    c = ~code
    return c & ((1 << 48) - 1), ((c >> 48) & 0xFF) - 128, (c >> 56) & 0x3F


def encode(a: int, b: int, p: int) -> int:
    return ~((1 << 62) | (p << 56) | ((b + 128) << 48) | a)


def _expr(code_or_value, s0):
    f = decode(code_or_value)
    if f is None:
        return code_or_value
    a, b, p = f
    return a * s0**p + b


def _code_of(expr, s0):
    """A size expression of the result as a form code, or its int; Decline when it is neither."""
    import sympy

    e = sympy.expand(sympy.sympify(expr))
    if not e.free_symbols:
        return int(e)
    if e.free_symbols != {s0}:
        raise Decline(f"a result size {e} of other symbols")
    poly = sympy.Poly(e, s0)
    coeffs = dict(poly.terms())
    b = int(coeffs.pop((0,), 0))
    if len(coeffs) != 1 or not -1 <= b <= 1:
        raise Decline(f"a result size {e} that is no form a*L**p + b")
    (p,), a = next(iter(coeffs.items()))
    if p not in (1, 2) or int(a) < 1 or a != int(a):
        raise Decline(f"a result size {e} that is no form a*L**p + b")
    return encode(int(a), b, p)


class _Node:
    """What the interpreter's rules read of an FX node: its target and its symbolic result."""

    def __init__(self, target, val):
        self.target, self.meta = target, {"val": val}

    def format_node(self):
        return str(self.target)


# -- the lowering ---------------------------------------------------------------------------------------------------
def lower(name, values, runtime_slots, storages, device, sym, capacity, forms):
    """The table entry of a signature with a varying inner size (kernels.lower's): (entry, registration); EXACT when
    declined. forms: (arg, elem, slot, code) per value of a tensor argument the key holds as a form of L."""

    try:
        return _lower(name, values, runtime_slots, storages, device, sym, capacity, forms)
    except kernels.NeedsPython:
        return ("python",), None
    except (Decline, Unsupported, padded_trace.NotTraceable) as e:
        why = str(e)
    except Exception as e:  # noqa: BLE001 — a defect of a padded rule: fail closed, the call runs at exact sizes
        why = f"the padded lowering failed ({type(e).__name__}: {e})"
    metrics.inc(f"eager_symbolic.declined.{kernels.cpp_name(name)}")
    if config.get("buckets_debug"):
        print(
            f"torchtpu: eager symbolic: {name} runs at exact sizes: {why} (at {user_line()}; "
            f"{_describe(values, forms)})",
            file=sys.stderr,
        )
    return EXACT, None


def _split_forms(forms):
    """The key's forms by argument: {(arg, elem): {slot: code}} of tensor values (sizes, strides, offset) and
    {(arg, elem): code} of int arguments (a factory's size: arange(L))."""
    by_path, int_forms = {}, {}
    for arg, elem, slot, code in forms:
        if slot < 0:
            int_forms[(arg, elem)] = code
        else:
            by_path.setdefault((arg, elem), {})[slot] = code
    return by_path, int_forms


def _describe(values, forms):
    """Each tensor argument's sizes, strides and offset as keyed (forms of L) and its storage's shape codes."""
    import sympy

    L = sympy.Symbol("L")
    keyed, _ = _split_forms(forms)

    def one(v, path):
        slots = keyed.get(path, {})
        vals = list(v.shape) + list(v.stride()) + [v.storage_offset()]
        ex = [str(_expr(slots.get(k, x), L)).replace(" ", "") for k, x in enumerate(vals)]
        nd = v.dim()
        sym, _cap, codes = _C._sym_of(v) if v.device.type == "tpu" else (-1, 0, [])
        store = f" of [{', '.join(str(_expr(c, L)).replace(' ', '') for c in codes)}]" if sym >= 0 else ""
        return f"({', '.join(ex[:nd])}) strides ({', '.join(ex[nd : 2 * nd])}) +{ex[-1]}{store}"

    out = []
    for i, v in enumerate(values):
        if isinstance(v, torch.Tensor):
            out.append(one(v, (i, -1)))
        elif isinstance(v, (list, tuple)):
            out += [one(x, (i, j)) for j, x in enumerate(v) if isinstance(x, torch.Tensor)]
    return "; ".join(out)


def _lower(name, values, runtime_slots, storages, device, sym, capacity, forms):
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    call = kernels.Call(name, values, True, runtime_slots, storages, device)
    kind, fname, _rule, out_names = call.info
    target = None  # in place or out=: the argument written (its storage gets the result)
    if kind == "inplace":
        target = call.args[0]
    elif kind == "out":
        if len(out_names) != 1:
            raise Decline("several out= arguments")
        call.kwargs = dict(call.kwargs)
        target = call.kwargs.pop(out_names[0])
    if target is not None and not isinstance(target, torch.Tensor):
        raise Decline(f"the {kind} form of a list")
    by_path, int_forms = _split_forms(forms)
    func = _FUNCTIONAL.get(fname) or kernels.overload(fname)  # in place, out=: the functional form, written back

    env = ShapeEnv()
    s0 = env.create_symbol(sym, ConstantSource("tpu_varying_size"))

    def symint(expr):
        if isinstance(expr, int):
            return expr
        return env.create_symintnode(expr, hint=int(expr.subs(s0, sym)))

    def layout(t):
        """(sizes, strides, offset) of a tensor argument as sympy expressions / ints, or None (static)."""
        slots = by_path.get(call.path_of.get(id(t), (None, None)))
        if slots is None:
            return None
        nd = t.dim()
        vals = list(t.shape) + list(t.stride()) + [t.storage_offset()]
        ex = [_expr(slots.get(k, v), s0) for k, v in enumerate(vals)]
        return ex[:nd], ex[nd : 2 * nd], ex[2 * nd]

    def plain(a):
        return a.value if isinstance(a, kernels.RuntimeScalar) else a

    call.seen.update(tuple(p) for p in runtime_slots)  # any scalar the padded code reads is keyed by value
    mode = FakeTensorMode(shape_env=env)

    def to_fake(a):
        if isinstance(a, torch.Tensor):
            lay = layout(a)
            with mode:
                if lay is None:
                    return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype)
                return torch.empty_strided([symint(e) for e in lay[0]], [symint(e) for e in lay[1]], dtype=a.dtype)
        return plain(a)

    where = _arg_places(call)

    def with_ints(args, kwargs, make):
        """args and kwargs with each int argument taken as a form of L replaced by make(expression)."""
        args, kwargs = list(args), dict(kwargs)
        for (a, e), code in int_forms.items():
            container, k = where[a]
            box = args if container == "args" else kwargs
            if e < 0:
                box[k] = make(_expr(code, s0))
            else:
                lst = list(box[k])
                lst[e] = make(_expr(code, s0))
                box[k] = lst
        return args, kwargs

    fargs = [[to_fake(x) for x in a] if isinstance(a, (list, tuple)) else to_fake(a) for a in call.args]
    fkwargs = {k: to_fake(a) for k, a in call.kwargs.items()}
    fargs, fkwargs = with_ints(fargs, fkwargs, symint)
    with mode, _quiet_fake_tensors():
        fout = padded_trace.meta_call(func, fargs, fkwargs)  # (a meta function that rejects it declines, below)
    if env.guards:
        raise Decline(f"its shapes depend on the value of the size ({env.guards[0].expr})")
    outs = [fout] if isinstance(fout, torch.Tensor) else list(fout) if isinstance(fout, tuple) else None
    if outs is None or not all(isinstance(o, torch.Tensor) for o in outs):
        raise Decline("results other than tensors")
    codes = [[_code_of(s.node.expr if isinstance(s, torch.SymInt) else s, s0) for s in o.shape] for o in outs]

    gm = None if _has_handler(func) else _decomposed(mode, func, fargs, fkwargs)
    if env.guards:  # the decomposition branched on the size: its graph holds for this size only
        raise Decline(f"its decomposition depends on the value of the size ({env.guards[0].expr})")
    tr = call.trace()
    with torch.no_grad(), padded_trace.Tracer(tr) as T:
        lv = tr.fn.param((), torch.int64)
        tr._scalars.append((lv, INT, (FROM_SYM, (0, -1), 0)))
        sizes = T.tensor(E.reshape(lv, (1,)))
        ctx = Ctx({s0: 0}, {s0: sym}, sizes)

        def to_padded(a):
            if not isinstance(a, torch.Tensor):
                return plain(a)
            lay = layout(a)
            if lay is None:
                return padded_plain(T.tensor(tr.read_value(a)))
            flat = _flat_value(tr, a)
            if flat.dtype != a.dtype:
                raise Decline("a storage read as another dtype")
            with _in_range(tr):  # its gather's indices are in range by construction (the padding's are 0)
                return _read_padded(ctx, T.tensor(flat), *lay)

        pargs = [[to_padded(x) for x in a] if isinstance(a, (list, tuple)) else to_padded(a) for a in call.args]
        pkwargs = {k: to_padded(a) for k, a in call.kwargs.items()}
        pargs, pkwargs = with_ints(pargs, pkwargs, ctx.size)
        if gm is None:
            res = interp.call_node(_Node(func, fout), pargs, pkwargs, ctx)
        else:  # the Core ATen decomposition (as compiled graphs have it), interpreted op by op
            from torch.utils import _pytree

            res = interp.run(gm, _pytree.tree_flatten((pargs, pkwargs))[0], ctx)
        res = [res] if not isinstance(res, (list, tuple)) else list(res)
        written = None
        if target is not None:
            lay = layout(target)
            if lay is None or len(res) != 1 or not isinstance(res[0], PT):
                raise Decline(f"the {kind} form into a tensor without the varying size")
            if res[0].t.dtype != target.dtype:
                res[0] = PT(res[0].t.to(target.dtype), res[0].dims)
            flat = _flat_value(tr, target)
            with _in_range(tr):
                if _whole(target, by_path.get(call.path_of.get(id(target))), capacity):
                    new = compact_output(ctx, res[0])
                    if new.numel() != flat.numel:
                        raise Decline("a compact result of another size than its storage")
                else:  # through a view: the valid positions scattered into the storage's value
                    new = _write_padded(ctx, T.tensor(flat), *lay, res[0])
            written = T.value(new)
            res = []
        results = []
        for r, o, c in zip(res, outs, codes):
            if not isinstance(r, PT):
                raise Decline("a result the interpreter gave as no tensor")
            if all(x >= 0 for x in c):  # no size follows L: the exact result
                results.append((T.value(r.t), c, None))
            else:
                with _in_range(tr):  # clamped indices
                    results.append((T.value(compact_output(ctx, r)), c, o))
    if any(src[0] == FROM_RNG for _, _, src in tr._scalars):
        raise Decline("random numbers")
    outputs = []
    if target is not None:
        key = tr._storages(target)[0]
        tr._cur[key] = tr.writes[key] = written  # the storage's whole (flat) value
        tr._write_tensor[key] = target
        a, e = call.path_of[id(target)]
        outputs.append((kernels.ARG, a, e, [], [], torch.float32))
    for j, (v, c, o) in enumerate(results):
        if o is None:
            meta = torch.empty(c, dtype=v.dtype, device="meta")
            outputs.append((kernels.NEW, 0, -1, list(c), list(meta.stride()), v.dtype))
        else:
            meta = torch.empty((v.numel,), dtype=v.dtype, device="meta")
            outputs.append((kernels.NEW, 0, -1, [v.numel], [1], v.dtype, -1, -1, c))
        slot = OutputSlot(j, meta)
        tr.write(slot, v if o is not None else E.reshape(v, tuple(c)))
    fid = tr.fragment(
        f"{kernels.label(name, *kernels.map_args(kernels.plain, call.args, call.kwargs))} "
        f"(a varying size, bucket {capacity})"
    )
    registration = getattr(tr, "registration", None) if fid >= 0 else None
    scalar_params = [(src[0], src[1][0], src[1][1], src[2]) for _, _, src in tr._scalars]
    res_targets = []
    for k in tr.writes:
        if isinstance(k, tuple) and k[0] == "out":
            res_targets.append((-1, k[1], -1, -1))
        elif target is not None and k == tr._storages(target)[0]:
            res_targets.append((k, -1, -1, -1))
        else:
            raise Decline("it writes an argument")
    returns = kernels.SINGLE if isinstance(fout, torch.Tensor) else kernels.TUPLE
    metrics.inc("eager_symbolic.lowered")
    return (
        "program",
        fid,
        list(tr._params),
        scalar_params,
        res_targets,
        outputs,
        returns,
        sorted(call.seen),
        bool(tr.checks),
        [],
    ), registration


_FUNCTIONAL = {"copy_": torch.ops.aten.copy.default}  # in-place ops whose rule is their own


def _flat_value(tr, t):
    """The flat Value of t's storage in Trace tr (zeros when it holds none)."""
    flat = tr._storage_value(t)
    if flat is None:
        flat = E.const(tr.fn, 0, t.dtype, (t.untyped_storage().nbytes() // t.element_size(),))
    return E.reshape(flat, (flat.numel,))


class _in_range:
    """Drops the device-side index checks of the ops inside: our own gathers and scatters, whose indices are in
    range by construction (clamped, or 0 in the padding)."""

    def __init__(self, tr):
        self.tr = tr

    def __enter__(self):
        self.n = len(self.tr.checks)

    def __exit__(self, *exc):
        del self.tr.checks[self.n :]


class _quiet_fake_tensors:
    """torch logs a meta function's error under fake tensors at error level; here it only means a decline."""

    def __enter__(self):
        import logging

        self.log = logging.getLogger("torch._subclasses.fake_tensor")
        self.level = self.log.level
        self.log.setLevel(logging.CRITICAL)

    def __exit__(self, *exc):
        self.log.setLevel(self.level)


def _has_handler(func) -> bool:
    return func in interp.HANDLERS or func.overloadpacket in interp.HANDLERS or torch.Tag.pointwise in func.tags


def _decomposed(mode, func, fargs, fkwargs):
    """func's Core ATen decomposition traced into an FX graph at the symbolic sizes (for the interpreter's (interp.py);
    its placeholders are the call's arguments, flattened)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils import _pytree

    table = torch._decomp.core_aten_decompositions()
    if func not in table:
        raise Decline(f"{func} has no bucketed rule and no decomposition")
    flat, spec = _pytree.tree_flatten((fargs, fkwargs))

    def fn(*leaves):
        a, k = _pytree.tree_unflatten(list(leaves), spec)
        return func(*a, **k)

    with mode, _quiet_fake_tensors():
        return make_fx(fn, decomposition_table=table)(*flat)


def _arg_places(call):
    """Schema argument index -> ("args", position) or ("kwargs", name) in the call (kernels.Call's split)."""
    out, pos = {}, 0
    for i, a in enumerate(call.op._schema.arguments):
        if a.kwarg_only:
            out[i] = ("kwargs", a.name)
        else:
            out[i] = ("args", pos)
            pos += 1
    return out


def _whole(t, codes, capacity):
    """Whether t is the compact tensor of its storage (contiguous from its start, as large as the storage at the
    capacity; codes: its values the key holds as forms, by slot): a result written compact replaces the storage's
    value."""
    if codes is None or t.storage_offset() != 0 or not t.is_contiguous():
        return False
    numel = 1
    for d, n in enumerate(t.shape):
        f = decode(codes.get(d, n))
        numel *= n if f is None else f[0] * capacity ** f[2] + f[1]
    return numel * t.element_size() == t.untyped_storage().nbytes()


def _positions(ctx, sizes, strides, offset, rows=False):
    """Per position of the padded layout of a view with those (symbolic) sizes, strides and offset: its index in
    the flat storage (0 in the padding) and whether it is valid (None: all are); returns (szs, padded, idx, mask,
    row). rows: where the view's inner dims are whole rows of `row` values of the storage (_row_split), idx counts
    rows and has the outer dims' shape and one more, the rows of the inner block (row 1: idx counts values)."""
    import sympy

    szs = [ctx.size(e) for e in sizes]
    padded = [z.padded if isinstance(z, Sz) else z for z in szs]
    j, row = _row_split(szs, strides, offset) if rows else (len(szs), 1)

    def rt(e):
        e = e // row if isinstance(e, int) else sympy.expand(e / row)
        return int(e) if isinstance(e, int) or e.is_Integer else ctx._eval(e)

    ishape = padded[:j] + ([math.prod(padded[j:]) // row] if j < len(szs) else [])
    idx = rt(offset)
    for d in range(len(ishape)):
        shape = [1] * len(ishape)
        shape[d] = ishape[d]
        idx = idx + ctx.iota(ishape[d]).view(shape) * (rt(strides[d]) if d < j else 1)
    mask = None
    for d, z in enumerate(szs):
        if isinstance(z, Sz):
            shape = [1] * len(padded)
            shape[d] = padded[d]
            m = ctx.iota(padded[d]).view(shape) < z.rt
            mask = m if mask is None else mask & m
    idx = idx.expand(ishape) if isinstance(idx, torch.Tensor) else ctx.iota(1).expand(ishape) * 0 + idx
    if mask is not None and j == len(szs):
        idx = torch.where(mask, idx, 0)
    return szs, padded, idx, mask, row


def _row_split(szs, strides, offset):
    """(j, row): the view's dims from j on are static and contiguous (one block of values per outer position), and
    `row` divides the block, every outer stride and the offset, so the view reads whole rows of `row` values of
    the flat storage: one gather of rows, which XLA:CPU copies as runs, where a gather of single values costs
    per value. (len(szs), 1) when it has no such block."""
    import sympy

    j, block = len(szs), 1
    while j > 0 and isinstance(szs[j - 1], int) and isinstance(strides[j - 1], int) and strides[j - 1] == block:
        block *= szs[j - 1]
        j -= 1
    if block <= 1:
        return len(szs), 1
    row = block
    for e in list(strides[:j]) + [offset]:
        if isinstance(e, int):
            row = math.gcd(row, abs(e))
        else:
            coeffs = sympy.expand(e).as_coefficients_dict().values()
            if not all(getattr(c, "is_Integer", False) for c in coeffs):
                return len(szs), 1
            for c in coeffs:
                row = math.gcd(row, abs(int(c)))
    return (j, row) if row > 1 else (len(szs), 1)


def _write_padded(ctx, flat, sizes, strides, offset, value):
    """The flat storage with the valid values of padded tensor `value` written through the view (sizes, strides,
    offset); the padding's writes go to one extra position, dropped after."""
    szs, padded, idx, mask, _ = _positions(ctx, sizes, strides, offset)
    if tuple(value.t.shape) != tuple(padded) or any(
        len(f) != 1 or (f[0][1] is None) != (not isinstance(z, Sz)) for f, z in zip(value.dims, szs)
    ):
        raise Decline("a written value laid out otherwise than its view")
    n = flat.numel()
    if mask is not None:
        idx = torch.where(mask, idx, n)
    ext = torch.cat([flat, torch.zeros(1, dtype=flat.dtype, device=flat.device)])
    return ext.index_put((idx.reshape(-1),), value.t.reshape(-1))[:n]


def _read_padded(ctx, flat, sizes, strides, offset):
    """The tensor of those (symbolic) sizes, strides and offset over a compact flat storage, in the padded layout
    of the interpreter (each dim of size n at its bucket's P: the valid values first, the padding zero)."""
    szs, padded, idx, mask, row = _positions(ctx, sizes, strides, offset, rows=True)
    vals = (flat[idx.reshape(-1)] if row == 1 else rows_at(flat, idx, row)).view(padded)
    if mask is not None:
        vals = torch.where(mask, vals, torch.zeros((), dtype=vals.dtype, device=vals.device))
    return PT(vals, [((z.padded, z),) if isinstance(z, Sz) else ((z, None),) for z in szs])


kernels.register_lowerer("sym", lower)
