"""Error messages that name the op, its inputs (shapes, dtypes, devices) and the user's line."""
from __future__ import annotations

import os
import traceback

import torch

_PKG_DIRS = (os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.abspath(torch.__file__)))


def user_line() -> str:
    """file:line of the innermost frame outside torch and torchtpu (the user's code)."""
    for frame in reversed(traceback.extract_stack()):
        f = os.path.abspath(frame.filename)
        if not f.startswith(_PKG_DIRS) and not f.startswith("<frozen"):
            return f"{os.path.basename(f)}:{frame.lineno}"
    return "<unknown>"


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
