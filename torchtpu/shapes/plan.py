"""A torch.compile graph's bucketed calls: ``Plan`` (found once from the graph's placeholders and outputs),
``execute`` (pads the inputs, runs the interpreter, returns compact outputs) and ``exact_outputs``.
"""

from __future__ import annotations

import math

import torch

from .interp import meta_val, run
from .padded import PT, Ctx, Sz, Unsupported, check_bounded, compact_output, min_max, pad_input, plain, sym_expr
from .policy import bucket


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
            val = meta_val(n)
            if isinstance(val, torch.SymInt):
                e = val.node.expr
                self.in_shapes.append(("int", e))
                symbols |= e.free_symbols
                if isinstance(e, sympy.Symbol):
                    self.sources.setdefault(e, (i, None))
            elif isinstance(val, torch.Tensor):
                shape = tuple(sym_expr(s) for s in val.shape)
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
            v = meta_val(a) if isinstance(a, torch.fx.Node) else None
            self.out_shapes.append(tuple(sym_expr(s) for s in v.shape) if isinstance(v, torch.Tensor) else None)
        for shape in [s[1] for s in self.in_shapes if s is not None and s[0] == "tensor"] + [
            s for s in self.out_shapes if s is not None
        ]:
            for e in shape:
                check_bounded(e)
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
    if isinstance(e, min_max()):
        return ("min(" if isinstance(e, min_max()[::2]) else "max(") + ", ".join(_py(a, index) for a in e.args) + ")"
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
    ctx = Ctx(plan.index, dict(zip(plan.symbols, values)), sizes_tensor)
    inputs = []
    for i, a in enumerate(args):
        spec = plan.in_shapes[i]
        if spec is not None and spec[0] == "int":
            inputs.append(ctx.size(spec[1]))
        elif isinstance(a, torch.Tensor):
            if flats[i] is not None:
                inputs.append(pad_input(ctx, flats[i], [ctx.size(e) for e in spec[1]]))
            else:
                inputs.append(plain(a))
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
