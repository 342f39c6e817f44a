"""torch._assert_async: Dynamo turns data-dependent checks (`torch._check` on a tensor, asserts on values) into it,
and code calls it to check a value without a host sync. As on cuda, a device-side check: debug mode raises at the
op, strict and fused at a later op or the next synchronization (was a counted CPU fallback with a host sync, which
also made every compiled graph holding one run op by op)."""

from __future__ import annotations

import torch

from .. import emit as E
from ..tables import lowering

_ZERO = "Expected Tensor with single nonzero value, but got zero"


@lowering("_assert_async", "_assert_async.msg")
def assert_async(tr, x, assert_msg=_ZERO):
    if x.numel != 1:
        what = "no values" if x.numel == 0 else "more than one value"
        raise RuntimeError(f"Boolean value of Tensor with {what} is ambiguous")
    zero = E.compare(x, E.const(x.fn, 0, x.dtype, x.shape), "EQ")
    message = assert_msg.replace("{", "{{").replace("}", "}}")  # tr.check formats it
    tr.check(zero, E.const(x.fn, 0, torch.int64, x.shape), RuntimeError, message)
    return []  # nothing: the program only checks
