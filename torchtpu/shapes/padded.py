"""Padded tensors and symbolic sizes: ``PT`` (a tensor at its bucket's sizes, each dim's factors), ``Sz`` (a
symbolic size: expression, padded value, true value at runtime), the interpreter's context ``Ctx``, the masks of
valid positions, and the gathers between the compact layout the user sees and the padded one the rules compute on.
"""

from __future__ import annotations

import math

import torch

from .policy import alone, bucket


class Unsupported(Exception):
    """The graph cannot run bucketed (the message says which op and why)."""


# -- sizes ----------------------------------------------------------------------------------------------------------
class Sz:
    """A symbolic size inside the interpreter: its sympy expression, its padded value, and its true value as a 0-dim
    int64 tensor (None when the expression has no bucketed symbol: then it is the static int `padded`)."""

    __slots__ = ("expr", "padded", "rt")

    def __init__(self, expr, padded, rt):
        self.expr, self.padded, self.rt = expr, padded, rt

    def __repr__(self):
        return f"Sz({self.expr}, padded={self.padded})"


class Ctx:
    def __init__(self, symbols, values, sizes_tensor):
        self.symbols = symbols  # sympy Symbol -> index into sizes_tensor
        self.values = values  # sympy Symbol -> true int (capture time only: checks)
        self.sizes = sizes_tensor
        self.device = sizes_tensor.device
        self._rt = {}
        self._iota = {}
        first = {}
        self.rep = {s: first.setdefault(values[s], s) for s in sorted(values, key=str)}

    def static(self, s) -> bool:
        """A symbol whose bucket holds only its own value is a constant of the program."""
        return alone(bucket(self.values[s]))

    def sym_rt(self, s):
        if s not in self._rt:
            self._rt[s] = self.sizes[self.symbols[s]]
        return self._rt[s]

    def size(self, expr) -> Sz | int:
        """An expression of the graph's symbols as a Sz (an int when it has no symbol)."""
        import sympy

        expr = sympy.sympify(expr)
        # constants of the program; then symbols of equal values as one (the program's key holds which are equal)
        fixed = {
            s: (self.values[s] if self.static(s) else self.rep[s])
            for s in expr.free_symbols
            if self.static(s) or self.rep[s] != s
        }
        if fixed:
            expr = expr.subs(fixed)
        if not expr.free_symbols:
            return int(expr)
        check_bounded(expr)
        padded = int(expr.subs({s: bucket(self.values[s]) for s in expr.free_symbols}))
        return Sz(expr, padded, self._eval(expr))

    def _eval(self, e):
        import sympy
        from torch.utils._sympy.functions import FloorDiv, Mod, PythonMod

        if isinstance(e, sympy.Symbol):
            return self.sym_rt(e)
        if isinstance(e, sympy.Integer):
            return int(e)
        if isinstance(e, sympy.Add):
            out = 0
            for a in e.args:
                out = out + self._eval(a)
            return out
        if isinstance(e, sympy.Mul):
            out = 1
            for a in e.args:
                out = out * self._eval(a)
            return out
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) > 0:
            return self._eval(e.base) ** int(e.exp)
        if isinstance(e, FloorDiv):
            return torch.div(self._eval(e.args[0]), self._eval(e.args[1]), rounding_mode="floor")
        if isinstance(e, (Mod, PythonMod)):
            return torch.remainder(self._eval(e.args[0]), self._eval(e.args[1]))
        if isinstance(e, min_max()):
            lo = isinstance(e, min_max()[::2])
            out = self._eval(e.args[0])
            for a in e.args[1:]:
                v = self._eval(a)
                if isinstance(out, torch.Tensor) and isinstance(v, torch.Tensor):
                    out = torch.minimum(out, v) if lo else torch.maximum(out, v)
                elif isinstance(out, torch.Tensor) or isinstance(v, torch.Tensor):
                    t, n = (out, v) if isinstance(out, torch.Tensor) else (v, out)
                    out = t.clamp(max=n) if lo else t.clamp(min=n)
                else:
                    out = min(out, v) if lo else max(out, v)
            return out
        raise Unsupported(f"the size expression {e} ({type(e).__name__})")

    def iota(self, n):
        if n not in self._iota:
            self._iota[n] = torch.arange(n, device=self.device)
        return self._iota[n]


