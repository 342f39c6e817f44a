"""Counters for everything the backend does: ``counters()``, ``report()``, ``reset()``, ``step_line()``.

``host_sync_lines()``: the host syncs by the user's line that caused them.

Names (stable, documented in docs/architecture.md):
  op.<aten op>                ops dispatched to the tpu kernels, by overload
  executions                  programs launched (chunks: one op each in strict/debug, many in fused)
  chunks, chunk_ops, chunk_ops_max   chunks run, ops in them (mean = chunk_ops / chunks), the largest
  cuts.<cause>                why chunks were cut (op, host_read, sync, size_cap, repeat, mode_switch, fallback,
                              data_dependent, collective, program)
  compiles, compile_seconds   XLA compilations and their wall time
  cache_hits.memory, cache_misses    launches served by a compiled program / compiled anew
  op_table.hits / .misses / .entries  C++ op-table lookups (a miss runs the Python rules once per signature)
  lowerings                   signatures lowered by the Python rules
  python_kernels              calls the C++ path handed to a Python kernel
  donated_buffers, donated_bytes      buffers a program overwrote in place
  host_syncs, host_sync.<cause>
  transfers.h2d / .d2h / .d2d, bytes.h2d / .d2h / .d2d
  fallback.<aten op>          ops run through the counted CPU fallback
  decomposed.<aten op>        ops run through PyTorch's decompositions
"""

from __future__ import annotations

import collections
import threading

from . import _C
from .errors import user_line

_lock = threading.Lock()
_counters: collections.Counter = collections.Counter()
_floats: dict[str, float] = collections.defaultdict(float)
_sync_lines: collections.Counter = collections.Counter()


def inc(name: str, n: int = 1) -> None:
    with _lock:
        _counters[name] += n


def add_time(name: str, seconds: float) -> None:
    with _lock:
        _floats[name] += seconds


def get(name: str) -> int:
    """One Python-side counter (no C++ counters: cheaper than counters())."""
    with _lock:
        return _counters.get(name, 0)


def host_sync(cause: str) -> None:

    with _lock:
        _counters["host_syncs"] += 1
        _counters["host_sync." + cause] += 1
        _sync_lines[user_line()] += 1


def host_sync_lines() -> dict:
    """Host syncs since the last reset by the user's source line that caused them ("file.py:line")."""
    with _lock:
        return dict(_sync_lines)


def counters() -> dict:

    with _lock:
        out = dict(_counters)
        out.update({k: round(v, 6) for k, v in _floats.items()})
    cc = _C._counters()
    for k, v in cc.pop("op_counts").items():
        out["op." + k] = out.get("op." + k, 0) + v
    for k, v in cc.items():
        if v:
            out[k] = out.get(k, 0) + v
    out["executions"] = cc["chunks"]
    hits = out.get("cache_hits.memory", 0) + cc["chunk_cache.hits"]
    if hits:
        out["cache_hits.memory"] = hits
    return out


def reset() -> None:

    with _lock:
        _counters.clear()
        _floats.clear()
        _sync_lines.clear()
    _C._reset_counters()


_step_marks: dict = {}


def step_line() -> str:
    """One line for logging per training step: what happened since the previous call."""
    global _step_marks
    c = counters()
    d = {
        k: c.get(k, 0) - _step_marks.get(k, 0)
        for k in ("ops", "executions", "chunk_ops", "compiles", "host_syncs", "donated_bytes", "lowerings")
    }
    fb = sum(v for k, v in c.items() if k.startswith("fallback.")) - _step_marks.get("fallbacks", 0)
    _step_marks = dict(c, fallbacks=fb + _step_marks.get("fallbacks", 0))
    mean = d["chunk_ops"] / d["executions"] if d["executions"] else 0.0
    return (
        f"ops {d['ops']} | chunks {d['executions']} ({mean:.1f} ops/chunk) | compiles {d['compiles']} | "
        f"lowerings {d['lowerings']} | host syncs {d['host_syncs']} | fallbacks {fb} | "
        f"donated {d['donated_bytes'] / 2**20:.1f} MiB"
    )


def _group(c: dict, prefix: str) -> list[tuple[str, int]]:
    return sorted(((k[len(prefix) :], v) for k, v in c.items() if k.startswith(prefix)), key=lambda kv: (-kv[1], kv[0]))


def report() -> str:
    c = counters()
    lines = ["torchtpu metrics"]
    scalars = [
        "executions",
        "chunk_ops",
        "chunk_ops_max",
        "compiles",
        "compile_seconds",
        "cache_hits.memory",
        "cache_misses",
        "op_table.misses",
        "lowerings",
        "python_kernels",
        "donated_bytes",
        "host_syncs",
        "transfers.h2d",
        "bytes.h2d",
        "transfers.d2h",
        "bytes.d2h",
    ]
    for k in scalars:
        lines.append(f"  {k:<22} {c.get(k, 0)}")
    ops = _group(c, "op.")
    lines.append(f"  ops dispatched: {sum(v for _, v in ops)} ({len(ops)} distinct)")
    for name, v in ops[:25]:
        lines.append(f"    {name:<40} {v}")
    if len(ops) > 25:
        lines.append(f"    ... {len(ops) - 25} more")
    for title, prefix in (
        ("chunk cuts by cause", "cuts."),
        ("host syncs by cause", "host_sync."),
        ("decomposed ops", "decomposed."),
        ("CPU fallbacks", "fallback."),
    ):
        group = _group(c, prefix)
        lines.append(f"  {title}: {sum(v for _, v in group)}")
        for name, v in group:
            lines.append(f"    {name:<40} {v}")
    with _lock:
        top = _sync_lines.most_common(5)
    if top:
        lines.append("  host syncs by line:")
        for line, v in top:
            lines.append(f"    {line:<60} {v}")
    return "\n".join(lines)
