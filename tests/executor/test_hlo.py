"""Emitted StableHLO checked as text for representative rules (no device involved)."""

import pytest
import torch

from torchtpu import emit as E
from torchtpu import views as S
from torchtpu.hlo import Fn, literal, tensor_type


def _module(build):
    fn = Fn()
    return fn.module(build(fn))


def test_types_and_literals():
    assert tensor_type((2, 3), torch.float32) == "tensor<2x3xf32>"
    assert tensor_type((), torch.bool) == "tensor<i1>"
    assert tensor_type((0, 4), torch.bfloat16) == "tensor<0x4xbf16>"
    assert literal(float("inf"), torch.float32) == "0x7F800000"
    assert literal(1.0, torch.bfloat16) == "0x3F80"
    assert literal(-3, torch.int64) == "-3"


def test_broadcasting_binary_op():
    text = _module(lambda fn: [E.add(fn.param((2, 3), torch.float32), fn.param((3,), torch.float32))])
    assert "func.func public @main(%arg0: tensor<2x3xf32>, %arg1: tensor<3xf32>) -> (tensor<2x3xf32>)" in text
    assert (
        '"stablehlo.broadcast_in_dim"(%arg1) {broadcast_dimensions = array<i64: 1>} '
        ": (tensor<3xf32>) -> tensor<2x3xf32>" in text
    )
    assert '"stablehlo.add"(%arg0, %v1) : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<2x3xf32>' in text


def test_reduce_has_a_region():
    text = _module(
        lambda fn: [E.reduce(fn.param((4, 5), torch.float32), E.const(fn, 0, torch.float32), [1], "stablehlo.add")]
    )
    assert '"stablehlo.reduce"(%arg0, %v1)' in text and "dimensions = array<i64: 1>" in text
    assert "^bb0(%a0: tensor<f32>, %b0: tensor<f32>)" in text and '"stablehlo.return"(%r0)' in text


def test_matmul_dot_general():
    text = _module(
        lambda fn: [
            E.dot_general(fn.param((2, 3, 4), torch.float32), fn.param((2, 4, 5), torch.float32), [0], [0], [2], [1])
        ]
    )
    assert (
        "dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], "
        "lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]>"
    ) in text
    assert "-> tensor<2x3x5xf32>" in text


def test_transpose_view_reads_without_gather():
    # x.t() over a (3, 4) storage: a reshape/slice/transpose chain, never a gather
    text = _module(lambda fn: [S.read_view(fn.param((3, 4), torch.float32), (4, 3), (1, 4), 0)])
    assert "stablehlo.transpose" in text and "stablehlo.gather" not in text
    # the diagonal: a padded strided window, still no gather
    text = _module(lambda fn: [S.read_view(fn.param((3, 3), torch.float32), (3,), (4,), 0)])
    assert "stablehlo.pad" in text and "stablehlo.gather" not in text


def test_slice_write_is_dynamic_update_slice():
    def build(fn):
        base = fn.param((4, 4), torch.float32)
        return [S.write_view(base, 16, torch.float32, (4,), (1,), 4, fn.param((4,), torch.float32))]

    text = _module(build)
    assert "stablehlo.dynamic_update_slice" in text and "stablehlo.scatter" not in text


@pytest.mark.parametrize(
    "sizes,strides,offset,numel",
    [
        ((8, 32, 52), (1664, 1, 32), 0, 13312),  # a transposed result written whole (SDPA's scaled key in decode)
        ((4, 3), (1, 4), 0, 12),  # x.t()
        ((2, 2), (1, 8), 1, 16),  # x[::2, 1::2].t() style: a strided box
        ((3,), (5,), 0, 12),  # a diagonal: its box runs past the storage end
    ],
)
def test_strided_write_is_update_slices_not_scatter(sizes, strides, offset, numel):
    # XLA:CPU runs a scatter element by element; a view whose dims nest by stride is written as a transpose into
    # a window of the storage and dynamic_update_slice
    def build(fn):
        base = fn.param((numel,), torch.float32)
        return [S.write_view(base, numel, torch.float32, sizes, strides, offset, fn.param(sizes, torch.float32))]

    text = _module(build)
    assert "stablehlo.scatter" not in text


def test_overlapping_write_still_scatters():
    def build(fn):  # an expanded view (stride 0): elements alias, only a scatter says which write wins
        base = fn.param((4,), torch.float32)
        return [S.write_view(base, 4, torch.float32, (3, 4), (0, 1), 0, fn.param((3, 4), torch.float32))]

    assert "stablehlo.scatter" in _module(build)


def test_text_is_deterministic():
    def build(fn):
        return [E.mul(E.unary("exponential", fn.param((8,), torch.float32)), E.const(fn, 2.0, torch.float32, (8,)))]

    assert _module(build) == _module(build)
