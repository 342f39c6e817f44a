"""Collectives as ops: ``torchtpu_c10d::all_reduce``, ``all_gather``, ``reduce_scatter`` on tpu tensors.

Each is an ordinary op of the C++ path with a lowering rule that emits the StableHLO collective
(``stablehlo.all_reduce`` / ``all_gather`` / ``reduce_scatter`` over the group's replicas), so a collective costs
what any op costs: in strict mode it is its own program, launched asynchronously; in fused mode it is recorded
into the pending chunk like a matmul, with no cut, and XLA schedules (and combines) the chunk's collectives beside
its compute. A program holding a collective is compiled for the group: one replica per rank, the group's devices
as the device assignment (runtime.py reads the group from the op's ``torchtpu_group`` attribute, global ranks and
world size). A program never holds collectives of two groups: the process group cuts (``cuts.collective``) before
a collective of another group than the pending one's.

The process group (distributed.py) calls these ops for the reductions XLA has (SUM, AVG, MIN, MAX, PRODUCT) on
any dtype but bool; torch.compile graphs reach them through the process group too (Dynamo's functional
collectives call it while the graph is captured, and the capture records these ops into the program); the rest
(bitwise reductions, broadcast, scatter, all-to-all, send/recv) stay jitted shard_map programs.
"""

from __future__ import annotations

import torch

from . import _C, kernels, tables
from . import emit as E
from .hlo import scalar_region

NAMESPACE = "torchtpu_c10d"
_lib = torch.library.Library(NAMESPACE, "DEF")
_lib.define("all_reduce(Tensor x, str op, int[] ranks, int world) -> Tensor")
_lib.define("all_gather(Tensor x, int[] ranks, int world) -> Tensor")
_lib.define("reduce_scatter(Tensor x, str op, int[] ranks, int world) -> Tensor")

OPS = ("SUM", "AVG", "MIN", "MAX", "PRODUCT")
_COMBINE = {
    "SUM": "stablehlo.add",
    "AVG": "stablehlo.add",
    "MIN": "stablehlo.minimum",
    "MAX": "stablehlo.maximum",
    "PRODUCT": "stablehlo.multiply",
}


def supports(op: str, dtype: torch.dtype) -> bool:
    """Whether these ops serve a reduction (else the process group's shard_map programs do)."""
    if dtype == torch.bool or op not in OPS:
        return False
    if dtype.is_complex and op in ("MIN", "MAX"):
        return False
    return True


def _check(name, x, op, ranks, world):
    n = len(ranks)
    if op is not None and op not in OPS:
        raise RuntimeError(f"torchtpu: {name}: reduce op {op} is not one of {OPS}")
    if op == "AVG" and not (x.dtype.is_floating_point or x.dtype.is_complex):
        raise RuntimeError(f"torchtpu: {name}: ReduceOp.AVG needs a floating-point tensor, got {x.dtype}")
    if n < 1 or sorted(set(ranks)) != sorted(ranks) or min(ranks) < 0 or max(ranks) >= world:
        raise RuntimeError(f"torchtpu: {name}: ranks {list(ranks)} are not distinct ranks of a world of {world}")
    if name != "all_reduce" and x.dim() == 0:
        raise RuntimeError(f"torchtpu: {name} needs a tensor of at least one dim, got shape {list(x.shape)}")
    if name == "reduce_scatter" and x.shape[0] % n:
        raise RuntimeError(
            f"torchtpu: reduce_scatter of {list(x.shape)} {x.dtype}: dim 0 ({x.shape[0]}) is not a multiple of "
            f"the group's size {n}"
        )


@torch.library.register_fake(f"{NAMESPACE}::all_reduce", lib=_lib)
def _all_reduce_meta(x, op, ranks, world):
    _check("all_reduce", x, op, ranks, world)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake(f"{NAMESPACE}::all_gather", lib=_lib)
def _all_gather_meta(x, ranks, world):
    _check("all_gather", x, None, ranks, world)
    return x.new_empty((x.shape[0] * len(ranks),) + tuple(x.shape[1:]))