def valid_expr(f):
    return None if f[1] is None else f[1].expr


def same_factors(a, b) -> bool:
    return len(a) == len(b) and all(x[0] == y[0] and valid_expr(x) == valid_expr(y) for x, y in zip(a, b))


# -- padded tensors ---------------------------------------------------------------------------------------------------
class PT:
    """A padded tensor: its values at padded sizes and, per dim, its factors: (padded size, valid Sz or None) from
    the major to the minor; a dim whose factors all have valid None holds no padding."""

    __slots__ = ("t", "dims")

    def __init__(self, t, dims):
        assert len(dims) == t.dim(), (t.shape, dims)
        self.t, self.dims = t, tuple(tuple(d) for d in dims)

    def tainted(self, d) -> bool:
        return any(f[1] is not None for f in self.dims[d])

    @property
    def any_tainted(self):
        return any(self.tainted(d) for d in range(len(self.dims)))


def plain(t):
    return PT(t, [((s, None),) for s in t.shape])


def dim_mask(ctx, factors):
    """A bool vector over a dim's padded positions: True where every factor is within its valid size."""
    m = None
    for i, (p, v) in enumerate(factors):
        if v is None:
            continue
        f = ctx.iota(p) < v.rt
        shape = [1] * len(factors)
        shape[i] = p
        f = f.view(shape)
        m = f if m is None else m & f
    if m is None:
        return None
    return m.expand([p for p, _ in factors]).reshape(-1)


def valid_mask(ctx, x: PT, dims=None):
    """A bool tensor broadcastable to x: True at valid positions of the given dims (default: all)."""
    dims = range(x.t.dim()) if dims is None else dims
    m = None
    for d in dims:
        dm = dim_mask(ctx, x.dims[d])
        if dm is None:
            continue
        shape = [1] * x.t.dim()
        shape[d] = dm.numel()
        dm = dm.view(shape)
        m = dm if m is None else m & dm
    return m


def fill_padding(ctx, x: PT, value, dims=None) -> torch.Tensor:
    """x's values with the padding of the given dims replaced by value."""
    m = valid_mask(ctx, x, dims)
    if m is None:
        return x.t
    return torch.where(m, x.t, torch.full((), value, dtype=x.t.dtype, device=x.t.device))


def fresh_dims(ctx, node_val, t):
    """Factors of an op's result whose dims are new (not views of an input's): from its symbolic sizes; a tainted dim
    holds its valid values first."""
    dims = []
    for s, p in zip(node_val.shape, t.shape):
        sz = ctx.size(s.node.expr) if isinstance(s, torch.SymInt) else int(s)
        dims.append(((p, sz if isinstance(sz, Sz) else None),))
    return dims


# -- compact <-> padded ------------------------------------------------------------------------------------------------
def pad_input(ctx, flat: torch.Tensor, sizes) -> PT:
    """A compact tensor of exact sizes `sizes` (Sz or int), read from the flat buffer of its storage, as a padded
    tensor (the padding zeroed)."""
    return _pad_dims(ctx, flat, [((s.padded, s),) if isinstance(s, Sz) else ((s, None),) for s in sizes])


def _pad_dims(ctx, flat: torch.Tensor, dims) -> PT:
    """The compact values in flat laid out padded with the given factors per dim (the padding zeroed)."""
    padded = [math.prod(p for p, _ in fs) for fs in dims]
    if not dims:
        return PT(flat[0], [])
    factors = [f for fs in dims for f in fs]
    k0, row = _static_suffix(factors)
    if k0 == 0:  # no padding at all: the first values as they are
        return PT(flat[: math.prod(padded)].view(padded), dims)
    idx, stride = None, 1  # in rows of `row` values, contiguous in both layouts
    for k in range(k0 - 1, -1, -1):
        p, v = factors[k]
        shape = [1] * k0
        shape[k] = p
        term = ctx.iota(p).view(shape) * stride
        idx = term if idx is None else idx + term
        stride = stride * (v.rt if v is not None else p)
    vals = rows_at(flat, idx.expand([p for p, _ in factors[:k0]]), row).view(padded)
    m = valid_mask(ctx, PT(vals, dims))
    if m is not None:
        vals = torch.where(m, vals, torch.zeros((), dtype=vals.dtype, device=vals.device))
    return PT(vals, dims)


