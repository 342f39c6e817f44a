"""The ops with lowering rules, as kernels of the C++ executor.

Every op with a rule (its functional form, and the in-place and ``out=`` forms derived from the schemas) is one
boxed C++ kernel (csrc/executor/kernel.cpp). The kernel keys the call by its argument signature; on a miss it
asks ``lower`` here, once per signature, for a table entry: the fragment the rule produces (traced by signature,
with the op's Scalar arguments as runtime parameters), where its inputs come from and what its results become.
Calls the table cannot serve (an ``out=`` that must be resized, boolean-mask indexing that must learn a size
on the host, tensors on two devices) run ``python_kernel`` here: the same steps on the real tensors.
"""

from __future__ import annotations

import torch
import torch._meta_registrations  # noqa: F401  (meta kernels give every op's output metadata)

from . import _C, executor, metrics, optable
from .arguments import device_index, flat, is_tpu, map_args, overload
from .errors import TpuOpError, op_error
from .tables import DIRECT, FOREACH, INPLACE_RULES, META, PREPROCESS, RULES, SCALARS_SHAPE_OUTPUT
from .trace import ArgSlot, OutputSlot, RuntimeScalar, Trace, label, plain, register_fragment
from .untraced import untraced

# entry kinds (csrc/core/kinds.h OutputKind, Returns): ints, as the op table on disk keeps them
NEW, ARG, NONE = (k.value for k in (_C.OutputKind.new, _C.OutputKind.arg, _C.OutputKind.none))
SINGLE, TUPLE, LIST, NOTHING = (
    r.value for r in (_C.Returns.single, _C.Returns.tuple, _C.Returns.list, _C.Returns.nothing)
)


def _to_meta(x):
    x = plain(x)
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, torch.Generator):
        return None
    if isinstance(x, torch.device) and x.type == "tpu":
        return torch.device("meta")
    return x


def meta(op, opname, args, kwargs):
    """Output metadata from PyTorch's meta kernels (types of runtime scalars only, which is all they read)."""
    margs, mkwargs = map_args(_to_meta, args, kwargs)
    try:
        return META[opname](*margs, **mkwargs) if opname in META else op(*margs, **mkwargs)
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise op_error(opname, map_args(plain, args, kwargs)[0], map_args(plain, args, kwargs)[1], e) from None


def as_tuple(x):
    return x if isinstance(x, (tuple, list)) else (x,)


# Ops whose CPU out= kernels reject any overlap between out and an input, and out tensors whose elements
# share memory (at::assert_no_overlap / assert_no_internal_overlap): the meta kernels cannot see aliasing.
_OUT_NO_OVERLAP = {
    "gather",
    "index_select",
    "take",
    "masked_select",
    "kthvalue",
    "cat",
    "bernoulli",
    "sort",
    "topk",
    "median",
    "nanmedian",
    "mode",
    "nonzero",
}
# out= overloads that CPU's structured kernels give no implicit cast: the out dtype must be the result's.
_OUT_DTYPE_EXACT = {"aminmax.out", "complex.out", "polar.out"}


def check_out_overlap(opname, args, kwargs, outs):
    if opname.split(".")[0] not in _OUT_NO_OVERLAP:
        return
    ins = [x for x in flat(args, kwargs) if is_tpu(x)]
    try:
        for o in outs:
            if is_tpu(o):
                _C._assert_no_internal_overlap(o)
                for x in ins:
                    _C._assert_no_overlap(o, x)
    except RuntimeError as e:
        raise op_error(opname, args, kwargs, e) from None


# -- one call of an op: lowered by signature (a table entry) or run on the real tensors ----------------------
class NeedsPython(Exception):
    """This call needs the Python kernel (raised while lowering by signature)."""


