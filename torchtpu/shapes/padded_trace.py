"""Runs torch code into one fragment: the ops it issues on *traced* tensors become StableHLO in a Trace, through the
same lowering rules the op table uses (no device work, no op-table entries, no capture).

This is how one eager op gets a program that serves every size of a bucket: the interpreter's rules (interp.py) (masks
where an op would read padding, gathers between compact and padded layouts) are torch code, and here they run on
traced tensors, so an op at padded sizes, its masks and the runtime sizes end up in one fragment.

A traced tensor is a meta tensor; the tracer keeps, per meta storage, the flat Value of that storage (row-major,
as a tpu storage's bytes). A view op (`view`, `expand`, `permute`, slicing...) runs on the meta tensors alone and
shares its input's storage; any other op reads its tensor arguments' Values through their views (views.py), runs
the op's lowering rule, and gives each result a new contiguous meta tensor and storage. CPU tensors that reach an
op (`torch.tensor(value)`) are small constants. Ops without a rule are decomposed by the Core ATen table; anything
else raises :class:`NotTraceable`.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from .. import emit as E
from .. import kernels
from .. import views as V

_MAX_CONSTANT = 256  # elements of a CPU tensor baked into a fragment


class NotTraceable(Exception):
    """The code did something a fragment cannot hold (a host read, an op without a rule, a big CPU tensor)."""


class Tracer(TorchDispatchMode):
    """``with Tracer(tr) as t:`` torch ops on tensors from :meth:`tensor` emit into Trace ``tr``."""

    def __init__(self, tr):
        super().__init__()
        self.tr = tr
        self.fn = tr.fn
        self._flat = {}  # meta storage (its StorageImpl address) -> flat Value of the storage
        self._alive = []  # the meta tensors whose storages are keyed (no address reused while tracing)
        self.ops = 0

    # -- values <-> traced tensors ------------------------------------------------------------------------------
    def tensor(self, value):
        """A traced tensor (contiguous, of value's shape and dtype) standing for Value `value`."""
        with torch._C._DisableTorchDispatch():
            t = torch.empty(tuple(value.shape), dtype=value.dtype, device="meta")
        self._flat[t.untyped_storage()._cdata] = E.reshape(value, (value.numel,))
        self._alive.append(t)
        return t

    def value(self, t):
        """The Value a traced tensor (or a small CPU constant) stands for, in its logical shape."""
        if t.device.type == "meta":
            flat = self._flat.get(t.untyped_storage()._cdata)
            if flat is None:
                raise NotTraceable(f"a meta tensor the tracer did not make ({tuple(t.shape)}, {t.dtype})")
            if flat.dtype != t.dtype:
                flat = V.reinterpret(flat, t.dtype)
            return V.read_view(flat, tuple(t.shape), tuple(t.stride()), t.storage_offset())
        if t.device.type == "cpu":
            if t.numel() > _MAX_CONSTANT:
                raise NotTraceable(f"a CPU tensor of {t.numel()} elements")
            return E.constant_array(self.fn, t.reshape(-1).tolist(), t.dtype, tuple(t.shape))
        raise NotTraceable(f"a {t.device.type} tensor inside traced code")

    # -- dispatch -------------------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops += 1
        qual = func.name()
        name = qual.split("::")[-1]
        if name in ("lift_fresh", "lift_fresh_copy", "detach", "alias") and args[0].device.type == "meta":
            return func(*args, **kwargs) if name != "lift_fresh_copy" else args[0]
        if name in ("_unsafe_view", "clone", "contiguous", "reshape", "_reshape_copy", "view_copy"):
            x = args[0]  # (reshape may or may not alias: here it copies, as the traced code never writes)
            shape = tuple(func(*args, **kwargs).shape)  # on the meta tensors
            return self.tensor(E.reshape(self.value(x), shape))
        if name.startswith("to.") and args[0].device.type == "meta":  # x.to(dtype): a view only when it changes nothing
            dtype = func(*args, **kwargs).dtype
            return args[0] if dtype == args[0].dtype else self.tensor(E.convert(self.value(args[0]), dtype))
        if func.is_view:
            return func(*args, **kwargs)  # meta tensors only: the result shares its input's storage
        if (
            name == "_to_copy"
            and kwargs.get("device") is not None
            and torch.device(kwargs["device"]).type == "meta"
            and args[0].device.type == "cpu"
        ):
            v = self.value(args[0])
            dtype = kwargs.get("dtype") or args[0].dtype
            return self.tensor(E.convert(v, dtype) if dtype != v.dtype else v)
        if name == "copy":  # copy(self, src): src's values in self's shape and dtype
            x, src = args[0], args[1]
            return self.tensor(E.broadcast_to(E.convert(self.value(src), x.dtype), tuple(x.shape)))
        if name == "device_put":  # prims: the same values (the tracer's tensors are all on one device)
            return self.tensor(self.value(args[0]))
        if name == "convert_element_type":  # prims
            return self.tensor(E.convert(self.value(args[0]), args[1]))
        if name in ("full_like", "zeros_like", "ones_like", "empty_like"):
            x = args[0]
            value = args[1] if name == "full_like" else 1 if name == "ones_like" else 0
            dtype = kwargs.get("dtype") or x.dtype
            return self.tensor(E.const(self.fn, value, dtype, tuple(x.shape)))
        if name in ("_local_scalar_dense", "item"):
            raise NotTraceable("a host read of a traced value")
        factory = _FACTORIES.get(name)
        if factory is not None:
            return factory(self, *args, **kwargs)
        key = name if qual.startswith("aten::") else qual  # torchtpu's own ops (torchtpu_attn::sdpa) keep theirs
        key = key if key in kernels.KERNELS else key + ".default"
        info = kernels.KERNELS.get(key)
        if info is not None and info[0] == "functional":
            return self._rule(func, info[2], args, kwargs)
        if info is not None and info[0] == "inplace" and isinstance(args[0], torch.Tensor):
            fop = getattr(torch.ops.aten, info[1].split(".")[0])
            fop = getattr(fop, info[1].split(".")[1] if "." in info[1] else "default")
            new = self._rule(fop, info[2], args, kwargs)  # (writes: only into tensors the tracer made)
            self._write(args[0], self.value(new))
            return args[0]
        decomp = _decomposition(func)
        if decomp is not None:
            with self:  # its ops through the tracer again (a mode is off inside its own dispatch)
                return decomp(*args, **kwargs)
        raise NotTraceable(f"{qual} has no rule")

    def _write(self, t, value):
        """Writes value through traced tensor t's view into its storage's flat Value (every alias sees it)."""
        key = t.untyped_storage()._cdata
        base = self._flat.get(key)
        if base is None or base.dtype != t.dtype:
            raise NotTraceable("an in-place write into a tensor the tracer did not make")
        value = E.broadcast_to(E.convert(value, t.dtype), tuple(t.shape))
        new = V.write_view(base, base.numel, t.dtype, tuple(t.shape), tuple(t.stride()), t.storage_offset(), value)
        self._flat[key] = E.reshape(new, (base.numel,))

    def _rule(self, func, rule, args, kwargs):
        metas = torch.utils._pytree.tree_map(_as_meta, (args, kwargs))
        out = meta_call(func, metas[0], metas[1])  # the meta function: shapes and dtypes (checks the call, as on cpu)

        def val(a):
            return self.value(a) if isinstance(a, torch.Tensor) else a

        vargs = [
            (
                [val(x) for x in a]
                if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a)
                else val(a)
            )
            for a in args
        ]
        vkwargs = {k: val(a) for k, a in kwargs.items()}
        res = rule(self.tr.with_out(out), *vargs, **vkwargs)
        if isinstance(out, torch.Tensor):
            return self.tensor(res[0] if isinstance(res, (list, tuple)) else res)
        if out is None:
            return None
        res = list(res) if isinstance(res, (list, tuple)) else [res]
        wrapped = [None if o is None else self.tensor(r) for o, r in zip(out, res)]
        return type(out)(wrapped) if isinstance(out, tuple) else wrapped


