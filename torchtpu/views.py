"""Views of storages: reading a strided view from a storage's value, writing through one, reinterpreting bytes.

A tensor is a view (sizes, strides, storage offset, dtype) of its storage. Reading a view lowers to
reshape/slice/transpose/broadcast over the storage's value (a gather only when no such chain exists); writing
through a view lowers to dynamic_update_slice, or scatter as the last resort, and gives the storage's new value.
Every alias sees the write because aliases share the storage. A view of another dtype (x.view(torch.int32),
torch.save's byte views, view_as_real) reads and writes the same bytes reinterpreted.
"""

from __future__ import annotations

import math

import torch

from . import dtypes as D
from . import emit as E
from .hlo import Value


def covers_storage(t: torch.Tensor) -> bool:
    """t is the whole of its storage, contiguous from offset 0 (a write replaces the storage's value)."""
    return (
        t.storage_offset() == 0
        and is_contiguous(t.shape, t.stride())
        and t.numel() * t.element_size() == t.untyped_storage().nbytes()
    )


def fit(base: Value, numel: int) -> Value:
    """A storage value of another length than its storage (the storage was resized): its first numel elements,
    zero-padded, flat."""
    if base.numel == numel:
        return base
    flat = E.reshape(base, (base.numel,))
    if base.numel > numel:
        return E.slice_(flat, [0], [numel])
    return E.pad(flat, E.const(base.fn, 0, base.dtype), [0], [numel - base.numel])


def reinterpret(v: Value, dtype) -> Value:
    """The storage bytes of `v` read as `dtype` (x.view(dtype), torch.save's byte views, view_as_real /
    view_as_complex): a flat value."""
    if v.dtype.is_complex:  # complex values are (real, imaginary) pairs of their component dtype in memory
        flat = E.reshape(v, (v.numel,))
        pairs = E.concatenate([E.reshape(E.real(flat), (v.numel, 1)), E.reshape(E.imag(flat), (v.numel, 1))], 1)
        return reinterpret(E.reshape(pairs, (2 * v.numel,)), dtype)
    if dtype.is_complex:
        parts = reinterpret(v, D.component(dtype))
        m = parts.numel // 2
        pairs = E.reshape(E.slice_(parts, [0], [2 * m]), (m, 2))
        return E.complex_(E.reshape(E.slice_dim(pairs, 1, 0, 1), (m,)), E.reshape(E.slice_dim(pairs, 1, 1, 2), (m,)))
    if v.dtype == torch.bool:
        v = E.convert(v, torch.uint8)  # i1 cannot be bitcast; bool bytes are 0/1
    if dtype == torch.bool:
        return E.convert(reinterpret(v, torch.uint8), torch.bool)
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


def _box(sizes, strides):
    """The dims that move (size > 1, stride != 0) ordered by stride, and the box they nest in: when each stride
    divides the previous one with room for its dim, the view is a strided slice of the storage window reshaped to
    `box` (its last entry the innermost stride). (dims, None) where the strides do not nest."""
    dims = sorted((d for d in range(len(sizes)) if sizes[d] > 1 and strides[d] != 0), key=lambda d: -strides[d])
    chain_ok = all(strides[a] % strides[b] == 0 and strides[a] >= strides[b] * sizes[b] for a, b in zip(dims, dims[1:]))
    if not dims or not chain_ok:
        return dims, None
    return dims, [sizes[dims[0]]] + [strides[a] // strides[b] for a, b in zip(dims, dims[1:])] + [strides[dims[-1]]]


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
    dims, box = _box(sizes, strides)  # a strided slice of a reshaped window, where the strides nest
    if box is not None:
        limits = [sizes[d] for d in dims] + [1]
        # The offset as coordinates of the box (mixed radix): when the view fits the box from there without a
        # carry, it is a plain slice of the storage's prefix reshaped to the box (q, k, v of one qkv buffer).
        bstr = [math.prod(box[i + 1 :]) for i in range(len(box))]
        at = [offset // bstr[0]] + [(offset // bstr[i]) % box[i] for i in range(1, len(box))]
        rows = at[0] + limits[0]
        if rows * bstr[0] <= m and all(at[i] + limits[i] <= box[i] for i in range(1, len(box))):
            prefix = flat if rows * bstr[0] == m else E.slice_(flat, [0], [rows * bstr[0]])
            window = E.reshape(prefix, [rows] + box[1:])
            v = E.slice_(window, at, [a + l for a, l in zip(at, limits)])
        else:
            span = math.prod(box)
            window = flat
            if offset + span > m:  # the last row of the box runs past the storage end: pad, never read
                window = E.pad(flat, E.const(fn, 0, flat.dtype), [0], [offset + span - m])
            window = E.reshape(E.slice_(window, [offset], [offset + span]), box)
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
        new = _write_box(flat, sizes, strides, offset, value)
        if new is None:
            new = E.scatter_flat(flat, flat_indices(fn, sizes, strides, offset), value)
    return E.reshape(new, base.shape)


def _write_box(flat: E.Value, sizes, strides, offset, value: E.Value) -> E.Value | None:
    """Writing through a strided view without a scatter, where the view's dims ordered by stride nest (the box of
    read_view): the value's dims are permuted into stride order and written into the box, a window of the storage
    from the offset, by dynamic_update_slice. A permuted dense tensor (a transposed result written whole) is the
    window itself. None where the view has no box (overlapping or broadcast elements): the caller scatters.
    XLA runs a scatter element by element on CPU (a (8, 52, 32) transpose written as one took most of a decode
    step), where a transpose and an update slice are copies."""
    fn = flat.fn
    if any(s > 1 and st == 0 for s, st in zip(sizes, strides)):
        return None
    dims, box = _box(sizes, strides)
    if box is None:
        return None
    span = math.prod(box)
    kept = sorted(dims)
    v = E.reshape(value, [sizes[d] for d in kept])
    v = E.transpose(v, [kept.index(d) for d in dims])
    v = E.reshape(v, [sizes[d] for d in dims] + [1])
    m = flat.numel
    if offset == 0 and span == m and v.numel == span:  # every element of the storage: the window is the value
        return E.reshape(v, (m,))
    padded = flat if offset + span <= m else E.pad(flat, E.const(fn, 0, flat.dtype), [0], [offset + span - m])
    window = E.reshape(E.slice_(padded, [offset], [offset + span]), box)
    zero = E.const(fn, 0, torch.int64)
    window = E.dynamic_update_slice(window, v, [zero] * len(box))
    start = E.const(fn, offset, torch.int64)
    new = E.dynamic_update_slice(padded, E.reshape(window, (span,)), [start])
    return new if new.numel == m else E.slice_(new, [0], [m])
