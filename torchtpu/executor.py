"""Runs lowering rules: trace one op (or a few) into a StableHLO function, compile through the
shared cache, launch, and publish the new storage buffers.

Modes: ``strict`` (default) launches asynchronously and returns; ``debug`` waits for each op,
names the op/shapes/dtypes/line on failure and optionally checks for NaN/Inf. ``fused`` is
not implemented yet.
"""
from __future__ import annotations

import collections
import contextlib
import math
import os
import threading

import numpy as np
import torch

from . import cache, metrics, runtime
from . import dtypes as D
from . import emit as E
from . import storage as S
from .errors import op_error, user_line
from .hlo import Fn, Value

MODES = ("debug", "strict", "fused")
_mode = os.environ.get("TORCHTPU_MODE", "strict")
if _mode not in MODES:
    raise ValueError(f"TORCHTPU_MODE={_mode!r}: expected one of {', '.join(MODES)}")
_check_nans = os.environ.get("TORCHTPU_CHECK_NANS", "0") not in ("", "0", "false")


def set_mode(name: str) -> None:
    global _mode
    if name not in MODES:
        raise ValueError(f"torchtpu.set_mode({name!r}): expected one of {', '.join(MODES)}")
    if name == "fused":
        raise NotImplementedError("torchtpu mode 'fused' is not implemented yet; use 'strict' or 'debug'")
    _mode = name


def get_mode() -> str:
    return _mode


@contextlib.contextmanager
def mode(name: str):
    old = get_mode()
    set_mode(name)
    try:
        yield
    finally:
        set_mode(old)


def set_check_nans(on: bool) -> None:
    global _check_nans
    _check_nans = bool(on)


# -- scalar buffers: bounded LRU so a learning-rate schedule cannot grow it without end ---------
_SCALAR_CACHE_MAX = 512  # values used every step stay; a schedule's one-off values pass through
_scalars: collections.OrderedDict = collections.OrderedDict()


def _scalar_buffer(value, dtype, device_index):
    key = (type(value), value, dtype, device_index)
    buf = _scalars.get(key)
    if buf is None:
        buf = runtime.get().scalar(value, dtype, device_index)
        _scalars[key] = buf
        if len(_scalars) > _SCALAR_CACHE_MAX:
            _scalars.popitem(last=False)
    else:
        _scalars.move_to_end(key)
    return buf


class Trace:
    """One function being built: parameters come from storage buffers and runtime scalars."""

    def __init__(self, opname: str, device_index: int):
        self.opname = opname
        self.device_index = device_index
        self.fn = Fn()
        self.args: list = []
        self._storage_param: dict[int, Value] = {}
        self._storage_cur: dict[int, Value] = {}
        self.writes: dict[int, Value] = {}  # token -> new buffer value (program results)
        self.source: dict[int, torch.Tensor] = {}  # id(Value) -> the tensor argument it was read from
        self.checks: list = []  # device-side checks: (any bad, one bad value, exception type, message)

    # -- inputs -----------------------------------------------------------------------------
    def _storage_value(self, tok: int) -> Value | None:
        v = self._storage_cur.get(tok)
        if v is not None:
            return v
        st = S.state(tok)
        if st is None or st.buf is None:
            return None
        buf = st.buf
        v = self.fn.param(buf.shape, D.from_numpy(buf.dtype))
        self.args.append(buf)
        self._storage_param[tok] = v
        self._storage_cur[tok] = v
        return v

    def read(self, t: torch.Tensor) -> Value:
        base = self._storage_value(S.token(t)) if t.numel() else None
        if base is None:
            return E.const(self.fn, 0, t.dtype, t.shape)
        if base.dtype != t.dtype:
            base = _reinterpret(base, t.dtype)
        return S.read_view(base, t.shape, t.stride(), t.storage_offset())

    def read_value(self, t: torch.Tensor) -> Value:
        """The values tensor `t` stands for: its storage view, conjugated / negated where its conj / neg bit is set
        (ops that PyTorch's Conjugate fallback passes through unresolved, matmuls and copies among them)."""
        v = self.read(t)
        if t.is_conj():
            v = E.conj(v)
        if t.is_neg():
            v = E.unary("negate", v)
        return v

    def scalar(self, value, dtype) -> Value:
        """A Python scalar as a runtime parameter (0, 1, -1 and non-finite values stay constants)."""
        if isinstance(value, torch.Tensor):
            value = value.item()
        if dtype == torch.bool or value in (0, 1, -1) or (isinstance(value, float) and not math.isfinite(value)):
            return E.const(self.fn, value, dtype)
        if dtype.is_complex:
            value = complex(value)
        elif not dtype.is_floating_point:
            value = int(value)
        elif isinstance(value, complex):  # a complex Python scalar with a real tensor: its real part, as CPU
            value = value.real
        v = self.fn.param((), dtype)
        self.args.append(_scalar_buffer(value, dtype, self.device_index))
        return v

    def host(self, t: torch.Tensor) -> Value:
        """A CPU tensor (e.g. a 0-d scalar tensor argument) as a parameter."""
        v = self.fn.param(t.shape, t.dtype)
        metrics.inc("transfers.h2d")
        metrics.inc("bytes.h2d", t.numel() * t.element_size())
        self.args.append(runtime.get().to_device(t.contiguous().clone(), self.device_index))
        return v

    def check(self, bad: Value, values: Value, exc: type, message: str) -> None:
        """A device-side check computed inside this op's program (an index out of range): the op fails when any
        element of the bool `bad` is true; `message.format(value=v)` names one offending element v of `values`.
        debug mode raises at the op; strict mode at the next synchronization or host read (as cuda's
        device-side asserts do), without an extra host sync per op."""
        fn = self.fn
        n = bad.numel
        b = E.reshape(bad, (n,))
        pos = E.iota(fn, (n,), 0)
        # the first offending element in row-major order, as CPU's loops report it
        first = E.reduce(E.select(b, pos, E.const(fn, n, torch.int64, (n,))), E.const(fn, n, torch.int64), [0],
                         "stablehlo.minimum")
        any_bad = E.compare(first, E.const(fn, n, torch.int64), "LT")
        v = E.reshape(E.broadcast_to(E.convert(values, torch.int64), bad.shape), (n,))
        at_first = E.compare(pos, E.broadcast_to(first, (n,)), "EQ")
        one = E.reduce(E.select(at_first, v, E.const(fn, 0, torch.int64, (n,))), E.const(fn, 0, torch.int64), [0],
                       "stablehlo.add")
        self.checks.append((any_bad, one, exc, message))

    # -- outputs ------------------------------------------------------------------------------
    def write(self, t: torch.Tensor, value: Value) -> None:
        if t.numel() == 0:
            return
        tok = S.token(t)
        value = E.broadcast_to(E.convert(value, t.dtype), tuple(t.shape))
        base = self._storage_value(tok)
        numel = t.untyped_storage().nbytes() // t.element_size()
        if base is not None and base.dtype != t.dtype:
            base = _reinterpret(base, t.dtype)
        new = S.write_view(base, numel, t.dtype, t.shape, t.stride(), t.storage_offset(), value)
        self._storage_cur[tok] = new
        self.writes[tok] = new


