"""A small StableHLO builder: SSA values with static shapes, emitted as MLIR text.

Every op is printed in MLIR's generic form, so one printer covers all of them. The
text is deterministic (names are numbered in order), which lets it key the cache.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import torch

from .dtypes import elem_type, to_numpy, uint_of_width


def tensor_type(shape: Sequence[int], dtype: torch.dtype) -> str:
    dims = "".join(f"{d}x" for d in shape)
    return f"tensor<{dims}{elem_type(dtype)}>"


def is_float(dtype):
    return dtype.is_floating_point


def is_unsigned(dtype):
    return dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64)


def literal(value, dtype: torch.dtype) -> str:
    """Text of a scalar literal of `dtype` (hex bit pattern for floats: exact, and covers inf/nan; a complex
    number is its (real, imaginary) pair)."""
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_complex:
        part = torch.float32 if dtype == torch.complex64 else torch.float64
        value = complex(value)
        return f"({literal(value.real, part)},{literal(value.imag, part)})"
    if dtype.is_floating_point:
        bits = np.asarray(value, dtype=to_numpy(dtype)).view(to_numpy(uint_of_width(dtype)))
        return "0x" + format(int(bits), "0%dX" % (dtype.itemsize * 2))
    return str(int(value))


def _attr_array(vals) -> str:
    vals = list(vals)
    return "array<i64" + (": " + ", ".join(str(int(v)) for v in vals) if vals else "") + ">"


def _list(vals) -> str:
    return "[" + ", ".join(str(int(v)) for v in vals) + "]"


class Value:
    __slots__ = ("fn", "name", "shape", "dtype")

    def __init__(self, fn: "Fn", name: str, shape, dtype):
        self.fn = fn
        self.name = name
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype

    @property
    def type(self) -> str:
        return tensor_type(self.shape, self.dtype)

    @property
    def rank(self):
        return len(self.shape)

    @property
    def numel(self):
        return math.prod(self.shape)

    def __repr__(self):
        return f"Value({self.name}: {self.type})"


class Fn:
    """The body of one `@main`: parameters, op lines, results."""

    def __init__(self):
        self.params: list[tuple[Value, str]] = []  # (value, extra arg attributes)
        self.lines: list[str] = []
        self.funcs: dict[str, str] = {}  # private functions called from @main (inlined JAX lowerings)
        self._n = 0

    # -- values -------------------------------------------------------------------------------
    def _fresh(self) -> str:
        self._n += 1
        return f"%v{self._n}"

    def param(self, shape, dtype, attrs: str = "") -> Value:
        v = Value(self, f"%arg{len(self.params)}", shape, dtype)
        self.params.append((v, attrs))
        return v

    def op(self, name: str, operands: Sequence[Value], shape, dtype, attrs: str = "", regions: str = "") -> Value:
        return self.op_multi(name, operands, [(shape, dtype)], attrs, regions)[0]

    def op_multi(self, name, operands, results, attrs: str = "", regions: str = "") -> list[Value]:
        base = self._fresh()
        outs = [Value(self, base if len(results) == 1 else f"{base}#{i}", s, d) for i, (s, d) in enumerate(results)]
        lhs = base if len(results) == 1 else f"{base}:{len(results)}"
        ins = ", ".join(o.name for o in operands)
        in_types = ", ".join(o.type for o in operands)
        out_types = ", ".join(o.type for o in outs)
        if len(outs) != 1:
            out_types = f"({out_types})"
        region_txt = f"({regions})" if regions else ""
        attr_txt = f" {{{attrs}}}" if attrs else ""
        self.lines.append(f'{lhs} = "{name}"({ins}){region_txt}{attr_txt} : ({in_types}) -> {out_types}')
        return outs

    # -- module ---------------------------------------------------------------------------------
    def module(self, results: Sequence[Value]) -> str:
        args = ", ".join(f"{v.name}: {v.type}" + (f" {{{a}}}" if a else "") for v, a in self.params)
        rtypes = ", ".join(r.type for r in results)
        body = "\n    ".join(self.lines)
        rets = ", ".join(r.name for r in results)
        ret_line = f'"func.return"({rets}) : ({rtypes}) -> ()'
        extra = "".join("\n" + self.funcs[k] for k in sorted(self.funcs))
        return (
            "module @torchtpu attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {\n"
            f"  func.func public @main({args}) -> ({rtypes}) {{\n    {body}\n    {ret_line}\n  }}{extra}\n}}\n"
        )


def region(args: Sequence[tuple[str, str]], body_lines: Sequence[str]) -> str:
    """One region with a single block. args: (name, type)."""
    arg_txt = ", ".join(f"{n}: {t}" for n, t in args)
    inner = "\n      ".join(body_lines)
    return f"{{\n    ^bb0({arg_txt}):\n      {inner}\n    }}"


def scalar_region(op_name: str, dtype: torch.dtype, n: int = 1) -> str:
    """Reducer/combiner region applying a binary elementwise op to n (acc, x) pairs."""
    t = tensor_type((), dtype)
    args = [(f"%a{i}", t) for i in range(n)] + [(f"%b{i}", t) for i in range(n)]
    lines = [f'%r{i} = "{op_name}"(%a{i}, %b{i}) : ({t}, {t}) -> {t}' for i in range(n)]
    rs = ", ".join(f"%r{i}" for i in range(n))
    lines.append(f'"stablehlo.return"({rs}) : ({", ".join([t] * n)}) -> ()')
    return region(args, lines)


__all__ = ["Fn", "Value", "tensor_type", "elem_type", "literal", "region", "scalar_region", "_attr_array", "_list"]
