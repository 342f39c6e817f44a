"""The lowering table and its registration with the dispatcher.

One rule per ATen overload (``@lowering("add.Tensor")``). A rule receives a Trace and the
op's arguments with every tpu tensor replaced by its StableHLO value; it returns the
value(s) of the functional result. From each functional rule the in-place (``add_.Tensor``)
and ``out=`` (``add.out``) kernels are derived from the schemas, in one loop.

Ops without a rule go to the boxed fallback: PyTorch's own decomposition when there is one
(counted as ``decomposed.<op>``), else the CPU round trip (counted as ``fallback.<op>``,
warned once, an error under ``TORCHTPU_FALLBACK=error``).
"""
from __future__ import annotations

import os
import threading
import warnings
from typing import Callable

import torch
import torch._decomp
import torch._meta_registrations  # noqa: F401  (meta kernels give every op's output metadata)
from torch.utils._pytree import tree_map

from . import _C, metrics
from . import executor as X
from .errors import TpuOpError, op_error

RULES: dict[str, Callable] = {}  # functional rules: in-place and out= kernels are derived from them
INPLACE_RULES: dict[str, Callable] = {}  # in-place-only ops (uniform_, normal_, ...): rule gives self's new value
DIRECT: dict[str, Callable] = {}  # kernels that are not value rules (copies, host reads)
FOREACH: dict[str, Callable] = {}  # _foreach_* rules generated from element rules (lowering/foreach.py)
PREPROCESS: dict[str, Callable] = {}  # functional op name -> (args, kwargs) -> (args, kwargs), run before meta
META: dict[str, Callable] = {}  # op name -> fn(meta args, meta kwargs) -> outputs, where the op has no meta kernel


def out_meta(tr, i=0):
    """The meta tensor of a rule's i-th output (rules read output shapes and dtypes from it)."""
    return tr.out[i] if isinstance(tr.out, (tuple, list)) else tr.out


def _registrar(table):
    def register(*names):
        def deco(fn):
            for n in names:
                assert n not in table, f"two kernels for {n}"
                table[n] = fn
            return fn

        return deco

    return register


lowering = _registrar(RULES)
inplace_lowering = _registrar(INPLACE_RULES)
direct = _registrar(DIRECT)


def _overload(name: str):
    packet, _, ov = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), ov or "default")


def _is_tpu(x):
    return isinstance(x, torch.Tensor) and x.device.type == "tpu"


# -- argument handling ---------------------------------------------------------------------------
def _device_index(opname, args, kwargs) -> int:
    """The tpu device of the op; rejects tensors on two devices (0-d CPU tensors are scalars, as on cuda)."""
    dev = None
    for x in _flat(args, kwargs):
        if isinstance(x, torch.Tensor):
            if x.device.type == "tpu":
                if dev is None:
                    dev = x.device
                elif x.device != dev:
                    raise op_error(opname, args, kwargs, f"Expected all tensors to be on the same device, but found at least two devices, {dev} and {x.device}")
            elif x.dim() != 0 or x.device.type != "cpu":
                raise op_error(opname, args, kwargs, f"Expected all tensors to be on the same device, but found at least two devices, tpu and {x.device} (move the {x.device} tensor with .to('tpu'))")
    if dev is None:
        d = kwargs.get("device")
        return (d.index or 0) if isinstance(d, torch.device) and d.index is not None else torch.tpu.current_device()
    return dev.index or 0


