"""A Trace turns one op (or a Python kernel's few steps) into a fragment: a private StableHLO function from the
values of the storages it reads (and its runtime scalars) to the new values of the storages it writes.

Rules see a Trace as their context: ``tr.out`` (output metadata), ``tr.scalar`` (a runtime scalar),
``tr.rng_state`` (a generator's Philox state), ``tr.check`` (a device-side check), and the values of their
arguments. The C++ executor records the fragment as a node of the pending graph and launches it alone (strict,
debug) or in a chunk with others (fused). A Trace is bound to its storages one of two ways:

- by signature (a miss of the C++ op table): storages are the op's argument storages by index, new outputs are
  placeholders, Scalar arguments that travel at run time are ``RuntimeScalar``s. The fragment is what the table
  keeps: the next calls with this signature run it without any Python;
- directly (Python kernels: copies, host reads): storages are real tensors', scalars are plain values.
"""

from __future__ import annotations

import math
import operator

import torch

from . import _C, checks
from . import emit as E
from . import views as V
from .errors import describe, user_line
from .hlo import Fn, Value

# How a runtime scalar travels, and where its value comes from (csrc/core/kinds.h ScalarKind, SourceKind)
FLOAT, INT, BOOL, COMPLEX, RNG = (
    k.value
    for k in (_C.ScalarKind.float, _C.ScalarKind.int, _C.ScalarKind.bool, _C.ScalarKind.complex, _C.ScalarKind.rng)
)
FROM_ARG, FROM_CPU_TENSOR, FROM_RNG, FROM_ROWS, FROM_SYM = (
    k.value
    for k in (_C.SourceKind.arg, _C.SourceKind.cpu_tensor, _C.SourceKind.rng, _C.SourceKind.rows, _C.SourceKind.sym)
)


class RuntimeScalar:
    """A Scalar argument that is a runtime parameter: the op table keys it by type, not value. Passing it to
    ``tr.scalar`` keeps it a parameter; anything else that looks at its value (arithmetic, comparisons other
    than with 0 and ±1, which the key already tells apart, ``float()``) makes the table key that argument by
    value from then on, so a rule can never bake a value into a fragment that serves other values."""

    __slots__ = ("value", "path", "_seen")

    def __init__(self, value, path, seen):
        self.value, self.path, self._seen = value, path, seen

    def _look(self):
        self._seen.add(self.path)
        return self.value

    def __eq__(self, other):
        if isinstance(other, (int, float)) and not isinstance(other, bool) and other in (0, 1, -1):
            return False  # 0 and ±1 are keyed by value: a runtime scalar is never one of them
        return self._look() == other

    def __ne__(self, other):
        return not self.__eq__(other)

    def __bool__(self):
        return True  # never 0

    def __hash__(self):
        return hash(self._look())

    def __repr__(self):
        return repr(self.value)

    def __float__(self):
        return float(self._look())

    def __int__(self):
        return int(self._look())

    def __index__(self):
        return int(self._look())

    def __complex__(self):
        return complex(self._look())


def _binary(fn, reflected=False):
    def op(self, other):
        v = self._look()
        o = other._look() if isinstance(other, RuntimeScalar) else other
        return fn(o, v) if reflected else fn(v, o)

    return op


def _unary(fn):
    def op(self, *args):
        return fn(self._look(), *args)

    return op


for _n, _f in (
    ("lt", operator.lt),
    ("le", operator.le),
    ("gt", operator.gt),
    ("ge", operator.ge),
    ("add", operator.add),
    ("sub", operator.sub),
    ("mul", operator.mul),
    ("truediv", operator.truediv),
    ("floordiv", operator.floordiv),
    ("mod", operator.mod),
    ("pow", operator.pow),
):
    setattr(RuntimeScalar, f"__{_n}__", _binary(_f))
    if _n not in ("lt", "le", "gt", "ge"):
        setattr(RuntimeScalar, f"__r{_n}__", _binary(_f, reflected=True))
for _n, _f in (
    ("neg", operator.neg),
    ("pos", operator.pos),
    ("abs", abs),
    ("round", round),
    ("trunc", math.trunc),
    ("floor", math.floor),
    ("ceil", math.ceil),
):
    setattr(RuntimeScalar, f"__{_n}__", _unary(_f))


def plain(x):
    """The Python value of a possibly-runtime scalar (for metadata, which depends on types only)."""
    return x.value if isinstance(x, RuntimeScalar) else x


