"""Python kernels Dynamo must not trace (torchtpu/kernels.py registers tables.DIRECT through it). Its own module:
the wrapper runs per call (loss.item() among them) and is no lowering code (tests/executor/test_fused.py watches those
files)."""

from __future__ import annotations

import functools
import sys

import torch


def untraced(fn):
    """A Python kernel Dynamo never traces. The dispatcher calls it from inside a compiled function's graph-broken
    code (torch.compile(backend="tpu") of `repeat_interleave(x, repeats_tensor)`), where Dynamo compiled its frames
    as user code (torchtpu's directory in its skip list notwithstanding) and lowered its ops inside another trace."""
    disabled = []

    @functools.wraps(fn)
    def run(*args, **kwargs):
        if "torch._dynamo" not in sys.modules:  # nothing compiles in this process
            return fn(*args, **kwargs)
        if not disabled:
            disabled.append(torch._dynamo.disable(fn, recursive=True))
        return disabled[0](*args, **kwargs)

    return run