def _reinterpret(v: Value, dtype) -> Value:
    """The storage bytes of `v` read as `dtype` (x.view(dtype), torch.save's byte views, view_as_real /
    view_as_complex): a flat value."""
    if v.dtype.is_complex:  # complex values are (real, imaginary) pairs of their component dtype in memory
        flat = E.reshape(v, (v.numel,))
        pairs = E.concatenate([E.reshape(E.real(flat), (v.numel, 1)), E.reshape(E.imag(flat), (v.numel, 1))], 1)
        return _reinterpret(E.reshape(pairs, (2 * v.numel,)), dtype)
    if dtype.is_complex:
        parts = _reinterpret(v, D.component(dtype))
        m = parts.numel // 2
        pairs = E.reshape(E.slice_(parts, [0], [2 * m]), (m, 2))
        return E.complex_(E.reshape(E.slice_dim(pairs, 1, 0, 1), (m,)), E.reshape(E.slice_dim(pairs, 1, 1, 2), (m,)))
    if v.dtype == torch.bool:
        v = E.convert(v, torch.uint8)  # i1 cannot be bitcast; bool bytes are 0/1
    if dtype == torch.bool:
        return E.convert(_reinterpret(v, torch.uint8), torch.bool)
    flat = E.reshape(v, (v.numel,))
    src, dst = v.dtype.itemsize, dtype.itemsize
    if src == dst:
        return E.bitcast(flat, dtype)
    fn = v.fn
    if src > dst:  # narrower: bitcast_convert appends a dimension of src/dst
        r = src // dst
        out = fn.op("stablehlo.bitcast_convert", [flat], (flat.numel, r), dtype)
        return E.reshape(out, (flat.numel * r,))
    r = dst // src
    n = flat.numel // r
    grouped = E.reshape(E.slice_(flat, [0], [n * r]), (n, r))
    return fn.op("stablehlo.bitcast_convert", [grouped], (n,), dtype)


# -- running a trace ------------------------------------------------------------------------------
def launch(tr: Trace, extra_results=()) -> list:
    """Compiles (cached) and runs the trace; publishes written storages. Returns extra results' arrays."""
    toks = list(tr.writes)
    results = [tr.writes[t] for t in toks] + list(extra_results)
    if not results:
        return []
    if tr.checks:  # one int64 vector (flag, value, flag, value, ...) after the other results
        results.append(E.concatenate([E.reshape(E.convert(v, torch.int64), (1,))
                                      for ok, one, _, _ in tr.checks for v in (ok, one)], 0))
    text = tr.fn.module(results)
    rt = runtime.get()
    exe = cache.get_or_compile(rt, text, tr.device_index)
    metrics.inc("executions")
    try:
        outs = rt.execute(exe, tr.args)
    except Exception as e:  # invalid arguments, OOM: raised at launch
        raise op_error(tr.opname, [], {}, e) from e
    if _mode == "debug":
        try:
            rt.wait(outs)
        except Exception as e:
            raise op_error(tr.opname, [], {}, e) from e
        if _check_nans:
            _check_finite(tr.opname, outs)
    if tr.checks:
        _add_check(_Check(tr.opname, user_line(), outs.pop(), [(exc, msg) for _, _, exc, msg in tr.checks]))
    for tok, buf in zip(toks, outs):
        S.set_buffer(tok, buf, tr.opname)
    return outs[len(toks):]