class OutputSlot:
    """A new output of an op being lowered by signature: it has the output's geometry but no storage yet."""

    def __init__(self, index, meta):
        self.index = index
        self.shape = tuple(meta.shape)
        self.dtype = meta.dtype
        self._stride = tuple(meta.stride())
        span = 1 + sum((s - 1) * st for s, st in zip(self.shape, self._stride)) if meta.numel() else 0
        self.nbytes = span * meta.element_size()

    def stride(self):
        return self._stride

    def storage_offset(self):
        return 0

    def numel(self):
        return math.prod(self.shape)

    def element_size(self):
        return self.dtype.itemsize

    def dim(self):
        return len(self.shape)


class ArgSlot(OutputSlot):
    """An out= argument that arrives empty and that the table entry resizes to `meta`'s shape first."""

    def __init__(self, path, meta):
        super().__init__(-1, meta)
        self.path = path


def _kind_of(dtype):
    if dtype == torch.bool:
        return BOOL
    if dtype.is_complex:
        return COMPLEX
    return FLOAT if dtype.is_floating_point else INT


class Trace:
    """One fragment being built. ``storages``: a function (tensor or OutputSlot) -> (key, (shape, dtype) of
    its storage's value or None when it holds none, storage size in bytes)."""

    def __init__(self, opname: str, device_index: int, storages, lowering=False, generator_path=None):
        self.opname = opname
        self.device_index = device_index
        self.fn = Fn()
        self._storages = storages
        self._params: list = []  # storage keys, in parameter order
        self._param_tensor: dict = {}  # key -> a tensor of that storage (direct recording)
        self._cur: dict = {}  # key -> the storage's current value in this trace
        self.writes: dict = {}  # key -> the storage's new value (results, in order)
        self._write_tensor: dict = {}
        self._scalars: list = []  # (Value, kind, source)
        self.checks: list = []  # (any bad, first bad value, exception type, message)
        self._source: dict[int, object] = {}  # id(Value) -> the argument it was read from
        self.seen: set = set()  # paths of runtime scalars whose value a rule looked at (lowering by signature)
        self._out = None  # output metadata (the functional form's); set by the kernel, read by rules
        self._lowering = lowering
        self._generator_path = generator_path  # lowering: generator object -> its argument path
        self._param_of: dict = {}  # key -> the parameter Value of that storage
        self._zeros: list = []  # Values known to be all zeros (write: a storage that holds none stays so)
        self._rows: dict = {}  # row class -> its valid-row-count parameter (bucketed rows)

    # -- what rules see (read-only: rules never change their context) -----------------------------
    @property
    def out(self):
        """The op's output metadata: a meta tensor, or a tuple/list of them."""
        return self._out

    def with_out(self, out):
        """This context with other output metadata, for a rule that hands part of its work to another rule (a
        _foreach_ op's element rule, a computation in a wider dtype)."""
        return _WithOut(self, out)

    def arg_of(self, value):
        """The argument (a tensor, with its strides and bits) a Value was read from, or None."""
        return self._source.get(id(value))

    def zeros(self, dtype, shape) -> Value:
        """A tensor of zeros that write() knows as such: written into a storage that holds no value (which reads as
        zeros), it leaves the storage so, without computing or allocating anything. That makes torch.zeros /
        zeros_like / new_zeros (empty + zero_) free until something else is written: autograd's zero gradients for
        outputs the loss never reads, among others, cost no program (a program per shape, before) and a bucketed
        graph takes them at its capacity without reading them (compile.py _flat_capacity)."""
        v = E.const(self.fn, 0, dtype, shape)
        self._zeros.append(v)
        return v

    def update(self, value, new_value) -> None:
        """Writes new_value into the storage of the argument `value` was read from (batch norm's running
        statistics, updated in the same program)."""
        self.write(self._source[id(value)], new_value)

    def bind_argument(self, value, arg) -> None:
        self._source[id(value)] = arg

    # -- inputs -----------------------------------------------------------------------------------
    def _storage_value(self, t) -> Value | None:
        key, vtype, nbytes = self._storages(t)
        v = self._cur.get(key)
        if v is not None:
            return v
        if vtype is None:
            return None
        shape, dtype = vtype
        v = self.fn.param(shape, dtype)
        self._params.append(key)
        self._param_tensor[key] = t
        self._param_of[key] = v
        self._cur[key] = v
        return v

    def read(self, t) -> Value:
        base = self._storage_value(t) if t.numel() else None
        if base is None:
            return E.const(self.fn, 0, t.dtype, t.shape)
        if base.dtype != t.dtype:
            base = V.reinterpret(base, t.dtype)
        return V.read_view(base, t.shape, t.stride(), t.storage_offset())

    def read_value(self, t) -> Value:
        """The values tensor `t` stands for: its storage view, conjugated / negated where its conj / neg bit is set
        (ops that PyTorch's Conjugate fallback passes through unresolved, matmuls and copies among them)."""
        v = self.read(t)
        if isinstance(t, torch.Tensor):
            if t.is_conj():
                v = E.conj(v)
            if t.is_neg():
                v = E.unary("negate", v)
        return v

    def scalar(self, value, dtype) -> Value:
        """A Python scalar as a runtime parameter (0, 1, -1 and non-finite values stay constants)."""
        if isinstance(value, RuntimeScalar):
            v = self.fn.param((), dtype)
            self._scalars.append((v, _kind_of(dtype), (FROM_ARG, value.path, 0)))
            return v
        if isinstance(value, torch.Tensor):
            value = value.item()
        if dtype == torch.bool or value in (0, 1, -1) or (isinstance(value, float) and not math.isfinite(value)):
            return E.const(self.fn, value, dtype)
        if self._lowering:
            return E.const(self.fn, value, dtype)  # a value the op table keys (or derives from keyed values)
        if dtype.is_complex:
            value = complex(value)
        elif not dtype.is_floating_point:
            value = int(value)
        elif isinstance(value, complex):  # a complex Python scalar with a real tensor: its real part, as CPU
            value = value.real
        v = self.fn.param((), dtype)
        self._scalars.append((v, _kind_of(dtype), ("value", value)))
        return v

    def rows(self, cls: int) -> Value:
        """The valid row count of bucketed row class `cls` (torchtpu/shapes/eager_buckets.py) as an int64 runtime
        parameter."""
        if cls not in self._rows:
            v = self.fn.param((), torch.int64)
            self._scalars.append((v, INT, (FROM_ROWS, (cls, -1), 0)))
            self._rows[cls] = v
        return self._rows[cls]

    def host(self, t, path=None) -> Value:
        """A 0-d CPU tensor argument (a scalar, as on cuda): a runtime parameter of its dtype."""
        assert t.dim() == 0, "only 0-d CPU tensors reach tpu rules"
        v = self.fn.param((), t.dtype)
        if path is not None:
            self._scalars.append((v, _kind_of(t.dtype), (FROM_CPU_TENSOR, path, 0)))
        else:
            self._scalars.append((v, _kind_of(t.dtype), ("value", t.item())))
        return v

    def rng_state(self, generator, increment: int) -> Value:
        """The generator's Philox (seed, offset) as a tensor<2xui64> parameter; every call of the op advances the
        offset by `increment` (identical streams in every mode)."""
        v = self.fn.param((2,), torch.uint64)
        if self._lowering:
            path = self._generator_path(generator) if self._generator_path else (-1, -1)
            self._scalars.append((v, RNG, (FROM_RNG, path, int(increment))))
        else:
            seed, offset = _C._philox_advance(generator, self.device_index, int(increment))
            self._scalars.append((v, RNG, ("rng", (seed, offset))))
        return v

    def check(self, bad: Value, values: Value, exc: type, message: str) -> None:
        """A device-side check computed inside this op's program (an index out of range): the op fails when any
        element of the bool `bad` is true; `message.format(value=v)` names the first offending element v of
        `values`. debug mode raises at the op; strict and fused at a later op or the next synchronization (as
        cuda's device-side asserts do), without an extra host sync per op."""
        fn = self.fn
        n = bad.numel
        b = E.reshape(bad, (n,))
        pos = E.iota(fn, (n,), 0)
        first = E.reduce(
            E.select(b, pos, E.const(fn, n, torch.int64, (n,))), E.const(fn, n, torch.int64), [0], "stablehlo.minimum"
        )
        any_bad = E.compare(first, E.const(fn, n, torch.int64), "LT")
        v = E.reshape(E.broadcast_to(E.convert(values, torch.int64), bad.shape), (n,))
        at_first = E.compare(pos, E.broadcast_to(first, (n,)), "EQ")
        one = E.reduce(
            E.select(at_first, v, E.const(fn, 0, torch.int64, (n,))), E.const(fn, 0, torch.int64), [0], "stablehlo.add"
        )
        self.checks.append((any_bad, one, exc, message))

    # -- outputs ------------------------------------------------------------------------------
    def write(self, t, value: Value) -> None:
        if t.numel() == 0:
            return
        key, _, nbytes = self._storages(t)
        base = self._storage_value(t)
        if base is None and any(value is z for z in self._zeros):
            return  # zeros into a storage that reads as zeros
        value = E.broadcast_to(E.convert(value, t.dtype), tuple(t.shape))
        numel = nbytes // t.element_size()
        if base is not None:
            if base.dtype != t.dtype:
                base = V.reinterpret(base, t.dtype)
            base = V.fit(base, numel) if base.numel != numel else base
        new = V.write_view(base, numel, t.dtype, t.shape, t.stride(), t.storage_offset(), value)
        self._cur[key] = new
        self.writes[key] = new
        self._write_tensor[key] = t

    # -- the fragment -----------------------------------------------------------------------------
    def results(self) -> list[Value]:
        res = list(self.writes.values())
        if self.checks:  # one int64 vector (flag, value, flag, value, ...) after the storage values
            res.append(
                E.concatenate(
                    [E.reshape(E.convert(v, torch.int64), (1,)) for ok, one, _, _ in self.checks for v in (ok, one)], 0
                )
            )
        return res

    def fragment(self, label: str) -> int:
        """Registers the fragment with the executor; its id (-1 when there is nothing to compute)."""
        results = self.results()
        if not results:
            return -1
        fn = self.fn
        storage_params = [self._param_of[k] for k in self._params]
        scalar_params = [v for v, _, _ in self._scalars]
        text = fn.function("@FRAGMENT", storage_params + scalar_params, results)
        args = (
            label,
            text,
            sorted(fn.funcs.items()),
            [(v.shape, v.dtype, v.type) for v in storage_params],
            [(kind, v.type) for v, kind, _ in self._scalars],
            [(v.shape, v.dtype, v.type) for v in results],
            bool(self.checks),
        )
        # what registering it takes, as plain values: the op table on disk keeps it (optable.py)
        self.registration = (args, self.opname, [(exc, msg) for _, _, exc, msg in self.checks])
        return register_fragment(self.registration)

    # -- direct recording (Python kernels) -------------------------------------------------------
    def record(self, label_text: str | None = None) -> None:
        """Records the fragment for the real tensors it read and wrote (strict: launched at once)."""
        fid = self.fragment(label_text or self.opname)
        if fid < 0:
            return
        fs, is_ = [], []
        for _, kind, src in self._scalars:
            if src[0] == "rng":
                is_.extend(int(x) - (1 << 64) if int(x) >= (1 << 63) else int(x) for x in src[1])
            elif kind == COMPLEX:
                fs.extend((complex(src[1]).real, complex(src[1]).imag))
            elif kind == FLOAT:
                fs.append(float(src[1]))
            else:
                is_.append(int(src[1]))
        results = [self._write_tensor[k] for k in self.writes] + ([None] if self.checks else [])
        line = user_line() if self.checks else ""
        _C._record_fragment(fid, [self._param_tensor[k] for k in self._params], fs, is_, results, line)


def register_fragment(registration) -> int:
    """Registers a fragment with the executor (and its checks' messages); its id in this process."""
    args, opname, messages = registration
    fid = _C._register_fragment(*args)
    if messages:
        checks.register(fid, opname, messages)
    return fid


class _WithOut:
    """A Trace seen with other output metadata (Trace.with_out); everything else is the Trace's own."""

    def __init__(self, tr, out):
        self._tr, self.out = tr, out

    def with_out(self, out):
        return _WithOut(self._tr, out)

    def __getattr__(self, name):
        return getattr(self._tr, name)


def _fn_function(self, name, params, results):
    """`func.func private <name>(params) -> (results)`, the parameters in the given order."""
    args = ", ".join(f"{v.name}: {v.type}" for v in params)
    rtypes = ", ".join(r.type for r in results)
    body = "\n    ".join(self.lines)
    rets = ", ".join(r.name for r in results)
    return (
        f"func.func private {name}({args}) -> ({rtypes}) {{\n    {body}\n"
        f'    "func.return"({rets}) : ({rtypes}) -> ()\n  }}'
    )


Fn.function = _fn_function


def label(opname, args, kwargs=None) -> str:
    parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in (kwargs or {}).items()]
    return f"{opname}({', '.join(parts)})"