def _static_suffix(factors):
    """(k0, row): the trailing factors from k0 on hold no padding; row is their product, a run of values that is
    contiguous in the compact and in the padded layout alike."""
    k0 = len(factors)
    while k0 > 0 and factors[k0 - 1][1] is None:
        k0 -= 1
    return k0, math.prod(p for p, _ in factors[k0:])


def rows_at(flat: torch.Tensor, idx: torch.Tensor, row: int) -> torch.Tensor:
    """flat read as rows of `row` values: the rows at idx (clamped into range), shape idx.shape + [row]. One
    gather of whole rows: XLA:CPU runs a gather slice by slice, so rows of 32 values cost ~1/32 of gathering the
    same values one by one."""
    if row == 1:
        return flat[idx.reshape(-1).clamp(0, flat.numel() - 1)].view(*idx.shape, 1)
    m = flat.numel() // row
    rows = flat[: m * row].view(m, row)
    return rows[idx.reshape(-1).clamp(0, m - 1)].view(*idx.shape, row)


def _conform(ctx, x: PT, d, factors) -> PT:
    """x with dim d laid out by the given factors (same valid count), its other dims as they are."""
    dims = list(x.dims)
    dims[d] = tuple(factors)
    return _pad_dims(ctx, compact_output(ctx, x), dims)


def compact_output(ctx, x: PT) -> torch.Tensor:
    """x's valid values in row-major order of its exact sizes, first in a flat tensor of x's padded numel (a dim
    merged from several padded ones is unravelled by its factors)."""
    n = x.t.numel()
    if n == 0 or x.t.dim() == 0:
        return x.t.reshape(-1)
    factors = [f for fs in x.dims for f in fs]
    k0, row = _static_suffix(factors)
    if k0 == 0:  # no padding: compact already
        return x.t.reshape(-1)
    nrows = n // row
    rest, src, pstride = ctx.iota(nrows), 0, 1  # in rows of `row` values
    for k in range(k0 - 1, -1, -1):
        p, v = factors[k]
        e = v.rt if v is not None else p
        if k == 0:
            i_k = rest
        else:
            rest, i_k = floor_divmod(rest, e, nrows)
        src = src + i_k * pstride
        pstride *= p
    # a flat result of its own (clone: free in traced code; in a compiled graph's program its buffer is the flat
    # storage a later bucketed call takes as it is, where a view of the (rows, row) gather would be copied anew)
    return rows_at(x.t.reshape(-1), src, row).reshape(-1).clone()


def floor_divmod(r: torch.Tensor, e, bound: int):
    """(r // e, r % e) for int64 r in [0, bound) and a size e >= 1 (an int or a 0-d int64 tensor), through one
    floating-point division: floor((r + 0.5) / e) is exact while the division's rounding error stays below the
    0.5 / e that separates (r + 0.5) / e from an integer (float64 always here; float32 for r < 2^22). x86 has no
    vector int64 division: XLA:CPU divides a 32k-element index one value at a time (312 us for a two-level
    unravel against 88 us through float64, measured in one jax.jit each)."""
    ft = torch.float64 if _has_f64() else torch.float32 if bound <= 1 << 22 else None
    if ft is None:
        return torch.div(r, e, rounding_mode="floor"), torch.remainder(r, e)
    q = torch.floor((r.to(ft) + 0.5) / (e.to(ft) if isinstance(e, torch.Tensor) else float(e))).to(torch.int64)
    return q, r - q * e


def _has_f64() -> bool:
    """Whether the platform computes float64 natively (TPUs do not)."""
    from .. import runtime

    return runtime.get().platform != "tpu"


def repack(ctx, x: PT, sizes) -> PT:
    """x's values laid out anew for exact sizes `sizes` (Sz or int per dim): compacted, then padded again."""
    return pad_input(ctx, compact_output(ctx, x), sizes)


