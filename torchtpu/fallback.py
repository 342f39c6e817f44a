"""Ops without a rule: PyTorch's own decomposition when there is one (counted as ``decomposed.<op>``), else the
CPU round trip (counted as ``fallback.<op>``, warned once, an error under ``TORCHTPU_FALLBACK=error``)."""

from __future__ import annotations

import threading
import warnings

import torch
import torch._decomp
from torch.utils._pytree import tree_map

from . import config, metrics
from . import executor as X
from .arguments import flat, is_tpu
from .errors import op_error
from .kernels import check_out_overlap

_fallback_lib = None


def register():
    global _fallback_lib
    _fallback_lib = torch.library.Library("_", "IMPL")
    _fallback_lib.fallback(fallback, dispatch_key="PrivateUse1")


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
        check_out_overlap(
            name, args, {k: v for k, v in kwargs.items() if k not in out_names}, [kwargs[n] for n in out_names]
        )
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
    policy = config.get("fallback")
    if policy == "error":
        raise op_error(
            name, args, kwargs, "no tpu lowering for this op and TORCHTPU_FALLBACK=error forbids the CPU fallback"
        )
    metrics.inc("fallback." + name)
    if policy != "silent" and name not in _warned:
        _warned.add(name)
        warnings.warn(
            f"torchtpu: aten::{name} has no tpu lowering; running it on CPU (counted in "
            f"torchtpu.metrics as fallback.{name}; TORCHTPU_FALLBACK=error to forbid)",
            stacklevel=3,
        )
    dev = None
    for x in flat(args, kwargs):
        if is_tpu(x):
            dev = x.device
            break
    if dev is None:
        d = kwargs.get("device")
        dev = d if isinstance(d, torch.device) else torch.device("tpu", torch.tpu.current_device())

    def to_cpu(x):
        if is_tpu(x):
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
    flat_args = list(args) + [kwargs.get(a.name) for a in schema.arguments[len(args) :]]
    flat_cargs = list(cargs) + [ckwargs.get(a.name) for a in schema.arguments[len(args) :]]
    alias_of = {}
    for a, orig, cpu in zip(schema.arguments, flat_args, flat_cargs):
        if a.alias_info is not None and a.alias_info.is_write and is_tpu(orig):
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