@torch.library.register_fake(f"{NAMESPACE}::reduce_scatter", lib=_lib)
def _reduce_scatter_meta(x, op, ranks, world):
    _check("reduce_scatter", x, op, ranks, world)
    return x.new_empty((x.shape[0] // len(ranks),) + tuple(x.shape[1:]))


def group_attrs(ranks, world) -> str:
    """The attributes every collective of the group carries: its replica group (the program's replicas are the
    group's ranks, in order) and the group itself (global ranks / world size), which picks the devices the program
    is compiled for and keeps the programs of two groups of one size apart in the cache."""
    n = len(ranks)
    ids = ", ".join(str(i) for i in range(n))
    group = ",".join(str(int(r)) for r in ranks)
    return (
        f"replica_groups = dense<[[{ids}]]> : tensor<1x{n}xi64>, "
        f'mhlo.frontend_attributes = {{torchtpu_group = "{group}/{int(world)}"}}'
    )


def _region(op, dtype):
    return scalar_region(_COMBINE[op], dtype)


def _opaque(x):
    """x as a value XLA cannot see as the same on every rank. XLA assumes every replica runs one program, so it
    folds a collective of a value it sees is built from constants (an all-reduce sum into a multiply by the group's
    size, a MAX into the value itself): wrong where ranks run different programs (MPMD code, chunks cut apart, a
    fill of the rank's own value), and the ranks that still run the collective then wait on the rest. An
    optimization barrier does not hold: XLA:CPU removes barriers before its later simplification passes (with its
    elemental fusion emitter, tests/conftest.py, `all_reduce(torch.full((2,), rank + 1.0))` was folded on rank 0
    and rank 1 hung). x times a 1 that XLA cannot know is 1 (the replica id is not 2^32 - 1 on any rank) is x
    exactly, for every value (-0.0, inf and nan included); XLA fuses the multiply into x's producer."""
    fn = x.fn
    rid = fn.op("stablehlo.replica_id", [], (), torch.uint32)
    keep = E.compare(rid, E.const(fn, 2**32 - 1, torch.uint32), "NE")  # true on every rank
    if x.dtype == torch.bool:
        return E.binary("and", x, keep)
    if x.dtype.is_complex:  # each part: a complex multiply by (1, 0) makes nan of an infinite part
        re, im = E.real(x), E.imag(x)
        one = E.convert(keep, re.dtype)
        return E.complex_(E.mul(re, one), E.mul(im, one))
    return E.mul(x, E.convert(keep, x.dtype))


def _all_reduce_rule(tr, x, op, ranks, world):
    x = _opaque(x)
    y = x.fn.op(
        "stablehlo.all_reduce", [x], x.shape, x.dtype, attrs=group_attrs(ranks, world), regions=_region(op, x.dtype)
    )
    return E.div(y, E.const(y.fn, len(ranks), y.dtype)) if op == "AVG" else y


def _all_gather_rule(tr, x, ranks, world):
    x = _opaque(x)
    shape = (x.shape[0] * len(ranks),) + x.shape[1:]
    return x.fn.op(
        "stablehlo.all_gather", [x], shape, x.dtype, attrs=f"all_gather_dim = 0 : i64, {group_attrs(ranks, world)}"
    )


def _reduce_scatter_rule(tr, x, op, ranks, world):
    x = _opaque(x)
    shape = (x.shape[0] // len(ranks),) + x.shape[1:]
    y = x.fn.op(
        "stablehlo.reduce_scatter",
        [x],
        shape,
        x.dtype,
        attrs=f"scatter_dimension = 0 : i64, {group_attrs(ranks, world)}",
        regions=_region(op, x.dtype),
    )
    return E.div(y, E.const(y.fn, len(ranks), y.dtype)) if op == "AVG" else y


RULES = {
    f"{NAMESPACE}::all_reduce": _all_reduce_rule,
    f"{NAMESPACE}::all_gather": _all_gather_rule,
    f"{NAMESPACE}::reduce_scatter": _reduce_scatter_rule,
}


def register() -> None:
    """Makes the ops C++ kernels with their rules (from torchtpu/__init__.py, after the aten kernels)."""
    for qual, rule in RULES.items():
        tables.RULES[qual] = rule
        kernels.KERNELS[qual] = ("functional", qual, rule, None)
    _C._register_kernels(list(RULES))


def all_reduce(t: torch.Tensor, op: str, ranks, world: int) -> torch.Tensor:
    return torch.ops.torchtpu_c10d.all_reduce(t, op, list(ranks), world)


def all_gather(t: torch.Tensor, ranks, world: int) -> torch.Tensor:
    return torch.ops.torchtpu_c10d.all_gather(t, list(ranks), world)


def reduce_scatter(t: torch.Tensor, op: str, ranks, world: int) -> torch.Tensor:
    return torch.ops.torchtpu_c10d.reduce_scatter(t, op, list(ranks), world)


__all__ = ["NAMESPACE", "OPS", "supports", "group_attrs", "register", "all_reduce", "all_gather", "reduce_scatter"]