def agree(ctx, node, a: PT, da, b: PT, db):
    """a and b with their dims da and db laid out alike: a single-prefix layout is brought to the other's factors
    (a merged B*T dim that arrived compact, next to one merged from padded [B, T])."""
    fa, fb = a.dims[da], b.dims[db]
    if not (a.tainted(da) and b.tainted(db)) or same_factors(fa, fb):
        return a, b
    if _count_expr(fa) != _count_expr(fb):
        raise Unsupported(f"{node.target}: dims of different valid sizes")
    if len(fa) == 1:
        return _conform(ctx, a, da, fb), b
    if len(fb) == 1:
        return a, _conform(ctx, b, db, fa)
    raise Unsupported(f"{node.target}: inputs padded differently")


def _count_expr(factors):
    import sympy

    n = sympy.Integer(1)
    for p, v in factors:
        n = n * (v.expr if v is not None else p)
    return sympy.expand(n)


# -- indexing ----------------------------------------------------------------------------------------------------------
def prefix(x, d) -> bool:
    """Whether dim d of x keeps its valid values first: only its outermost factor is padded, so a valid (exact)
    coordinate is its padded position. A merged dim padded inside (`[B, T]` flattened with T padded) is not: exact
    position b * T + t sits at b * T_bucket + t."""
    return all(f[1] is None for f in x.dims[d][1:])


def prefixed(ctx, x: PT, dims) -> PT:
    """x with each of the given dims laid out with its valid values first (a merged dim padded inside, `[B*T]` of
    `[B, T]` with T padded, becomes compact: exact coordinate c at position c), so that an index *value*, which
    counts exact coordinates as in the user's program, reads or writes the right position."""
    for d in dims:
        if not prefix(x, d):
            x = _conform(ctx, x, d, ((x.t.shape[d], count_sz(ctx, x.dims[d])),))
    return x


def count_sz(ctx, factors):
    sz = ctx.size(_count_expr(factors))
    if not isinstance(sz, Sz):
        raise Unsupported(f"a merged dim without a valid count (factors {factors})")
    return sz


# -- a graph's bucketed calls -----------------------------------------------------------------------------------------
def sym_expr(s):
    return s.node.expr if isinstance(s, torch.SymInt) else int(s)


def monotone(e) -> bool:
    """Whether a size expression never decreases as its symbols grow (sums, products with positive factors,
    floor divisions by positive constants, min/max of such): then its value at the buckets' sizes bounds its value
    at every size of the bucket, which a padded layout needs. `s - 4 * ceil(s / 5)` (chunk's last piece) is not:
    1 at s = 5, 0 at its bucket's 8."""
    import sympy
    from torch.utils._sympy.functions import FloorDiv

    if isinstance(e, int) or isinstance(e, sympy.Symbol) or (isinstance(e, sympy.Basic) and e.is_number):
        return True
    if isinstance(e, sympy.Add):
        return all(a.is_number or monotone(a) for a in e.args)
    if isinstance(e, sympy.Mul):
        return all((a.is_number and a > 0) or (not a.is_number and monotone(a)) for a in e.args)
    if isinstance(e, sympy.Pow):
        return e.exp.is_Integer and int(e.exp) > 0 and monotone(e.base)
    if isinstance(e, FloorDiv):
        if e.args[1].is_number:
            return e.args[1] > 0 and monotone(e.args[0])
        q = sympy.cancel(e.args[0] / e.args[1])  # an exact quotient: (s**2) // s is s
        return sympy.fraction(q)[1] == 1 and q.is_polynomial() and monotone(sympy.expand(q))
    if isinstance(e, min_max()):
        return all(monotone(a) for a in e.args)
    return False


def min_max():
    """(min, max, min, max): sympy's and torch's own (ShapeEnv's expressions use torch.utils._sympy's)."""
    import sympy
    from torch.utils._sympy.functions import Max, Min

    return (sympy.Min, sympy.Max, Min, Max)


def check_bounded(e):
    if not monotone(e):
        raise Unsupported(f"the size {e} may shrink as its symbols grow: no bucket bounds it")
