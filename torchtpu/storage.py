"""Storage handles and views.

A tpu storage's data pointer is a token (see csrc/core/allocator.h). Its state lives
here: ``buf`` is the device buffer (a jax Array) holding the whole storage, or None
while the storage was never written (it then reads as zeros: allocation never exposes
garbage). ``producer`` names the op that wrote it, so an asynchronous failure names it.

Reading a view lowers to reshape/slice/transpose/broadcast over the storage buffer
(a gather only when no such chain exists); writing through a view lowers to
dynamic_update_slice, or scatter as the last resort, and produces the storage's new
buffer. Every alias sees the write because aliases share the storage.
"""
from __future__ import annotations

import math

import torch

from . import _C
from . import emit as E

FREE, MOVE = 0, 1


class StorageState:
    __slots__ = ("buf", "producer")

    def __init__(self, buf=None, producer=""):
        self.buf = buf
        self.producer = producer


_states: dict[int, StorageState] = {}


def token(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def state(tok: int) -> StorageState | None:
    return _states.get(tok)


def set_buffer(tok: int, buf, producer: str) -> None:
    st = _states.get(tok)
    if st is None:
        _states[tok] = StorageState(buf, producer)
    else:
        st.buf, st.producer = buf, producer


def drain_events(resize_copy) -> None:
    """Applies frees and resize moves recorded by the allocator, in order.

    resize_copy(old_buf, new_nbytes) -> new buffer holding the old bytes as a prefix.
    """
    for kind, tok, new_tok, nbytes in _C._drain_storage_events():
        if kind == FREE:
            _states.pop(tok, None)
        else:
            st = _states.get(tok)
            if st is not None and st.buf is not None:
                _states[new_tok] = StorageState(resize_copy(st.buf, nbytes), st.producer)


def live_buffers():
    return [s.buf for s in _states.values() if s.buf is not None]


# -- view geometry ------------------------------------------------------------------------------
def is_contiguous(sizes, strides) -> bool:
    expected = 1
    for s, st in zip(reversed(sizes), reversed(strides)):
        if s != 1 and st != expected:
            return False
        expected *= s
    return True


def flat_indices(fn, sizes, strides, offset) -> E.Value:
    """int64 tensor of `sizes` holding each element's position in the flat storage."""
    idx = E.const(fn, offset, torch.int64, sizes)
    for d, (s, st) in enumerate(zip(sizes, strides)):
        if s > 1 and st != 0:
            term = E.mul(E.iota(fn, sizes, d), E.const(fn, st, torch.int64, sizes))
            idx = E.add(idx, term)
    return idx


def read_view(base: E.Value, sizes, strides, offset) -> E.Value:
    """Value of the strided view (sizes, strides, offset) over storage buffer `base`."""
    sizes, strides = list(sizes), list(strides)
    fn = base.fn
    n = math.prod(sizes)
    m = base.numel
    if n == 0:
        return E.const(fn, 0, base.dtype, sizes)
    if offset == 0 and n == m and is_contiguous(sizes, strides):
        return E.reshape(base, sizes)
    flat = E.reshape(base, (m,))
    if is_contiguous(sizes, strides):
        return E.reshape(E.slice_(flat, [offset], [offset + n]), sizes)
    # Box method: keep dims that move (size > 1, stride != 0), ordered by stride; if each
    # stride divides the previous one, the view is a strided slice of a reshaped window.
    dims = sorted((d for d in range(len(sizes)) if sizes[d] > 1 and strides[d] != 0), key=lambda d: -strides[d])
    chain_ok = all(strides[a] % strides[b] == 0 and strides[a] >= strides[b] * sizes[b] for a, b in zip(dims, dims[1:]))
    if dims and chain_ok:
        box = [sizes[dims[0]]] + [strides[a] // strides[b] for a, b in zip(dims, dims[1:])] + [strides[dims[-1]]]
        span = math.prod(box)
        window = flat
        if offset + span > m:  # the last row of the box runs past the storage end: pad, never read
            window = E.pad(flat, E.const(fn, 0, flat.dtype), [0], [offset + span - m])
        window = E.reshape(E.slice_(window, [offset], [offset + span]), box)
        limits = [sizes[d] for d in dims] + [1]
        v = E.slice_(window, [0] * len(box), limits)
        v = E.reshape(v, [sizes[d] for d in dims])
        # v's axes are `dims` (by stride); put them back in tensor order, then broadcast the rest.
        order = sorted(range(len(dims)), key=lambda i: dims[i])
        v = E.transpose(v, order)
        kept = sorted(dims)
        return E.broadcast_in_dim(v, sizes, kept)
    if not dims:  # every dim is size 1 or broadcast: one element
        v = E.reshape(E.slice_(flat, [offset], [offset + 1]), ())
        return E.broadcast_in_dim(v, sizes, [])
    return E.take_along_flat(flat, flat_indices(fn, sizes, strides, offset))


def write_view(base: E.Value | None, storage_numel: int, dtype, sizes, strides, offset, value: E.Value) -> E.Value:
    """New flat-or-shaped storage buffer after writing `value` through the view. base None = zeros."""
    sizes, strides = list(sizes), list(strides)
    fn = value.fn
    n = math.prod(sizes)
    if offset == 0 and n == storage_numel and is_contiguous(sizes, strides):
        return E.reshape(value, base.shape) if base is not None else value
    if base is None:
        base = E.const(fn, 0, dtype, (storage_numel,))
    if n == 0:
        return base
    flat = E.reshape(base, (base.numel,))
    if is_contiguous(sizes, strides):
        start = E.const(fn, offset, torch.int64)
        new = E.dynamic_update_slice(flat, E.reshape(value, (n,)), [start])
    else:
        new = E.scatter_flat(flat, flat_indices(fn, sizes, strides, offset), value)
    return E.reshape(new, base.shape)