class Call:
    def __init__(self, name, values, lowering, runtime_slots=(), storages=(), device=None):
        self.name = name
        self.op = overload(name)
        name = name if name in KERNELS else name + ".default"
        self.name = name
        self.info = KERNELS[name]
        self.lowering = lowering
        schema = self.op._schema
        self.seen: set = set()
        self.resizes: list = []  # (arg, elem, sizes) of empty out= arguments the entry resizes
        vals = list(values)
        self.path_of = {}  # id(argument object) -> its path
        for i, v in enumerate(vals):
            self.path_of[id(v)] = (i, -1)
            if isinstance(v, (list, tuple)):
                for j, e in enumerate(v):
                    self.path_of[id(e)] = (i, j)
        if lowering:
            for a, e in runtime_slots:
                if e < 0:
                    vals[a] = RuntimeScalar(vals[a], (a, e), self.seen)
                else:
                    lst = list(vals[a])
                    lst[e] = RuntimeScalar(lst[e], (a, e), self.seen)
                    vals[a] = lst
            if name.split(".")[0] in SCALARS_SHAPE_OUTPUT:
                self.seen.update(tuple(p) for p in runtime_slots)
            self.tokens = {tok: (k, vt) for k, (tok, vt) in enumerate(storages)}
        self.args, self.kwargs = [], {}
        for a, v in zip(schema.arguments, vals):
            if a.kwarg_only:
                self.kwargs[a.name] = v
            else:
                self.args.append(v)
        self.device = device
        # id(argument tensor) -> fn(trace, value) -> value: what its padding rows read as (shapes/eager_buckets.py)
        self.masks: dict = {}

    # storage resolution for the Trace
    def storage(self, t):
        if isinstance(t, ArgSlot):
            return ("arg", t.path), None, t.nbytes
        if isinstance(t, OutputSlot):
            return ("out", t.index), None, t.nbytes
        st = t.untyped_storage()
        tok = st.data_ptr()
        if self.lowering:
            k, vt = self.tokens[tok]
            return k, vt, st.nbytes()
        return tok, (_C._storage_value_type(t) if st.nbytes() else None), st.nbytes()

    def generator_path(self, g):
        return self.path_of.get(id(g), (-1, -1)) if g is not None else (-1, -1)

    def trace(self):
        return Trace(self.name, self.device, self.storage, lowering=self.lowering, generator_path=self.generator_path)

    def values(self, tr, args, kwargs):
        def conv(x):
            if isinstance(x, torch.Tensor):
                if x.device.type == "tpu":
                    v = tr.read_value(x)
                    if id(x) in self.masks:
                        v = self.masks[id(x)](tr, v)
                else:
                    v = tr.host(x, self.path_of.get(id(x)) if self.lowering else None)
                tr.bind_argument(v, x)  # tr.update / tr.arg_of (batch norm's running stats, copy_'s bits)
                return v
            return x

        return map_args(conv, args, kwargs)

    def run_rule(self, tr, rule, args, kwargs):
        vargs, vkwargs = self.values(tr, args, kwargs)
        try:
            res = rule(tr, *vargs, **vkwargs)
        except TpuOpError:
            raise
        except NeedsPython:
            raise
        except Exception as e:
            raise op_error(self.name, *map_args(plain, args, kwargs), e) from e
        return as_tuple(res)

    def new_output(self, j, m):
        if self.lowering:
            return OutputSlot(j, m)
        return torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=torch.device("tpu", self.device))

    # -- the three forms -------------------------------------------------------------------------
    def run(self):
        kind, fname, rule, out_names = self.info
        args, kwargs = self.args, self.kwargs
        if self.lowering and self._preprocessed() is not None:
            raise NeedsPython()  # the arguments change per call (boolean masks): execute() re-dispatches them
        if not self.lowering:
            self.device = device_index(self.name, args, kwargs)
        fop = overload(fname)
        tr = self.trace()
        if kind == "functional":
            fmeta = meta(self.op, self.name, args, kwargs)
            tr._out = fmeta
            vals = self.run_rule(tr, rule, args, kwargs)
            if fmeta is None:  # returns nothing (_assert_async): its program only checks
                return tr, NOTHING, []
            metas = as_tuple(fmeta)
            outs = [None if m is None else self.new_output(j, m) for j, m in enumerate(metas)]
            for o, v in zip(outs, vals):
                if o is not None:
                    tr.write(o, v)
            returns = LIST if isinstance(fmeta, list) else TUPLE if isinstance(fmeta, tuple) else SINGLE
            result = outs
        elif kind == "inplace":
            fmeta = meta(self.op, self.name, args, kwargs)  # in-place: shapes must not grow, dtypes must cast
            if fop is not self.op:
                fmeta = meta(fop, fname, args, kwargs)
                selfs = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
                for t, m in zip(selfs, as_tuple(fmeta)):
                    if not torch.can_cast(m.dtype, t.dtype):
                        raise op_error(
                            self.name,
                            args,
                            kwargs,
                            f"result type {m.dtype} can't be cast to the desired output type {t.dtype}",
                        )
            tr._out = fmeta
            vals = self.run_rule(tr, rule, args, kwargs)
            if isinstance(args[0], (list, tuple)):  # _foreach_*_: every tensor of the list; returns nothing
                for t, v in zip(args[0], vals):
                    tr.write(t, v)
                returns, result = NOTHING, []
            else:
                tr.write(args[0], vals[0])
                returns, result = SINGLE, [args[0]]
        else:  # out
            ometa = meta(self.op, self.name, args, kwargs)
            kwargs = dict(kwargs)
            outs = [kwargs.pop(n) for n in out_names]
            check_out_overlap(self.name, args, kwargs, outs)
            resized = False
            # an out-only rule (no functional twin, e.g. arange.start_out) takes its shapes from the out meta
            fmeta = ometa if fop is self.op else meta(fop, fname, args, kwargs)
            targets = []
            for o, m in zip(outs, as_tuple(fmeta)):
                if self.name in _OUT_DTYPE_EXACT and o.dtype != m.dtype:
                    raise op_error(
                        self.name,
                        args,
                        kwargs,
                        f"Expected out tensor to have dtype {m.dtype}, but got {o.dtype} instead",
                    )
                if o.shape != m.shape:
                    if self.lowering:
                        if o.numel() != 0 or not o.is_contiguous() or o.untyped_storage().nbytes() != 0:
                            # resizing a tensor with values, or within a storage it shares (it may come to
                            # overlap an input there, as on cpu): the Python kernel does it
                            raise NeedsPython()
                        # arrived empty (a factory: arange(n) is empty + arange.start_out): the entry resizes it
                        path = self.path_of[id(o)]
                        self.resizes.append((path[0], path[1], list(m.shape)))
                        targets.append(ArgSlot(path, m))
                        continue
                    o.resize_(m.shape)
                    resized = True
                targets.append(o)
            if resized:  # a resize within its storage can make an out overlap an input (cpu checks after it)
                check_out_overlap(self.name, args, kwargs, outs)
            tr._out = fmeta
            vals = self.run_rule(tr, rule, args, kwargs)
            for o, v in zip(targets, vals):
                tr.write(o, v)
            returns = TUPLE if len(outs) > 1 else SINGLE
            result = outs
        return tr, returns, result

    def entry(self):
        """Lowers by signature: the table entry (csrc/executor/entry.h) as Python values."""
        tr, returns, result = self.run()
        fid = tr.fragment(label(self.name, *map_args(plain, self.args, self.kwargs)))
        self.registration = getattr(tr, "registration", None) if fid >= 0 else None
        storage_params = list(tr._params)
        scalar_params = []
        for _, _, src in tr._scalars:
            kind, path, inc = src
            scalar_params.append((kind, path[0], path[1], inc))
        results = []
        for k in tr.writes:
            if not isinstance(k, tuple):
                results.append((k, -1, -1, -1))
            elif k[0] == "out":
                results.append((-1, k[1], -1, -1))
            else:  # a resized out= argument
                results.append((-1, -1, k[1][0], k[1][1]))
        outputs = []
        for r in result:
            if r is None:
                outputs.append((NONE, 0, -1, [], [], torch.float32))
            elif isinstance(r, OutputSlot):
                outputs.append((NEW, 0, -1, list(r.shape), list(r.stride()), r.dtype))
            else:
                a, e = self.path_of[id(r)]
                outputs.append((ARG, a, e, [], [], torch.float32))
        return (
            "program",
            fid,
            storage_params,
            scalar_params,
            results,
            outputs,
            returns,
            sorted(self.seen),
            bool(tr.checks),
            self.resizes,
        )

    def _preprocessed(self):
        """(args, kwargs) the op's PREPROCESS step replaces the call's by (boolean masks by their indices), or None."""
        pre = PREPROCESS.get(self.info[1])
        if pre is None:
            return None
        new_args, new_kwargs = pre(self.args, self.kwargs)
        return None if new_args is self.args and new_kwargs is self.kwargs else (new_args, new_kwargs)

    def execute(self):
        """Runs the call on its real tensors (Python kernel path)."""
        pre = self._preprocessed()
        if pre is not None:  # through the op table again, keyed by the new arguments (indices with bucketed rows)
            return _redispatch(self.op, *pre[0], **pre[1])
        tr, returns, result = self.run()
        tr.record(label(self.name, self.args, self.kwargs))
        if returns == NOTHING:
            return None
        if returns == LIST:
            return list(result)
        if returns == TUPLE:
            return tuple(result)
        return result[0]


