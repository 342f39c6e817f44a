"""Counters for everything the backend does: ``counters()``, ``report()``, ``reset()``.

Names (stable, documented in docs/architecture.md):
  op.<aten op>                ops dispatched to the tpu kernels, by overload
  executions                  executables launched
  compiles, compile_seconds   XLA compilations and their wall time
  cache_hits.memory, cache_misses
  host_syncs, host_sync.<cause>
  transfers.h2d / .d2h, bytes.h2d / .d2h
  fallback.<aten op>          ops run through the counted CPU fallback
  decomposed.<aten op>        ops run through PyTorch's decompositions
"""
from __future__ import annotations

import collections
import threading

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


def host_sync(cause: str) -> None:
    from .errors import user_line

    with _lock:
        _counters["host_syncs"] += 1
        _counters["host_sync." + cause] += 1
        _sync_lines[user_line()] += 1


def counters() -> dict:
    with _lock:
        out = dict(_counters)
        out.update({k: round(v, 6) for k, v in _floats.items()})
        return out


def reset() -> None:
    with _lock:
        _counters.clear()
        _floats.clear()
        _sync_lines.clear()


def _group(c: dict, prefix: str) -> list[tuple[str, int]]:
    return sorted(((k[len(prefix):], v) for k, v in c.items() if k.startswith(prefix)), key=lambda kv: (-kv[1], kv[0]))


def report() -> str:
    c = counters()
    lines = ["torchtpu metrics"]
    scalars = ["executions", "compiles", "compile_seconds", "cache_hits.memory", "cache_misses", "host_syncs",
               "transfers.h2d", "bytes.h2d", "transfers.d2h", "bytes.d2h"]
    for k in scalars:
        lines.append(f"  {k:<22} {c.get(k, 0)}")
    ops = _group(c, "op.")
    lines.append(f"  ops dispatched: {sum(v for _, v in ops)} ({len(ops)} distinct)")
    for name, v in ops[:25]:
        lines.append(f"    {name:<40} {v}")
    if len(ops) > 25:
        lines.append(f"    ... {len(ops) - 25} more")
    for title, prefix in (("host syncs by cause", "host_sync."), ("decomposed ops", "decomposed."),
                          ("CPU fallbacks", "fallback.")):
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
