"""Error messages that name the op, its inputs (shapes, dtypes, devices) and the user's line."""

from __future__ import annotations

import os
import sys

import torch

_PKG_DIRS = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(torch.__file__)))
_internal: dict[str, bool] = {}  # code filename -> inside torch/torchtpu (or frozen)


def _is_internal(filename: str) -> bool:
    v = _internal.get(filename)
    if v is None:
        f = os.path.abspath(filename)
        v = _internal[filename] = f.startswith(_PKG_DIRS) or filename.startswith("<frozen")
    return v


def user_line() -> str:
    """file:line of the innermost frame outside torch and torchtpu (the user's code); a few µs (walks frames
    without building a traceback). On autograd's backward thread there is no user frame: '<backward>'."""
    try:
        f = sys._getframe(1)
    except ValueError:  # called from C++ with no Python frame (autograd's backward thread)
        f = None
    while f is not None:
        code = f.f_code
        if not _is_internal(code.co_filename):
            return f"{os.path.basename(code.co_filename)}:{f.f_lineno}"
        f = f.f_back
    return "<backward>" if torch._C._current_autograd_node() is not None else "<unknown>"


def describe(x) -> str:
    if isinstance(x, torch.Tensor):
        dt = str(x.dtype).replace("torch.", "")
        return f"{dt}{list(x.shape)} on {x.device}"
    if isinstance(x, (list, tuple)):
        inner = ", ".join(describe(v) for v in x)
        return f"[{inner}]"
    return repr(x)


def describe_args(args, kwargs) -> str:
    parts = [describe(a) for a in args] + [f"{k}={describe(v)}" for k, v in kwargs.items()]
    return ", ".join(parts)


class TpuOpError(RuntimeError):
    """An ATen op failed on tpu; the message names the op, its inputs and the Python line."""


def op_error(opname: str, args, kwargs, cause: BaseException | str) -> TpuOpError:
    msg = cause if isinstance(cause, str) else f"{type(cause).__name__}: {cause}"
    return TpuOpError(f"tpu: {opname}({describe_args(args, kwargs)}) at {user_line()}: {msg}")