# Lowerers of signatures whose tensors are bucketed (torchtpu/shapes registers them): "rows" (a data-dependent row
# count: eager_buckets.py) and "sym" (a varying inner size: eager_symbolic.py). Each takes (name, values,
# runtime_slots, storages, device, *what the C++ key adds) and returns (entry, registration).
LOWERERS: dict = {}
_on_lowering: list = []  # fn(name, values), called on every lowering (not on op-table hits)


def register_lowerer(kind: str, fn) -> None:
    LOWERERS[kind] = fn


def on_lowering(fn) -> None:
    _on_lowering.append(fn)


def lower(name, values, runtime_slots, storages, device, key=None, buckets=None):
    """C++ callback on an op-table miss: the entry for this signature (from the op table on disk when an earlier
    process lowered it: optable.py). `buckets`: ("sym", L, capacity, forms) when the signature has a varying inner
    size, else (valid rows per row class, bucketed tensor arguments) when its tensors walk the rows of bucketed
    storages."""
    if key is not None:
        known = optable.lookup(key, name, values)
        if known is not None:
            metrics.inc("optable.hits")
            registration, entry = known
            if registration is None:
                return entry
            return (entry[0], register_fragment(registration), *entry[2:])
    metrics.inc("lowerings")
    for fn in _on_lowering:
        fn(name, values)
    slots = [tuple(p) for p in runtime_slots]
    if buckets is not None:
        kind, extra = ("sym", buckets[1:]) if buckets[0] == "sym" else ("rows", buckets)
        entry, registration = LOWERERS[kind](name, values, slots, storages, device, *extra)
    else:
        call = Call(name, values, True, slots, storages, device)
        try:
            entry = call.entry()
        except NeedsPython:
            entry, call.registration = ("python",), None
        registration = call.registration
    if key is not None:
        optable.remember(key, name, values, (registration, entry))
    return entry