def _flat(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def _to_meta(x):
    if isinstance(x, torch.Tensor):
        return torch.empty_strided(x.shape, x.stride(), dtype=x.dtype, device="meta")
    if isinstance(x, torch.Generator):
        return None
    if isinstance(x, torch.device) and x.type == "tpu":
        return torch.device("meta")
    return x


def _map(fn, args, kwargs):
    """tree_map for ATen arguments (values, or lists/tuples of them): much cheaper than pytree."""

    def one(x):
        return type(x)(fn(v) for v in x) if isinstance(x, (list, tuple)) else fn(x)

    return [one(a) for a in args], {k: one(v) for k, v in kwargs.items()}


# Output metadata per argument signature: the meta kernels are Python refs for many ops and cost more
# than the rest of a launch. Numbers in arguments typed `Scalar` in the schema (alpha, other, value, Adam's
# bias corrections in _foreach_div_.ScalarList: the ones that change from step to step) enter the key by
# type only; every other number (eps, momentum, scale factors, which may shape an output) by value. arange's
# and range's Scalars shape their output, so they count by value.
_META_CACHE: dict = {}
_META_CACHE_MAX = 16384
_SCALAR_TYPES = ("number", "Optional[number]", "List[number]",  # how torch 2.13 prints Scalar, Scalar?, Scalar[]
                 "Scalar", "Scalar?", "List[Scalar]")
_scalar_args: dict = {}  # op name -> (positions, names) of Scalar / Scalar[] arguments


def _scalar_slots(op, opname):
    slots = _scalar_args.get(opname)
    if slots is None:
        if opname.split(".")[0] in ("arange", "range"):
            slots = (frozenset(), frozenset())
        else:
            sargs = [(i, a.name) for i, a in enumerate(op._schema.arguments) if str(a.type) in _SCALAR_TYPES]
            slots = (frozenset(i for i, _ in sargs), frozenset(n for _, n in sargs))
        _scalar_args[opname] = slots
    return slots


def _sig_one(x, scalar_slot):
    if isinstance(x, torch.Tensor):
        return (tuple(x.shape), x.stride(), x.dtype, x.device.type)
    if scalar_slot and isinstance(x, (int, float, complex)) and not isinstance(x, bool):
        return type(x)
    if isinstance(x, torch.Generator):
        return torch.Generator
    return x


def _signature(op, opname, args, kwargs):
    positions, names = _scalar_slots(op, opname)

    def one(x, slot):
        return tuple(_sig_one(v, slot) for v in x) if isinstance(x, (list, tuple)) else _sig_one(x, slot)

    return (opname, tuple(one(a, i in positions) for i, a in enumerate(args)),
            tuple((k, one(v, k in names)) for k, v in kwargs.items()))


def meta(op, opname, args, kwargs):
    key = _signature(op, opname, args, kwargs)
    try:
        hit = _META_CACHE.get(key)
    except TypeError:  # an unhashable argument: no caching
        key, hit = None, None
    if hit is not None:
        return hit
    margs, mkwargs = _map(_to_meta, args, kwargs)
    try:
        out = META[opname](*margs, **mkwargs) if opname in META else op(*margs, **mkwargs)
    except (RuntimeError, ValueError, TypeError, IndexError) as e:
        raise op_error(opname, args, kwargs, e) from None
    if key is not None:
        if len(_META_CACHE) >= _META_CACHE_MAX:
            _META_CACHE.clear()
        _META_CACHE[key] = out
    return out


def _values(tr, args, kwargs):
    def conv(x):
        if isinstance(x, torch.Tensor):
            v = tr.read_value(x) if x.device.type == "tpu" else tr.host(x)
            tr.source[id(v)] = x  # lets a rule update an input in place (batch norm's running stats)
            return v
        return x

    return _map(conv, args, kwargs)


def _as_tuple(x):
    return x if isinstance(x, (tuple, list)) else (x,)


def _new_like_meta(m, device_index):
    return torch.empty(m.shape, dtype=m.dtype, device=torch.device("tpu", device_index))


def _run_rule(opname, rule, args, kwargs, fmeta, dev):
    tr = X.Trace(opname, dev)
    tr.out = fmeta
    vargs, vkwargs = _values(tr, args, kwargs)
    try:
        res = rule(tr, *vargs, **vkwargs)
    except TpuOpError:
        raise
    except Exception as e:
        raise op_error(opname, args, kwargs, e) from e
    return tr, _as_tuple(res)


# -- kernels derived from a rule ------------------------------------------------------------------
def _prologue(opname, pre, args, kwargs):
    """Counts the op, applies its argument preprocessing, finds its device, applies storage events."""
    metrics.inc("op." + opname)
    if pre is not None:
        args, kwargs = pre(args, kwargs)
    dev = _device_index(opname, args, kwargs)
    X.drain()
    return args, kwargs, dev


def functional_kernel(opname, rule):
    op = _overload(opname)
    pre = PREPROCESS.get(opname)

    def kernel(*args, **kwargs):
        args, kwargs, dev = _prologue(opname, pre, args, kwargs)
        fmeta = meta(op, opname, args, kwargs)
        tr, vals = _run_rule(opname, rule, args, kwargs, fmeta, dev)
        metas = _as_tuple(tr.out)  # a rule may correct the meta kernel where CPU differs (batch norm)
        outs = [None if m is None else _new_like_meta(m, dev) for m in metas]  # None: an undefined output
        for o, v in zip(outs, vals):
            if o is not None:
                tr.write(o, v)
        X.launch(tr)
        if isinstance(fmeta, list):  # Tensor[] results
            return outs
        return tuple(outs) if isinstance(fmeta, tuple) else outs[0]

    return kernel


def inplace_kernel(opname, fname, rule):
    op, fop = _overload(opname), _overload(fname)
    pre = PREPROCESS.get(fname)

    def kernel(*args, **kwargs):
        args, kwargs, dev = _prologue(opname, pre, args, kwargs)
        fmeta = meta(op, opname, args, kwargs)  # in-place: shapes must not grow, dtypes must cast
        if fop is not op:
            fmeta = meta(fop, opname, args, kwargs)
            selfs = args[0] if isinstance(args[0], (list, tuple)) else [args[0]]
            for t, m in zip(selfs, _as_tuple(fmeta)):
                if not torch.can_cast(m.dtype, t.dtype):
                    raise op_error(opname, args, kwargs, f"result type {m.dtype} can't be cast to the desired output type {t.dtype}")
        tr, vals = _run_rule(opname, rule, args, kwargs, fmeta, dev)
        if isinstance(args[0], (list, tuple)):  # _foreach_*_: every tensor of the list; returns nothing
            for t, v in zip(args[0], vals):
                tr.write(t, v)
            X.launch(tr)
            return None
        tr.write(args[0], vals[0])
        X.launch(tr)
        return args[0]

    return kernel


# Ops whose CPU out= kernels reject any overlap between out and an input, and out tensors whose elements
# share memory (at::assert_no_overlap / assert_no_internal_overlap): the meta kernels cannot see aliasing.
_OUT_NO_OVERLAP = {"gather", "index_select", "take", "masked_select", "kthvalue", "cat", "bernoulli", "sort",
                   "topk", "median", "nanmedian", "mode", "nonzero"}


# out= overloads that CPU's structured kernels give no implicit cast: the out dtype must be the result's.
_OUT_DTYPE_EXACT = {"aminmax.out", "complex.out", "polar.out"}


def check_out_overlap(opname, args, kwargs, outs):
    if opname.split(".")[0] not in _OUT_NO_OVERLAP:
        return
    ins = [x for x in _flat(args, kwargs) if _is_tpu(x)]
    try:
        for o in outs:
            if _is_tpu(o):
                _C._assert_no_internal_overlap(o)
                for x in ins:
                    _C._assert_no_overlap(o, x)
    except RuntimeError as e:
        raise op_error(opname, args, kwargs, e) from None


def out_kernel(opname, fname, rule, out_names):
    op, fop = _overload(opname), _overload(fname)
    pre = PREPROCESS.get(fname)

    def kernel(*args, **kwargs):
        args, kwargs, dev = _prologue(opname, pre, args, kwargs)
        ometa = meta(op, opname, args, kwargs)
        outs = [kwargs.pop(n) for n in out_names]
        check_out_overlap(opname, args, kwargs, outs)
        # an out-only rule (no functional twin, e.g. arange.start_out) takes its shapes from the out meta
        fmeta = ometa if fop is op else meta(fop, opname, args, kwargs)
        for o, m in zip(outs, _as_tuple(fmeta)):
            if opname in _OUT_DTYPE_EXACT and o.dtype != m.dtype:
                raise op_error(opname, args, kwargs, f"Expected out tensor to have dtype {m.dtype}, but got "
                                                     f"{o.dtype} instead")
            if o.shape != m.shape:
                o.resize_(m.shape)
        tr, vals = _run_rule(opname, rule, args, kwargs, fmeta, dev)
        for o, v in zip(outs, vals):
            tr.write(o, v)
        X.launch(tr)
        return tuple(outs) if len(outs) > 1 else outs[0]

    return kernel


def _variants(opname):
    """(in-place overload name or None, [(out overload name, out arg names)])."""
    packet, _, ov = opname.partition(".")
    ov = ov or "default"
    fschema = _overload(opname)._schema
    sig = [(a.name, str(a.type).replace("Tensor(a!)", "Tensor")) for a in fschema.arguments]
    inplace = None
    ip = getattr(torch.ops.aten, packet + "_", None)
    if ip is not None and ov in ip.overloads():
        inplace = f"{packet}_.{ov}"
    outs = []
    for name in getattr(torch.ops.aten, packet).overloads():
        s = getattr(getattr(torch.ops.aten, packet), name)._schema
        out_args = [a.name for a in s.arguments if a.is_out]
        if out_args and [(a.name, str(a.type)) for a in s.arguments if not a.is_out] == sig:
            outs.append((f"{packet}.{name}", out_args))
    return inplace, outs


_lib = None
_fallback_lib = None
_registered: set[str] = set()


def _impl(name, kernel):
    _lib.impl(name[: -len(".default")] if name.endswith(".default") else name, kernel, "PrivateUse1")
    _registered.add(name)


def register_all():
    global _lib
    _lib = torch.library.Library("aten", "IMPL")
    for name, fn in DIRECT.items():
        _impl(name, fn)
    for name, rule in INPLACE_RULES.items():
        _impl(name, inplace_kernel(name, name, rule))
    for name, rule in FOREACH.items():
        _impl(name, functional_kernel(name, rule))
        inplace, _ = _variants(name)
        if inplace:
            _impl(inplace, inplace_kernel(inplace, name, rule))
    for name, rule in RULES.items():
        out_args = [a.name for a in _overload(name)._schema.arguments if a.is_out]
        if out_args:  # an out-only op
            _impl(name, out_kernel(name, name, rule, out_args))
            continue
        _impl(name, functional_kernel(name, rule))
        inplace, outs = _variants(name)
        if inplace and inplace not in RULES and inplace not in DIRECT:
            _impl(inplace, inplace_kernel(inplace, name, rule))
        for oname, out_names in outs:
            if oname not in RULES and oname not in DIRECT:
                _impl(oname, out_kernel(oname, name, rule, out_names))
    global _fallback_lib
    _fallback_lib = torch.library.Library("_", "IMPL")
    _fallback_lib.fallback(fallback, dispatch_key="PrivateUse1")


def registered_ops() -> set[str]:
    return set(_registered)


# -- the boxed fallback --------------------------------------------------------------------------
_warned: set[str] = set()
_tls = threading.local()


def _decomposing() -> set:
    s = getattr(_tls, "decomposing", None)
    if s is None:
        s = _tls.decomposing = set()
    return s


def _opname(op) -> str:
    s = op._schema
    return s.name.split("::")[-1] + ("." + s.overload_name if s.overload_name else "")


def _into_out_args(op, kwargs, result):
    """An .out decomposition must leave its result in the out= tensors; some return a fresh tensor instead
    (e.g. reflection_pad1d.out for bfloat16, whose opmath wrapper computes in float32): copy it there."""
    outs = [kwargs[a.name] for a in op._schema.arguments if a.is_out and a.name in kwargs]
    if not outs:
        return result
    res = result if isinstance(result, (tuple, list)) else (result,)
    for o, r in zip(outs, res):
        if isinstance(r, torch.Tensor) and r is not o:
            if o.shape != r.shape:
                o.resize_(r.shape)
            o.copy_(r)
    return outs[0] if len(outs) == 1 else tuple(outs)


def fallback(op, *args, **kwargs):
    name = _opname(op)
    out_names = [a.name for a in op._schema.arguments if a.is_out and a.name in kwargs]
    if out_names:
        check_out_overlap(name, args, {k: v for k, v in kwargs.items() if k not in out_names},
                          [kwargs[n] for n in out_names])
    decomp = torch._decomp.decomposition_table.get(op)
    active = _decomposing()
    if decomp is not None and op not in active:
        active.add(op)
        try:
            out = decomp(*args, **kwargs)
        except TypeError as e:
            # NOTE: some decompositions registered for an .out overload do not take its out argument names
            # (e.g. max_pool2d_with_indices_backward.grad_input); the CPU round trip handles those.
            if "unexpected keyword argument" not in str(e):
                raise
            out = NotImplemented
        finally:
            active.discard(op)
        if out is not NotImplemented:  # a decomposition may decline a case
            metrics.inc("decomposed." + name)
            return _into_out_args(op, kwargs, out)
    return cpu_fallback(op, name, args, kwargs)


def cpu_fallback(op, name, args, kwargs):
    policy = os.environ.get("TORCHTPU_FALLBACK", "warn")
    if policy == "error":
        raise op_error(name, args, kwargs, "no tpu lowering for this op and TORCHTPU_FALLBACK=error forbids the CPU fallback")
    metrics.inc("fallback." + name)
    if policy != "silent" and name not in _warned:
        _warned.add(name)
        warnings.warn(f"torchtpu: aten::{name} has no tpu lowering; running it on CPU (counted in "
                      f"torchtpu.metrics as fallback.{name}; TORCHTPU_FALLBACK=error to forbid)", stacklevel=3)
    dev = None
    for x in _flat(args, kwargs):
        if _is_tpu(x):
            dev = x.device
            break
    if dev is None:
        d = kwargs.get("device")
        dev = d if isinstance(d, torch.device) else torch.device("tpu", torch.tpu.current_device())

    def to_cpu(x):
        if _is_tpu(x):
            return X.read_host(x, "fallback")
        if isinstance(x, torch.device) and x.type == "tpu":
            return torch.device("cpu")
        if isinstance(x, torch.Generator) and x.device.type == "tpu":
            return None
        return x

    cargs, ckwargs = tree_map(to_cpu, (args, kwargs))
    res = op(*cargs, **ckwargs)
    schema = op._schema
    # Mutated tensor arguments: copy the CPU result back into the tpu tensor.
    flat_args = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args):]]
    flat_cargs = list(cargs) + [ckwargs.get(a.name) for a in schema.arguments[len(args):]]
    alias_of = {}
    for a, orig, cpu in zip(schema.arguments, flat_args, flat_cargs):
        if a.alias_info is not None and a.alias_info.is_write and _is_tpu(orig):
            if orig.shape != cpu.shape:  # out= tensors the CPU kernel resized
                orig.resize_(cpu.shape)
            orig.copy_(cpu)
            alias_of[id(cpu)] = orig

    def back(r):
        if isinstance(r, torch.Tensor):
            if id(r) in alias_of:
                return alias_of[id(r)]
            return r.to(dev)
        return r

    return tree_map(back, res)
