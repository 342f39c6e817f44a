"""Device-side checks (an index out of range): what each checked fragment reports, and their verification.

A rule adds a check with ``Trace.check``; the op's own program returns (flag, first offending value) pairs as
one int64 vector. The executor keeps the vectors of launched chunks in C++ and hands them here at a host read
or a sync (strict, fused), or at once (debug mode), never per op.
"""

from __future__ import annotations

import numpy as np

_MESSAGES: dict[int, tuple] = {}  # fragment id -> (op name, [(exception type, message template)])


def register(fragment: int, opname: str, messages) -> None:
    _MESSAGES[fragment] = (opname, messages)


def verify(raw, deferred: bool) -> None:
    """raw: [(int64 vector, fragment id, Python line)]. Raises the first failed check's error."""
    for flags, fragment, line in raw:
        try:
            v = np.asarray(flags)
        except Exception:  # the op itself failed: that error surfaces where its result is read
            continue
        opname, messages = _MESSAGES[fragment]
        for i, (exc, msg) in enumerate(messages):
            if v[2 * i]:
                where = (
                    (
                        f"issued at {line}; tpu ops run asynchronously, so this surfaces at a later op or "
                        "synchronization, as a cuda device-side assert does; TORCHTPU_MODE=debug raises at the op"
                    )
                    if deferred
                    else f"at {line}"
                )
                raise exc(f"tpu: {opname} ({where}): {msg.format(value=int(v[2 * i + 1]))}")