@untraced
def _redispatch(op, *args, **kwargs):
    """Calls `op` through the dispatcher again; untraced: inside a compiled function's graph-broken code Dynamo
    would otherwise trace the op-table miss it may cause (jax.device_put among its frames) as user code."""
    return op(*args, **kwargs)


def python_kernel(name, values):
    """C++ callback for calls the table does not serve (an op's own Python kernel first: copy_ from the host)."""
    direct = DIRECT.get(name) or DIRECT.get(name + ".default")
    if direct is not None:
        args, kwargs = [], {}
        for a, v in zip(overload(name)._schema.arguments, values):
            if a.kwarg_only:
                kwargs[a.name] = v
            else:
                args.append(v)
        return direct(*args, **kwargs)
    return Call(name, values, False).execute()


# -- the kernels to register ---------------------------------------------------------------------------------
KERNELS: dict[str, tuple] = {}  # op name -> (kind, functional name, rule, out argument names)


def _variants(opname):
    """(in-place overload name or None, [(out overload name, out arg names)])."""
    packet, _, ov = opname.partition(".")
    ov = ov or "default"
    fschema = overload(opname)._schema
    sig = [(a.name, str(a.type).replace("Tensor(a!)", "Tensor")) for a in fschema.arguments]
    inplace = None
    ip = getattr(torch.ops.aten, packet + "_", None)
    if ip is not None and ov in ip.overloads():
        isig = [(a.name, str(a.type).replace("Tensor(a!)", "Tensor")) for a in getattr(ip, ov)._schema.arguments]
        if isig == sig:  # pow_.Scalar is pow.Tensor_Scalar's in-place form, not pow.Scalar's
            inplace = f"{packet}_.{ov}"
    outs = []
    for name in getattr(torch.ops.aten, packet).overloads():
        s = getattr(getattr(torch.ops.aten, packet), name)._schema
        out_args = [a.name for a in s.arguments if a.is_out]
        if out_args and [(a.name, str(a.type)) for a in s.arguments if not a.is_out] == sig:
            outs.append((f"{packet}.{name}", out_args))
    return inplace, outs


