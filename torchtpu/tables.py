"""The lowering tables: one rule per ATen overload (``@lowering("add.Tensor")``).

A rule receives a Trace (the op's context: output metadata in ``tr.out``, runtime scalars, checks) and the
op's arguments with every tpu tensor replaced by its StableHLO value; it returns the value(s) of the functional
result. The in-place (``add_.Tensor``) and ``out=`` (``add.out``) forms are derived from the schemas in one loop
(kernels.py). A rule never knows which mode (strict, debug, fused) or path (one op, a chunk) calls it.
"""

from __future__ import annotations

from typing import Callable

RULES: dict[str, Callable] = {}  # functional rules: in-place and out= kernels are derived from them
INPLACE_RULES: dict[str, Callable] = {}  # in-place-only ops (uniform_, normal_, ...): rule gives self's new value
DIRECT: dict[str, Callable] = {}  # Python kernels that are not value rules (host copies, host reads)
FOREACH: dict[str, Callable] = {}  # _foreach_* rules generated from element rules (lowering/foreach.py)
PREPROCESS: dict[str, Callable] = {}  # functional op name -> (args, kwargs) -> (args, kwargs), run before meta
META: dict[str, Callable] = {}  # op name -> fn(meta args, meta kwargs) -> outputs, where the op has no meta kernel
# Ops whose Scalar arguments shape the output: the op table keys them by value, not by type.
SCALARS_SHAPE_OUTPUT = {"arange", "range"}


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