_ALIASES = {
    "aten::__and__.Tensor": torch.ops.aten.bitwise_and.Tensor,
    "aten::__or__.Tensor": torch.ops.aten.bitwise_or.Tensor,
    "aten::__xor__.Tensor": torch.ops.aten.bitwise_xor.Tensor,
}


def _decomposition(func):
    if func.name() in _ALIASES:
        return _ALIASES[func.name()]
    if func.name() == "aten::where.ScalarOther":
        return lambda c, x, other: torch.where(c, x, torch.full((), other, dtype=x.dtype, device=x.device))
    if func.name() == "aten::where.ScalarSelf":
        return lambda c, other, x: torch.where(c, torch.full((), other, dtype=x.dtype, device=x.device), x)
    decomp = torch._decomp.core_aten_decompositions().get(func)
    if decomp is None:
        decomp = torch._decomp.decomposition_table.get(func)
    return decomp


def meta_call(func, args, kwargs):
    """func on meta or fake tensors, where torch's meta function is narrower than our rules: _grouped_mm's accepts
    BF16 only (its CUDA kernel's), ours any float type, to the same shapes (the result's type from the arguments or
    out_dtype); histc's floats only; constant_pad_nd's takes a symbolic size for its value (its reference does not)."""
    if func is torch.ops.aten._grouped_mm.default:
        dtypes = {a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()}
        if dtypes and dtypes != {torch.bfloat16}:
            cast = [a.to(torch.bfloat16) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
            out_dtype = cast[4] if len(cast) > 4 else kwargs.get("out_dtype")
            if len(cast) > 4:
                cast[4] = None
            out = func(*cast, **{k: v for k, v in kwargs.items() if k != "out_dtype"})
            return out.to(out_dtype or args[0].dtype)
    if func is torch.ops.aten.constant_pad_nd.default:  # torch's meta function specializes a symbolic size
        from torch import _refs

        return _refs.constant_pad_nd(*args, **kwargs)
    if (
        func is torch.ops.aten.histc.default and isinstance(args[0], torch.Tensor) and not args[0].is_floating_point()
    ):  # torch's histc takes floats; ours counts integers in float32 too
        return func(args[0].to(torch.float32), *args[1:], **kwargs).to(args[0].dtype)
    return func(*args, **kwargs)


def _as_meta(a):
    if isinstance(a, torch.Tensor) and a.device.type != "meta":
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta")
    return a


# -- factories (no tensor argument: nothing for a rule to read) -------------------------------------------------------
def _dtype(kwargs, default):
    d = kwargs.get("dtype")
    return d if d is not None else default


def _arange(tracer, *args, **kwargs):
    if len(args) == 1:
        start, end, step = 0, args[0], 1
    else:
        start, end, step = (list(args) + [1])[:3]
    n = max(0, -(-(end - start) // step))
    kinds = (start, end, step)
    dtype = _dtype(kwargs, torch.int64 if all(isinstance(k, int) for k in kinds) else torch.get_default_dtype())
    v = E.iota(tracer.fn, (n,), 0, torch.int64)
    if dtype.is_floating_point:
        v = E.convert(v, dtype)
    if step != 1:
        v = E.mul(v, E.const(tracer.fn, step, v.dtype, (n,)))
    if start != 0:
        v = E.add(v, E.const(tracer.fn, start, v.dtype, (n,)))
    return tracer.tensor(E.convert(v, dtype) if v.dtype != dtype else v)


def _full(tracer, size, fill_value, **kwargs):
    dtype = _dtype(
        kwargs,
        torch.get_default_dtype()
        if isinstance(fill_value, float)
        else torch.bool
        if isinstance(fill_value, bool)
        else torch.int64,
    )
    return tracer.tensor(E.const(tracer.fn, fill_value, dtype, tuple(size)))


def _filled(value):
    def make(tracer, size, **kwargs):
        return tracer.tensor(E.const(tracer.fn, value, _dtype(kwargs, torch.get_default_dtype()), tuple(size)))

    return make


def _scalar_tensor(tracer, value, **kwargs):
    return tracer.tensor(E.const(tracer.fn, value, _dtype(kwargs, torch.get_default_dtype()), ()))


_FACTORIES = {
    "arange": _arange,
    "arange.start": _arange,
    "arange.start_step": _arange,
    "full": _full,
    "full.default": _full,
    "zeros": _filled(0),
    "ones": _filled(1),
    "empty.memory_format": _filled(0),
    "scalar_tensor": _scalar_tensor,
}
