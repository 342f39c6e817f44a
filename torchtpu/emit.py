"""Typed StableHLO op emitters over `hlo.Value`s: the vocabulary lowering rules are written in.

Each helper checks nothing beyond what it needs; shape/dtype errors are caught earlier
by the op's meta kernel, which names the ATen op.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch

from . import dtypes as D
from .hlo import Value, _attr_array, _list, literal, region, scalar_region, tensor_type


# -- constants, shapes, dtypes ------------------------------------------------------------------
def const(fn, value, dtype, shape=()) -> Value:
    v = fn.op(
        "stablehlo.constant", [], (), dtype, attrs=f"value = dense<{literal(value, dtype)}> : {tensor_type((), dtype)}"
    )
    return broadcast_to(v, shape) if tuple(shape) else v


def constant_array(fn, values, dtype, shape) -> Value:
    """A constant tensor from a flat list of values (row-major)."""
    values = list(values)
    if not values:
        return const(fn, 0, dtype, shape)
    lits = ", ".join(literal(v, dtype) for v in values)
    shape = tuple(int(s) for s in shape)
    if len(shape) != 1:
        return reshape(constant_array(fn, values, dtype, (len(values),)), shape)
    return fn.op("stablehlo.constant", [], shape, dtype, attrs=f"value = dense<[{lits}]> : {tensor_type(shape, dtype)}")


def acc_dtype(dt):
    """The dtype a kernel computes in: float32 for float16/bfloat16 (rounded once at the end, as CPU's opmath
    kernels do), the dtype itself otherwise."""
    return torch.float32 if dt in (torch.float16, torch.bfloat16) else dt


def convert(x: Value, dtype) -> Value:
    if x.dtype == dtype:
        return x
    if dtype == torch.bool:  # x != 0, as torch does
        return compare(x, const(x.fn, 0, x.dtype, x.shape), "NE")
    if x.dtype.is_complex and not dtype.is_complex:  # the real part, as torch's casts (which warn) keep
        return convert(real(x), dtype)
    if dtype.is_complex and not x.dtype.is_complex:  # (x, 0)
        part = convert(x, D.component(dtype))
        return complex_(part, const(x.fn, 0, part.dtype, x.shape))
    return x.fn.op("stablehlo.convert", [x], x.shape, dtype)


# -- complex numbers -------------------------------------------------------------------------------
def real(x: Value) -> Value:
    return x.fn.op("stablehlo.real", [x], x.shape, D.component(x.dtype)) if x.dtype.is_complex else x


def imag(x: Value) -> Value:
    if not x.dtype.is_complex:
        return const(x.fn, 0, x.dtype, x.shape)
    return x.fn.op("stablehlo.imag", [x], x.shape, D.component(x.dtype))


def complex_(re: Value, im: Value) -> Value:
    shape = broadcast_shapes(re.shape, im.shape)
    re, im = broadcast_to(re, shape), broadcast_to(im, shape)
    return re.fn.op("stablehlo.complex", [re, im], shape, D.complex_of(re.dtype))


def conj(x: Value) -> Value:
    return complex_(real(x), unary("negate", imag(x))) if x.dtype.is_complex else x


def bitcast(x: Value, dtype) -> Value:
    if x.dtype == dtype:
        return x
    assert x.dtype.itemsize == dtype.itemsize, (x.dtype, dtype)
    return x.fn.op("stablehlo.bitcast_convert", [x], x.shape, dtype)


def reshape(x: Value, shape) -> Value:
    shape = tuple(int(s) for s in shape)
    if x.shape == shape:
        return x
    return x.fn.op("stablehlo.reshape", [x], shape, x.dtype)


def transpose(x: Value, perm) -> Value:
    perm = [int(p) for p in perm]
    if perm == list(range(x.rank)):
        return x
    return x.fn.op(
        "stablehlo.transpose", [x], [x.shape[p] for p in perm], x.dtype, f"permutation = {_attr_array(perm)}"
    )


def broadcast_in_dim(x: Value, shape, dims) -> Value:
    shape = tuple(int(s) for s in shape)
    if x.shape == shape and list(dims) == list(range(len(shape))):
        return x
    return x.fn.op("stablehlo.broadcast_in_dim", [x], shape, x.dtype, f"broadcast_dimensions = {_attr_array(dims)}")


def broadcast_to(x: Value, shape) -> Value:
    """Numpy-style broadcast (trailing dims aligned)."""
    shape = tuple(int(s) for s in shape)
    off = len(shape) - x.rank
    assert off >= 0, (x.shape, shape)
    for i, s in enumerate(x.shape):
        assert s == shape[off + i] or s == 1, (x.shape, shape)
    # size-1 dims that expand must be dropped first: broadcast_in_dim allows 1 -> n directly
    return broadcast_in_dim(x, shape, range(off, len(shape)))


def broadcast_shapes(*shapes):
    if all(s == shapes[0] for s in shapes):
        return tuple(shapes[0])
    rank = max(len(s) for s in shapes)
    out = [1] * rank
    for s in shapes:
        for i, d in enumerate(s, rank - len(s)):
            if d != 1:
                assert out[i] in (1, d), shapes  # shapes were checked by the op's meta kernel
                out[i] = d
    return tuple(out)


def slice_(x: Value, starts, limits, strides=None) -> Value:
    strides = strides or [1] * x.rank
    if list(starts) == [0] * x.rank and list(limits) == list(x.shape) and list(strides) == [1] * x.rank:
        return x
    shape = [max(0, -(-(l - s) // st)) for s, l, st in zip(starts, limits, strides)]
    return x.fn.op(
        "stablehlo.slice",
        [x],
        shape,
        x.dtype,
        f"start_indices = {_attr_array(starts)}, limit_indices = {_attr_array(limits)}, "
        f"strides = {_attr_array(strides)}",
    )


def slice_dim(x: Value, dim, start, stop, step=1) -> Value:
    starts, limits, strides = [0] * x.rank, list(x.shape), [1] * x.rank
    starts[dim], limits[dim], strides[dim] = start, stop, step
    return slice_(x, starts, limits, strides)


def concatenate(xs: Sequence[Value], dim: int) -> Value:
    if len(xs) == 1:
        return xs[0]
    shape = list(xs[0].shape)
    shape[dim] = sum(x.shape[dim] for x in xs)
    return xs[0].fn.op("stablehlo.concatenate", list(xs), shape, xs[0].dtype, f"dimension = {dim} : i64")


def pad(x: Value, padval: Value, low, high, interior=None) -> Value:
    interior = interior or [0] * x.rank
    shape = [lo + s + hi + max(0, s - 1) * it for s, lo, hi, it in zip(x.shape, low, high, interior)]
    return x.fn.op(
        "stablehlo.pad",
        [x, padval],
        shape,
        x.dtype,
        f"edge_padding_low = {_attr_array(low)}, edge_padding_high = {_attr_array(high)}, "
        f"interior_padding = {_attr_array(interior)}",
    )


def iota(fn, shape, dim, dtype=torch.int64) -> Value:
    return fn.op("stablehlo.iota", [], shape, dtype, f"iota_dimension = {dim} : i64")


def dynamic_update_slice(x: Value, update: Value, starts: Sequence[Value]) -> Value:
    return x.fn.op("stablehlo.dynamic_update_slice", [x, update, *starts], x.shape, x.dtype)


def dynamic_slice(x: Value, starts: Sequence[Value], sizes) -> Value:
    return x.fn.op("stablehlo.dynamic_slice", [x, *starts], sizes, x.dtype, f"slice_sizes = {_attr_array(sizes)}")


# -- elementwise ---------------------------------------------------------------------------------
def unary(name: str, x: Value) -> Value:
    # |z| of a complex z is real
    dtype = D.component(x.dtype) if name == "abs" else x.dtype
    return x.fn.op(f"stablehlo.{name}", [x], x.shape, dtype)


def binary(name: str, a: Value, b: Value, dtype=None) -> Value:
    shape = broadcast_shapes(a.shape, b.shape)
    a, b = broadcast_to(a, shape), broadcast_to(b, shape)
    return a.fn.op(f"stablehlo.{name}", [a, b], shape, dtype or a.dtype)


def add(a, b):
    return binary("add", a, b)


def sub(a, b):
    return binary("subtract", a, b)


def mul(a, b):
    return binary("multiply", a, b)


def div(a, b):
    return binary("divide", a, b)


def maximum(a, b):
    return binary("maximum", a, b)


def minimum(a, b):
    return binary("minimum", a, b)


def compare(a: Value, b: Value, direction: str) -> Value:
    shape = broadcast_shapes(a.shape, b.shape)
    a, b = broadcast_to(a, shape), broadcast_to(b, shape)
    if a.dtype.is_floating_point or a.dtype.is_complex:  # complex: EQ / NE only
        kind = "FLOAT"
    elif a.dtype in (torch.bool, torch.uint8, torch.uint16, torch.uint32, torch.uint64):
        kind = "UNSIGNED"
    else:
        kind = "SIGNED"
    return a.fn.op(
        "stablehlo.compare",
        [a, b],
        shape,
        torch.bool,
        f"comparison_direction = #stablehlo<comparison_direction {direction}>, "
        f"compare_type = #stablehlo<comparison_type {kind}>",
    )


def select(pred: Value, a: Value, b: Value) -> Value:
    shape = broadcast_shapes(pred.shape, a.shape, b.shape)
    return pred.fn.op(
        "stablehlo.select", [broadcast_to(pred, shape), broadcast_to(a, shape), broadcast_to(b, shape)], shape, a.dtype
    )


def clamp(x: Value, lo: Value | None, hi: Value | None) -> Value:
    if lo is not None:
        x = maximum(x, lo)
    if hi is not None:
        x = minimum(x, hi)
    return x


def isnan(x: Value) -> Value:
    return compare(x, x, "NE")


# -- reductions ----------------------------------------------------------------------------------
def reduce(x: Value, init: Value, dims, op_name: str) -> Value:
    dims = sorted(int(d) for d in dims)
    shape = [s for i, s in enumerate(x.shape) if i not in dims]
    return x.fn.op(
        "stablehlo.reduce",
        [x, init],
        shape,
        x.dtype,
        f"dimensions = {_attr_array(dims)}",
        scalar_region(op_name, x.dtype),
    )


def reduce_multi(xs: Sequence[Value], inits: Sequence[Value], dims, body_lines, arg_names) -> list[Value]:
    """Variadic reduce with a custom body. arg_names: names of the 2n region args (acc..., x...)."""
    dims = sorted(int(d) for d in dims)
    results = [([s for i, s in enumerate(x.shape) if i not in dims], x.dtype) for x in xs]
    types = [tensor_type((), x.dtype) for x in xs] * 2
    reg = region(list(zip(arg_names, types)), body_lines)
    return xs[0].fn.op_multi(
        "stablehlo.reduce", list(xs) + list(inits), results, f"dimensions = {_attr_array(dims)}", reg
    )


# -- linear algebra ------------------------------------------------------------------------------
def dot_general(a: Value, b: Value, lhs_batch, rhs_batch, lhs_contract, rhs_contract, dtype=None) -> Value:
    lb = [a.shape[d] for d in lhs_batch]
    lfree = [a.shape[d] for d in range(a.rank) if d not in lhs_batch and d not in lhs_contract]
    rfree = [b.shape[d] for d in range(b.rank) if d not in rhs_batch and d not in rhs_contract]
    attrs = (
        "dot_dimension_numbers = #stablehlo.dot<"
        + (
            f"lhs_batching_dimensions = {_list(lhs_batch)}, rhs_batching_dimensions = {_list(rhs_batch)}, "
            if lhs_batch
            else ""
        )
        + f"lhs_contracting_dimensions = {_list(lhs_contract)}, rhs_contracting_dimensions = {_list(rhs_contract)}>"
    )
    return a.fn.op("stablehlo.dot_general", [a, b], lb + lfree + rfree, dtype or a.dtype, attrs)


# -- indexing ------------------------------------------------------------------------------------
def gather(
    operand: Value, indices: Value, offset_dims, collapsed, start_index_map, index_vector_dim, slice_sizes, out_shape
) -> Value:
    attrs = (
        f"dimension_numbers = #stablehlo.gather<offset_dims = {_list(offset_dims)}, "
        f"collapsed_slice_dims = {_list(collapsed)}, "
        f"start_index_map = {_list(start_index_map)}, index_vector_dim = {index_vector_dim}>, "
        f"slice_sizes = {_attr_array(slice_sizes)}, indices_are_sorted = false"
    )
    return operand.fn.op("stablehlo.gather", [operand, indices], out_shape, operand.dtype, attrs)


def take_along_flat(flat: Value, idx: Value) -> Value:
    """flat: 1-D; idx: int64 of any shape -> flat[idx]."""
    n = idx.numel
    i2 = reshape(idx, (n, 1))
    g = gather(
        flat,
        i2,
        offset_dims=[],
        collapsed=[0],
        start_index_map=[0],
        index_vector_dim=1,
        slice_sizes=[1],
        out_shape=(n,),
    )
    return reshape(g, idx.shape)


def scatter(
    operand: Value,
    indices: Value,
    updates: Value,
    update_window_dims,
    inserted_window_dims,
    scatter_dims_to_operand_dims,
    index_vector_dim,
    combiner: str | None,
) -> Value:
    """combiner: None = replace, else a stablehlo binary op name (e.g. 'stablehlo.add')."""
    t = tensor_type((), operand.dtype)
    if combiner is None:
        reg = region([("%a", t), ("%b", t)], [f'"stablehlo.return"(%b) : ({t}) -> ()'])
    else:
        reg = scalar_region(combiner, operand.dtype)
    attrs = (
        f"scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = {_list(update_window_dims)}, "
        f"inserted_window_dims = {_list(inserted_window_dims)}, "
        f"scatter_dims_to_operand_dims = {_list(scatter_dims_to_operand_dims)}, "
        f"index_vector_dim = {index_vector_dim}>, indices_are_sorted = false, unique_indices = false"
    )
    return operand.fn.op("stablehlo.scatter", [operand, indices, updates], operand.shape, operand.dtype, attrs, reg)


def scatter_flat(flat: Value, idx: Value, updates: Value, combiner=None) -> Value:
    """flat: 1-D; idx int64 (any shape) ; updates same shape as idx."""
    n = idx.numel
    return scatter(flat, reshape(idx, (n, 1)), reshape(updates, (n,)), [], [0], [0], 1, combiner)


def rng_bit_generator(state: Value, shape, dtype=torch.uint64) -> tuple[Value, Value]:
    new_state, bits = state.fn.op_multi(
        "stablehlo.rng_bit_generator",
        [state],
        [(state.shape, state.dtype), (shape, dtype)],
        "rng_algorithm = #stablehlo<rng_algorithm PHILOX>",
    )
    return new_state, bits


def numel(shape):
    return math.prod(shape)