def _collect():
    k = {}
    for name, rule in INPLACE_RULES.items():
        k[name] = ("inplace", name, rule, None)
    for name, rule in FOREACH.items():
        k[name] = ("functional", name, rule, None)
        inplace, _ = _variants(name)
        if inplace:
            k[inplace] = ("inplace", name, rule, None)
    for name, rule in RULES.items():
        if "::" in name:  # an op of torchtpu's own (lowering/attention.py): no in-place or out= forms
            k[name] = ("functional", name, rule, None)
            continue
        out_args = [a.name for a in overload(name)._schema.arguments if a.is_out]
        if out_args:  # an out-only op
            k[name] = ("out", name, rule, out_args)
            continue
        k[name] = ("functional", name, rule, None)
        inplace, outs = _variants(name)
        if inplace and inplace not in RULES and inplace not in DIRECT:
            k[inplace] = ("inplace", name, rule, None)
        for oname, out_names in outs:
            if oname not in RULES and oname not in DIRECT:
                k[oname] = ("out", name, rule, out_names)
    return k


_lib = None
_registered: set[str] = set()


def cpp_name(name):
    return name[: -len(".default")] if name.endswith(".default") else name


def register_all():
    """Registers every op with a rule as the C++ kernel, and the Python kernels of DIRECT."""
    global _lib
    KERNELS.update(_collect())
    _C._register_kernels([cpp_name(n) for n in KERNELS])
    # the C++ kernel names a default overload without ".default"
    KERNELS.update({n[: -len(".default")]: v for n, v in list(KERNELS.items()) if n.endswith(".default")})
    _registered.update(KERNELS)
    _lib = torch.library.Library("aten", "IMPL")
    for name, fn in DIRECT.items():
        if name not in KERNELS:  # the C++ kernel calls the ones that also have a rule (copy_)
            _lib.impl(cpp_name(name), untraced(fn), "PrivateUse1")
        _registered.add(name)


def callbacks() -> dict:
    """What the C++ path calls back into: the executor's callbacks and the op table's (lower, python_kernel). Each
    runs untraced: the dispatcher calls them from inside a compiled function's graph-broken code too, where Dynamo
    would otherwise compile the frames they call (jax's among them: lowering a new signature, compiling a chunk) as
    user code; jax's pytree calls then failed inside Dynamo's frames (Longcat-Flash's expert loop, compiled)."""
    cbs = {**executor.callbacks(), "lower": lower, "python_kernel": python_kernel}
    return {k: untraced(f) for k, f in cbs.items()}


def registered_ops() -> set[str]:
    return set(_registered)
