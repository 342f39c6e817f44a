"""The Python half of the executor: modes, host reads, synchronization, device-side checks, and compiling chunks.

The per-op path is C++ (csrc/executor, csrc/graph): it records each op as a node of its device's pending graph
and cuts it into chunks, one XLA program each. Here are the steps that need Python and happen per chunk or per
host read, never per op on a cache hit: compiling a chunk and building its launcher (``compile_chunk``), reading
values back to the host, verifying device-side checks.

Modes: ``strict`` (default) cuts after every op and launches asynchronously; ``debug`` also waits for each op and
raises its errors at the op, with the Python line; ``fused`` records ops and cuts at host reads, syncs, CPU
fallbacks, a mode switch, the size cap and the repeated-structure rule. One path: strict is fused with a cut
after every op, debug is strict plus a wait.
"""

from __future__ import annotations

import contextlib
import math

import numpy as np
import torch

from . import _C, cache, checks, config, metrics, runtime
from . import dtypes as D
from . import views as V
from .errors import user_line
from .trace import Trace

MODES = config.KNOBS["mode"].choices  # _C.Mode's names (csrc/core/kinds.h)
Cut = _C.CutCause  # why a pending graph is cut: Cut.host_read, Cut.sync, ... (csrc/core/kinds.h)

_mode = config.get("mode")
_check_nans = config.get("check_nans")
_C._set_mode(getattr(_C.Mode, _mode))
_C._set_chunk_cache_capacity(cache.MAX_ENTRIES)


def fused_limits_from_env() -> None:
    """The fused-mode cut policy's knobs (docs/modes.md), read from torchtpu.config."""
    _C._set_fused_limits(
        config.get("fused_max_ops"),
        config.get("fused_repeat_min_ops"),
        config.get("fused_read_split_min_ops"),
        config.get("fused_repeat_min_weight"),
        config.get("fused_program_cut_ops"),
    )


fused_limits_from_env()


def set_mode(name: str) -> None:
    """Switches the execution mode; what is pending in fused mode is launched first."""
    global _mode
    if name not in MODES:
        raise ValueError(f"torchtpu.set_mode({name!r}): expected one of {', '.join(MODES)}")
    if name != _mode:
        _C._cut(-1, Cut.mode_switch)
    _mode = name
    _C._set_mode(getattr(_C.Mode, name))


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
    """debug mode's NaN/Inf check after each op (its listeners: shapes/eager_buckets.py turns bucketing off, since the
    check reads whole buffers and bucketed rows' padding would trip it)."""
    config.set("check_nans", bool(on))


def _check_nans_changed(on) -> None:
    global _check_nans
    _check_nans = on


config.on_change("check_nans", _check_nans_changed)


def direct_trace(opname: str, device_index: int) -> Trace:
    """A Trace over real tensors, for the Python kernels; ``tr.record()`` runs it."""

    def storage(t):
        st = t.untyped_storage()
        return st.data_ptr(), (_C._storage_value_type(t) if st.nbytes() else None), st.nbytes()

    return Trace(opname, device_index, storage)


@contextlib.contextmanager
def exact_uploads():
    """Uploads inside keep their exact sizes: our own copies (a bucketed graph's inputs padded to their capacity, a
    nonzero's rows) are not batches whose dim 0 varies (csrc/executor/kernel.cpp upload_capacity)."""
    before = _C._set_exact_uploads(True)
    try:
        yield
    finally:
        _C._set_exact_uploads(before)


# -- host reads -----------------------------------------------------------------------------------------------
def buffer_of(t: torch.Tensor, cause: Cut = Cut.host_read):
    """The jax Array holding t's whole storage (what is pending is launched first), or None if never written."""
    return _C._storage_buffer(t, cause)


def uploaded_values(t: torch.Tensor):
    """t's value as a view of the host bytes its storage was uploaded from, if the storage holds them still (a
    write gives the storage a new buffer, which has none), else None."""
    if t.numel() == 0 or t.is_conj() or t.is_neg():
        return None
    kept = _C._storage_host_values(t)
    if kept is None or kept.dtype != t.dtype:
        return None
    last = t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    if last >= kept.numel():
        return None
    return kept.as_strided(t.shape, t.stride(), t.storage_offset())


def read_host(t: torch.Tensor, cause: str) -> torch.Tensor:
    """The value of tpu tensor `t` as a new contiguous CPU tensor. Blocks (a host sync), unless its storage still
    holds the bytes of a small upload, whose host copy is kept while sizes are bucketed (a nonzero's indices, an
    MoE's expert ids: `x[expert_idx]` reads its index as a Python int)."""
    out = torch.empty(t.shape, dtype=t.dtype)
    kept = uploaded_values(t)
    if kept is not None:
        metrics.inc("host_reads_from_upload")
        metrics.inc(f"host_reads_from_upload.{cause}")
        return out.copy_(kept)
    metrics.host_sync(cause)
    if t.numel() == 0:
        return out
    vt = _C._storage_value_type(t)
    if vt is None:
        verify_checks()
        return out.zero_()
    shape, dtype = vt
    whole = V.covers_storage(t) and dtype == t.dtype and tuple(shape) in (tuple(t.shape), (t.numel(),))
    # a contiguous run of a buffer not much larger (a bucketed program's exact-size output, the compact prefix of
    # its capacity): the buffer is read and the run cut out on the host, with no program per size
    start = t.storage_offset()
    run = (
        not whole
        and dtype == t.dtype
        and not (t.is_conj() or t.is_neg())
        and V.is_contiguous(t.shape, t.stride())
        and start + t.numel() <= math.prod(shape) <= 4 * t.numel() + 16384
    )
    src = t
    if not whole and not run:  # a view, another dtype or a resized storage: one small program makes it contiguous
        src = torch.empty(t.shape, dtype=t.dtype, device=t.device)
        tr = direct_trace("read:" + cause, t.device.index or 0)
        tr.write(src, tr.read(t))
        tr.record()
    buf = buffer_of(src)
    if buf is not None:
        buf.block_until_ready()  # the value first: then the checks of what has finished (its own among them)
    verify_checks(wait=False)
    try:
        host = runtime.get().to_host(buf)
    except Exception as e:
        raise RuntimeError(f"tpu: reading a tensor failed: {e}") from e
    metrics.inc("transfers.d2h")
    metrics.inc("bytes.d2h", t.numel() * t.element_size())
    out.copy_(host.reshape(-1)[start : start + t.numel()].reshape(t.shape) if run else host.reshape(t.shape))
    return out