# -- device-side checks ---------------------------------------------------------------------------------
class _Check:
    __slots__ = ("opname", "line", "flags", "messages")

    def __init__(self, opname, line, flags, messages):
        self.opname, self.line, self.flags, self.messages = opname, line, flags, messages

    def verify(self, deferred: bool) -> None:
        try:
            v = np.asarray(self.flags)
        except Exception:  # the op itself failed: that error surfaces where its result is read
            return
        for i, (exc, msg) in enumerate(self.messages):
            if v[2 * i]:
                where = (f"issued at {self.line}; tpu ops run asynchronously, so this surfaces at a later op or "
                         "synchronization, as a cuda device-side assert does; TORCHTPU_MODE=debug raises at the op"
                         ) if deferred else f"at {self.line}"
                raise exc(f"tpu: {self.opname} ({where}): {msg.format(value=int(v[2 * i + 1]))}")


_PENDING_CHECKS_MAX = 4096  # beyond this many unverified checks, the oldest are waited for (bounded memory)
_pending_checks: collections.deque = collections.deque()


def _add_check(c: _Check) -> None:
    if _mode == "debug":
        c.verify(deferred=False)
        return
    _pending_checks.append(c)
    # Checks whose programs have finished are verified as they come (no waiting); a long run without a host
    # read waits for the oldest ones only when too many are pending.
    while _pending_checks and (len(_pending_checks) > _PENDING_CHECKS_MAX or _pending_checks[0].flags.is_ready()):
        _verify(_pending_checks.popleft())


def _verify(c: _Check) -> None:
    try:
        c.verify(deferred=True)
    except Exception:
        _pending_checks.clear()  # reported once, as a device-side assert is
        raise


def verify_checks() -> None:
    """Raises the first failed device-side check of the ops issued so far (waits for their programs)."""
    while _pending_checks:
        _verify(_pending_checks.popleft())


def _check_finite(opname, outs):
    for o in outs:
        if o.dtype.kind == "f" or str(o.dtype) == "bfloat16":
            a = np.asarray(o).astype(np.float32)
            if not np.isfinite(a).all():
                bad = "NaN" if np.isnan(a).any() else "Inf"
                raise FloatingPointError(
                    f"tpu: {opname} produced {bad} (TORCHTPU_CHECK_NANS=1) at {user_line()}; output shape {list(o.shape)}")


def read_host(t: torch.Tensor, cause: str) -> torch.Tensor:
    """The value of tpu tensor `t` as a new contiguous CPU tensor. Blocks (a host sync)."""
    drain()
    metrics.host_sync(cause)
    verify_checks()
    out = torch.empty(t.shape, dtype=t.dtype)
    if t.numel() == 0:
        return out
    tok = S.token(t)
    st = S.state(tok)
    if st is None or st.buf is None:
        return out.zero_()
    buf = st.buf
    whole = (t.storage_offset() == 0 and S.is_contiguous(t.shape, t.stride())
             and t.numel() * t.element_size() == t.untyped_storage().nbytes() and D.from_numpy(buf.dtype) == t.dtype)
    if not whole:
        tr = Trace("read:" + cause, t.device.index or 0)
        (buf,) = launch(tr, [tr.read(t)])
    try:
        host = runtime.get().to_host(buf)
    except Exception as e:
        raise RuntimeError(f"tpu: the op {st.producer} that produced this tensor failed: {e}") from e
    metrics.inc("transfers.d2h")
    metrics.inc("bytes.d2h", t.numel() * t.element_size())
    out.copy_(host.reshape(t.shape))
    return out


def synchronize(device_index: int | None = None) -> None:
    drain()
    rt = runtime.get()
    if rt._backend is None:
        return
    verify_checks()
    try:
        rt.wait(S.live_buffers())
    except Exception as e:
        raise RuntimeError(f"tpu: a queued op failed: {e}") from e


# -- storage events -------------------------------------------------------------------------------
def _resize_copy(old_buf, new_nbytes):
    dtype = D.from_numpy(old_buf.dtype)
    n_new = new_nbytes // dtype.itemsize
    tr = Trace("resize_", 0)
    base = tr.fn.param(old_buf.shape, dtype)
    tr.args.append(old_buf)
    flat = E.reshape(base, (base.numel,))
    if n_new <= flat.numel:
        new = E.slice_(flat, [0], [n_new])
    else:
        new = E.pad(flat, E.const(tr.fn, 0, dtype), [0], [n_new - flat.numel])
    (out,) = launch(tr, [new])
    return out


def drain() -> None:
    S.drain_events(_resize_copy)


__all__ = ["Trace", "launch", "read_host", "synchronize", "set_mode", "get_mode", "mode", "drain"]