def synchronize(device_index: int | None = None) -> None:
    """Launches what is pending and waits for every queued tpu op; raises failed device-side checks."""
    try:
        _C._synchronize(-1 if device_index is None else device_index, Cut.sync)
    except RuntimeError as e:
        raise RuntimeError(f"tpu: a queued op failed: {e}") from e
    verify_checks()


def cut(device_index: int | None = None, cause: Cut = Cut.sync) -> None:
    """Launches what is pending (fused mode) without waiting."""
    _C._cut(-1 if device_index is None else device_index, cause)


# -- chunks: compile and launch (C++ callbacks) --------------------------------------------------------------
def compile_chunk(text, device_index, leaves, n_f, n_i, results):
    """Compiles a chunk's module through the shared cache; returns its launcher (a jax fast-path callable)."""
    rt = runtime.get()
    exe = cache.get_or_compile(rt, text, device_index)
    ins = [(tuple(s), d) for s, d in leaves]
    if n_f:
        ins.append(((n_f,), torch.float64))
    if n_i:
        ins.append(((n_i,), torch.int64))
    group = rt.group_of(text)
    if group is not None:  # collectives inside (collectives.py): compiled for the group's devices
        launcher = rt.group_launcher(exe, device_index, group)
    else:
        launcher = rt.launcher(exe, device_index, ins, [(tuple(s), d) for s, d in results])
    if _mode == "debug" and _check_nans:
        return _checking_nans(launcher, results)
    return launcher


def _checking_nans(launcher, results):
    def run(*args):
        outs = launcher(*args)
        for o in outs:
            if o.dtype.kind in "fc" or str(o.dtype) == "bfloat16":
                a = np.asarray(o)
                a = a.astype(np.complex128 if a.dtype.kind == "c" else np.float32)
                if not np.isfinite(a).all():
                    bad = "NaN" if np.isnan(a).any() else "Inf"
                    raise FloatingPointError(
                        f"produced {bad} (TORCHTPU_CHECK_NANS=1) at {user_line()}; output shape {list(o.shape)}"
                    )
        return outs

    return run


def device_put_args(shape, dtype, device_index):
    """What csrc/runtime uploads a host array of this shape and dtype with: (jaxlib's batched_device_put, aval,
    sharding, [device], numpy dtype). A copy costs ~2.5 µs through it against ~20 µs for jax.device_put."""
    from jax._src import core
    from jax._src.lib import xla_client as xc
    from jax._src.sharding_impls import SingleDeviceSharding

    dev = runtime.get().device(device_index)
    np_dtype = D.to_numpy(dtype)
    return (xc.batched_device_put, core.ShapedArray(tuple(shape), np_dtype), SingleDeviceSharding(dev), [dev], np_dtype)


def wait_all(device_index):
    runtime.get().wait_device(device_index)


# -- device-side checks (checks.py) ------------------------------------------------------------------------
def submit_checks(raw, now):
    """C++ callback: checks to verify now (debug mode, at the op), or the oldest of too many pending ones. The
    executor keeps the others in C++ (no Python per op) until a host read or a sync verifies them."""
    checks.verify(raw, deferred=not now)


_unfinished: list = []  # checks taken from the executor whose programs had not finished at a host read


def verify_checks(wait: bool = True) -> None:
    """Raises the first failed device-side check of the ops launched so far; a failed check is reported once, as a
    device-side assert is. wait=False (a host read) verifies the programs that have finished and keeps the
    others for the next read or sync, so that a read never waits for work it does not need."""
    global _unfinished
    raw = _unfinished + list(_C._take_checks())
    if not wait:
        ready = []
        _unfinished = []
        for c in raw:
            (ready if c[0].is_ready() else _unfinished).append(c)
        raw = ready
    else:
        _unfinished = []
    checks.verify(raw, deferred=True)


def callbacks() -> dict:
    """The executor's half of the C++ callbacks (torchtpu/__init__.py adds the op table's: lower, python_kernel)."""
    return {
        "compile_chunk": compile_chunk,
        "submit_checks": submit_checks,
        "user_line": user_line,
        "wait_all": wait_all,
        "device_put_args": device_put_args,
    }


__all__ = ["read_host", "synchronize", "set_mode", "get_mode", "mode", "direct_trace", "buffer_of", "cut"]
